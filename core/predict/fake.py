"""Measured memory breakdowns, to check the analytic estimate (memlab.core.predict.analytic) against:

1. `fake_estimate`: one training step on fake tensors (torch FakeTensorMode: shapes and dtypes, no storage) under
   torch.distributed._tools.mem_tracker.MemTracker, which follows every tensor's storage and sorts it into
   parameters, gradients, optimizer state, activations and backward temporaries. Needs no GPU and no memory: a
   GPT-2-small step at batch 64 takes seconds on a laptop. It measures tensors, not the allocator (no workspaces,
   no rounding), with the kernels of the device it runs on (on a CPU-only machine, the CPU's).
2. `SnapshotSink`: `memlab run --memory-snapshot` records the CUDA caching allocator's history over the first
   measured steps (torch.cuda.memory._record_memory_history), writes torch's own snapshot (a pickle, for
   https://pytorch.org/memory_viz; memlab writes it and never loads one) and a breakdown at the peak by category
   (parameters, gradients, optimizer state, activations, other), read from the allocation stacks.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import importlib.util
import json
import os
import pickle
import threading
from pathlib import Path
from typing import Any, Callable, Iterator
from unittest import mock

from memlab.core import step as train_step
from memlab.core.attention import kernel_for
from memlab.core.config import Experiment, Profile, experiment_from_dict, profile_from_dict
from memlab.core.errors import DeviceError, MemlabError
from memlab.core.predict.analytic import COMPONENTS, WORKSPACE_BYTES, Estimate, estimate, param_count
from memlab.core.predict.cuda_temporaries import sdpa_backward_workspace_bytes
from memlab.core.techniques import check_plan, check_techniques

CATEGORIES = ("parameters", "gradients", "optimizer_state", "activations", "other")
# A fake step patches module attributes (F.dropout, F.scaled_dot_product_attention; the allocator replay's trace also
# GPT.__init__ and torch.utils.swap_tensors): one at a time per process. A study's lanes predict in threads; without
# this, one trace restored the functions under another still running, whose prediction then came out wrong (tiny
# under 2 GiB, three threads: sac_ops 1060 for 864, gradcp_bf16 1447 for 1279) and left the patches in place after
# both (bench/lane_race_check.py, bench/results/lane-race-cpu/).
FAKE_STEP_LOCK = threading.RLock()


def estimate_categories(est: Estimate) -> dict[str, int]:
    """An estimate's components in the measured categories, to print side by side."""
    c = est.components
    opt_peak = est.peak_phase.startswith("optimizer")
    return {
        "parameters": c["weights"],
        "gradients": c["gradients"],
        "optimizer_state": c["optimizer_state"],
        "activations": c["activations"] + c["logits_loss"] + (0 if opt_peak else c["temporaries"]),
        "other": c["workspace"] + (c["temporaries"] if opt_peak else 0),
    }


# ---------------------------------------------------------------------------------------------- fake tensors


def fake_estimate(experiment: Experiment, profile: Profile, *, vocab_size: int, micro_batch: int | None = None,
                  gpu_kernels: bool = True) -> Estimate:
    """Measure one training step (forward, backward, clip, optimizer step, after a first step that creates the
    optimizer state) on fake tensors, with the engine's own step (memlab.core.step). Kernels that declare they
    cannot run on fake tensors are replaced by one that saves the same tensors (SDPA), torch.compile is left off;
    the notes say so. SDPA and dropout save what the GPU's fused kernels save (`gpu_kernels` False: this device's)."""
    import torch


    check_plan(experiment, profile)
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    notes = [f"fake tensors on {device.type}: tensors only (no allocator rounding or library workspaces)"]
    p = fake_runnable(experiment, profile, device, notes)
    check_techniques(experiment, p, device)
    b = micro_batch if micro_batch is not None else max(1, experiment.train.batch_size // p.accumulation.steps)
    if b < 1:
        raise MemlabError(f"estimate: the micro-batch must be at least 1, got {b}")
    try:
        peak = _fake_step_peak(experiment, p, device, vocab_size, b, gpu_kernels)
    except MemlabError:
        raise
    except Exception as e:  # noqa: BLE001 (an op without a fake implementation, a kernel that needs real data)
        raise MemlabError(f"--method fake could not run this profile ({e.__class__.__name__}: {str(e).splitlines()[0] if str(e) else ''}); use --method analytic") from None
    return _fake_result(experiment, profile, peak, device, vocab_size, b, notes)


def fake_runnable(experiment: Experiment, profile: Profile, device: Any, notes: list[str]) -> Profile:
    """A copy of `profile` that runs on fake tensors on `device`, with the same saved tensors; notes say what changed."""

    p = copy.deepcopy(profile)
    if not _kernel_runs_on_fake(experiment, p, device):
        notes.append(f"attention.kernel = {p.attention.kernel} measured as SDPA (the same saved tensors; it cannot run on fake tensors)")
        p.attention.kernel, p.attention.sdpa_backend = "sdpa", "auto"
        p.attention.window = 0  # a fused kernel's memory does not depend on the window (O(T) per head either way)
    if p.compile.enabled:
        notes.append("compile measured uncompiled (the fused loss of a compiled step keeps less; see the analytic figure)")
        p.compile.enabled = False
        p.checkpointing.budget = 1.0  # torch.compile's setting: uncompiled, check_techniques refuses any other
    if p.precision.dtype == "fp16":
        notes.append("fp16's GradScaler left out (a scale and a flag per step: no memory of its own)")
    if device.type != "cuda":
        _cpu_stand_ins(p, notes)
    kernel_for(experiment, p, device)  # the stand-in itself must build here
    return p


def _kernel_runs_on_fake(experiment: Experiment, profile: Profile, device: Any) -> bool:
    """The kernel's own declaration; a kernel that cannot even be built here (flash without a GPU) cannot either."""

    try:
        return kernel_for(experiment, profile, device).supports.fake_tensors
    except MemlabError:
        return False


def _cpu_stand_ins(p: Profile, notes: list[str]) -> None:
    """Settings that need CUDA, replaced by their CPU twin where the saved tensors are the same."""
    if p.precision.dtype == "tf32":
        p.precision.dtype = "fp32"  # same storage; TF32 is a matmul mode
    if p.checkpointing.offload or p.optimizer.offload:
        raise DeviceError("--method fake cannot measure offloading to the host without CUDA (host and device are one here); use --method analytic")
    p.loader.pin_memory = False
    p.allocator.expandable_segments = False
    if p.attention.kernel == "sdpa" and p.attention.sdpa_backend in ("cudnn", "efficient"):
        notes.append(f"sdpa_backend = {p.attention.sdpa_backend} measured as a fused kernel saves (its output and log-sum-exp)")
        p.attention.sdpa_backend = "auto"
    if p.optimizer.name in ("adamw8bit", "adamw4bit", "paged_adamw8bit"):
        raise DeviceError(f"--method fake cannot run optimizer.name = {p.optimizer.name} without CUDA; use --method analytic")
    if p.kernels.float8:
        raise DeviceError("--method fake cannot run float8 matmuls without CUDA; use --method analytic")
    if p.cuda_graph.enabled:  # a capture allocates what the launched step does; the replay models the graph's pool
        notes.append("cuda_graph measured launched (the same tensors; the allocator replay gives the graph its own pool)")
        p.cuda_graph.enabled = False


def _fake_step_peak(experiment: Experiment, p: Profile, device: Any, vocab_size: int, b: int, gpu_kernels: bool = True) -> dict:
    """MemTracker's peak snapshot over the second of two training steps built by memlab.core.step on fake tensors."""
    from torch.distributed._tools.mem_tracker import MemTracker

    tracker: list[Any] = [None]

    def on_phase(name: str) -> None:
        if name == "forward" and tracker[0] is not None:
            tracker[0].reset_mod_stats()  # MemTracker refuses a second forward of the root otherwise

    with fake_step(experiment, p, device, vocab_size, b, gpu_kernels=gpu_kernels) as (step, batch):
        step.run(batch(), on_phase=on_phase)  # the first step creates the optimizer state, as the engine's warm-up does
        mt = MemTracker()
        # optimizer.in_backward holds one optimizer per parameter (memlab.core.techniques.optim_in_backward)
        mt.track_external(step.model, getattr(step.optimizer, "optimizers", step.optimizer))
        tracker[0] = mt
        with mt:
            step.run(batch(), on_phase=on_phase)
        return mt.get_tracker_snapshot("peak")


@contextlib.contextmanager
def fake_step(experiment: Experiment, p: Profile, device: Any, vocab_size: int, b: int, *watchers: Any,
              gpu_kernels: bool = True, attention_backward: str = "") -> Iterator[tuple[Any, Callable[[], list]]]:
    """The engine's step (memlab.core.step) built on fake tensors, inside `watchers` (dispatch modes entered before
    the model is built, innermost): yields the step and a maker of one step's micro-batches at micro-batch b.
    `.item()` answers any number; SDPA and dropout save what the GPU's fused kernels save, not what the CPU's paths
    save (unless `gpu_kernels` is False: this device's own). `attention_backward` names the GPU backend whose
    backward workspace the fused SDPA allocates and frees (memlab.core.predict.cuda_temporaries; "" for none)."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode


    T, k = experiment.model.seq_len, p.accumulation.steps

    def batch() -> list:
        return [(torch.randint(0, vocab_size, (b, T), device=device), torch.randint(0, vocab_size, (b, T), device=device)) for _ in range(k)]

    with FAKE_STEP_LOCK, contextlib.ExitStack() as stack:
        kernels = _gpu_kernels(torch, p, attention_backward) if gpu_kernels else contextlib.nullcontext()
        for mode in (FakeTensorMode(), _scalars(torch), kernels, *watchers):
            stack.enter_context(mode)
        step = train_step.build_step(experiment, p, device, vocab_size, on_device=True)  # a module lookup: tests swap it
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


@contextlib.contextmanager
def _gpu_kernels(torch: Any, p: Profile, attention_backward: str = "") -> Iterator[None]:
    """The GPU's fused SDPA and dropout in place of the CPU's: what a fake step on a CPU must allocate to be a GPU
    step (both CPU paths keep more: see _fused_sdpa and _fused_dropout)."""
    with _fused_sdpa(torch, p, attention_backward), _fused_dropout(torch):
        yield


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

    if p.attention.sdpa_backend == "math":
        return contextlib.nullcontext()

    class FusedAttention(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v):
            # Through an SDPA op, not empty_like: checkpointing.mode "ops" keeps SDPA's outputs and recomputes an
            # empty_like (1.1 GiB short on the wide held-out shape). Its fake kernel makes what the fused GPU kernels
            # do: the output and an fp32 (B, H, T) log-sum-exp, on any device.
            out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, True)
            ctx.save_for_backward(q, k, v, out, lse)
            return out

        @staticmethod
        def backward(ctx, grad):
            q, k, v, _, _ = ctx.saved_tensors
            grads = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
            workspace = sdpa_backward_workspace_bytes(backend, *q.shape)
            if workspace:
                torch.empty(workspace, dtype=torch.uint8, device=q.device)  # made and dropped: freed within the kernel
            return grads

    def attention(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, **_):
        return FusedAttention.apply(q, k, v)

    return mock.patch.object(torch.nn.functional, "scaled_dot_product_attention", attention)


def _fake_result(experiment: Experiment, profile: Profile, peak: dict, device: Any, vocab_size: int, b: int, notes: list[str]) -> Estimate:
    import torch

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
        comps["workspace"] = WORKSPACE_BYTES.get(profile.attention.kernel, WORKSPACE_BYTES["default"])
        notes.append("workspace: the analytic constant, added (fake tensors have none)")
    if profile.attention.kernel == "eager" and profile.precision.dtype in ("fp32", "tf32"):
        # bench/results/estimate-h100: gradcp's allocator history on the H100 held one more fp32 T x T gradient at
        # the attention backward's peak than the fake (meta) kernels allocate; the analytic figure counts it
        notes.append("fp32 eager attention: the H100 held a third fp32 T x T gradient in backward that fake tensors do not allocate; expect a real peak above this one")
    F = m_.d_ff or 4 * m_.d_model
    return Estimate(
        profile=profile.name,
        experiment=experiment.name,
        micro_batch=b,
        accumulation=profile.accumulation.steps,
        vocab_size=vocab_size,
        params=param_count(m_.n_layer, m_.d_model, F, m_.seq_len, vocab_size),
        components=comps,
        peak_phase="measured step (fake tensors)",
        phases={},
        notes=notes,
        method="fake",
    )


# ---------------------------------------------------------------------------------------------- allocator snapshots

SNAPSHOT_FILE = "memory_snapshot.pickle"
BREAKDOWN_FILE = "memory_breakdown.json"
MAX_ENTRIES = 500_000


def _names(frames: list[dict] | None) -> list[tuple[str, str]]:
    return [(str(f.get("filename", "")).replace("\\", "/"), str(f.get("name", ""))) for f in (frames or [])]


def _any(frames: list[tuple[str, str]], files: tuple[str, ...] = (), names: tuple[str, ...] = ()) -> bool:
    return any(any(x in fn for x in files) or name in names for fn, name in frames)


def _source_of(module: str) -> str:
    """Where this install keeps a memlab module (its file) or package (its folder), as stack frames name it: core/
    at the top level under `pip install -e .`, site-packages/memlab/core/ from a wheel. Asked of the import system,
    so frames are matched by module, whatever the layout."""
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise ImportError(f"memsnapshot: cannot locate {module}")
    path = os.path.dirname(spec.origin) + os.sep if spec.submodule_search_locations is not None else spec.origin
    return path.replace("\\", "/")


# Resolved on first use, not at import: locating a module imports its parent package (memlab.core.techniques: torch).
@functools.cache
def _optim_files() -> tuple[str, ...]:
    """Frames of the optimizer's code: its state and temporaries."""
    return ("torch/optim/", "torchao/optim", _source_of("memlab.core.optim"), _source_of("memlab.core.techniques.optim_offload"))


@functools.cache
def _step_files() -> tuple[str, ...]:
    """Frames of forward and backward: what they make and free within the step are activations."""
    memlab_files = tuple(_source_of(m) for m in ("memlab.core.model", "memlab.core.loss", "memlab.core.attention", "memlab.core.techniques"))
    return memlab_files + ("torch/utils/checkpoint.py", "torch/nn/", "torch/autograd/")


_PARAM_NAMES = ("_apply", "to_empty")


def classify(alloc_frames: list[dict] | None, free_frames: list[dict] | None, alive_at_cut: bool, allocated_before_cut: bool) -> str:
    """The category of one allocation, from its Python stacks (torch records them with stacks="python").

    gradients: freed by `optimizer.zero_grad` (set_to_none frees every .grad); made in backward on autograd's
      thread, where no Python frame exists, so the free is what tells them apart.
    optimizer state: made under torch.optim / torchao.optim and still alive at the end of the last full step.
    parameters: made by Module._apply (model.to(device)) and still alive.
    activations: made in forward or backward (model, loss, attention, checkpoint, autograd) and freed within the step.
    other: the rest: library workspaces (made once, kept), the input batch, optimizer temporaries.
    """
    af, ff = _names(alloc_frames), _names(free_frames)
    if _any(ff, names=("zero_grad",)):
        return "gradients"
    if alive_at_cut:
        if _any(af, files=_optim_files()):
            return "optimizer_state"
        if _any(af, names=_PARAM_NAMES):
            return "parameters"
        return "other"
    if _any(af, files=_optim_files()):
        return "other"
    if not af or _any(af, files=_step_files()):
        return "activations"
    return "other"


def breakdown(snapshot: dict, device: int = 0) -> dict[str, Any]:
    """Replay the allocator's trace of one device and split the allocated bytes at their peak by category.

    The trace window may start after some blocks were allocated (a ring buffer): blocks still active at the dump
    (listed in `segments`) and blocks whose free appears without their allocation were alive from the start.
    The analysis ends at the last `zero_grad` (the end of the last complete step), so that a step in flight at the
    dump is not mistaken for long-lived memory; an OOM in the trace ends it there instead.
    """
    traces = snapshot.get("device_traces") or []
    events = [ev for ev in (traces[device] if device < len(traces) else []) if ev.get("action") in ("alloc", "free_requested", "free_completed", "oom")]
    records, open_by_addr, oom_at = _trace_records(events)
    records += _blocks_before_window(snapshot, device, open_by_addr)
    zero_grads = [r[1] for r in records if r[1] is not None and _any(_names(r[4]), names=("zero_grad",))]
    cut = oom_at if oom_at is not None else (max(zero_grads) if zero_grads else len(events))
    peak, peak_at = _live_peak(records, len(events), cut)
    cats = dict.fromkeys(CATEGORIES, 0)
    for r in records:
        alive_at_peak = r[0] <= peak_at and (r[1] is None or r[1] > peak_at)
        if not alive_at_peak:
            continue
        alive_at_cut = r[1] is None or r[1] > cut
        cats[classify(r[3], r[4], alive_at_cut, r[0] <= cut)] += r[2]
    return {"peak_bytes": peak, "categories": cats, "events": len(events), "oom": oom_at is not None, "complete_steps": len(zero_grads)}


def _trace_records(events: list[dict]) -> tuple[list[list[Any]], dict[int, list[Any]], int | None]:
    """Allocation records [alloc index or -1, free index or None, size, alloc frames, free frames] from the trace,
    the records still open by address, and the index of the first OOM (None without one)."""
    records: list[list[Any]] = []
    open_by_addr: dict[int, list[Any]] = {}
    oom_at: int | None = None
    for i, ev in enumerate(events):
        action, addr = ev["action"], ev.get("addr")
        if action == "alloc":
            rec = [i, None, int(ev.get("size", 0)), ev.get("frames"), None]
            records.append(rec)
            open_by_addr[addr] = rec
        elif action in ("free_requested", "free_completed"):
            rec = open_by_addr.pop(addr, None)
            if rec is None:
                if action == "free_completed":
                    continue  # the second half of a free already counted
                rec = [-1, None, int(ev.get("size", 0)), None, None]  # allocated before the window
                records.append(rec)
            rec[1], rec[4] = i, ev.get("frames")
        elif action == "oom" and oom_at is None:
            oom_at = i
    return records, open_by_addr, oom_at


def _blocks_before_window(snapshot: dict, device: int, open_by_addr: dict[int, list[Any]]) -> list[list[Any]]:
    """Blocks active at the dump that the trace window never saw allocated: alive from the start."""
    out = []
    for seg in snapshot.get("segments") or []:
        if seg.get("device", device) != device:
            continue
        for blk in seg.get("blocks") or []:
            if blk.get("state") != "active_allocated" or blk.get("address") in open_by_addr:
                continue  # free, or its allocation is in the window: counted already
            frames = blk.get("frames")
            if frames is None and blk.get("history"):
                frames = blk["history"][-1].get("frames")
            out.append([-1, None, int(blk.get("size", 0)), frames, None])
    return out


def _live_peak(records: list[list[Any]], n_events: int, cut: int) -> tuple[int, int]:
    """(peak live bytes, the event index where it is reached; -1 before any) over the trace up to `cut`."""
    delta = [0] * (n_events + 1)
    base = 0
    for r in records:
        if r[0] < 0:
            base += r[2]
        else:
            delta[r[0]] += r[2]
        if r[1] is not None:
            delta[r[1]] -= r[2]
    live, peak, peak_at = base, base, -1
    for i in range(min(cut + 1, n_events)):
        live += delta[i]
        if live > peak:
            peak, peak_at = live, i
    return peak, peak_at


def _record(torch: Any, context: str) -> None:
    """Record the allocator's history (a ring of MAX_ENTRIES), Python stacks for `context` ("all": allocations and
    frees; "alloc": allocations only). Called again with another context, torch keeps what it recorded."""
    torch.cuda.memory._record_memory_history(enabled="all", context=context, stacks="python", max_entries=MAX_ENTRIES)


class SnapshotSink:
    """A sink for the engine that records the allocator from construction (before the model exists) until
    `steps` measured steps are done (or the run ends), then writes the snapshot and the breakdown into the run
    folder. Construct it before the run starts: recording must begin before the first allocation."""

    def __init__(self, device: Any, steps: int = 3):
        import torch

        if getattr(device, "type", str(device)) != "cuda" or not torch.cuda.is_available():
            raise DeviceError("--memory-snapshot records the CUDA caching allocator and needs CUDA; on CPU use memlab estimate (add --method fake for a measured breakdown)")
        if steps < 1:
            raise MemlabError(f"memory snapshot: steps must be at least 1, got {steps}")
        self.steps = steps
        self.run_dir: Path | None = None
        self.measure_after = 0
        self.result: dict[str, Any] | None = None
        self.path: Path | None = None
        self.estimate: Estimate | None = None
        _record(torch, "all")
        self._recording = True
        self._backward = torch.autograd.backward
        torch.autograd.backward = self._backward_recorded

    def _backward_recorded(self, *args: Any, **kwargs: Any) -> Any:
        """torch.autograd.backward with frees recorded without their stacks while it runs. With their stacks
        (context "all"), a backward that recomputes checkpointed blocks fails: the non-reentrant checkpoint stops a
        recomputation early by raising inside it, and recording a free's Python stack while that exception is in
        flight loses it ("SystemError: ... returned NULL without setting an exception", torch 2.11 on an H100:
        bench/snapshot_stop_probe.py; with context "alloc", or the early stop off, it ran). Allocations keep their
        stacks; the breakdown reads free stacks only for zero_grad, which runs outside backward."""
        import torch

        if self._recording:
            _record(torch, "alloc")
        try:
            return self._backward(*args, **kwargs)
        finally:
            if self._recording:
                _record(torch, "all")

    def emit(self, ev: dict) -> None:
        kind = ev.get("event")
        if kind == "started":
            self.run_dir = Path(ev["run_dir"]) if ev.get("run_dir") else None
            self.measure_after = int(ev.get("experiment", {}).get("train", {}).get("measure_after", 0))
            self.estimate = self._estimate(ev)
        elif kind == "step" and self._recording and ev.get("step", 0) >= self.measure_after + self.steps - 1:
            self._dump(f"after {ev['step'] + 1} steps")
        elif kind in ("finished", "failed") and self._recording:
            self._dump("at the end of the run" if kind == "finished" else f"at the failure ({ev.get('reason')})")

    @staticmethod
    def _estimate(ev: dict) -> Estimate | None:

        try:
            exp, prof = experiment_from_dict(ev["experiment"]), profile_from_dict(ev["profile"])
            return estimate(exp, prof, vocab_size=int(ev["vocab_size"]), micro_batch=int(ev["micro_batch"]))
        except Exception:  # noqa: BLE001 (the breakdown stands without it)
            return None

    def _dump(self, when: str) -> None:
        import torch

        snap = torch.cuda.memory._snapshot()
        self._stop(torch)
        folder = self.run_dir or Path(".")
        self.path = folder / SNAPSHOT_FILE
        tmp = self.path.with_suffix(".tmp")
        with open(tmp, "wb") as f:
            pickle.dump(snap, f)  # torch's own snapshot format (what _dump_snapshot writes), for memory_viz
        os.replace(tmp, self.path)
        result = breakdown(snap, torch.cuda.current_device())
        result["when"] = when
        result["snapshot"] = str(self.path)
        if self.estimate is not None:
            result["estimate_categories"] = estimate_categories(self.estimate)
            result["estimate_total_bytes"] = self.estimate.total_bytes
        self.result = result
        (folder / BREAKDOWN_FILE).write_text(json.dumps(result, indent=2))

    def close(self) -> None:
        if self._recording:
            import torch

            self._stop(torch)

    def _stop(self, torch: Any) -> None:
        torch.cuda.memory._record_memory_history(enabled=None)
        torch.autograd.backward = self._backward
        self._recording = False
