"""Doing a study's work, in three phases, each item once: every profile's max micro-batch; a run of every profile at
the common effective batch; with --at-max, a run of every profile at its own max (another optimisation: its
perplexity is not comparable). One child process per run through the queue supervisor (memlab.core.queue), so a
refused, failed or crashed profile is recorded and the study goes on. State is saved after every item; `stop()`
(Ctrl-C) ends the running children (each keeps its folder), starts nothing more, and leaves the rest for a resume.

Lanes (memlab.core.lanes, `--gpus`): the searches and the runs are spread over the GPUs given to this invocation,
one at a time on each; a resumed study uses whatever GPUs it is given. The phases are one queue (study.ready): a
free lane takes the next search, else the next run whose search has ended, so no lane waits for the slowest search.
A run at the common batch need not even wait for its own search to end: once a probe has fitted its micro-batch, it
will not be split (on a 4-GPU H200 the study ended 26 s after its slowest search, which was its own run's time).
With `--lanes N` (N searches share each GPU) the runs start once every search has ended: a timed run needs its GPU
to itself.
"""

from __future__ import annotations

import shlex
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from memlab.core.gpu_memory import MEMORY_ENV
from memlab.core.lanes import CPU_LANE, Lane, LaneQueue, drain_on_lanes, map_on_lanes, names_gpu_fault, nvml_fault
from memlab.core.queue import QueueOutcome
from memlab.core.study.maxbatch import LiveProbes, find_max
from memlab.core.study.plan import Plan
from memlab.core.study.ready import ReadyItems
from memlab.core.study.state import Item, StudyState
from memlab.core.supervisor import ChildSpec

Say = Callable[[str], None]
TRAIN_KINDS = ("common", "at_max")


class Study:
    def __init__(self, plan: Plan, state: StudyState, out: Path, say: Say, lanes: Sequence[Lane] = (CPU_LANE,)):
        self.plan, self.state, self.out, self.say = plan, state, out, say
        self.lanes = list(lanes)  # this invocation's GPUs (--gpus): a resumed study uses what it is given now
        self.out_lanes: set[Lane] = set()  # lanes whose GPU failed: they take nothing more
        self.stopping = False
        self._run_queues: set[LaneQueue] = set()  # the runs in flight, one queue each
        self.live = LiveProbes()  # the max-batch probes in flight: a stop cancels them
        self.progress = Progress(self._pending_counts, say, lanes=plan.lanes * len(self.lanes), run_lanes=len(self.lanes))
        self._lock = threading.RLock()  # lanes: one state file, one progress line at a time

    def stop(self) -> None:
        self.stopping = True
        self.live.cancel_all()
        with self._lock:
            queues = list(self._run_queues)
        for q in queues:
            q.stop()

    def run(self) -> None:
        """Do what is not final yet; returns when done or stopped (see `stopping`)."""
        kinds = TRAIN_KINDS if self.plan.options.at_max else TRAIN_KINDS[:1]
        if self.plan.lanes == 1:
            self._one_queue(("max", *kinds))
            return
        self._max_phase()  # N searches share each GPU: a timed run needs its GPU to itself, so the runs come after
        if not self.stopping:
            self._one_queue(kinds)

    # ------------------------------------------------------------------------------------------ one queue

    def _one_queue(self, kinds: Sequence[str]) -> None:
        """The items of `kinds` (searches first, then runs) in one queue over the lanes: a free lane takes the next
        search, else the next run whose search has ended (ReadyItems), else waits for one to end."""
        items = [self.state.item(kind, name) for kind in kinds for name in self.plan.options.profiles]
        ready = ReadyItems([i for i in items if not i.final], self._needs)

        def work(item: Item, lane: Lane) -> None:
            try:
                self._max_item(item.profile, lane) if item.kind == "max" else self._train_item(item, lane)
            finally:
                ready.ended(item)

        drain_on_lanes(lambda lane: ready.take(lambda: self.stopping or lane in self.out_lanes), work, self.lanes,
                       stopping=lambda: self.stopping, out=self.out_lanes)
        if ready.left and not self.stopping and set(self.lanes) <= self.out_lanes:
            self.say(f"every GPU lane failed ({', '.join(lane.name for lane in self.out_lanes)}): "
                     f"{len(ready.left)} item(s) not started; resume with other --gpus")

    def _needs(self, item: Item) -> list[str]:
        """The keys of the items `item` waits for: a run, its profile's search (and the baseline's, for
        --batch baseline-max); a run at the profile's own max, its common-batch run too (a refusal there is final)."""
        if item.kind == "max":
            return []
        needs = [] if self._fitted_already(item) else [f"max/{item.profile}"]
        if item.kind == "at_max":
            return needs + [f"common/{item.profile}"]
        mode = self.plan.options.batch
        return needs if mode == "experiment" or mode.isdigit() else needs + ["max/baseline"]

    def _fitted_already(self, item: Item) -> bool:
        """A run at the common batch whose micro-batch (the batch over the profile's own accumulation) a probe of its
        search in flight has fitted: _split will not split it further, whatever the search ends at."""
        mode = self.plan.options.batch
        if item.kind != "common" or not self.plan.on_cuda or not (mode == "experiment" or mode.isdigit()):
            return False
        batch = self.plan.experiment.train.batch_size if mode == "experiment" else int(mode)
        steps = self.plan.profiles[item.profile].accumulation.steps
        return batch % steps == 0 and (self.state.item("max", item.profile).known_fit or 0) >= batch // steps

    def _train_item(self, item: Item, lane: Lane) -> None:
        """One run on `lane`, through a queue of its own (a GPU fault takes the lane out; a stop ends the child)."""
        spec = self._spec(item)
        if spec is None:
            with self._lock:
                self.state.save(self.out)
            return
        queue = LaneQueue([lane], on_start=self._started, on_event=self._event, on_result=self._ended)
        with self._lock:
            self._run_queues.add(queue)
            if self.stopping:  # a stop that came before this queue existed
                queue.stop()
        try:
            queue.run([(item, spec)])
        finally:
            with self._lock:
                self._run_queues.discard(queue)
                self.out_lanes |= set(queue.out)

    # ------------------------------------------------------------------------------------------ max batch

    def _max_phase(self) -> None:
        """One search at a time on each GPU lane, or with --lanes N, N at once on each (each in its own capped child
        processes: memory only, no timing is taken from a search)."""
        names = self.plan.options.profiles
        slots = [lane for lane in self.lanes for _ in range(self.plan.lanes)]
        map_on_lanes(self._max_item, names, slots, stopping=lambda: self.stopping, out=self.out_lanes)

    def _max_item(self, name: str, lane: Lane = CPU_LANE) -> None:
        item = self.state.item("max", name)
        if item.final or self.stopping:
            return
        where = f" on {lane.name}" if lane.indices else ""
        with self._lock:
            item.lane = lane.name if lane.indices else ""
            self.progress.start(item, "max batch " + ("search" if self.plan.on_cuda else "(predicted: CPU)") + where)
        t0 = time.monotonic()
        find_max(self.plan, item, lambda line: self.say(f"  {name}: {line}"), lambda: self.stopping, self.live, env=lane.env,
                 apart=len(self.lanes) * self.plan.lanes > 1)
        self._check_gpu(item, lane)
        item.seconds = time.monotonic() - t0
        with self._lock:
            self.progress.end(item, _max_line(item))
            self.state.save(self.out)

    def _check_gpu(self, item: Item, lane: Lane) -> None:
        """A search that failed because its GPU did: the item is `crashed` (tried again on a resume) and the lane
        is taken out; the other lanes go on."""
        if item.status != "error" or not lane.indices:
            return
        why = names_gpu_fault(item.message) or nvml_fault(lane)
        if why:
            with self._lock:
                self.out_lanes.add(lane)
                left = len(self.lanes) - len(self.out_lanes)
            item.status, item.message = "crashed", f"{lane.name} failed: {why}; the lane is taken out ({left} lane(s) go on)"

    # ------------------------------------------------------------------------------------------ training runs

    def _event(self, item: Item, ev: dict) -> None:
        with self._lock:  # the lanes' children report at once; the progress is one
            self.progress.event(item, ev)

    def _started(self, item: Item, spec: ChildSpec, lane: Lane) -> None:
        what = f"{'at its own max' if item.kind == 'at_max' else 'common batch'} {item.batch}"
        with self._lock:
            item.lane = lane.name if lane.indices else ""
            self.progress.start(item, what + (f" on {lane.name}" if lane.indices else ""))

    def _spec(self, item: Item) -> ChildSpec | None:
        """The child that trains `item`, or None with the item's status saying why it cannot run."""
        batch, accumulation, why = self._batch_for(item)
        if batch is None:
            fits_none = self.state.item("max", item.profile).status == "does not fit"  # final: a resume cannot change it
            item.status = "rejected" if why.startswith("refused") else "does not fit" if fits_none else "not run"
            item.message = why
            return None
        item.batch, item.accumulation = batch, accumulation
        overrides = self.plan.run_overrides() + [f"train.batch_size={batch}"] + ([f"accumulation.steps={accumulation}"] if accumulation else [])
        env = {MEMORY_ENV: str(self.plan.cap_bytes)} if self.plan.on_cuda and self.plan.cap_bytes else {}
        spec = ChildSpec(profile=item.profile, experiment=self.plan.options.experiment, device=self.plan.options.device,
                         runs_dir=str(self.out / "runs"), overrides=overrides, env=env)
        item.command = command_line(spec)
        return spec

    def _batch_for(self, item: Item) -> tuple[int | None, int | None, str]:
        """(effective batch, accumulation override or None, why not)."""
        own = self.state.item("max", item.profile)
        if own.status == "rejected":
            return None, None, f"refused: {own.message}"
        at_common = self.state.items.get(f"common/{item.profile}")
        if item.kind == "at_max" and at_common is not None and at_common.status == "rejected":
            return None, None, f"refused: {at_common.message}"  # a refusal is the profile's, whatever the batch
        if item.kind == "at_max":
            size = own.max_batch if self.plan.on_cuda else own.predicted_max_batch
            return (size, 1, "") if size else (None, None, f"its max batch is unknown ({own.status}: {own.message})")
        mode = self.plan.options.batch
        if mode == "experiment":
            return self._split(item.profile, self.plan.experiment.train.batch_size)
        if mode.isdigit():
            return self._split(item.profile, int(mode))
        base = self.state.item("max", "baseline")
        size = base.max_batch if self.plan.on_cuda else base.predicted_max_batch
        return self._split(item.profile, size) if size else (None, None, f"the baseline's max batch is unknown ({base.status}: {base.message})")

    def _split(self, profile: str, batch: int) -> tuple[int | None, int | None, str]:
        """The common batch as micro-batch x accumulation within the micro-batch this profile's search measured:
        the same effective batch (the same math), accumulated where the profile's own micro-batch would not fit
        under the cap; not run where even micro-batch 1 does not fit."""
        own = self.state.item("max", profile)
        if not self.plan.on_cuda or own.status not in ("measured", "does not fit"):  # or in flight (_fitted_already)
            return batch, None, ""
        if not own.max_batch:
            return None, None, f"even micro-batch 1 does not fit under the cap (its max-batch search: {own.message})"
        steps = self.plan.profiles[profile].accumulation.steps
        if batch % steps == 0 and batch // steps <= own.max_batch:
            return batch, None, ""
        steps = next(a for a in range(steps, batch + 1) if batch % a == 0 and batch // a <= own.max_batch)
        return batch, steps, ""

    def _ended(self, outcome: QueueOutcome) -> None:
        item: Item = outcome.key
        result = outcome.result
        if result.status == "skipped":  # not started (a stop, or every lane's GPU failed): left for a resume
            return
        with self._lock:
            item.status, item.message, item.seconds = result.status, result.message, outcome.seconds
            item.run_dir = _relative(result.run_dir, self.out) if result.run_dir else None
            self.progress.end(item, f"{result.status} in {outcome.seconds:.1f} s" + (f" · {result.message}" if result.message and result.status != "finished" else ""))
            self.state.save(self.out)

    def _pending_counts(self) -> list[tuple[str, str]]:
        """(item key, kind) of every item not final yet."""
        kinds = ("max", *TRAIN_KINDS) if self.plan.options.at_max else ("max", "common")
        return [(self.state.item(k, n).key, k) for k in kinds for n in self.plan.options.profiles if not self.state.item(k, n).final]


@dataclass
class _Running:
    t_start: float
    total: int | None = None  # the child's total steps (its started event)
    left_s: float | None = None  # its remaining time at its own pace
    last_print: float = 0.0


class Progress:
    """One line when an item starts and ends, and a run's step count every few seconds, each with the study's ETA:
    what is left, timed by what this study has measured (a running item's own pace for its remaining steps), shared
    by the lanes."""

    EVERY_S = 5.0

    def __init__(self, pending: Callable[[], list[tuple[str, str]]], say: Say, lanes: int = 1, run_lanes: int = 1):
        self.pending, self.say, self.lanes, self.run_lanes = pending, say, lanes, run_lanes
        self.done_s: dict[str, list[float]] = {}
        self.running: dict[str, _Running] = {}  # by item key; several at once on several lanes

    def start(self, item: Item, what: str) -> None:
        self.running[item.key] = _Running(time.monotonic())
        left = self.pending()
        self.say(f"[{item.kind} {item.profile}] {what} · {len(left)} item(s) left · study ETA {self._eta(left)}")

    def end(self, item: Item, line: str) -> None:
        run = self.running.pop(item.key, None)
        took = item.seconds if item.kind == "max" and item.seconds else time.monotonic() - (run.t_start if run else time.monotonic())
        self.done_s.setdefault(item.kind, []).append(took)
        self.say(f"[{item.kind} {item.profile}] {line}")

    def event(self, key: Item, ev: dict) -> None:
        run = self.running.get(key.key)
        if run is None:
            return
        if ev.get("event") == "started":
            run.total = ev.get("total_steps")
        if ev.get("event") != "step" or not isinstance(ev.get("step"), int):
            return
        now = time.monotonic()
        total, step = run.total, ev["step"] + 1
        if isinstance(total, int) and total > 0 and step > 1:
            run.left_s = (now - run.t_start) / step * (total - step)
        if now - run.last_print >= self.EVERY_S:
            run.last_print = now
            self.say(f"  {key.profile}: step {step}" + (f"/{total}" if isinstance(total, int) else "") + f" · study ETA {self._eta(self.pending())}")

    def _eta(self, left: list[tuple[str, str]]) -> str:
        """Each item left at the mean of its class's (max-batch searches, runs) so far, shared by the lanes; a
        running item at its own pace (the longest of those running, as they run side by side)."""
        known = [self.running[key].left_s for key, _ in left if key in self.running and self.running[key].left_s is not None]
        seconds = max(known, default=0.0)
        for key, kind in left:
            if key in self.running and self.running[key].left_s is not None:
                continue
            times = [s for k, v in self.done_s.items() if (k == "max") == (kind == "max") for s in v]
            if not times:
                return "unknown until the first " + ("search" if kind == "max" else "run") + " ends"
            seconds += sum(times) / len(times) / (self.lanes if kind == "max" else self.run_lanes)
        return _duration(seconds)


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s" if m else f"{s}s"


def _max_line(item: Item) -> str:
    pred = f"predicted {item.predicted_max_batch}" if item.predicted_max_batch else "no prediction"
    if item.status == "measured":
        return f"max micro-batch {item.max_batch} ({pred})" + (f" · {item.message}" if item.message else "")
    return f"{item.status}: {item.message}" if item.status != "predicted" else f"max micro-batch {pred} · {item.message}"


def _relative(run_dir: str, out: Path) -> str:
    path = Path(run_dir).resolve()
    try:
        return str(path.relative_to(out.resolve()))
    except ValueError:
        return str(path)


def command_line(spec: ChildSpec) -> str:
    """The child's command as a person would type it (memlab, not this interpreter; no --events)."""
    argv = spec.argv()
    if argv[:3] == [sys.executable, "-m", "memlab"]:
        argv = ["memlab", *argv[3:]]
    if "--events" in argv:
        i = argv.index("--events")
        del argv[i:i + 2]
    env = " ".join(f"{k}={v}" for k, v in spec.env.items())
    return (env + " " if env else "") + shlex.join(argv)
