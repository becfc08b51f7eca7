"""Stand-ins for what the allocator replay's fake step (memlab.core.predict.trace) cannot run: CUDA-only
libraries and copies to the host. Each allocates on the device what the real one allocates there (the same
tensors' sizes, dtypes and lifetimes, read from the library's source) and nothing else; what the real one keeps in
host memory or in CUDA unified memory is not on the allocator's books, so it is left out.

    optimizer  adamw8bit, adamw4bit, bf16_sr  torchao 0.18.0 optim/adam.py (_AdamBase._new_buffer) and
                                              subclass_8bit.py / subclass_4bit.py (OptimState*.zeros)
               paged_adamw8bit                bitsandbytes 0.50.2 optim/optimizer.py (Optimizer2State.init_state,
                                              Optimizer8bit.get_state_buffer)
               optimizer.offload              memlab.core.techniques.optim_offload: state and step on the host
               galore                         AdamW itself: its full-size state is more than GaLore's projected
                                              one (an upper bound: the max batch errs low), SVD temporaries left out
    loss       liger                          liger-kernel 0.8.5 ops/fused_linear_cross_entropy.py
               cce                            cut-cross-entropy 25.1.1 cce.py, cce_lse_forward.py, indexed_dot.py,
                                              cce_backward.py, utils.py
    grads      distributed.mode = ddp         torch 2.13 nn/parallel/distributed.py (_DDP bucket assignment: 1 MiB
                                              first, then 25 MiB), reducer.cpp (gradient_as_bucket_view)
    base       finetune.base = nf4            bitsandbytes 0.50.2 nn/modules.py (Linear4bit, Params4bit with
                                              compress_statistics), autograd/_functions.py (MatMul4Bit: saves no
                                              input, dequantizes the weight to bf16 in forward and backward);
                                              the adapters peft's lora.Linear over it (not lora/bnb.py's
                                              Linear4bit: the model has no is_loaded_in_4bit)
    offload    checkpointing.offload          torch.autograd.graph.save_on_cpu: every saved tensor to the host,
                                              back to the device (a new tensor) when backward unpacks it
               offload_overlap                memlab.core.offload.OverlapOffload itself, with copies that
                                              allocate on the device only

Steps that run their updates in place (torchao's compiled single_param_adam, bitsandbytes' 8-bit kernels) are
taken as allocating nothing beyond their state: their temporaries, if Inductor keeps any, are not modelled.
"""

from __future__ import annotations

import contextlib
import copy
import math
from dataclasses import dataclass
from typing import Any, Iterator

import torch
from memlab.core.config import Profile
from memlab.core.errors import MemlabError
from memlab.core.standin import with_settings
from memlab.core.techniques import around_graphs_standin, graphs_standin, memory_standins
from memlab.core.linear_ce import head_loss
from memlab.core.offload import HostCopies, OverlapOffload
from memlab.core.predict.analytic import liger_chunk_rows
from memlab.core.predict.cuda_temporaries import div_up

@dataclass(frozen=True)
class StandIns:
    """What stands in for the profile's CUDA-only parts, as its techniques declare them; None where its own runs."""

    optimizer: str | None = None  # an optimizer.name of a CUDA-only library, or "offload"
    loss: str | None = None  # loss.fused: "liger" or "cce"
    offload: str | None = None  # checkpointing.offload: "sync" (save_on_cpu) or "overlap"
    base: str | None = None  # finetune.base: "nf4" (a 4-bit base under the adapters)
    grads: str | None = None  # where the gradients live: "ddp_buckets" (distributed.mode = ddp)


def split(profile: Profile) -> tuple[Profile, StandIns]:
    """A copy of `profile` that builds on fake tensors (the settings each technique's stand-in declares), and the
    stand-ins that `install` puts in their place once the step is built."""
    p = copy.deepcopy(profile)
    installs: dict[str, str | None] = {}
    for standin in memory_standins(profile):
        with_settings(p, standin.settings)
        installs[standin.kind] = standin.installs
    return p, StandIns(*(installs.get(kind) for kind in ("optimizer", "loss", "offload", "base", "grads")))


def compiled_standin(profile: Profile) -> Profile:
    """What a compiled step's trace (memlab.core.predict.inductor) traces for `profile`, as its techniques declare
    (techniques.graphs_standin: kernels.fused's graphs are the stock compiled model's); `profile` itself if nothing."""
    return _with(profile, graphs_standin(profile))


def around_graphs(profile: Profile) -> Profile:
    """The eager step a compiled step's graphs are replayed in (trace.compiled_trace), as its techniques
    declare (techniques.around_graphs_standin: float8's Linears left in bf16)."""
    return _with(profile, around_graphs_standin(profile))


def _with(profile: Profile, settings: dict[str, Any]) -> Profile:
    if not settings:
        return profile
    p = copy.deepcopy(profile)
    with_settings(p, settings)
    return p


def install(step: Any, standins: StandIns, compute_dtype: torch.dtype) -> bool:
    """Put the stand-ins into a step built from split's profile (memlab.core.step.TrainStep); True where the technique
    then empties CUDA's cache, as finetune's quantization does once the bf16 weights are gone."""
    if standins.optimizer is not None:
        step.optimizer = _optimizer(standins.optimizer, step.optimizer.param_groups)
    if standins.loss is not None:
        kernel = liger_fused_linear_cross_entropy if standins.loss == "liger" else cce_linear_cross_entropy
        step.model.loss_kernel = head_loss(standins.loss, compute_dtype, kernel=kernel)
    if standins.offload == "sync":
        step.offload = save_on_host
    elif standins.offload == "overlap":
        overlap = OverlapOffload(DeviceSideCopies())
        overlap.install(list(step.model.blocks), step.model.final_norm)  # as techniques.act_offload.apply does
        step.offload = overlap.forward
    if standins.base == "nf4":
        quantized_base(step.model)
    if standins.grads == "ddp_buckets":
        ddp_buckets(step)
    return standins.base is not None


# ---------------------------------------------------------------------------------------------- DDP's buckets

DDP_BUCKET_CAPS = (1 << 20, 25 << 20)  # the first bucket's cap, then every other's (DDP's bucket_cap_mb default)
DDP_BROADCAST_BYTES = 250 << 20  # the chunks DDP broadcasts the module's state in when it wraps


def ddp_buckets(step: Any) -> None:
    """What DDP (gradient_as_bucket_view, as memlab.core.distributed wraps) allocates, as the H200's allocator history
    of Llama-3.2-1B's ddp_bf16 shows it (torch 2.11): wrapping, the module's state broadcast in flattened chunks (two
    alive at a time), then one flat bucket for every trained parameter. Each gradient autograd makes is copied into
    the bucket and replaced by a view of it. At the forward after the first step the reducer builds its buckets
    again (rebuild_buckets): the flat one freed, then one per 25 MiB of parameters in reverse order (the first
    1 MiB). Left out, the prediction was 12.8% under deep ddp_bf16's peak; with 25 MiB buckets from the start,
    Llama's reserve 5.1% under. The fake step has no process group to wrap in."""
    _DDPReducer(step)


class _DDPReducer:
    """The buckets' lifetimes, as DDP's reducer keeps them (ddp_buckets)."""

    def __init__(self, step: Any) -> None:
        _broadcast_chunks([*step.model.parameters(), *step.model.buffers()])
        self.trained = [p for p in step.model.parameters() if p.requires_grad][::-1]
        self.views: dict[torch.Tensor, torch.Tensor] = {}
        _buckets(self.trained, self.views, caps=(math.inf,))
        self.backward_ran = self.rebuilt = False
        for p in self.trained:
            p.register_post_accumulate_grad_hook(self.into_bucket)
        self.zero_grad = step.optimizer.zero_grad
        step.optimizer.zero_grad = self.zero_grad_then_rebuild
        # with accumulation only the last micro-batch's backward syncs (no_sync before it): until then the gradients
        # autograd makes stay where they are, beside the buckets
        self.forwards, self.accumulation = 0, step.accumulation
        step.model.register_forward_pre_hook(self.count_forward)

    def count_forward(self, *_: Any) -> None:
        self.forwards += 1

    def into_bucket(self, p: torch.Tensor) -> None:
        if self.forwards % self.accumulation:  # not the step's last micro-batch: DDP's hooks do not run
            return
        view = self.views[p]
        if p.grad is not view:
            view.copy_(p.grad)
            p.grad = view
        self.backward_ran = True

    def zero_grad_then_rebuild(self, *args: Any, **kwargs: Any) -> None:
        self.zero_grad(*args, **kwargs)
        if self.backward_ran and not self.rebuilt:  # the gradients are gone: the views hold the flat bucket alone
            self.views.clear()
            _buckets(self.trained, self.views, DDP_BUCKET_CAPS)
            self.rebuilt = True


def _broadcast_chunks(tensors: list[torch.Tensor]) -> None:
    """_sync_module_states: the tensors flattened into chunks of DDP_BROADCAST_BYTES or more, each made before the one
    before it is freed; a tensor that fills a chunk alone is sent as it is."""
    chunk, size, previous = [], 0, None
    for t in [*tensors, None]:
        if t is not None:
            chunk.append(t)
            size += t.numel() * t.element_size()
        if chunk and (t is None or size >= DDP_BROADCAST_BYTES):
            made = torch.empty(size, dtype=torch.uint8, device=chunk[0].device) if len(chunk) > 1 else None
            previous, chunk, size = made, [], 0
    del previous


def _buckets(trained: list[torch.Tensor], views: dict[torch.Tensor, torch.Tensor], caps: tuple[float, ...]) -> None:
    """A bucket per cap's worth of parameters (caps[0] the first, caps[-1] every other), one dtype each; `views`
    points each parameter at its place in one."""
    for dtype in dict.fromkeys(p.dtype for p in trained):
        taken, size, cap = [], 0, caps[0]
        for p in (p for p in trained if p.dtype == dtype):
            taken.append(p)
            size += p.numel() * p.element_size()
            if size >= cap:
                _bucket(taken, views)
                taken, size, cap = [], 0, caps[-1]
        if taken:
            _bucket(taken, views)


def _bucket(params: list[torch.Tensor], views: dict[torch.Tensor, torch.Tensor]) -> None:
    flat = torch.empty(sum(p.numel() for p in params), dtype=params[0].dtype, device=params[0].device)
    offset = 0
    for p in params:
        views[p] = flat[offset:offset + p.numel()].view_as(p)
        offset += p.numel()


@contextlib.contextmanager
def swappable_fake_parameters() -> Iterator[None]:
    """Module.to swaps a fake parameter for its converted copy (torch.utils.swap_tensors), which refuses a tensor
    with a weak reference, and FakeTensorMode's converter keeps one to fake tensors it made (MetaConverter's
    tensor_memo, a cache): precision.dtype = bf16_pure's model.to(bf16) failed with "Couldn't swap
    Embedding.weight". The cache is emptied before each swap."""
    from unittest import mock

    swap = torch.utils.swap_tensors

    def swap_uncached(t1: torch.Tensor, t2: torch.Tensor) -> None:
        for t in (t1, t2):
            mode = getattr(t, "fake_mode", None)
            if mode is not None:
                mode.fake_tensor_converter.meta_converter.tensor_memo.clear()
        swap(t1, t2)

    with mock.patch.object(torch.utils, "swap_tensors", swap_uncached):
        yield


# ---------------------------------------------------------------------------------------------- a 4-bit base

NF4_BLOCK = 64  # weights per absmax (bitsandbytes' default blocksize for 4-bit)
NF4_NESTED_BLOCK = 256  # absmaxes per second-level scale (compress_statistics)


def quantized_base(model: torch.nn.Module) -> None:
    """Every adapted Linear's bf16 base swapped for what bitsandbytes keeps of it in NF4; the adapter layer stays
    peft's lora.Linear, as it is over the real 4-bit base (memlab quantizes a built model, which has no
    `is_loaded_in_4bit`, so peft wraps bitsandbytes' Linear4bit as any Linear: no clone of the base output, the input
    cast to the adapters' fp32 under autocast too; the H200's allocator trace of Llama-3.1-8B's qlora_gradcp step
    shows both). Each bf16 weight is freed as its layer's stand-in takes its place (nothing else holds it), as
    finetune._quantize drops each once its 4-bit twin is in place: the build peaks near the bf16 model, not the bf16
    model plus the whole 4-bit base (Llama-3.1-8B: 16.24 GB replayed, 16.07 on an H200; bench/results/qlora-build-h200)."""
    adapted = [m for m in model.modules() if isinstance(getattr(m, "base_layer", None), torch.nn.Linear) and hasattr(m, "lora_A")]
    for module in adapted:
        if any(getattr(module, "use_dora", {}).values()):
            raise MemlabError("the NF4 stand-in does not model DoRA over a 4-bit base (its weight norm "
                              "dequantizes the whole weight); predict dora over base = bf16")
        module.base_layer = NF4Linear(module.base_layer)


class NF4Linear(torch.nn.Module):
    """bitsandbytes' Linear4bit as the allocator sees it: the weight packed two to a byte, an 8-bit absmax per
    64 weights and an fp32 scale per 256 absmaxes; forward and backward each dequantize a transient bf16 weight."""

    def __init__(self, linear: torch.nn.Linear) -> None:
        super().__init__()
        n, device = linear.weight.numel(), linear.weight.device
        self.in_features, self.out_features = linear.in_features, linear.out_features
        blocks = div_up(n, NF4_BLOCK)
        self.weight = torch.nn.Parameter(torch.empty(div_up(n, 2), 1, dtype=torch.uint8, device=device), requires_grad=False)
        self.register_buffer("absmax", torch.empty(blocks, dtype=torch.uint8, device=device))
        self.register_buffer("absmax_scale", torch.empty(div_up(blocks, NF4_NESTED_BLOCK), dtype=torch.float32, device=device))
        self.bias = linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = _Dequantized.apply(x.to(torch.bfloat16), self.weight, self.out_features, self.in_features)
        return out + self.bias if self.bias is not None else out


class _Dequantized(torch.autograd.Function):
    """MatMul4Bit: the input is not saved (the frozen weight needs no gradient), the packed weight is."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, packed: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
        ctx.save_for_backward(packed)
        ctx.shape = (rows, cols)
        return torch.nn.functional.linear(x, _dequantize(packed, rows, cols))

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        (packed,) = ctx.saved_tensors
        return grad @ _dequantize(packed, *ctx.shape), None, None, None


def _dequantize(packed: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    return torch.empty(rows, cols, dtype=torch.bfloat16, device=packed.device)


# ---------------------------------------------------------------------------------------------- optimizers


def _optimizer(name: str, groups: list[dict]) -> torch.optim.Optimizer:
    if name == "offload":
        return HostSteppedOptimizer(groups)
    if name == "paged_adamw8bit":
        return PagedAdamW8bitState(groups)
    return TorchaoAdamWState(groups, name)


class _StateOnly(torch.optim.Optimizer):
    """An optimizer whose step makes each parameter's state on its first step and updates nothing: the real
    update runs in place (no allocation) or on the host."""

    def __init__(self, groups: list[dict]) -> None:
        super().__init__([{"params": g["params"]} for g in groups], {})

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None and not self.state[p]:
                    self.state[p] = self.make_state(p) or {"made": True}

    def make_state(self, p: torch.Tensor) -> dict:
        return {}


class HostSteppedOptimizer(_StateOnly):
    """optimizer.offload (memlab.core.techniques.optim_offload.CPUOffloadOptimizer): the fp32 masters, their
    gradient buffers and AdamW's moments are pinned host memory; its step copies each gradient to the host and the
    updated master back into the parameter in place. Nothing on the device."""


# torchao 0.18.0, optim/adam.py: AdamW8bit block_size=256, AdamW4bit block_size=128, _AdamW block_size=inf
TORCHAO_BLOCK = {"adamw8bit": 256, "adamw4bit": 128, "bf16_sr": math.inf}
TORCHAO_BITS = {"adamw8bit": 8, "adamw4bit": 4}


class TorchaoAdamWState(_StateOnly):
    """torchao's low-bit AdamW (and _AdamW for bf16_sr): per parameter, exp_avg then exp_avg_sq (_AdamBase.step),
    each from _new_buffer: a quantized state where numel >= 4096 and numel % block_size == 0, else
    torch.zeros_like(p) (bf16_sr: block_size inf, always zeros_like, so bf16 under bf16_pure). The quantized state
    (OptimState8bit.zeros / OptimState4bit.zeros) is three tensors: codes uint8 (numel, or numel // 2 at 4 bits),
    scale fp32 (numel // block_size), qmap fp32 (the 2**bits-entry map, torch.tensor(qmap_list), one per state).
    state["step"] and the lr tensor are made without a device: on the host."""

    def __init__(self, groups: list[dict], name: str) -> None:
        super().__init__(groups)
        self.block, self.bits = TORCHAO_BLOCK[name], TORCHAO_BITS.get(name)

    def make_state(self, p: torch.Tensor) -> dict:
        return {"exp_avg": self._new_buffer(p), "exp_avg_sq": self._new_buffer(p)}

    def _new_buffer(self, p: torch.Tensor) -> Any:
        n = p.numel()
        if self.bits is None or n < 4096 or n % self.block:
            return torch.zeros_like(p)
        # new_zeros, not torch.zeros(device=): the same blocks, made from `p` (memlab.core.predict.deepen's owner)
        codes = p.new_zeros(n * self.bits // 8, dtype=torch.uint8)
        scale = p.new_zeros(n // self.block, dtype=torch.float32)
        qmap = p.new_zeros(2**self.bits, dtype=torch.float32)
        return codes, scale, qmap


PAGED_MIN_NUMEL = 100_000  # bitsandbytes get_state_buffer: `p.numel() < 1e5` stays in the caching allocator
MIN_8BIT_SIZE = 4096  # bitsandbytes Optimizer2State's min_8bit_size default (PagedAdamW8bit passes it on)
BNB_BLOCK = 256  # init_state: `blocksize = 256` for absmax1 / absmax2


class PagedAdamW8bitState(_StateOnly):
    """bitsandbytes' PagedAdamW8bit (Optimizer2State, optim_bits 8, is_paged): per parameter, state1 and state2
    (uint8, or fp32 below MIN_8BIT_SIZE elements) from get_state_buffer, which pages those of >= 1e5 elements into
    CUDA unified memory (F.get_paged: outside the caching allocator) and makes the rest with torch.zeros_like; 8-bit
    states add absmax1 and absmax2, fp32, one per 256-element block (torch.zeros, allocator). At the first 8-bit
    parameter the two 256-entry fp32 maps (create_dynamic_map, signed and unsigned) move to the device, once."""

    def __init__(self, groups: list[dict]) -> None:
        super().__init__(groups)
        self.qmaps: tuple[torch.Tensor, ...] = ()

    def make_state(self, p: torch.Tensor) -> dict:
        n = p.numel()
        eight_bit = n >= MIN_8BIT_SIZE
        if eight_bit and not self.qmaps:
            self.qmaps = tuple(p.new_zeros(256, dtype=torch.float32) for _ in range(2))
        dtype = torch.uint8 if eight_bit else torch.float32
        state = {f"state{i}": self._buffer(p, dtype) for i in (1, 2)}
        if eight_bit:
            blocks = -(-n // BNB_BLOCK)
            state |= {f"absmax{i}": p.new_zeros(blocks, dtype=torch.float32) for i in (1, 2)}  # from p: see above
        return state

    @staticmethod
    def _buffer(p: torch.Tensor, dtype: torch.dtype) -> torch.Tensor | None:
        return torch.zeros_like(p, dtype=dtype) if p.numel() < PAGED_MIN_NUMEL else None  # paged: not ours


# ---------------------------------------------------------------------------------------------- fused losses


class LigerFusedLinearCE(torch.autograd.Function):
    """liger-kernel 0.8.5 LigerFusedLinearCrossEntropyFunction (reduction mean, accum_dtype fp32, no bias), its
    device allocations in order. Forward (under the caller's autocast, amp_custom_fwd) computes the gradients:
    grad_input = zeros_like(input), grad_weight = zeros_like(weight, dtype=accum_dtype), loss_1d fp32 (BT), the
    target mask and its sum; then per chunk of liger_chunk_rows rows the chunk's logits (input_chunk @ weight.t():
    autocast's cached copy of the fp32 weight, in the compute dtype; mm out= is not taken since the dtypes differ),
    the CE kernel writing their gradient in place, grad_input's rows (grad_logits @ weight, then copied in) and
    grad_weight accumulated in place (addmm out_dtype=fp32 on torch >= 2.8: no temporary). loss = sum(loss_1d).
    It saves grad_input and grad_weight; backward hands them on (torch.equal against a new scalar 1.0; the scaling
    kernel, when it runs, is in place)."""

    @staticmethod
    def forward(ctx: Any, inp: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, ignore_index: int) -> torch.Tensor:
        BT, H = inp.shape
        V = weight.shape[0]
        grad_input = torch.zeros_like(inp)
        grad_weight = torch.zeros_like(weight, dtype=torch.float32)
        loss_1d = torch.zeros(BT, dtype=torch.float32, device=inp.device)
        target_mask = target != ignore_index
        target_mask.sum().item()
        rows = liger_chunk_rows(BT, V, H)
        for start in range(0, BT, rows):
            chunk = inp[start:start + rows]
            grad_logits = chunk @ weight.t()  # the CE kernel overwrites the logits with their gradient
            grad_input[start:start + rows] = grad_logits @ weight
            del grad_logits
        loss = torch.sum(loss_1d)
        ctx.save_for_backward(grad_input.detach(), grad_weight.detach())
        return loss

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple:
        grad_input, grad_weight = ctx.saved_tensors
        torch.tensor(1.0, device=grad_output.device)  # torch.equal(grad_output, torch.tensor(1.0, device=...))
        return grad_input, grad_weight, None, None


def liger_fused_linear_cross_entropy(inp: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, *,
                                     ignore_index: int = -100, reduction: str = "mean", accum_dtype: Any = None) -> torch.Tensor:
    """liger_kernel.transformers.functional.liger_fused_linear_cross_entropy as memlab calls it (memlab.core.linear_ce)."""
    if reduction != "mean" or accum_dtype is not torch.float32:
        raise ValueError("the liger stand-in follows memlab's call: reduction='mean', accum_dtype=torch.float32")
    return LigerFusedLinearCE.apply(inp, weight, target, ignore_index)


class CutCrossEntropy(torch.autograd.Function):
    """cut-cross-entropy 25.1.1 LinearCrossEntropyFunction (impl cce, filter_eps None, reduction mean, no ignored
    targets), its device allocations in order. Forward: cce_lse_forward_kernel's lse (fp32, B) and locks (uint32,
    cdiv(B, 128); no logit_avg without a filter), indexed_neg_dot_forward_kernel's out (fp32, B; .to(fp32) is a
    no-op), nll = out.add_(lse) and its mean. Saves e, c and lse. Backward (cce_backward_kernel): de =
    zeros_like(e), dc = zeros_like(c, dtype=e.dtype), de_locks and dc_locks (int32, cdiv(B, n) x n and
    cdiv(V, n) x n with n = cdiv(D, 64)); returns de and dc (dc.to(c.dtype): the same dtype, no copy)."""

    @staticmethod
    def forward(ctx: Any, e: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        B = e.shape[0]
        lse = torch.full((B,), -float("inf"), dtype=torch.float32, device=e.device)
        locks = torch.zeros(div_up(B, 128), dtype=torch.int32, device=e.device)  # uint32 in the library: same bytes
        neg_dot = torch.zeros(B, dtype=torch.float32, device=e.device)
        loss = neg_dot.add_(lse).mean()
        del locks, neg_dot
        ctx.save_for_backward(e, c, lse)
        return loss

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple:
        e, c, _ = ctx.saved_tensors
        de = torch.zeros_like(e)
        dc = torch.zeros_like(c, dtype=e.dtype)
        n = div_up(c.shape[1], 64)
        de_locks = torch.zeros(div_up(e.shape[0], n), n, dtype=torch.int32, device=e.device)
        dc_locks = torch.zeros(div_up(c.shape[0], n), n, dtype=torch.int32, device=e.device)
        del de_locks, dc_locks
        return de, dc


def cce_linear_cross_entropy(e: torch.Tensor, c: torch.Tensor, targets: torch.Tensor, *, ignore_index: int = -100,
                             reduction: str = "mean", impl: str = "cce", filter_eps: Any = "auto") -> torch.Tensor:
    """cut_cross_entropy.linear_cross_entropy as memlab calls it (memlab.core.linear_ce): _build_flat_valids first
    makes (targets != ignore_index).nonzero().to(int32), transient (bool, int64 and int32, one per target), and
    returns None when no target is ignored, as memlab's never are."""
    if reduction != "mean" or impl != "cce" or filter_eps is not None:
        raise ValueError("the cce stand-in follows memlab's call: reduction='mean', impl='cce', filter_eps=None")
    n = targets.numel()
    valid = targets.flatten() != ignore_index
    found = torch.empty(n, 1, dtype=torch.int64, device=targets.device)  # valid.nonzero(): one row per valid target
    del valid
    valids = found.to(torch.int32)
    del found, valids  # no target ignored: _build_flat_valids returns None
    return CutCrossEntropy.apply(e.contiguous(), c)


# ---------------------------------------------------------------------------------------------- activation offload


@dataclass(frozen=True)
class HostCopy:
    """What went to the host: its shape and dtype (host memory is not the allocator's)."""

    size: torch.Size
    dtype: torch.dtype


def save_on_host() -> Any:
    """torch.autograd.graph.save_on_cpu as the device sees it: pack copies each saved tensor into pinned host
    memory (the device tensor then lives only as long as the forward holds it), unpack makes a new device tensor
    of its size (packed.to(device)) each time backward reads it."""
    def pack(t: torch.Tensor) -> tuple:
        return t.device, HostCopy(t.size(), t.dtype)

    def unpack(packed: tuple) -> torch.Tensor:
        device, host = packed
        return torch.empty(host.size, dtype=host.dtype, device=device)

    return torch.autograd.graph.saved_tensors_hooks(pack, unpack)


class DeviceSideCopies(HostCopies):
    """memlab.core.offload.CudaCopies as the allocator sees it: to_host allocates host memory only, to_device one
    device tensor of the host copy's size (on the compute stream, as CudaCopies does); no streams to wait for
    (HostCopies' tokens and waits)."""

    def to_host(self, t: torch.Tensor) -> HostCopy:
        return HostCopy(t.size(), t.dtype)

    def to_device(self, host: HostCopy, device: torch.device) -> torch.Tensor:
        return torch.empty(host.size, dtype=host.dtype, device=device)
