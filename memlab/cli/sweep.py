"""`memlab sweep`: run a queue of profiles headless, one child process per run, through the core queue supervisor."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

from memlab.cli.options import DeviceOpt, ExperimentOpt, GpusOpt, ModelOpt, RunsDirOpt, SetOpt, StepsOpt, model_overrides, refuse_early
from memlab.core.units import gib

if TYPE_CHECKING:
    from memlab.core.lanes import Lane, LaneQueue
    from memlab.core.queue import QueueOutcome
    from memlab.core.supervisor import ChildSpec


def sweep(
    profiles: Annotated[str, typer.Option("--profiles", help="Comma-separated profile names or TOML paths, run in this order.")],
    experiment: ExperimentOpt = "auto",
    model: ModelOpt = None,
    device: DeviceOpt = "auto",
    runs_dir: RunsDirOpt = "runs",
    steps: StepsOpt = None,
    set_: SetOpt = None,
    nproc: Annotated[Optional[int], typer.Option("--nproc", help="Run each profile on N ranks through torchrun (memlab run --nproc); profiles must be ddp or fsdp.")] = None,
    vary: Annotated[Optional[str], typer.Option("--vary", help="One knob over several values, section.key=v1,v2,...: one run per profile and value, named e.g. compile_budget@budget=0.5.")] = None,
    gpus: GpusOpt = None,
    redo: Annotated[bool, typer.Option("--redo", help="Run every item again, also those already finished in --runs-dir.")] = False,
) -> None:
    """Train several profiles, each in a fresh process, one at a time on each GPU; a failed run is recorded and the sweep goes on.

    How each run ends:
    finished: it completed · oom: out of memory · nan: the loss diverged
    interrupted: Ctrl-C or SIGTERM; its folder is kept with what it had
    rejected: the child refused its input (e.g. a technique this device lacks)
    crashed: it ended without saying how (SIGKILL from the OOM killer, a segfault), or its GPU failed (that GPU's lane is taken out)
    error: another failure the run reported
    skipped: not started (the sweep was stopped first)

    Resumes: a run already finished in --runs-dir (same experiment, profile or --vary value, and ranks) is not run
    again; --redo runs it again. Several GPUs (--gpus): one lane each, the next run to whichever lane is free.

    Exit status: 0 when every run finished, 1 when any did not, 2 for bad input, 130 when stopped by Ctrl-C.
    """
    from memlab.core.environment import check_device_name

    from memlab.cli.options import check_token_cache, refuse_flag_and_set

    check_device_name(device)
    refuse_flag_and_set(set_, steps=steps)
    overrides = model_overrides(model) + list(set_ or []) + ([f"train.steps={steps}"] if steps is not None else [])
    names = _profile_names(profiles)
    items = [(name, label, overrides + extra) for name in names for label, extra in vary_items(name, vary)]
    # each run resolved once with the experiment, --set and its --vary value, so a typo or a bad value fails before
    # the first hour of runs (exit 2) and before the runs folder is made; before torch is imported where it can
    refuse_early(experiment, lambda device_type: _resolve_all(items, experiment, device_type, vary, nproc))

    from memlab.core.environment import device_type
    from memlab.core.lanes import idle_gpus, plan_lanes
    from memlab.core.runstore import ensure_runs_dir
    from memlab.core.supervisor import ChildSpec

    dev_type = device_type(device)  # the children import torch; this process, on the CPU, need not
    resolved = _resolve_all(items, experiment, dev_type, vary, nproc)  # what `auto` means here decides what refuse_early could not
    keys = [key for key, _ in resolved]
    check_token_cache([data for _, data in resolved])
    lanes = plan_lanes(gpus, dev_type, nproc)  # a GPU not visible, listed twice, fewer GPUs than ranks: exit 2 here
    ensure_runs_dir(Path(runs_dir))  # and a runs folder no child could write to, once (after the input is known good)
    extra = ["--nproc", str(nproc)] if nproc is not None else []  # the child becomes torchrun
    specs = [ChildSpec(profile=name, experiment=experiment, device=dev_type, runs_dir=runs_dir, overrides=item_overrides,
                       extra_args=extra, label=label) for name, label, item_overrides in items]
    for gpu in idle_gpus(lanes, gpus) if lanes[0].indices else []:
        typer.echo(f"note: GPU {gpu} stays idle: --nproc {nproc} takes {nproc} GPUs a run", err=True)
    todo = _not_finished_yet(list(enumerate(specs, 1)), keys, runs_dir, redo)
    outcomes, stopped = _run_stoppable(_make_queue(len(specs), lanes), todo)
    _report(len(specs), len(todo), outcomes, stopped, runs_dir)


def _report(total: int, queued: int, outcomes: list, stopped: bool, runs_dir: str) -> None:
    """The sweep's last line and exit status: 0 every run finished (now or before), 1 some did not, 130 stopped."""
    done = total - queued + sum(o.status == "finished" for o in outcomes)
    skipped = sum(o.status == "skipped" for o in outcomes)
    tail = f" (stopped early; {skipped} not run)" if stopped else ""
    typer.echo(f"sweep: {done}/{total} finished{tail}; compare with: memlab table {runs_dir}", err=True)
    if stopped:
        raise typer.Exit(130)
    if done < total:
        raise typer.Exit(1)


def _not_finished_yet(numbered: list[tuple[int, ChildSpec]], keys: list[tuple[str, str, int]], runs_dir: str,
                      redo: bool) -> list[tuple[int, ChildSpec]]:
    """The items to run: without --redo, those whose run (same profile name, experiment id and ranks) has not
    finished in the runs folder yet; each one passed over says so, with its folder."""
    from memlab.core.runfolder import finished_runs

    done = {} if redo else finished_runs(runs_dir)
    todo = []
    for (i, spec), key in zip(numbered, keys):
        if key in done:
            typer.echo(f"[{i}/{len(numbered)}] {spec.name}: already finished · {done[key]} (--redo runs it again)", err=True)
        else:
            todo.append((i, spec))
    return todo


def _profile_names(profiles: str) -> list[str]:
    from memlab.cli.options import profile_list

    return profile_list(profiles)


def vary_items(name: str, vary: str | None) -> list[tuple[str, list[str]]]:
    """--vary section.key=v1,v2 -> one (label, [--set item]) per value, labelled `name@key=value` so that table and
    plot tell the runs apart; without --vary, the profile once under its own name."""
    from memlab.core.errors import MemlabError

    if vary is None:
        return [("", [])]
    lhs, _, rhs = vary.partition("=")
    parts = lhs.strip().split(".")
    values = [v.strip() for v in rhs.split(",")]
    if len(parts) != 2 or not all(parts) or not all(values):
        raise MemlabError(f"--vary {vary!r}: expected section.key=v1,v2,..., e.g. checkpointing.budget=0,0.25,0.5,0.75,1")
    return [(f"{name}@{parts[1]}={v}", [f"{lhs.strip()}={v}"]) for v in values]


def _resolve_all(items: list[tuple[str, str, list[str]]], experiment: str, device_type: str, vary: str | None,
                 nproc: int | None) -> list[tuple[tuple[str, str, int], Any]]:
    return [_resolve_one(name, label, experiment, device_type, item_overrides, vary, nproc) for name, label, item_overrides in items]


def _resolve_one(name: str, label: str, experiment: str, device_type: str, overrides: list[str], vary: str | None,
                 nproc: int | None) -> tuple[tuple[str, str, int], Any]:
    """Resolve one run (a bad input fails here): its identity in the runs folder (profile name as the run records
    it, experiment id, ranks), and its data (whose token cache must be writable)."""
    from memlab.cli.options import resolve
    from memlab.core.errors import MemlabError

    try:
        exp, prof = resolve(experiment, name, device_type, overrides)
    except MemlabError as e:
        raise MemlabError(f"--vary {vary}: {e}" if vary else str(e)) from None
    return (label or prof.name, exp.fingerprint(), nproc or 1), exp.data


def _make_queue(total: int, lanes: list[Lane]) -> LaneQueue:
    """The lanes' queue with sweep's progress: a line when a run starts, its progress while it trains (in place on
    a terminal with one lane; plain lines every 10% otherwise), a line when it ends; a GPU lane named in each."""
    import sys

    from memlab.core.lanes import LaneQueue

    last_steps: dict[int, int] = {}
    lane_of: dict[int, Lane] = {}
    plain = len(lanes) > 1  # several runs at once: no line drawn in place
    progress = {lane: RunProgress(sys.stderr, interactive=False if plain else None, label=_tag(lane)) for lane in lanes}

    def on_start(i: int, spec: ChildSpec, lane: Lane) -> None:
        lane_of[i] = lane
        progress[lane].reset()
        typer.echo(f"[{i}/{total}{_tag(lane)}] {spec.name} ...", err=True)

    def on_event(i: int, ev: dict) -> None:
        if ev.get("event") == "step" and isinstance(ev.get("step"), int) and i in lane_of:
            last_steps[i] = ev["step"] + 1
            progress[lane_of[i]].step(ev)

    def on_result(outcome: QueueOutcome) -> None:
        lane = lane_of.get(outcome.key)
        if lane is not None:
            progress[lane].clear()
        if outcome.status != "skipped":
            typer.echo(f"[{outcome.key}/{total}{_tag(lane)}] {_result_line(outcome, last_steps.get(outcome.key, 0))}", err=True)

    return LaneQueue(lanes, on_start=on_start, on_event=on_event, on_result=on_result)


def _tag(lane: Lane | None) -> str:
    """' gpu 1' for a GPU lane (what the progress lines name), '' for the CPU's one."""
    return f" {lane.name}" if lane is not None and lane.indices else ""


class RunProgress:
    """A child's training progress from its step events: `step 120/300 · 51,000 tok/s · ETA 0:42`."""

    def __init__(self, stream, interactive: bool | None = None, clock=time.monotonic, label: str = ""):
        self.stream, self.clock, self.label = stream, clock, label  # label: the lane, e.g. " gpu 1"
        self.interactive = stream.isatty() if interactive is None else interactive
        self.reset()

    def reset(self) -> None:
        self._t0: float | None = None
        self._first = 0
        self._last_draw = 0.0
        self._last_tenth = -1
        self._drawn = False

    def step(self, ev: dict) -> None:
        done, total = ev["step"] + 1, ev.get("total_steps") or 0
        now = self.clock()
        if self._t0 is None:
            self._t0, self._first = now, done
        line = self.line(done, total, ev.get("tokens_per_s"), now)
        if self.interactive:
            if now - self._last_draw >= 0.1 or done == total:
                self.stream.write("\r\x1b[2K" + line)
                self.stream.flush()
                self._last_draw, self._drawn = now, True
        else:
            tenth = 10 * done // max(1, total)
            if tenth != self._last_tenth:
                self._last_tenth = tenth
                self.stream.write(line + "\n")
                self.stream.flush()

    def line(self, done: int, total: int, tokens_per_s: float | None, now: float) -> str:
        lane = f"[{self.label.strip()}] " if self.label else ""
        text = f"  {lane}step {done}/{total}" if total else f"  {lane}step {done}"
        if isinstance(tokens_per_s, (int, float)) and tokens_per_s:
            text += f" · {tokens_per_s:,.0f} tok/s"
        steps_timed = done - self._first
        if total and steps_timed > 0 and self._t0 is not None:
            left = (now - self._t0) / steps_timed * (total - done)
            text += f" · ETA {int(left // 60)}:{int(left % 60):02d}"
        return text

    def clear(self) -> None:
        if self.interactive and self._drawn:
            self.stream.write("\r\x1b[2K")
            self.stream.flush()
        self._drawn = False


def _run_stoppable(queue: LaneQueue, items: list[tuple[int, ChildSpec]]) -> tuple[list[QueueOutcome], bool]:
    """Run the queue; the first Ctrl-C stops every lane (each running run keeps what it has, the rest is skipped)."""
    def on_sigint(signum, frame):  # noqa: ARG001
        if queue.stopping:
            return
        typer.echo("\nstopping: the running runs are asked to stop and keep what they have; finished runs are kept", err=True)
        queue.stop()

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        outcomes = queue.run(items)
    finally:
        signal.signal(signal.SIGINT, previous)
    return outcomes, queue.stopping


def _result_line(outcome: QueueOutcome, steps_seen: int) -> str:
    """`bf16: finished in 12.3s · 300 steps · 51,000 tok/s · peak 1.20 GiB · val ppl 31.2 · runs/...`."""
    result = outcome.result
    s = result.summary or {}
    n = s.get("steps", steps_seen)
    detail = f" · {n} step{'' if n == 1 else 's'}" if s or steps_seen else ""
    tps, peak = s.get("tokens_per_s"), s.get("peak_alloc_bytes") or s.get("peak_host_rss_bytes")
    if isinstance(tps, (int, float)) and tps:
        detail += f" · {tps:,.0f} tok/s"
    if isinstance(peak, (int, float)) and peak:
        detail += f" · peak {gib(peak)}"
    if isinstance(s.get("val_ppl"), (int, float)):
        detail += f" · val ppl {s['val_ppl']:.2f}"
    message = f" · {result.message}" if result.status != "finished" and result.message else ""
    return f"{outcome.spec.name}: {result.status} in {outcome.seconds:.1f}s{detail}{message} · {result.run_dir or 'no run folder'}"


def register(app: typer.Typer) -> None:
    app.command("sweep")(sweep)
