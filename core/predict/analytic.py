"""Peak GPU memory of one training step, predicted from the configuration alone: config in, bytes out.

Existing estimators (accelerate's `estimate-memory`, DeepSpeed's ZeRO estimators) count weights, gradients and
optimizer state and leave activations out; at the shapes memlab trains, activations and the B x T x V logits are
most of the peak. This one walks the step the engine runs (memlab.core.model, loss, optim) and counts every tensor
that is alive at each moment where the peak can fall:

    forward, last block      all saved activations below it, plus that block's forward temporaries
    loss forward             every block's saved activations, the logits (fp32 copy + log-softmax output)
    loss backward            the same, with the log-softmax output and two B*T*V fp32 gradients
    block backward           top-down, block by block: what is still saved, the recomputed block (checkpointing),
                             the backward temporaries, and the parameter gradients made so far
    optimizer step           weights, gradients, optimizer state and the optimizer's own temporaries

and reports the largest, split by component. Sizes come from how PyTorch stores things (what autograd saves for
each op under autocast, which dtype each tensor has), written out once per op below. The one thing that cannot be
derived is the allocator's and the libraries' own overhead (cuBLAS workspaces, kernel scratch, block rounding):
a measured constant (WORKSPACE_BYTES), recorded with where it was measured.

Notation (as in model.py): L layers, C d_model, H heads, F d_ff, T seq_len, V padded vocabulary, b the micro-batch;
e = bytes of a matmul output (2 under bf16/fp16 autocast, 4 in fp32/tf32). The residual stream is always fp32:
the embeddings are fp32 parameters and fp32 + bf16 promotes to fp32.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

from memlab.core.attention import declared, effective_window
from memlab.core.config import Experiment, Profile, to_dict
from memlab.core.data import cache as cache_mod
from memlab.core.data.tokens import cache_entry
from memlab.core.errors import ConfigError, MemlabError
from memlab.core.offload import MIN_BYTES
from memlab.core.predict.calibration import CALIBRATION
from memlab.core.units import gib, parse_size
from memlab.core.predict.inductor import GraphShape, budget_peaks
from memlab.core.predict.search import LIMIT, largest_near

# ---------------------------------------------------------------------------------------------- measured constants

# Bytes the CUDA caching allocator reports as allocated beyond the tensors counted here (cuBLAS / cuBLASLt
# workspaces, attention scratch, block rounding), and device memory outside the allocator on a card used whole (the
# CUDA context, handles, loaded kernels), of which the driver's own reserve: measured, so data keyed by GPU and torch
# (memlab.core.predict.calibration). A GPU with another reserve takes its own in its place (card.context_bytes_here).
WORKSPACE_BYTES = CALIBRATION.workspace_bytes
CUDA_CONTEXT_BYTES = CALIBRATION.cuda_context_bytes


def card_size(text: str) -> int:
    """--gpu-memory as bytes: a card's whole memory, so it must hold more than the CUDA context (else the allocator's
    share would be negative)."""
    card = parse_size(text)
    if card <= CUDA_CONTEXT_BYTES:
        raise ConfigError(f"--gpu-memory {text} ({gib(card)}) is not more than the CUDA context and libraries a run holds "
                          f"outside the allocator ({gib(CUDA_CONTEXT_BYTES)}); give the card's whole memory, e.g. --gpu-memory 24GiB")
    return card


# The batch that fits is bounded by the allocator's *reserved* memory, not by the tensors alive: the share of
# the limit lost to fragmentation at the largest batch that fits, 1 - allocated / reserved at the peak, by how the
# step allocates. Measured on the H100 (find-batch's probes that fitted at the searches'
# largest batch): plain steps 0.03 .. 0.07 (bf16, baseline, chunked_ce, selective, adamw8bit, accum, adafactor);
# a checkpointed block recomputed in backward leaves holes the size of its activations, 0.10 .. 0.15 (gradcp,
# gradcp_bf16, gradcp_every2, leanest, fsdp_gradcp_bf16); activations offloaded to the host and copied back,
# 0.18 at micro-batch 16 and above 0.18 at 128 (act_offload: 112 fitted in 16 GiB, 128 did not, at a predicted
# 13.1 GiB allocated), 0.22 taken so that the prediction falls inside that bracket.
FRAGMENTATION_MARGIN = {"plain": 0.05, "recompute": 0.13, "offload": 0.22}

COMPONENTS = ("weights", "gradients", "optimizer_state", "activations", "logits_loss", "temporaries", "workspace")


# ---------------------------------------------------------------------------------------------- result


@dataclass
class Estimate:
    """Predicted peak of one training step. `components` are the bytes alive at the peak moment (`peak_phase`)."""

    profile: str
    experiment: str
    micro_batch: int
    accumulation: int
    vocab_size: int
    params: int
    components: dict[str, int]
    peak_phase: str
    phases: dict[str, int]  # the peak of each candidate moment, for the curious
    notes: list[str] = field(default_factory=list)
    method: str = "analytic"  # analytic | fake (measured on fake tensors, memlab.core.predict.fake)

    @property
    def total_bytes(self) -> int:
        return sum(self.components.values())


# ---------------------------------------------------------------------------------------------- shapes


@dataclass(frozen=True)
class _Shape:
    L: int
    C: int
    H: int
    F: int
    T: int
    V: int
    b: int

    @property
    def BT(self) -> int:
        return self.b * self.T

    @property
    def BTC(self) -> int:
        return self.b * self.T * self.C

    @property
    def BTF(self) -> int:
        return self.b * self.T * self.F

    @property
    def BHTT(self) -> int:
        return self.b * self.H * self.T * self.T


def block_params(C: int, F: int) -> dict[str, int]:
    """Parameter counts of one block: matrices (decayed) and vectors (biases, LayerNorm; not decayed)."""
    return {"matrix": 3 * C * C + C * C + C * F + F * C, "vector": 2 * C + 3 * C + C + 2 * C + F + C}


def param_count(L: int, C: int, F: int, T: int, V: int) -> int:
    """Parameters counted once (tied embeddings): wte V x C, wpe T x C, L blocks, ln_f."""
    bp = block_params(C, F)
    return V * C + T * C + L * (bp["matrix"] + bp["vector"]) + 2 * C


def param_shapes(L: int, C: int, F: int, T: int, V: int) -> list[tuple[int, ...]]:
    """Every parameter's shape, as the optimizer sees them (for per-tensor rules: Adafactor, 8-bit)."""
    shapes: list[tuple[int, ...]] = [(V, C), (T, C)]
    for _ in range(L):
        shapes += [(C,), (C,), (3 * C, C), (3 * C,), (C, C), (C,), (C,), (C,), (F, C), (F,), (C, F), (C,)]
    return shapes + [(C,), (C,)]


def padded(vocab: int) -> int:
    """The engine's padding of the tokenizer's vocabulary (engine.padded_vocab): up to a multiple of 64."""
    return -(-vocab // 64) * 64


# ---------------------------------------------------------------------------------------------- optimizer


def _hidden(shapes: list[tuple[int, ...]]) -> list[tuple[int, ...]]:
    """The hidden matrices Muon and GaLore treat apart (memlab.core.muon.hidden_matrices): the 2-D shapes after
    wte and wpe, which param_shapes lists first (the LM head is tied to wte)."""
    return [s for s in shapes[2:] if len(s) == 2]


def _blockwise(n: int, bits: int, block: int, min_size: int = 4096) -> int:
    """Two moments of n elements quantized to `bits` with an fp32 scale per `block` elements (torchao, bitsandbytes:
    tensors under 4096 elements, or (torchao) not a whole number of blocks, keep fp32 moments)."""
    if n < min_size or n % block:
        return 8 * n
    return 2 * (n * bits // 8 + 4 * (n // block))


def _galore_matrix(shape: tuple[int, ...], rank: int) -> int:
    """galore_torch 1.0, proj_type "std": the moments of the R x r (R >= C) or r x C projection, 2 x 4 bytes each,
    and the projection, a slice of the fp32 SVD factor that, being a view, keeps the whole min(R, C)^2 factor alive."""
    R, C = shape
    m = min(R, C)
    return 8 * min(rank, m) * max(R, C) + 4 * m * m


def paged_bytes(shapes: list[tuple[int, ...]]) -> int:
    """bitsandbytes' paged optimizers put a state of >= 1e5 elements in CUDA unified memory (cudaMallocManaged):
    outside PyTorch's caching allocator, so neither counted in its peak nor seen by torch.cuda.max_memory_allocated."""
    return sum(2 * math.prod(s) for s in shapes if math.prod(s) >= 100_000)


def optimizer_state_bytes(profile: Profile, shapes: list[tuple[int, ...]]) -> int:
    """Bytes of optimizer state in the caching allocator, by optimizer (parameters fp32 except under bf16_pure).

    adamw (foreach or fused): two fp32 moments, 8 bytes a parameter (fused also keeps a 4-byte step per tensor).
    adafactor (torch.optim.Adafactor): no first moment; a matrix R x C keeps a row and a column factor,
        (R + C) x 4 bytes; a vector keeps a full fp32 second moment.
    adamw8bit (torchao): tensors of >= 4096 elements divisible by the 256-element block keep two uint8 moments
        plus an fp32 scale per block (2 x (1 + 4/256) bytes); smaller tensors keep fp32 moments.
    adamw4bit (torchao 0.18 AdamW4bit): the same rule with 4-bit codes and 128-element blocks, 2 x (0.5 + 4/128).
    bf16_sr (torchao _AdamW, bf16 parameters): moments shaped like the parameter, bf16: 4 bytes a parameter.
    muon: one fp32 momentum buffer per hidden matrix (4 bytes), AdamW's 8 bytes for the rest.
    paged_adamw8bit (bitsandbytes): 8-bit moments (256-element blocks) for >= 4096 elements, fp32 below; states
        of >= 1e5 elements are paged (paged_bytes), so only their block scales are counted here.
    galore: _galore_matrix per hidden matrix, AdamW's 8 bytes for the rest.
    optimizer.offload: the state (and fp32 master copies) live in host memory: 0 on the GPU.
    optimizer.in_backward: AdamW's state, one optimizer per parameter: the same bytes.
    """
    opt = profile.optimizer
    sizes = [math.prod(s) for s in shapes]
    hidden = _hidden(shapes)
    rest = sum(sizes) - sum(math.prod(s) for s in hidden)
    if opt.offload:
        return 0
    if opt.name == "adamw":
        return 8 * sum(sizes) + (4 * len(shapes) if opt.fused else 0)
    if opt.name == "adafactor":
        return sum(4 * (s[0] + s[1]) if len(s) >= 2 else 4 * s[0] for s in shapes)
    if opt.name == "adamw8bit":
        return sum(_blockwise(n, 8, 256) + (2 * 256 * 4 if n >= 4096 and n % 256 == 0 else 0) for n in sizes)
    if opt.name == "adamw4bit":
        return sum(_blockwise(n, 4, 128) + (2 * 16 * 4 if n >= 4096 and n % 128 == 0 else 0) for n in sizes)
    if opt.name == "bf16_sr":
        return 4 * sum(sizes)
    if opt.name == "muon":
        return 4 * sum(math.prod(s) for s in hidden) + 8 * rest
    if opt.name == "paged_adamw8bit":
        in_allocator = sum(8 * n if n < 4096 else (2 * n if n < 100_000 else 0) + 8 * -(-n // 256) for n in sizes)
        return in_allocator + 2 * 256 * 4
    if opt.name == "galore":
        return sum(_galore_matrix(s, opt.rank) for s in hidden) + 8 * rest
    raise ConfigError(f"estimate: unknown optimizer.name {opt.name!r}")


def optimizer_temp_bytes(profile: Profile, shapes: list[tuple[int, ...]], device: str = "cuda") -> int:
    """Temporaries of one optimizer step. The foreach implementations work on whole parameter groups at once:
    AdamW's `_foreach_sqrt(exp_avg_sqs)` and Adafactor's `row_var @ col_var` variance estimates are one fp32 copy
    of the largest group (the decayed matrices). Fused AdamW and torchao's compiled steps (8-bit, 4-bit, bf16_sr)
    fuse them away, as do bitsandbytes' in-place 8-bit kernels; an offloaded optimizer steps on the host. On the
    CPU, Adafactor defaults to its per-tensor loop (the engine asks AdamW for foreach explicitly), so only the
    largest tensor's temporaries exist at once. Muon and GaLore: _per_matrix_temp_bytes, or AdamW's foreach
    temporaries of the rest, whichever is larger."""
    opt = profile.optimizer
    if opt.offload or opt.name in ("adamw8bit", "adamw4bit", "bf16_sr", "paged_adamw8bit") or (opt.name == "adamw" and opt.fused):
        return 0
    if opt.in_backward:
        # one parameter at a time, single-tensor AdamW: sqrt(exp_avg_sq) and its quotient coexist (8 bytes a weight)
        return 8 * max(math.prod(s) for s in shapes)
    matrices = [math.prod(s) for s in shapes if len(s) >= 2]
    vectors = [math.prod(s) for s in shapes if len(s) < 2]
    if opt.name == "adafactor":
        if device != "cuda":
            return 4 * max(max(matrices), 2 * max(vectors))
        return 4 * max(sum(matrices), 2 * sum(vectors))  # vectors: grad*grad, then a clone of the variance
    if opt.name in ("muon", "galore"):
        hidden = _hidden(shapes)
        embeddings = sum(math.prod(s) for s in shapes[:2])  # wte, wpe: AdamW's decayed group
        return max(_per_matrix_temp_bytes(opt.name, hidden), 4 * max(embeddings, sum(vectors)))
    return 4 * max(sum(matrices), sum(vectors))


def _per_matrix_temp_bytes(name: str, hidden: list[tuple[int, ...]]) -> int:
    """Muon (torch.optim.Muon, one matrix at a time): the fp32 Nesterov update (4n), its bf16 copy and the next
    Newton-Schulz iterate (2n + 2n) and two m x m bf16 Gram matrices (4 m^2, m = min(R, C)).
    GaLore: the update projected back to R x C and its scaled copy (8n); on a projection step, the fp32 SVD
    factors U (R x m) and Vh (m x C) beside the gradient (LAPACK's own workspace not counted)."""
    if name == "muon":
        return max(8 * R * C + 4 * min(R, C) ** 2 for R, C in hidden)
    return max(max(8 * R * C, 4 * min(R, C) * (R + C)) for R, C in hidden)


# ---------------------------------------------------------------------------------------------- activations


def _attention_kind(profile: Profile) -> str:
    """The kernel's own declaration (memlab.core.attention): eager and SDPA's math backend materialize the T x T
    scores; every other kernel keeps O(T) per head. The estimator's one question to the attention kernel: every
    memory rule that depends on it reads this."""

    return "materialized" if declared(profile.attention).materializes_scores else "fused"


@dataclass(frozen=True)
class _Precision:
    autocast: bool
    e: int  # bytes of a matmul output / linear input under this precision
    weight_copies: bool = True  # autocast makes (and autograd saves) bf16 copies of the fp32 weights; not under FSDP
    # bytes per element of the copy of a block Linear's weight kept for backward (None: e, autocast's copy); see float8
    block_weight: int | None = None
    float8: bool = False
    # bytes of the model's own dtype: its parameters and gradients, the residual stream (the blocks' inputs, LayerNorm
    # in and out, the residual's gradient): fp32 even under autocast, bf16 under bf16_pure
    r: int = 4

    @property
    def w(self) -> int:
        return self.e if self.block_weight is None else self.block_weight


def _precision(profile: Profile) -> _Precision:
    """bf16_pure has no autocast (the weights are bf16 already: no copies) and 2-byte matmul outputs."""
    amp = profile.precision.dtype in ("bf16", "fp16")
    e = 2 if amp or profile.precision.dtype == "bf16_pure" else 4
    if profile.precision.dtype == "bf16_pure":
        return _Precision(False, e, r=2)  # the weights are bf16: so is every activation, the residual stream too
    if profile.kernels.float8:
        # torchao's Float8Linear (memlab.core.techniques.float8) saves the fp32 weight parameter itself, not
        # autocast's bf16 copy; its float8 casts are temporaries, remade in backward. Compiled too: the H100 list of
        # saved tensors (bench/saved_tensors.py) holds the fp32 masters and no float8 tensor.
        return _Precision(amp, e, block_weight=0, float8=True)
    return _Precision(amp, e)


def param_bytes(profile: Profile) -> int:
    """Bytes of a parameter, and of its gradient: 2 under bf16_pure, else 4 (autocast keeps fp32 parameters)."""
    return 2 if profile.precision.dtype == "bf16_pure" else 4


def _dropout_mask_bytes(experiment: Experiment, pr: _Precision, device: str) -> int:
    """Bytes per element of a dropout mask (0 = no dropout). CUDA's fused native_dropout keeps a bool mask; the
    CPU's keeps its scaled noise tensor in the input's dtype."""
    if experiment.model.dropout <= 0:
        return 0
    return 1 if device == "cuda" else pr.e


def _block_mask_bytes(experiment: Experiment, profile: Profile, pr: _Precision, device: str) -> int:
    """Bytes per element of the (T, T) mask each block's attention makes and keeps for backward (0 = none); the
    kernel's cached boolean mask itself (T^2 bytes, one for all blocks) is counted once, in _model_saved.
    eager (memlab.core.attention.eager): masked_fill(~mask) makes the inverted boolean mask per call and autograd
      saves it for masked_fill's backward: 1 byte.
    a window with dropout on CUDA runs SDPA's efficient backend with an explicit mask (flex has no dropout, nor has
      FA4; flash windows without the mask only where FA2 is installed, which this plan does not assume). Each call
      turns the boolean mask into an additive one in q's dtype (ATen's convert_boolean_attn_mask: a new tensor per
      call) and _scaled_dot_product_efficient_attention saves it as attn_bias for its backward: e bytes."""

    m = experiment.model
    if profile.attention.kernel == "eager":
        return 1
    if device != "cuda" or m.dropout <= 0 or not effective_window(profile.attention.window, m.seq_len):
        return 0
    return pr.e if profile.attention.kernel in ("flash", "flex") else 0


def block_saved(s: _Shape, pr: _Precision, kind: str, dropout: int, parts: str = "all", mask: int = 0) -> dict[str, int]:
    """Bytes autograd keeps for backward from one un-checkpointed block (or only its "attn" / "mlp" half).

    attention half: ln_1 input (fp32 residual) and its mean/rstd; the qkv Linear's input (its bf16 cast under
    autocast, else the fp32 LayerNorm output); then the kernel's saves:
      fused (SDPA flash/cuDNN/efficient, flash-attn, flex): q, k, v (views of the qkv output, 3e BTC), the output
        (e BTC, also the proj Linear's input: the same storage) and the fp32 log-sum-exp (4 bHT);
      materialized (eager): contiguous copies of q, k, v made by matmul's reshape (3e BTC), the fp32 softmax output
        (4 bHT^2; under autocast also its bf16 cast, 2 bHT^2) and the contiguous copy of the output (e BTC).
    MLP half: ln_2 input (fp32 residual) and mean/rstd, the fc input (e BTC), fc output and GELU output (e BTF each).
    Under autocast the bf16 copies of the four weight matrices are saved too (for the input gradients).
    Dropout (p > 0; `dropout` = mask bytes per element): a mask per residual dropout; eager attention dropout
    keeps its mask and its fp32 output (the softmax output stays saved by the softmax).
    `mask` (bytes per element, 0 = none): the (T, T) mask the attention keeps for backward (_block_mask_bytes).
    """
    e, amp = pr.e, pr.autocast
    out: dict[str, int] = {}
    if parts in ("all", "attn"):
        out["residual"] = pr.r * s.BTC
        out["ln_stats"] = 8 * s.BT
        out["attn_in"] = e * s.BTC
        out["qkv"] = 3 * e * s.BTC
        out["attn_out"] = e * s.BTC
        if kind == "materialized":
            out["scores"] = (4 + (2 if amp else 0)) * s.BHTT
            if dropout:
                out["scores"] += ((1 if dropout == 1 else 4) + 4) * s.BHTT
        else:
            out["lse"] = 4 * s.b * s.H * s.T
        if amp and pr.weight_copies:
            out["weight_copies"] = pr.w * 4 * s.C * s.C
        if dropout:
            out["dropout_masks"] = dropout * s.BTC
        if mask:
            out["attn_mask"] = mask * s.T * s.T
    if parts in ("all", "mlp"):
        out["residual"] = out.get("residual", 0) + pr.r * s.BTC
        out["ln_stats"] = out.get("ln_stats", 0) + 8 * s.BT
        out["mlp_in"] = e * s.BTC
        out["mlp_hidden"] = 2 * e * s.BTF
        if amp and pr.weight_copies:
            out["weight_copies"] = out.get("weight_copies", 0) + pr.w * 2 * s.C * s.F
        if dropout:
            out["dropout_masks"] = out.get("dropout_masks", 0) + dropout * s.BTC
    return out


def _block_layout(profile: Profile, L: int) -> list[str]:
    """Per block: plain | full (checkpointed whole) | sel_attn | sel_mlp (one sub-layer checkpointed) | ops (matmul
    and attention outputs kept, the rest recomputed) | budget (compiled under checkpointing.budget < 1)."""
    ck = profile.checkpointing
    if ck.mode == "none":
        return ["budget" if ck.budget < 1 else "plain"] * L
    if ck.mode == "ops":
        return ["ops"] * L
    if ck.mode == "full":
        return ["full"] * L
    if ck.mode == "every_n":
        return ["full" if i % ck.every == 0 else "plain" for i in range(L)]
    if ck.mode == "selective":
        return ["sel_attn" if ck.target == "attention" else "sel_mlp"] * L
    raise ConfigError(f"estimate: unknown checkpointing.mode {ck.mode!r}")


def ops_saved(s: _Shape, pr: _Precision, kind: str, dropout: int = 0) -> int:
    """What mode "ops" keeps of one block besides its input: every matmul's output (qkv 3e BTC, the two
    projections e BTC each, fc e BTF) and the attention kernel's outputs (fused: its output e BTC and the fp32
    log-sum-exp 4 bHT; eager: the two bmm outputs, the scores e bHT^2 and the output e BTC), and every dropout
    that returns its mask (CUDA's native_dropout, `dropout` = 1: its output and bool mask; the two residual
    dropouts, e BTC each, and eager attention's on the fp32 probabilities). Norms, GELU and casts (the autocast
    weight copies too) are recomputed, and so is the CPU's in-place dropout (memlab.core.techniques.checkpointing).
    The eager policy's step: a GPU compiles each block, whose graphs keep less (an upper bound there, +0.5% to +17% on
    ten GPT shapes; maxbatch.guards)."""
    attention = pr.e * s.BHTT + pr.e * s.BTC if kind == "materialized" else pr.e * s.BTC + 4 * s.b * s.H * s.T
    kept_dropout = 0
    if dropout == 1:
        kept_dropout = 2 * (pr.e + 1) * s.BTC + ((4 + 1) * s.BHTT if kind == "materialized" else 0)
    return 3 * pr.e * s.BTC + 2 * pr.e * s.BTC + pr.e * s.BTF + attention + kept_dropout


def _saved_of(layout: str, s: _Shape, pr: _Precision, kind: str, dropout: int, block_input: int = 4,
              budget: float = 1.0, mask: int = 0) -> int:
    """Bytes one block keeps between its forward and its backward. `block_input`: bytes per element of the
    block's input (the fp32 residual; bf16 under FSDP2, whose MixedPrecisionPolicy casts every block's inputs).
    `budget`: checkpointing.budget, for the "budget" layout."""
    if layout == "plain":
        return sum(block_saved(s, pr, kind, dropout, mask=mask).values())
    if layout == "full":
        return block_input * s.BTC  # the non-reentrant checkpoint keeps only the block's input
    if layout == "ops":
        return block_input * s.BTC + ops_saved(s, pr, kind, dropout)
    if layout == "budget":
        # Only where the compiled step cannot be traced (_traced_budget_moments, which replaces these figures
        # otherwise). An approximation, borne out on the H100 at 0.75 and 1 only (see _saved_activations' note): the min-cut
        # partitioner keeps at most `budget` of what it keeps at 1.0 (the compiled no-checkpointing figure, = the
        # eager plain block, see _saved_activations) and at 0.0 recomputes what it can, which in memory is full
        # checkpointing (the residual stream, one block input each, stays: every block's recompute starts from
        # it). Linear in between.
        floor = block_input * s.BTC
        return floor + round(budget * (sum(block_saved(s, pr, kind, dropout, mask=mask).values()) - floor))
    if layout == "sel_attn":
        # attention recomputed: keep ln_1's input and stats, the attention sub-layer's input (fp32 LN output)
        return 4 * s.BTC + 8 * s.BT + 4 * s.BTC + sum(block_saved(s, pr, kind, dropout, "mlp", mask).values())
    if layout == "sel_mlp":
        return sum(block_saved(s, pr, kind, dropout, "attn", mask).values()) + 4 * s.BTC + 8 * s.BT + 4 * s.BTC
    raise AssertionError(layout)


def _untraceable(st: _Step, blocks: str = "") -> str | None:
    """Why memlab.core.predict.inductor cannot trace this step compiled under checkpointing.budget (its model is
    memlab's plain GPT on one CUDA GPU: SDPA attention, or flash-attn's, which saves the same tensors; bf16 autocast,
    full logits; float8's Linears where torchao is installed here), or None when it can. With `blocks`, only the
    blocks are compiled: the loss is no graph's."""
    p = st.profile
    reasons = [
        (st.device != "cuda", f"the {st.device} backend"),
        (p.precision.dtype != "bf16", f"precision {p.precision.dtype}"),
        (p.attention.kernel not in ("sdpa", "flash") or p.attention.sdpa_backend == "math" or bool(st.mask), f"attention {p.attention.kernel}:{p.attention.sdpa_backend}" + (" with a mask" if st.mask else "")),
        ((p.loss.chunked or p.loss.fused != "none") and not blocks, "a chunked or fused loss"),
        (p.kernels.fused, "fused kernels"),
        (p.kernels.float8 and not torchao_installed(), "float8 kernels and no torchao installed here (pip install 'memlab[torchao]')"),
        (st.offload or st.ddp or st.fsdp or p.optimizer.in_backward, "offload, distributed or optimizer.in_backward"),
    ]
    return next((why for hit, why in reasons if hit), None)


def _graph_shape(st: _Step, experiment: Experiment, blocks: str = ""):
    """What memlab.core.predict.inductor traces for this compiled step: the partitioner decides at the
    experiment's own micro-batch (at least 2: torch.compile specializes a batch of 1)."""

    s, p = st.s, st.profile
    # flash-attn's kernels are custom ops, in none of the partitioner's op lists: cuDNN attention's place
    sdpa_flash = p.attention.kernel == "sdpa" and p.attention.sdpa_backend in ("flash", "efficient")
    attention = "flash" if sdpa_flash else "cudnn"
    configured = max(2, experiment.train.batch_size // (st.k * st.world_size))
    # another family's model is built from its own [model] section (an hf model: the transformers model the engine builds)
    model = json.dumps(to_dict(experiment.model), sort_keys=True) if experiment.model.family != "gpt" else ""
    finetune = json.dumps(to_dict(p.finetune), sort_keys=True) if p.finetune.method == "lora" else ""
    return GraphShape(s.L, s.H, s.C, s.F, s.V, s.T, experiment.model.dropout, p.checkpointing.budget, configured, attention,
                      p.kernels.float8, model, finetune, blocks)


def torchao_installed() -> bool:
    """float8's graphs are traced with torchao's own Float8Linear: without it here, its step cannot be."""
    import importlib.util

    return importlib.util.find_spec("torchao") is not None


def compiled_graph_shape(experiment: Experiment, profile: Profile, vocab_size: int, blocks: str = ""):
    """The GraphShape of this compiled step on one CUDA GPU (memlab.core.predict.inductor), or a MemlabError
    saying why it cannot be traced (_untraceable). `blocks`: of its blocks, compiled one by one in that
    checkpointing mode (the engine's per-op checkpointing)."""
    st = _resolve_step(experiment, profile, vocab_size, None, 1, "cuda")
    why = _untraceable(st, blocks)
    if why:
        raise MemlabError(f"the compiled {'blocks' if blocks else 'step'} cannot be traced with {why}")
    return _graph_shape(st, experiment, blocks)


def _traced_budget_moments(st: _Step, experiment: Experiment, static: _Static, model: _ModelSaved, notes: list[str]) -> dict[str, dict[str, int]]:
    """A step compiled under checkpointing.budget < 1, traced on fake tensors (memlab.core.predict.inductor): the
    partitioner's own choice of what to save, and Inductor's own buffers for both graphs, replayed. The backward's
    peak is where the recompute lands: at budget 0 the backward rebuilds the whole forward before its first
    gradient, so it peaks about as high as no budget at all. Its gradients are made inside the compiled backward
    (counted there); with accumulation, those of the micro-batches before are alive too. One trace serves every
    micro-batch (the batch is a symbol in it); the partitioner decides at the experiment's own micro-batch.
    {} when not traced."""
    if st.profile.checkpointing.budget >= 1 or not st.compiled or _untraceable(st):
        return {}

    s, p = st.s, st.profile
    shape = _graph_shape(st, experiment)
    configured = shape.batch
    try:
        peaks = budget_peaks(shape, s.b)
    except Exception as e:  # noqa: BLE001 (an estimate without the trace is still one: the interpolation, said so)
        notes.append(f"checkpointing.budget: the compiled step could not be traced ({e}); the figures interpolate")
        return {}
    earlier = static.grads_full if st.k > 1 else 0
    notes.append(f"checkpointing.budget {p.checkpointing.budget:g}: traced (torch.compile's partitioner and Inductor's "
                 f"buffers on fake tensors): {peaks.saved / 2**30:.2f} GiB saved for backward. On the H100 within 2% of "
                 "the measured peak (gpt2s at budgets 0 to 1, 6.53 GiB predicted at 0 against 6.54; the seed shape and "
                 f"bigvocab at 0 to 0.75); the partitioner's choices are those it makes at micro-batch {configured}")
    return {
        "forward (traced)": static.moment(static.grads_fwd, peaks.forward + model.tokens, 0, 0),
        "backward (traced)": static.moment(earlier + peaks.backward_grads, peaks.backward - peaks.backward_grads + model.tokens, 0, 0),
    }


def _weight_copy_bytes(layout: str, s: _Shape, pr: _Precision) -> int:
    """bf16 weight copies autocast caches during forward (all blocks) but autograd does not keep for this block."""
    if not pr.autocast or not pr.weight_copies or pr.float8:  # Float8Linear casts nothing through autocast's cache
        return 0
    biases = pr.e * (3 * s.C + s.C + s.F + s.C)
    if layout in ("full", "ops"):  # ops recomputes the casts too
        return biases + pr.e * (4 * s.C * s.C + 2 * s.C * s.F)
    if layout == "sel_attn":
        return biases + pr.e * 4 * s.C * s.C
    if layout == "sel_mlp":
        return biases + pr.e * 2 * s.C * s.F
    return biases


def _block_fwd_extra(s: _Shape, pr: _Precision, kind: str) -> int:
    """Forward temporaries of one block beyond what it saves: the largest set alive at once.
    MLP: fc output and GELU output coexist (2e BTF) in a checkpointed block; in a plain block both are saved, and
    the temporaries are the fp32 LayerNorm output (4 BTC) and the proj output. Eager attention: the scaled and
    masked scores coexist before the softmax (fp32: 4 bHT^2 besides the saved output; autocast: the bf16 masked
    scores and the fp32 softmax input, 6 bHT^2)."""
    extra = pr.r * s.BTC + pr.e * s.BTC
    if kind == "materialized":
        extra = max(extra, (6 if pr.autocast else 4) * s.BHTT)
    return extra


def _block_bwd_extra(s: _Shape, pr: _Precision, kind: str, saved: dict[str, int], dropout: int = 0) -> int:
    """Backward temporaries of one block beyond its saved tensors (each freed once the last node using it ran).

    MLP (all of the block's saves still alive): the fp32 residual gradient (4 BTC) and, under autocast, its cast
    for the bf16 branch (e BTC); proj's backward makes the GELU-output gradient (e BTF) and proj's weight
    gradient (e CF). Later nodes free more than they make.
    Attention, once the MLP's saves, v and the proj input are freed: the residual gradient and v's gradient
    (4 + e BTC); eager: the gradients of the probabilities, of the masked and of the scaled scores while the
    fp32 softmax output lives (12 bHT^2 in fp32: the H100's allocator history of gradcp shows three fp32 T x T
    gradients alive at the peak besides the recomputed probabilities, one more than the CPU's fake tensors
    count: CUDA's softmax backward makes tmp = grad * output, see _eager_scores_bwd; 6 under autocast, where the
    bf16 probabilities are freed first; with dropout, _eager_scores_bwd); fused kernels: dq, dk, dv and the concatenated d(qkv) (6e BTC)
    plus flash's fp32 dq accumulator (4 BTC).
    """
    e = pr.e
    mlp = pr.r * s.BTC + (e * s.BTC if pr.autocast else 0) + e * s.BTF + e * s.C * s.F
    freed = saved.get("mlp_hidden", 0) + saved.get("mlp_in", 0) + pr.r * s.BTC + 2 * e * s.BTC
    grads_made = pr.r * (2 * s.C * s.F + s.C * s.C)  # by then: the MLP's and attention proj's weight gradients
    if kind == "materialized":
        attn = pr.r * s.BTC + e * s.BTC + _eager_scores_bwd(pr, dropout) * s.BHTT
    else:
        attn = pr.r * s.BTC + 4 * s.BTC + 6 * e * s.BTC
    return max(mlp, attn - freed + grads_made)


def _eager_scores_bwd(pr: _Precision, dropout: int) -> int:
    """Bytes per T x T element eager attention's backward holds beyond the block's saves (see _block_bwd_extra).
    fp32 with CUDA's fused dropout (a 1-byte mask): the peak is softmax's backward, where CUDA (SoftMax.cu,
    softmax_backward_cuda_out) makes tmp = grad * output besides grad_input while the softmax output and its
    incoming gradient live: four fp32 T x T (16). By then the dropout's saved mask and output (1 + 4) are freed,
    so 16 less the block's T x T saves (4 + 1 + 4) = 7 beyond them; the dropout backward before it holds
    4 + 1 + 4 + 4 (the matmul's gradient, its masked copy) = 4 beyond. The same tmp is the third gradient of the
    no-dropout figure (12 = 16 - the softmax output); fake tensors (meta kernels) do not allocate it."""
    if not dropout:
        return 6 if pr.autocast else 12
    if dropout == 1 and not pr.autocast:
        return 4 * 4 - (4 + dropout + 4)  # 7
    return 4


# ---------------------------------------------------------------------------------------------- the estimate


@dataclass(frozen=True)
class _Step:
    """The training step being estimated: its shapes, its precision and the profile's switches, resolved once."""

    profile: Profile
    s: _Shape
    pr: _Precision
    kind: str  # _attention_kind: materialized | fused
    dropout: int  # bytes per element of a dropout mask, 0 = no dropout
    k: int  # accumulation steps
    world_size: int
    device: str
    mask: int = 0  # bytes per element of the (T, T) mask each block keeps (_block_mask_bytes), 0 = none

    @property
    def fsdp(self) -> bool:
        return self.profile.distributed.mode == "fsdp"

    @property
    def ddp(self) -> bool:
        return self.profile.distributed.mode == "ddp"

    @property
    def host(self) -> bool:  # fsdp with its sharded state in host memory
        return self.fsdp and self.profile.distributed.cpu_offload

    @property
    def compiled(self) -> bool:
        return self.profile.compile.enabled

    @property
    def offload(self) -> bool:  # activations saved on the CPU
        return self.profile.checkpointing.offload

    @property
    def overlap(self) -> bool:  # ... by memlab.core.offload: the blocks' large activations only, one block ahead
        return self.offload and self.profile.checkpointing.offload_overlap

    @property
    def sync_offload(self) -> bool:  # ... by save_on_cpu: every saved tensor
        return self.offload and not self.overlap

    @property
    def chunked(self) -> bool:
        return self.profile.loss.chunked

    @property
    def fused_loss(self) -> str:  # loss.fused: none | liger | cce
        return self.profile.loss.fused


def _resolve_step(experiment: Experiment, p: Profile, vocab_size: int, micro_batch: int | None, world_size: int, device: str) -> _Step:
    m = experiment.model
    k = p.accumulation.steps
    b = micro_batch if micro_batch is not None else max(1, experiment.train.batch_size // (k * world_size))
    if b < 1:
        raise ConfigError(f"estimate: the micro-batch must be at least 1, got {b}")
    if vocab_size < 1:
        raise ConfigError(f"estimate: the vocabulary size must be at least 1, got {vocab_size}")
    F = m.d_ff or 4 * m.d_model
    s = _Shape(m.n_layer, m.d_model, m.n_head, F, m.seq_len, vocab_size, b)
    pr = _precision(p)
    if p.distributed.mode == "fsdp" and pr.autocast:
        # FSDP2's MixedPrecisionPolicy all-gathers the parameters in bf16: autocast has no fp32 weight to cast, and
        # the bf16 weights autograd saves are the unsharded parameters, freed after each block's forward (reshard)
        # and gathered again for its backward: counted once, in the all-gather term (_static_memory), not per block.
        pr = _Precision(pr.autocast, pr.e, weight_copies=False)
    dropout = _dropout_mask_bytes(experiment, pr, device)
    return _Step(p, s, pr, _attention_kind(p), dropout, k, world_size, device, _block_mask_bytes(experiment, p, pr, device))


@dataclass(frozen=True)
class _Static:
    """Weights, gradients and optimizer state of one rank (fp32 parameters in every profile), and the constants
    every moment of the step shares."""

    params: int
    weights: int
    grads_full: int  # every parameter gradient
    grads_fwd: int  # gradients alive during the forward: from earlier micro-batches, or DDP's buckets
    head_grads: int  # wte (tied LM head) and ln_f: the first gradients backward makes
    block_grads: int  # one block's
    block_step: int  # optimizer.in_backward: the temporaries of the step of one block parameter, inside backward
    opt_state: int
    opt_temp: int
    gathered: int  # fsdp: the all-gathered unsharded parameters alive during forward and backward
    workspace: int

    def moment(self, grads: int, acts: int, loss: int, temps: int, *, gathered: bool = True) -> dict[str, int]:
        """The components alive at one moment of the step."""
        return {
            "weights": self.weights + (self.gathered if gathered else 0), "gradients": grads,
            "optimizer_state": self.opt_state, "activations": acts, "logits_loss": loss, "temporaries": temps,
            "workspace": self.workspace,
        }


def _gathered_blocks(d, n_layer: int) -> int:
    """Blocks whose unsharded parameters FSDP2 holds at once: one unit (blocks_per_unit blocks; the default's one block
    is what the H100 measurements fit, FSDP2's own prefetch included) plus the units gathered ahead (prefetch > 1);
    every block when reshard_after_forward is off (each stays gathered from its forward to its backward)."""
    if not d.reshard_after_forward:
        return n_layer
    return min(n_layer, d.blocks_per_unit * max(1, d.prefetch))


def _static_memory(st: _Step, notes: list[str]) -> _Static:
    """Distributed (profile.distributed, world_size ranks; memlab.core.distributed builds the wrappers):
      ddp   every rank keeps whole weights, gradients and optimizer state, plus DDP's gradient buckets: one fp32
            copy of the gradients, allocated when the model is wrapped, so alive from the first forward on. With
            gradient_as_bucket_view=True (as memlab wraps) the .grad tensors are views of the buckets: the bucket
            term replaces the gradients as they are made, and the optimizer step sees 4N, not 8N. Measured on
            2 x H200, gpt2s micro 16 bf16 (docs/multi-gpu.md): DDP per-GPU peak
            8.26 GiB vs 7.91 on one GPU, +0.35 GiB = 92.1M params x 4 B; the optimizer phase unchanged (1.79).
      fsdp  weights, gradients and optimizer state divided by world_size (FSDP2 shards every tensor on dim 0),
            plus the unsharded parameters in the compute dtype of one block (all-gathered for its forward and
            again for its backward) and of the root (wte/LM head, wpe, ln_f: not resharded between forward and
            backward). FSDP2 prefetches the next block's all-gather, so a second block may briefly be whole too.
            Measured (same run): peak 7.27 GiB, optimizer phase 0.95 GiB vs 1.79 on one GPU.
      fsdp + cpu_offload   the sharded parameters, gradients and optimizer state live in pinned host memory
            (CPUOffloadPolicy; the step runs on the CPU): the GPU holds only the all-gathered unsharded
            parameters. Measured (same run): peak 6.74 GiB, optimizer phase 0.06 GiB.
    """
    s, p = st.s, st.profile
    shapes = param_shapes(s.L, s.C, s.F, s.T, s.V)
    N = param_count(s.L, s.C, s.F, s.T, s.V)
    shard = st.world_size if st.fsdp else 1
    on_gpu = 0 if st.host else 1
    pb = param_bytes(p)
    grads_full = on_gpu * pb * N // shard
    _optimizer_notes(p, shapes, notes)
    bp = block_params(s.C, s.F)
    gathered = 0
    if st.ddp:
        notes.append(f"ddp x{st.world_size}: whole weights, gradients and optimizer state per GPU, plus DDP's gradient buckets (one fp32 copy of the gradients, alive all step)")
    elif st.fsdp:
        root = s.V * s.C + s.T * s.C + 2 * s.C
        blocks = _gathered_blocks(p.distributed, s.L)
        gathered = st.pr.e * (blocks * (bp["matrix"] + bp["vector"]) + root)
        where = "on the host (cpu_offload); the GPU holds" if st.host else f"sharded {st.world_size} ways, plus"
        notes.append(f"fsdp x{st.world_size}: weights, gradients and optimizer state {where} the unsharded parameters of {blocks} block(s) and the root")
    in_bwd = _in_backward(p, s, notes)
    return _Static(
        params=N,
        weights=on_gpu * pb * N // shard,
        grads_full=in_bwd["grads"] if in_bwd else grads_full,
        # With accumulation, every micro-batch after the first runs with the gradients of the ones before alive.
        # DDP: the buckets hold every gradient from the start; with accumulation, beside them the gradients of the
        # micro-batches before the last, made under no_sync and moved into the buckets only by the last backward
        # (on the H200, heldout_logits at accumulation 2: 2.77 GiB measured, 2.63 with the buckets alone).
        grads_fwd=grads_full * (2 if st.ddp and st.k > 1 else 1) if st.k > 1 or st.ddp else 0,
        head_grads=on_gpu * pb * (s.V * s.C + 2 * s.C) // shard,
        block_grads=0 if in_bwd else on_gpu * pb * (bp["matrix"] + bp["vector"]) // shard,
        block_step=in_bwd.get("block_step", 0),
        opt_state=on_gpu * optimizer_state_bytes(p, shapes) // shard,
        opt_temp=on_gpu * optimizer_temp_bytes(p, shapes, st.device) // shard,
        gathered=gathered,
        workspace=WORKSPACE_BYTES if st.device == "cuda" else 0,
    )


def _optimizer_notes(p: Profile, shapes: list[tuple[int, ...]], notes: list[str]) -> None:
    """What the figures leave out, or count with less certainty, for the optimizer-state techniques."""
    if p.optimizer.name == "paged_adamw8bit":
        gib = paged_bytes(shapes) / 1024**3
        notes.append(f"paged_adamw8bit: {gib:.2f} GiB of 8-bit state in CUDA unified memory, outside the allocator (not in this peak, nor in torch.cuda.max_memory_allocated; NVML sees it)")
    if p.precision.dtype == "bf16_pure":
        notes.append("bf16_pure: weights, gradients and every activation 2 bytes (the residual stream too)")
    if p.optimizer.name in ("muon", "galore"):
        notes.append(f"{p.optimizer.name}: temporaries of one hidden matrix's update at a time (per-tensor loop); less certain than AdamW's")


def _in_backward(p: Profile, s: _Shape, notes: list[str]) -> dict[str, int]:
    """optimizer.in_backward (memlab.core.techniques.optim_in_backward): no gradient buffer. Each parameter is
    stepped by its hook as soon as its gradient is complete, then the gradient is freed; so in a block's backward
    the gradients alive are the tied embedding's (the LM head starts it, autograd holds it until the embedding adds
    its part at the very end) and the one block parameter being stepped, with its step's temporaries. The
    "optimizer step" moment is the last hook, the embedding's: its gradient and temporaries, the activations gone.
    Empty when the profile steps after backward."""
    if not p.optimizer.in_backward:
        return {}
    largest_block = max(3 * s.C * s.C, s.C * s.F)
    step_temp = optimizer_temp_bytes(p, [(largest_block,)])
    notes.append("optimizer.in_backward: no gradient buffer; one parameter's gradient (and its step's temporaries) at a time, besides the tied embedding's")
    return {"grads": 4 * max(s.V, s.T) * s.C, "block_step": step_temp}  # the gradient itself: in _block_bwd_extra


@dataclass(frozen=True)
class _Saved:
    """What the blocks keep for backward."""

    layout: list[str]  # per block: _block_layout
    plain: dict[str, int]  # an un-checkpointed block's saves, by tensor
    per_block: list[int]  # bytes each block keeps between its forward and its backward
    block_input: int  # bytes per element of a block's input
    in_flight: int = 0  # offload_overlap: one block's activations on their way to or from the host

    @property
    def total(self) -> int:
        return sum(self.per_block)


def _saved_activations(st: _Step, notes: list[str]) -> _Saved:
    s, pr, kind, dropout, p = st.s, st.pr, st.kind, st.dropout, st.profile
    layout = _block_layout(p, s.L)
    # Compiled blocks save what eager ones do: AOTAutograd's min-cut partitioner (with Inductor's decompositions)
    # keeps the normalized LayerNorm output instead of its input (same bytes), the bf16 casts, q/k/v, the kernel's
    # output, fc and GELU outputs, and the bf16 weights (checked on the CPU with torch 2.13, bench/README).
    plain = block_saved(s, pr, kind, dropout, mask=st.mask)
    if p.kernels.float8 and st.compiled:
        plain = _float8_compiled_saved(plain)
    # FSDP2's MixedPrecisionPolicy (cast_forward_inputs) hands each block its input in bf16: what a checkpoint keeps.
    # Measured on the H100: fsdp_gradcp_bf16 at micro-batch 16 .. 76 peaked 2 BTC x L below gradcp_bf16's figure.
    block_input = pr.e if st.fsdp and pr.autocast else pr.r
    budget = p.checkpointing.budget
    saved = [sum(plain.values()) if lay == "plain" else _saved_of(lay, s, pr, kind, dropout, block_input, budget, st.mask) for lay in layout]
    untraceable = _untraceable(st) if "budget" in layout else None
    if untraceable:
        # The traced model (_traced_budget_moments) does not cover this step: the old interpolation, a low bound.
        notes.append(f"checkpointing.budget {budget:g}: saved activations interpolated linearly between full recompute (0) "
                     f"and compile's own choice (1), as the compiled step cannot be traced here ({untraceable}). On "
                     "the H100 (gpt2s) that was within 10% at 0.75 and 1 only: below, the peak is the backward's, which "
                     "recomputes much of the forward at once (budget 0: 6.54 GiB measured, 2.24 so predicted); this "
                     "figure is then a low bound")
    if "ops" in layout:
        notes.append("checkpointing.mode ops: keeps matmul and attention outputs, the rest recomputed; counted op by op "
                     "(on the H100, gpt2s micro-batch 16: 6.07 GiB predicted, 6.06 measured)")
    if st.compiled:
        # No scale of its own any more: the 4% gpt2s once seemed to save here was the loss backward's second logit
        # buffer, which Inductor does not keep (see _loss_moments); checked on gpt2s and the held-out seed shape.
        notes.append("compile: the loss is fused (bf16 logits kept, no fp32 copy); less certain than eager figures")
    if p.kernels.fused:
        # Its norms keep their fp32 input where the stock graph keeps the normalized output: the same bytes.
        # Measured on the H100, gpt2s micro-batch 128: 47.72 GB fused, 47.71 GB stock.
        notes.append("kernels.fused: counted as the stock graph (each norm keeps its input instead of its output: same bytes)")
    if p.kernels.float8:
        notes.append("kernels.float8: block weights saved as the fp32 masters (no bf16 copies), float8 casts are "
                      "temporaries; compiled, the LayerNorm and GELU outputs are recomputed in backward, not saved")
    if st.overlap:
        kept = _overlap_kept(s, plain)
        notes.append("offload_overlap: a block keeps its weight copies and tensors under 1 MiB; one block's other "
                     "saves are in flight beside the block computed (forward) or differentiated (backward)")
        return _Saved(layout, plain, [kept] * s.L, block_input, in_flight=sum(plain.values()) - kept)
    if st.offload:
        # save_on_cpu: every tensor saved for backward goes to pinned host memory; a checkpoint's input stays (it
        # is a reference the checkpoint holds, not a saved tensor).
        saved = [4 * s.BTC if lay == "full" else 0 for lay in layout]
    return _Saved(layout, plain, saved, block_input)


def _float8_compiled_saved(plain: dict[str, int]) -> dict[str, int]:
    """A plain block under compiled float8, as listed on the H100 (bench/saved_tensors.py, gpt2s with 2 layers): the
    partitioner recomputes both LayerNorm outputs (the qkv and fc Linears' inputs: backward casts them to float8
    again anyway) from the saved fp32 residual, and GELU from the fc output, so neither norm output nor the GELU
    output is kept; q, k, v, the attention output and the fc output are."""
    out = {k: v for k, v in plain.items() if k not in ("attn_in", "mlp_in")}
    out["mlp_hidden"] = plain["mlp_hidden"] // 2
    return out


def _overlap_kept(s: _Shape, plain: dict[str, int]) -> int:
    """What an un-checkpointed block keeps on the GPU under offload_overlap (memlab.core.offload): the bf16 weight
    copies (weights are not moved), and the tensors too small to move: LayerNorm's mean and rstd (4 BT bytes each)
    and the attention's log-sum-exp (4 bHT), each under MIN_BYTES at ordinary shapes."""

    kept = plain.get("weight_copies", 0)
    if 4 * s.BT < MIN_BYTES:
        kept += plain["ln_stats"]
    if 4 * s.b * s.H * s.T < MIN_BYTES:
        kept += plain.get("lse", 0)
    return kept


@dataclass(frozen=True)
class _ModelSaved:
    """Model-level tensors around the blocks: tokens, ln_f, the LM head's input and weight, the loss's rows."""

    rows: int  # rows of logits alive at once (a chunk's, or every token's)
    tokens: int  # x and y (and the embedding dropout's mask)
    total: int  # everything model-level saved for backward, tokens included
    cache_extra: int  # forward only: autocast's weight copies that nothing saves
    h_fp32: int  # the fp32 h GPT.forward holds while the loss runs


def _model_saved(st: _Step, saved: _Saved) -> _ModelSaved:
    s, pr, dropout, compiled, chunked = st.s, st.pr, st.dropout, st.compiled, st.chunked
    c = min(st.profile.loss.chunk_size, s.BT) if chunked else liger_chunk_rows(s.BT, s.V, s.C) if st.fused_loss == "liger" else s.BT
    tokens = 16 * s.BT  # x and y, int64 (the embedding saves x itself)
    if dropout:
        tokens += (1 if dropout == 1 else 4) * s.BTC  # the embedding dropout's mask (the fp32 residual's)
    if st.mask:
        tokens += s.T * s.T  # the kernel's cached boolean (T, T) mask, one for all blocks, kept between steps
    final = pr.r * s.BTC + 8 * s.BT  # ln_f's input (the residual stream) and its stats
    if chunked:
        head_in, head_w = 4 * s.BTC, 0  # the checkpointed chunks hold views of the fp32 ln_f output
    elif st.fused_loss != "none":
        head_in, head_w = 0, 0  # what the library keeps is counted in _fused_loss_moments
    else:
        head_in = pr.e * s.BTC  # the LM head's input: the bf16 cast of h, or h itself in fp32
        head_w = pr.e * s.V * s.C if pr.autocast and pr.weight_copies else 0  # its bf16 weight, saved for the input gradient
    if st.sync_offload:  # offload_overlap keeps what is saved outside the blocks: backward needs it first
        final = head_in = head_w = 0
    # Forward-only extras: autocast caches the bf16 copy of every weight until the forward's autocast region ends,
    # so checkpointed blocks' (and the biases') copies exist during the forward though nothing saves them.
    cache_extra = 0 if compiled else sum(_weight_copy_bytes("full" if st.sync_offload else lay, s, pr) for lay in saved.layout)
    if (chunked or st.fused_loss == "liger") and pr.autocast and pr.weight_copies and not compiled:
        cache_extra += pr.e * s.V * s.C  # the head's matmul runs under autocast: its bf16 weight is cached too
    h_fp32 = 4 * s.BTC if (pr.autocast and not chunked) or st.fused_loss != "none" else 0
    return _ModelSaved(c, tokens, tokens + final + head_in + head_w, cache_extra, h_fp32)


def _forward_moment(st: _Step, static: _Static, saved: _Saved, model: _ModelSaved) -> dict[str, int]:
    """Forward, in the last block: the blocks below keep their saves; this one adds its temporaries."""
    s, pr, kind = st.s, st.pr, st.kind
    last = saved.per_block[-1]
    if st.overlap:  # the block computed holds all its saves until their copies end, the one before is in flight
        fwd_block = sum(saved.plain.values()) + saved.in_flight + _block_fwd_extra(s, pr, kind)
    elif saved.layout[-1] == "plain" and not st.offload:
        fwd_block = last + _block_fwd_extra(s, pr, kind)
    else:  # a checkpointed block's internals are temporaries: fc and GELU outputs coexist, or the scores
        fwd_block = last + max(2 * pr.e * s.BTF, _block_fwd_extra(s, pr, kind))
    return static.moment(static.grads_fwd, saved.total - last + model.tokens, 0, fwd_block + model.cache_extra)


def _loss_moments(st: _Step, static: _Static, saved: _Saved, model: _ModelSaved) -> dict[str, dict[str, int]]:
    """The loss, forward and backward."""
    if st.fused_loss != "none":
        return _fused_loss_moments(st, static, saved, model)
    s, pr, c = st.s, st.pr, model.rows
    acts = saved.total + model.total
    grads = static.grads_fwd
    if st.compiled and not st.chunked:
        # Inductor fuses upcast, log-softmax and NLL: it keeps the logits in the matmul's dtype with the row max and
        # log-sum-exp, and writes the logits' gradient in that dtype in one kernel, into the saved logits' own
        # buffer (it is their last use): one logit-sized buffer in backward, not two. Held out, not fitted: the
        # seed-shaped experiment (4 x 256, V 50304, B 64) measured compile 2.46 GiB
        # where two buffers predicted 3.94.
        return {
            "loss forward": static.moment(grads, acts, pr.e * s.BT * s.V, model.h_fp32),
            "loss backward": static.moment(grads, acts, pr.e * s.BT * s.V, 0),
        }
    # forward: inside cross_entropy the fp32 logits and the log-softmax output coexist (8 bytes a logit);
    # the log-softmax output (4) is kept for backward unless the chunk is checkpointed
    # (a chunk also keeps its bf16 logits alive in a local variable: e more)
    fwd_logits = (8 + (pr.e if st.chunked and pr.autocast else 0)) * c * s.V
    forward = static.moment(grads, acts, fwd_logits, model.h_fp32 + model.cache_extra)
    # backward: the log-softmax output, NLL's gradient and log-softmax's gradient, all fp32 (12 bytes a logit)
    loss_tmp = 0
    if st.chunked:
        # per chunk: the recomputed bf16 head weight and input rows, and the fp32 gradient of h summed over the
        # chunks (4 BTC); between chunks the sum and the next chunk's full-size slice gradient (8 BTC) coexist
        with_chunk = (pr.e * s.V * s.C if pr.autocast else 0) + pr.e * c * s.C + 4 * s.BTC
        loss_tmp = max(with_chunk, 8 * s.BTC - 12 * c * s.V)
        grads = grads or 4 * s.V * s.C  # the head's gradient exists after the first chunk
    return {"loss forward": forward, "loss backward": static.moment(grads, acts, 12 * c * s.V, loss_tmp)}


def liger_chunk_rows(BT: int, V: int, C: int) -> int:
    """Rows of logits Liger's fused linear cross-entropy makes at once (liger_kernel 0.8.5,
    ops/fused_linear_cross_entropy.py, chunk_mem_const = 1): enough rows that a chunk's logits are about as large
    as its input, B*T x C, rounded up to a power of two, at most B*T."""
    inc_factor = -(-V // C)
    return min(1 << max(0, (-(-BT // inc_factor) - 1).bit_length()), BT)


def _fused_loss_moments(st: _Step, static: _Static, saved: _Saved, model: _ModelSaved) -> dict[str, dict[str, int]]:
    """loss.fused (memlab.core.linear_ce): a library's head + loss, which never holds the B x T x V logits.
    GPT.forward holds the fp32 h while the call runs (model.h_fp32); the library gets h cast to the compute dtype.

    liger  (liger_kernel 0.8.5, ops/fused_linear_cross_entropy.py) computes the gradients in forward: it allocates
           grad_input like its input (e BTC) and grad_weight like the fp32 weight (4 VC, zeros_like: the parameter's
           dtype), then per chunk of model.rows rows makes the chunk's logits (e c V, in place of their gradient).
           Both gradients are saved for backward, which only hands them on (grad_weight becomes the head's
           gradient; under autocast the bf16 grad_input is cast back to fp32, 4 BTC).
    cce    (cut_cross_entropy 25.1.1, cce.py) saves its 16-bit inputs, h (e BTC) and the weight's cast (e VC), the
           rows' fp32 log-sum-exp (4 BT) and the vocabulary's mean logit (4 V, for the gradient filter); logits
           exist only in SRAM blocks. Backward (cce_backward.py) makes de (e BTC) and dc (e VC, in e's dtype) while
           the saves live; once its node has run, autograd frees the saves and the casts back to the fp32 weight
           and h make 4 VC (the head's gradient) and 4 BTC from de and dc: the larger of the two moments.
    """
    s, pr = st.s, st.pr
    acts = saved.total + model.total
    cast_h = pr.e * s.BTC if pr.autocast else 0  # the compute-dtype copy of h handed to the library
    if st.fused_loss == "liger":
        held = pr.e * s.BTC + 4 * s.BT  # grad_input and the per-row losses
        grads = static.grads_fwd + 4 * s.V * s.C  # grad_weight, the head's gradient from the forward on
        forward = static.moment(grads, acts, held + pr.e * model.rows * s.V, model.h_fp32 + cast_h + model.cache_extra)
        backward = static.moment(grads, acts, pr.e * s.BTC, 4 * s.BTC if pr.autocast else 0)
        return {"loss forward": forward, "loss backward": backward}
    kept = pr.e * s.BTC + pr.e * s.V * s.C + 4 * s.BT + 4 * s.V
    forward = static.moment(static.grads_fwd, acts, kept, model.h_fp32 + model.cache_extra)
    made = pr.e * s.BTC + pr.e * s.V * s.C
    in_kernel = static.moment(static.grads_fwd, acts, kept + made, 0)
    cast_back = static.moment(static.grads_fwd + 4 * s.V * s.C, acts, made, 4 * s.BTC)
    return {"loss forward": forward, "loss backward": max(in_kernel, cast_back, key=lambda m: sum(m.values()))}


def _live_in_block_backward(st: _Step, saved: _Saved, layout: str, remaining: int, kept: int = 0) -> int:
    """Activations alive while one block is differentiated: what is still saved, plus the block's own tensors
    (recomputed if checkpointed, unpacked back from the host if offloaded). `kept`: what this block saved."""
    s = st.s
    if st.overlap:  # this block's saves brought back, and the block below's arriving (the prefetch window)
        return remaining + 2 * saved.in_flight
    if st.offload:
        return remaining + st.pr.e * s.BTF
    if layout == "full":
        return remaining - saved.block_input * s.BTC + sum(saved.plain.values())  # its input is counted already
    if layout in ("ops", "budget"):  # recomputed back to a plain block's saves (what it kept is part of them)
        return remaining - kept + sum(saved.plain.values())
    if layout in ("sel_attn", "sel_mlp"):
        half = "attn" if layout == "sel_attn" else "mlp"
        return remaining + sum(block_saved(s, st.pr, st.kind, st.dropout, half, st.mask).values()) - 4 * s.BTC - 8 * s.BT
    return remaining


def _block_backward_moment(st: _Step, static: _Static, saved: _Saved, model: _ModelSaved) -> dict[str, dict[str, int]]:
    """Block backward, top down: what is still saved, the block being differentiated (recomputed if
    checkpointed), its backward temporaries, and the parameter gradients made so far. The largest block wins."""
    s = st.s
    extra = _block_bwd_extra(s, st.pr, st.kind, saved.plain, st.dropout)
    best: tuple[int, int, int, int] | None = None  # (total, block, grads, live)
    remaining = saved.total + model.tokens
    for i in reversed(range(s.L)):
        live = _live_in_block_backward(st, saved, saved.layout[i], remaining, saved.per_block[i])
        g = static.grads_fwd if st.k > 1 or st.ddp else static.head_grads + static.block_grads * (s.L - 1 - i) + static.block_step
        total = g + live + extra
        if best is None or total > best[0]:
            best = (total, i, g, live)
        remaining -= saved.per_block[i]
    assert best is not None
    _, top, grads, live = best
    return {f"block backward (block {top})": static.moment(grads, live, 0, extra)}


def estimate(
    experiment: Experiment,
    profile: Profile,
    *,
    vocab_size: int,
    micro_batch: int | None = None,
    world_size: int = 1,
    device: str = "cuda",
) -> Estimate:
    """Predicted peak allocated bytes of a training step of `profile` on `experiment` at `micro_batch`
    (default: train.batch_size / (accumulation.steps x world_size), per rank as the engine splits it). `vocab_size`
    is the model's (already padded) vocabulary. `world_size` ranks (--nproc) matter under profile.distributed: see
    _static_memory.
    `device` = "cpu" predicts the tensors of the CPU backend (no workspace; Adafactor's per-tensor loop)."""
    st = _resolve_step(experiment, profile, vocab_size, micro_batch, world_size, device)
    notes: list[str] = []
    static = _static_memory(st, notes)
    saved = _saved_activations(st, notes)
    model = _model_saved(st, saved)
    # compiled under checkpointing.budget: the traced step's own forward and backward, when it can be traced
    traced = _traced_budget_moments(st, experiment, static, model, notes)
    phases = {
        **(traced or {
            "forward (last block)": _forward_moment(st, static, saved, model),
            **_loss_moments(st, static, saved, model),
            **_block_backward_moment(st, static, saved, model),
        }),
        # the optimizer step: every gradient, the state, the step's temporaries; fsdp: every unit resharded by now
        "optimizer step": static.moment(static.grads_full, model.tokens, 0, static.opt_temp, gathered=False),
    }
    totals = {name: sum(v.values()) for name, v in phases.items()}
    peak = max(totals, key=lambda n: totals[n])
    return Estimate(
        profile=profile.name,
        experiment=experiment.name,
        micro_batch=st.s.b,
        accumulation=st.k,
        vocab_size=st.s.V,
        params=static.params,
        components=dict(phases[peak]),
        peak_phase=peak,
        phases=totals,
        notes=notes,
    )


# ---------------------------------------------------------------------------------------------- max batch


def allocation_pattern(profile: Profile) -> str:
    """Which FRAGMENTATION_MARGIN applies: how the step's allocations come and go."""
    if profile.checkpointing.offload:
        return "offload"
    if profile.checkpointing.mode in ("full", "every_n", "ops") or profile.checkpointing.budget < 1:
        return "recompute"
    return "plain"


def usable_bytes(memory_bytes: int, *, profile: Profile | None = None, pattern: str | None = None) -> int:
    """What the allocator can hand out as tensors on a card of `memory_bytes` in total (a real one, or --gpu-memory's
    emulated one: both hold the CUDA context, loaded kernels and library workspaces outside the allocator, 1.20-1.23
    GiB at the peak of every H100 run of the study), less the fragmentation margin of `pattern` (by default the
    profile's allocation pattern; plain when no profile is given)."""
    avail = memory_bytes - CUDA_CONTEXT_BYTES
    pattern = pattern or (allocation_pattern(profile) if profile is not None else "plain")
    return int(avail * (1 - FRAGMENTATION_MARGIN[pattern]))


def predict_max_batch(
    experiment: Experiment, profile: Profile, *, vocab_size: int, memory_bytes: int, limit: int = LIMIT,
    world_size: int = 1, pattern: str | None = None,
) -> int:
    """The largest micro-batch whose predicted peak fits in `memory_bytes` (0 if not even 1 fits), with the
    fragmentation margin of `pattern` (usable_bytes). Peak memory grows monotonically with the batch, so
    galloping from 1 then bisecting on the pure function finds it exactly."""
    budget = usable_bytes(memory_bytes, profile=profile, pattern=pattern)

    def fits(b: int) -> bool:
        return estimate(experiment, profile, vocab_size=vocab_size, micro_batch=b, world_size=world_size).total_bytes <= budget

    return largest_near(fits, 1, limit)


# ---------------------------------------------------------------------------------------------- vocabulary


def vocab_for(experiment: Experiment) -> tuple[int, str]:
    """The padded vocabulary the engine will build, and where the figure came from. Not pure: it reads the token
    cache's meta.json when the corpus was tokenized already. model.vocab_size wins; a trained BPE (`bpe:N`) has N
    tokens; otherwise the cached entry says; otherwise a ConfigError asks for model.vocab_size."""
    if experiment.model.vocab_size:
        return experiment.model.vocab_size, "model.vocab_size"
    try:
        _, spec, name = cache_entry(experiment.data)
        meta = cache_mod.read_meta(cache_mod.tokens_dir() / name)
        if meta is not None:
            return padded(int(meta["vocab_size"])), "the token cache"
        if spec.kind == "bpe":
            return padded(spec.vocab), f"{experiment.data.tokenizer} (not tokenized yet: assumed {spec.vocab} tokens)"
    except MemlabError:
        raise
    except Exception as e:  # noqa: BLE001 (a source that cannot be opened here: say what to do)
        raise ConfigError(
            f"cannot tell the vocabulary size of {experiment.data.tokenizer} ({e.__class__.__name__}: {e}); "
            "set it with --set model.vocab_size=N or tokenize first with memlab data prepare"
        ) from None
    raise ConfigError(
        f"the vocabulary of {experiment.data.tokenizer} is unknown until the corpus is tokenized; run memlab data "
        "prepare first, or set --set model.vocab_size=N"
    )


def peak_for_run(experiment: Experiment, profile: Profile, *, vocab_size: int, micro_batch: int, device: str, world_size: int = 1) -> int | None:
    """The engine's `estimate_peak_bytes`: the prediction recorded beside the measured peak (the formula's, so the gpt
    family's only: None for another). Never fails a run."""
    if getattr(experiment.model, "family", "gpt") != "gpt":
        return None
    try:
        return estimate(experiment, profile, vocab_size=vocab_size, micro_batch=micro_batch, device=device, world_size=world_size).total_bytes
    except Exception:  # noqa: BLE001 (an estimate is a nicety; a run must not die of it)
        return None
