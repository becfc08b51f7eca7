"""`memlab run --memory-snapshot`: a real run's CUDA caching allocator history over the first measured steps
(torch.cuda.memory._record_memory_history), written as torch's own snapshot (a pickle, for
https://pytorch.org/memory_viz; memlab writes it and never loads one) and a breakdown at the peak by category
(parameters, gradients, optimizer state, activations, other), read from the allocation stacks, beside the estimate.
Measurement, not prediction: the predictor (memlab.core.predict) is checked against it.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import pickle
from pathlib import Path
from typing import Any

from memlab.core.config import experiment_from_dict, profile_from_dict
from memlab.core.errors import DeviceError, MemlabError
from memlab.core.predict.analytic import Estimate, estimate

CATEGORIES = ("parameters", "gradients", "optimizer_state", "activations", "other")


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
    """Frames of the optimizer's code: its state and temporaries (built at the optimizer technique's door)."""
    return ("torch/optim/", "torchao/optim", _source_of("memlab.core.optim"), _source_of("memlab.core.techniques.optimizer"),
            _source_of("memlab.core.techniques.optim_offload"))


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
