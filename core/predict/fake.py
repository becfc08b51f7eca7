"""`fake_estimate`: one training step on fake tensors (torch FakeTensorMode: shapes and dtypes, no storage) under
   torch.distributed._tools.mem_tracker.MemTracker, which follows every tensor's storage and sorts it into
   parameters, gradients, optimizer state, activations and backward temporaries. Needs no GPU and no memory: a
   GPT-2-small step at batch 64 takes seconds on a laptop. It measures tensors, not the allocator (no workspaces,
   no rounding), with the kernels of the device it runs on (on a CPU-only machine, the CPU's). A real run's
   allocator snapshot (`memlab run --memory-snapshot`) is measurement: memlab.core.memsnapshot.
"""

from __future__ import annotations

import contextlib
import copy
import threading
from typing import Any, Callable, Iterator
from unittest import mock

import torch
from memlab.core import techniques
from memlab.core.attention import fake_tensors_note, keeps_scores, kernel_for
from memlab.core.config import Experiment, Profile
from memlab.core.errors import DeviceError, MemlabError
from memlab.core.models import family
from memlab.core.models import hf as hf_family
from memlab.core.predict.analytic import COMPONENTS, WORKSPACE_BYTES, Estimate, param_count
from memlab.core.predict.cuda_autocast import cuda_policy
from memlab.core.predict.cuda_temporaries import sdpa_backward_workspace_bytes
from memlab.core.predict.standins import StandIns, install, split, swappable_fake_parameters
from memlab.core.standin import with_settings
from memlab.core.techniques import accumulation, check_plan, check_techniques, checkpointing, fake_steps, finetune, torch_compile
from memlab.core.dtypes import compute_dtype

# A fake step patches module attributes (F.dropout, F.scaled_dot_product_attention; the allocator replay's trace also
# GPT.__init__ and torch.utils.swap_tensors): one at a time per process. A study's lanes predict in threads; without
# this, one trace restored the functions under another still running, whose prediction then came out wrong (tiny
# under 2 GiB, three threads: sac_ops 1060 for 864, gradcp_bf16 1447 for 1279) and left the patches in place after
# both (bench/lane_race_check.py, bench/results/lane-race-cpu/).
FAKE_STEP_LOCK = threading.RLock()


# ---------------------------------------------------------------------------------------------- fake tensors


def fake_estimate(experiment: Experiment, profile: Profile, *, vocab_size: int, micro_batch: int | None = None,
                  gpu_kernels: bool = True) -> Estimate:
    """Measure one training step (forward, backward, clip, optimizer step, after a first step that creates the
    optimizer state) on fake tensors, with the engine's own step (memlab.core.step). Kernels that declare they
    cannot run on fake tensors are replaced by one that saves the same tensors (SDPA), torch.compile is left off;
    the notes say so. SDPA and dropout save what the GPU's fused kernels save (`gpu_kernels` False: this device's)."""
    check_plan(experiment, profile)
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    notes = [f"fake tensors on {device.type}: tensors only (no allocator rounding or library workspaces)"]
    p, standins = split(profile)  # CUDA-only libraries and host copies: the stand-ins their techniques declare
    p = fake_runnable(experiment, p, device, notes)
    check_techniques(experiment, p, device)
    b = micro_batch if micro_batch is not None else max(1, accumulation.micro_batch(experiment, p, 1))
    if b < 1:
        raise MemlabError(f"estimate: the micro-batch must be at least 1, got {b}")
    try:
        peak, params = _fake_step_peak(experiment, p, device, vocab_size, b, gpu_kernels, standins)
    except MemlabError:
        raise
    except Exception as e:  # noqa: BLE001 (an op without a fake implementation, a kernel that needs real data)
        raise MemlabError(f"--method fake could not run this profile ({e.__class__.__name__}: {str(e).splitlines()[0] if str(e) else ''}); use --method analytic") from None
    return _fake_result(experiment, profile, peak, device, vocab_size, b, notes, params)


def fake_runnable(experiment: Experiment, profile: Profile, device: Any, notes: list[str]) -> Profile:
    """A copy of `profile` that runs on fake tensors on `device`, with the same saved tensors, as its techniques
    declare (memlab.core.techniques.fake_steps); notes say what changed."""
    p = copy.deepcopy(profile)
    for declared in fake_steps(experiment, profile, device):
        if declared.refusal:
            raise DeviceError(declared.refusal)
        with_settings(p, declared.settings)
        if declared.note:
            notes.append(declared.note)
    if torch_compile.compiles(profile):  # which graphs the predictor replays for a compiled step is its own method
        notes.append(_compile_note(experiment, profile))
    elif reads_block_graphs(experiment, profile):
        notes.append("checkpointing ops: the breakdown is the eager per-op policy's; the peaks replay each block's "
                     "compiled graphs, as a GPU runs them")
    kernel_for(experiment, p, device)  # the stand-in itself must build here
    return p


def _compile_note(experiment: Experiment, profile: Profile) -> str:
    if reads_compiled_graphs(experiment, profile):
        return "compile read from its graphs: the breakdown is the eager step's, the peaks the compiled graphs' (Inductor's own buffers)"
    return ("compile traced as the eager step, an upper bound (the compiled-graph reader builds neither DoRA, a 4-bit "
            "base nor a layer's own window; on the H100 Llama-3.2-1B's compiled LoRA step peaked 10.38 GiB, its eager "
            "trace 16.69)")


def reads_compiled_graphs(experiment: Experiment, profile: Profile) -> bool:
    """Whether the replay reads the compiled step's own graphs (memlab.core.predict.inductor compiles the model the
    engine builds: memlab's GPT, or the transformers model of an hf experiment). Where it cannot, the eager step is
    traced instead, an upper bound (Inductor frees and fuses what the eager step keeps; _compile_note says so in
    the prediction's notes)."""
    return torch_compile.compiles(profile) and _graphs_readable(experiment, profile)


def reads_block_graphs(experiment: Experiment, profile: Profile) -> bool:
    """Whether the replay reads the graphs of the blocks a GPU compiles one by one (checkpointing.compiled_blocks:
    per-op checkpointing); where it cannot, the eager per-op policy is traced, which saves the same tensors through
    eager temporaries (on the H200 Llama-3.2-1B at 1 x 2048 reserved 21.44 GiB, its eager trace 22.79)."""
    return bool(checkpointing.compiled_blocks(profile)) and finetune.trains_whole_model(profile) and \
        _graphs_readable(experiment, profile)


def _graphs_readable(experiment: Experiment, profile: Profile) -> bool:
    """memlab's GPT; an hf model unless it is fine-tuned other than by LoRA on a bf16 base (the reader adds peft's
    LoRA adapters as the engine does: Llama-3.2-1B's compiled LoRA step predicted 10.38 GiB for the H100's 10.38,
    +60.8% traced eager; DoRA and a 4-bit base are not built there) or its layers window or soft-cap their attention
    (the CPU's kernel stands in for a plain causal one)."""
    if experiment.model.family == "gpt":
        return True
    return finetune.graphs_readable(profile) and not _windowed_layers(experiment)


def _windowed_layers(experiment: Experiment) -> bool:
    """Whether any layer of this hf model has a window or an attention soft-cap of its own (Mistral v0.1, Gemma-2)."""
    model = family.shared_skeleton(experiment)
    config = model.hf.config
    return any(hf_family.layer_windows(model)) or bool(getattr(config, "attn_logit_softcapping", None))


def _fake_step_peak(experiment: Experiment, p: Profile, device: Any, vocab_size: int, b: int, gpu_kernels: bool = True,
                    standins: StandIns = StandIns()) -> tuple[dict, int]:
    """MemTracker's peak snapshot over the second of two training steps built by memlab.core.step on fake tensors,
    and the model's parameter count (the model built, whatever its family)."""
    tracker: list[Any] = [None]

    def on_phase(name: str) -> None:
        if name == "forward" and tracker[0] is not None:
            tracker[0].reset_mod_stats()  # MemTracker refuses a second forward of the root otherwise

    with fake_step(experiment, p, device, vocab_size, b, gpu_kernels=gpu_kernels) as (step, batch):
        install(step, standins, compute_dtype(p))
        step.run(batch(), on_phase=on_phase)  # the first step creates the optimizer state, as the engine's warm-up does
        mt = _global_peak_tracker()
        # optimizer.in_backward holds one optimizer per parameter (memlab.core.techniques.optim_in_backward)
        mt.track_external(step.model, getattr(step.optimizer, "optimizers", step.optimizer))
        _frozen_without_grad_hooks(mt, step.model)
        tracker[0] = mt
        with mt:
            step.run(batch(), on_phase=on_phase)
        return mt.get_tracker_snapshot("peak"), step.model.num_params()


def _global_peak_tracker() -> Any:
    """A MemTracker that keeps the step's global peak snapshot (what get_tracker_snapshot("peak") returns) and not
    each module's own peaks, which nothing here reads. MemTracker updates those by walking every module it has seen
    on every allocation: on Llama-3.1-8B with LoRA, thousands of modules times tens of thousands of allocations, 60%
    of the trace's time. Where this torch's MemTracker lacks the fields this relies on, the plain one."""
    from torch.distributed._tools import mem_tracker

    kept = ("_curr_mem_snap", "_peak_mem", "_peak_mem_snap")

    class GlobalPeakTracker(mem_tracker.MemTracker):
        def _update_peak_stats(self, peak_state: Any) -> None:
            if not all(hasattr(self, name) for name in kept):
                return super()._update_peak_stats(peak_state)
            for dev, snap in self._curr_mem_snap.items():
                if self._peak_mem.get(dev, 0) < snap[mem_tracker._TOTAL_KEY]:
                    self._peak_mem[dev] = snap[mem_tracker._TOTAL_KEY]
                    self._peak_mem_snap[dev] = copy.deepcopy(snap)

    has_total = hasattr(mem_tracker, "_TOTAL_KEY")
    return GlobalPeakTracker() if has_total else mem_tracker.MemTracker()


class _NoHook:
    def remove(self) -> None:
        pass


def _frozen_without_grad_hooks(tracker: Any, model: Any) -> None:
    """MemTracker hooks every parameter's gradient, and a frozen one (fine-tuning's base) refuses a hook: marked as
    hooked already, it is tracked as a parameter and never asked for a gradient it will not have."""
    for p in model.parameters():
        if not p.requires_grad:
            tracker._param_to_grad_hook_handles[p] = (_NoHook(), _NoHook())


@contextlib.contextmanager
def fake_step(experiment: Experiment, p: Profile, device: Any, vocab_size: int, b: int, *watchers: Any,
              gpu_kernels: bool = True, attention_backward: str = "") -> Iterator[tuple[Any, Callable[[], list]]]:
    """The engine's step (memlab.core.step) built on fake tensors, inside `watchers` (dispatch modes entered before
    the model is built, innermost): yields the step and a maker of one step's micro-batches at micro-batch b.
    `.item()` answers any number; SDPA and dropout save what the GPU's fused kernels save, not what the CPU's paths
    save, and autocast keeps CUDA's fp32 ops in fp32 (memlab.core.predict.cuda_autocast; unless `gpu_kernels` is
    False: this device's own). `attention_backward` names the GPU backend whose
    backward workspace the fused SDPA allocates and frees (memlab.core.predict.cuda_temporaries; "" for none)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    T, k = experiment.model.seq_len, accumulation.steps(p)

    def batch() -> list:
        return [(torch.randint(0, vocab_size, (b, T), device=device), torch.randint(0, vocab_size, (b, T), device=device)) for _ in range(k)]

    with FAKE_STEP_LOCK, contextlib.ExitStack() as stack:
        # the GPU's fused SDPA and dropout in place of the CPU's, which keep more (see _fused_sdpa and _fused_dropout)
        kernels = (_fused_sdpa(torch, p, attention_backward), _fused_dropout(torch)) if gpu_kernels else ()
        if gpu_kernels and device.type != "cuda":  # the ops CUDA's autocast runs in fp32, in fp32 here too
            stack.enter_context(cuda_policy())
        stack.enter_context(swappable_fake_parameters())  # peft's adapters and bf16_pure convert fake parameters
        for mode in (FakeTensorMode(), _scalars(torch), *kernels, *watchers):
            stack.enter_context(mode)
        step = techniques.build_step(experiment, p, device, vocab_size, on_device=True)  # a module lookup: tests swap it
        step.scaler = None  # fake tensors: GradScaler's inf check reads a value that does not exist
        yield step, batch


def _scalars(torch: Any) -> Any:
    """A dispatch mode: `.item()` has no value on a fake tensor (Adafactor, clipping read one): any number does."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Scalars(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is torch.ops.aten._local_scalar_dense.default:
                return 1.0 if args[0].dtype.is_floating_point else 1
            return func(*args, **(kwargs or {}))

    return Scalars()


def _fused_dropout(torch: Any) -> Any:
    """F.dropout as CUDA runs it: native_dropout, which keeps a bool mask for backward. The CPU's dropout keeps its
    scaled noise in the input's dtype (4 bytes an element for eager fp32 attention's T x T probabilities: 0.45 GiB
    over the H100's peak for the seed shape's baseline)."""
    def dropout(input, p=0.5, training=True, inplace=False):  # noqa: A002, ARG001 (F.dropout's own signature)
        if not training or p == 0:
            return input
        return torch.ops.aten.native_dropout(input, p, True)[0]

    return mock.patch.object(torch.nn.functional, "dropout", dropout)


def _fused_sdpa(torch: Any, p: Profile, backend: str = "") -> Any:
    """F.scaled_dot_product_attention replaced by what a fused GPU kernel (flash, cuDNN, efficient) allocates: its
    output and an fp32 (B, H, T) log-sum-exp, both saved; in backward the three input gradients; dropout is drawn
    inside the kernel (no mask). On a CPU, SDPA with dropout takes the math path, which saves the T x T
    probabilities and their mask (13% over the H100's peak on the seed shape). Left alone where the profile pins
    sdpa_backend = math, which saves T x T on a GPU too. With `backend`, backward also allocates and frees that
    GPU kernel's workspace once the gradients exist (memlab.core.predict.cuda_temporaries)."""

    if keeps_scores(p):
        return contextlib.nullcontext()

    class FusedAttention(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v, bias):
            # Through an SDPA op, not empty_like: checkpointing.mode "ops" keeps SDPA's outputs and recomputes an
            # empty_like (1.1 GiB short on the wide held-out shape). Its fake kernel makes what the fused GPU kernels
            # do: the output and an fp32 (B, H, T) log-sum-exp, on any device.
            out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, True)
            ctx.save_for_backward(q, k, v, out, lse, bias)
            return out

        @staticmethod
        def backward(ctx, grad):
            q, k, v, _, _, _ = ctx.saved_tensors
            grads = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
            workspace = sdpa_backward_workspace_bytes(backend, *q.shape)
            if workspace:
                torch.empty(workspace, dtype=torch.uint8, device=q.device)  # made and dropped: freed within the kernel
            return *grads, None

    def attention(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, **_):
        return FusedAttention.apply(q, k, v, _attention_bias(torch, q, attn_mask, dropout_p))

    return mock.patch.object(torch.nn.functional, "scaled_dot_product_attention", attention)


def _attention_bias(torch: Any, q: Any, mask: Any, dropout_p: float) -> Any:
    """The mask the GPU's kernel saves for backward, None where it takes none. A mask comes with dropout only from a
    window that no fused kernel here can drop out (memlab.core.attention: `sdpa:efficient+mask`), and the efficient
    kernel turns a boolean one into an additive one in q's dtype on every call (ATen's convert_boolean_attn_mask)
    and saves that: a (T, T) tensor per block. Left out, the long held-out shape's window was 13.9% under the
    H100's peak. Without dropout a window is the flash kernel's own, with no mask."""
    if mask is None or not dropout_p:
        return None
    if mask.dtype != torch.bool:
        return mask
    return torch.where(mask.logical_not(), float("-inf"), torch.zeros((), dtype=q.dtype, device=q.device))


def _fake_result(experiment: Experiment, profile: Profile, peak: dict, device: Any, vocab_size: int, b: int, notes: list[str],
                 params: int) -> Estimate:
    m_ = experiment.model
    cuda = device.type == "cuda"
    snap = next((v for d, v in peak.items() if torch.device(d).type == device.type), {})
    by = {str(getattr(key, "value", key)): int(v) for key, v in snap.items()}
    comps = dict.fromkeys(COMPONENTS, 0)
    comps["weights"] = by.get("Parameter", 0) + by.get("Buffer", 0)
    comps["gradients"] = by.get("Gradient", 0)
    comps["optimizer_state"] = by.get("Optstate", 0)
    comps["activations"] = by.get("Activation", 0)
    comps["temporaries"] = by.get("Temp", 0) + by.get("Other", 0)
    if cuda:
        comps["workspace"] = WORKSPACE_BYTES
        notes.append("workspace: the analytic constant, added (fake tensors have none)")
    notes += [note] if (note := fake_tensors_note(profile)) else []
    F = m_.d_ff or 4 * m_.d_model
    return Estimate(
        profile=profile.name,
        experiment=experiment.name,
        micro_batch=b,
        accumulation=accumulation.steps(profile),
        vocab_size=vocab_size,
        # the gpt family's count from its formula (as every figure before); another family's from the model built
        params=param_count(m_.n_layer, m_.d_model, F, m_.seq_len, vocab_size) if getattr(m_, "family", "gpt") == "gpt" else params,
        components=comps,
        peak_phase="measured step (fake tensors)",
        phases={},
        notes=notes,
        method="fake",
    )
