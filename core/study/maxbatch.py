"""Each profile's largest micro-batch: measured on CUDA through find-batch's machinery (one child per probe, under
the --gpu-memory cap, cached bounds), predicted by the estimator everywhere (on the CPU only predicted, and said so).
"""

from __future__ import annotations

import multiprocessing
import os
import threading
from typing import Any, Callable

from memlab.core import batchfind as bf
from memlab.core import gpu_memory
from memlab.core.predict import card, maxbatch, valid_for
from memlab.core.predict.trace import SearchStopped
from memlab.core.study.plan import CPU_MEMORY, Plan
from memlab.core.study.state import Item
from memlab.core.units import gib, parse_size

PROBE_STEPS = 3  # as `memlab find-batch` (its cache answers for the same steps)


class Stopped(Exception):
    """The study was asked to stop between two probes."""


class LiveProbes:
    """The probes in flight (one per lane), so that a stop cancels them at once rather than waiting for each to
    end: a compiled probe takes minutes. A probe added after the stop is cancelled as it comes."""

    def __init__(self) -> None:
        self._probes: set[Any] = set()
        self._cancelled = False
        self._lock = threading.RLock()  # reentrant: the stop comes from a signal handler, maybe mid-add

    def add(self, probe: Any) -> None:
        with self._lock:
            self._probes.add(probe)
            if self._cancelled:
                probe.cancel()

    def discard(self, probe: Any) -> None:
        with self._lock:
            self._probes.discard(probe)

    def cancel_all(self) -> None:
        with self._lock:
            self._cancelled = True
            for probe in list(self._probes):
                probe.cancel()


def predicted_max(plan: Plan, name: str, stopping: Callable[[], bool] | None = None,
                  apart_env: dict[str, str] | None = None) -> tuple[int | None, str]:
    """(the estimator's max micro-batch at accumulation 1, the memory it assumed), None when it cannot tell. On a GPU
    the allocator replay traces the step for up to minutes: `stopping` is asked between its traces and within them
    (SearchStopped). With `apart_env` (a lane's CUDA_VISIBLE_DEVICES): in a process of its own, for lanes predicting
    at once (predictions in threads of one process take turns on its GIL: on 4 H200 lanes the four took ~25 s where
    one takes ~7)."""
    memory = plan.cap_bytes or parse_size(CPU_MEMORY)
    where = gib(memory) if plan.cap_bytes or plan.on_cuda else f"{gib(memory)} (an 80 GB card assumed)"
    what = (plan.experiment, plan.profiles[name], memory)
    how = {"replay": _replays(plan), "capped": bool(plan.cap_bytes)}
    if apart_env is not None:
        return _predicted_apart(what, how, apart_env, stopping or (lambda: False)), where
    return maxbatch.predicted_max_batch(*what, **how, should_stop=stopping), where


def _replays(plan: Plan) -> bool:
    """Whether the prediction replays the allocator over a traced step (seconds of CPU), not the analytic formula's
    milliseconds: on a real GPU only."""
    return plan.on_cuda and card.cuda_here()


def _predicted_apart(what: tuple, how: dict, env: dict[str, str], stopping: Callable[[], bool]) -> int | None:
    """predicted_max_batch(*what, **how) in a spawned process that sees the lane's GPU alone (the replay asks the device's
    capability, which makes a CUDA context: on the GPU this lane searches next, gone before its first probe);
    terminated at a stop (SearchStopped). None when the process fails: the search then starts from 1."""
    ctx = multiprocessing.get_context("spawn")
    receive, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_predict_into, args=(send, env, what, how), name="memlab-predict", daemon=True)
    proc.start()
    send.close()
    try:
        while not receive.poll(0.2):
            if stopping():
                raise SearchStopped("stopped while predicting")
            if not proc.is_alive() and not receive.poll(0):
                return None
        return receive.recv()
    except EOFError:  # the process ended without an answer
        return None
    finally:
        if proc.is_alive():
            proc.terminate()
        proc.join(timeout=5)


def _predict_into(send: Any, env: dict[str, str], what: tuple, how: dict) -> None:
    os.environ.update(env)  # before anything makes a CUDA context
    try:
        send.send(maxbatch.predicted_max_batch(*what, **how))
    except Exception:  # noqa: BLE001 (no prediction: the search starts from 1, as without an estimate)
        send.send(None)


def find_max(plan: Plan, item: Item, on_probe: Callable[[str], None], stopping: Callable[[], bool],
             live: LiveProbes | None = None, env: dict[str, str] | None = None, apart: bool = False) -> None:
    """Fill `item` (kind max) with the measured (CUDA) or predicted (CPU) max micro-batch and its status. A search
    resumed after a stop keeps the prediction it started from: on the seeds' shape leanest's replay took ~5 minutes
    of the H100 each time it was made again (--redo forgets it), and the bounds its probes found (study.json), as
    long as it resumes on the same GPU model. `env`: the lane's (CUDA_VISIBLE_DEVICES), for every probe's child.
    `apart`: predict in a process of its own (several lanes at once)."""
    _forget_another_gpus(plan, item)
    if item.predicted_max_batch is None or not plan.on_cuda:
        try:
            apart_env = (env or {}) if apart and _replays(plan) else None  # a process is worth starting for a replay only
            item.predicted_max_batch, where = predicted_max(plan, item.profile, stopping, apart_env=apart_env)
        except SearchStopped:
            item.status, item.message = "interrupted", "stopped while predicting the max batch (the allocator replay)"
            return
    if not plan.on_cuda:
        item.status = "predicted" if item.predicted_max_batch else "error"
        note = valid_for(plan.gpu_name if plan.on_cuda else None).note()
        item.message = (f"not measured (CPU): the estimator's prediction for {where}" + (f" ({note})" if note else "")
                        if item.predicted_max_batch else "not measured (CPU), and the estimator could not predict it")
        return
    item.command = _find_batch_command(plan, item.profile)
    _note_memlab(item)
    try:
        result = _search(plan, item, on_probe, stopping, live or LiveProbes(), env or {})
    except Stopped:
        item.status, item.message = "interrupted", "stopped before the search ended"
    except bf.ProbeRejected as e:
        item.status, item.message = "rejected", str(e)
    except bf.DoesNotFitError as e:
        item.status, item.message, item.max_batch = "does not fit", str(e), 0
    except bf.ProbeError as e:
        item.status, item.message = ("interrupted" if stopping() else "error"), str(e)
    else:
        item.status, item.max_batch = "measured", result.max_batch
        item.message = "" if result.exact else f"the limit {result.max_batch} fits: the true maximum may be larger"


def _forget_another_gpus(plan: Plan, item: Item) -> None:
    """A search resumed on another GPU model starts over: the card's reserve, and so the budget, differ."""
    if item.searched_on != plan.gpu_name:
        item.predicted_max_batch = item.known_fit = item.known_oom = item.allocator_budget_bytes = None
        item.searched_with = []
    item.searched_on = plan.gpu_name


def _note_memlab(item: Item) -> None:
    """The memlab whose probes this search runs (its commit in a git checkout, else its version): the report names
    it, and a search resumed after an update names each."""
    import memlab
    from memlab.core.environment import git_sha

    made_by = git_sha() or memlab.__version__
    if made_by not in item.searched_with:
        item.searched_with.append(made_by)


def _search(plan: Plan, item: Item, on_probe: Callable[[str], None], stopping: Callable[[], bool],
            live: LiveProbes, lane_env: dict[str, str]) -> bf.SearchResult:
    name = item.profile
    prof = plan.profiles[name]
    gpu = plan.gpu_name or "unknown GPU"
    key = bf.cache_key(plan.experiment, prof, gpu, plan.cap_bytes, steps=PROBE_STEPS)
    fit, oom, _ = bf.cached_bounds(key)
    fit, oom = bf.merged_bounds((fit, oom), [item.known_fit or 0], [item.known_oom] if item.known_oom else [])
    start = bf.start_below(item.predicted_max_batch)
    env = lane_env | ({gpu_memory.PER_PROCESS_ENV: "1"} if plan.lanes > 1 else {})  # N searches share a card: no device-wide figure
    probe = bf.ChildProbe(name, plan.options.experiment, plan.run_overrides(), seq_len=plan.experiment.model.seq_len,
                          steps=PROBE_STEPS, cap_bytes=plan.cap_bytes, env=env)

    def guarded(b: int) -> bf.ProbeResult:
        if stopping():
            raise Stopped
        return probe(b)

    def noted(r: bf.ProbeResult) -> None:
        found = bf.merged_bounds((item.known_fit or 0, item.known_oom), *bf.outcome_lists([r]))
        item.known_fit, item.known_oom = found[0] or None, found[1]
        item.allocator_budget_bytes = r.allocator_budget_bytes or item.allocator_budget_bytes
        on_probe(f"micro-batch {r.batch} {r.verdict} · peak {gib(r.peak_alloc_bytes)} · {r.seconds:.1f} s")

    meta = {"experiment": plan.experiment.name, "profile": prof.name, "gpu": gpu, "cap_bytes": plan.cap_bytes, "steps": PROBE_STEPS}
    live.add(probe)
    try:  # what was learned stays in the cache, even when stopped
        return bf.search_recorded(guarded, key, meta, known=(fit, oom), on_probe=noted, start=start)
    finally:
        live.discard(probe)
        probe.close()


def _find_batch_command(plan: Plan, name: str) -> str:
    sets = " ".join(f"--set {s}" for s in plan.run_overrides())
    cap = f" --gpu-memory {plan.options.gpu_memory}" if plan.options.gpu_memory else ""
    return f"memlab find-batch --profile {name} --experiment {plan.options.experiment}{cap} --steps {PROBE_STEPS} {sets}".rstrip()
