"""`memlab run`: train one profile headless, in this process, into a run folder."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from memlab.cli.options import (DeviceOpt, EpochsOpt, ExperimentOpt, MaxDocsOpt, ModelOpt, RunsDirOpt, SetOpt, StepsOpt,
                                data_overrides, model_overrides, refuse_early, refuse_flag_and_set, resolve)

EXIT_BY_STATUS = {"finished": 0, "interrupted": 130, "oom": 1, "nan": 1, "error": 1}


def run(
    profile: Annotated[str, typer.Option("--profile", "-p", help="Built-in profile name (memlab profiles) or a TOML file.")],
    experiment: ExperimentOpt = "auto",
    model: ModelOpt = None,
    device: DeviceOpt = "auto",
    runs_dir: RunsDirOpt = "runs",
    steps: StepsOpt = None,
    set_: SetOpt = None,
    batch_size: Annotated[Optional[str], typer.Option("--batch-size", help="Effective batch (train.batch_size), or 'max': find the largest micro-batch that fits and lower accumulation to match.")] = None,
    data: Annotated[Optional[str], typer.Option("--data", help="stdlib | a file or folder | hf:NAME[:CONFIG]")] = None,
    text_field: Annotated[Optional[str], typer.Option("--text-field", help="Field holding the text (json, parquet, csv or hf: data).")] = None,
    tokenizer: Annotated[Optional[str], typer.Option("--tokenizer", help="bpe:N | a tokenizer.json file | hf:NAME")] = None,
    streaming: Annotated[Optional[bool], typer.Option("--streaming/--no-streaming", help="Stream an hf: dataset.")] = None,
    max_docs: MaxDocsOpt = None,
    epochs: EpochsOpt = None,
    events: Annotated[Optional[str], typer.Option("--events", help="Stream events as JSON lines: '-' for stdout, or a file path.")] = None,
    no_meters: Annotated[bool, typer.Option("--no-meters", help="Turn off per-phase memory resets and the NVML sampler (to measure the meters' cost).")] = False,
    memory_snapshot: Annotated[bool, typer.Option("--memory-snapshot", help="CUDA: record the allocator over the first measured steps; writes a memory snapshot (open it at pytorch.org/memory_viz) and a breakdown beside the estimate.")] = False,
    label: Annotated[Optional[str], typer.Option("--label", help="Name the run's profile in results (default: the profile's name), e.g. gradcp@b16; sweep --vary sets it.")] = None,
    nproc: Annotated[Optional[int], typer.Option("--nproc", help="Run N ranks on this host through torchrun (one GPU each on CUDA); the profile picks ddp or fsdp (e.g. ddp_bf16, fsdp_bf16).")] = None,
    force: Annotated[bool, typer.Option("--force", help="CPU: run even when the predicted host peak is more than the memory available.")] = False,
) -> None:
    """Train one technique profile and measure it (memory by phase, speed, quality)."""
    from memlab.core.environment import check_device_name

    check_device_name(device)
    refuse_flag_and_set(set_, steps=steps, epochs=epochs, batch_size=batch_size, data=data, text_field=text_field,
                        tokenizer=tokenizer, max_docs=max_docs, streaming=streaming)
    overrides = model_overrides(model) + list(set_ or []) + data_overrides(data, text_field, tokenizer, streaming, max_docs, epochs, steps)
    overrides += _batch_size_items(batch_size)
    refuse_early(experiment, lambda device_type: resolve(experiment, profile, device_type, overrides))
    if label is not None:
        checked_label(label)

    from memlab.core import distributed  # torch from here on: the input is known to be good
    from memlab.core.environment import resolve_device
    from memlab.core.techniques import apply_to_process

    dev = resolve_device(device)
    _check_ranks(nproc, batch_size)
    dev = distributed.init_from_env(dev)  # under torchrun: the process group, and this rank's device (cuda:LOCAL_RANK)
    max_batch = _apply_batch_size(batch_size, experiment, profile, dev, overrides)
    exp, prof = resolve(experiment, profile, dev.type, overrides)
    if label is not None:
        prof.name = checked_label(label)
    if dev.type == "cpu" and not force:  # before anything allocates: the host has no allocator cap to fail cleanly
        _refuse_over_host(exp, prof)
    if nproc is not None:  # checked here, so a bad combination is one line before any process starts
        args = ["run", "--profile", profile, "--experiment", experiment, "--device", device, "--runs-dir", runs_dir]
        args += [a for item in overrides for a in ("--set", item)] + (["--events", events] if events else [])
        args += (["--label", label] if label is not None else []) + (["--no-meters"] if no_meters else [])
        _exec_torchrun(nproc, args + (["--memory-snapshot"] if memory_snapshot else []), exp, prof, dev)
    apply_to_process(prof)  # the allocator's settings, before anything initializes CUDA
    _watch_supervisor(events)
    sinks, snapshot = _sinks(events, memory_snapshot, dev)
    status = _run_and_report(exp, prof, dev, runs_dir, sinks, snapshot, quiet=events == "-",
                             meters=not no_meters, max_batch=max_batch)
    raise typer.Exit(EXIT_BY_STATUS.get(status, 1))


def _refuse_over_host(exp, prof) -> None:
    from memlab.core.predict.host import refuse_over_host

    refuse_over_host(exp, prof)


def _watch_supervisor(events: str | None) -> None:
    """A supervisor's child (events on stdout, MEMLAB_SUPERVISED set): if the supervisor dies, stop, not run on
    unwatched."""
    from memlab.core.supervisor import SUPERVISED_ENV, honour_sigint, stop_when_orphaned

    if events == "-" and os.environ.get(SUPERVISED_ENV):
        honour_sigint()
        stop_when_orphaned()


def _check_ranks(nproc: int | None, batch_size: str | None) -> None:
    """Several ranks: `--nproc N` re-executes this command under torchrun (run); under torchrun (ours or the user's,
    multi-host included) every rank runs this same command and only rank 0 speaks and writes."""
    from memlab.core import distributed
    from memlab.core.errors import MemlabError

    if nproc is not None and distributed.launched_by_torchrun():
        raise MemlabError("--nproc starts torchrun itself; under torchrun leave it out (torchrun's --nproc-per-node sets the ranks)")
    if batch_size == "max" and (nproc is not None or distributed.world_size() > 1):
        raise MemlabError("--batch-size max probes one GPU at a time; find it without --nproc, then pass --batch-size <that x ranks>")


def checked_label(label: str) -> str:
    """A --label as the profile's name: one line of printable text (run folders replace what a path cannot hold)."""
    from memlab.core.errors import MemlabError

    if not label.strip() or not label.isprintable() or len(label) > 100:
        raise MemlabError(f"--label {label!r}: give a short name on one line (at most 100 characters), e.g. compile_budget@budget=0.25")
    return label.strip()


def _batch_size_items(batch_size: str | None) -> list[str]:
    """--batch-size N as an override (max is measured later, by _apply_batch_size)."""
    from memlab.core.errors import MemlabError

    if batch_size is None or batch_size == "max":
        return []
    try:
        value = int(batch_size)
    except ValueError:
        value = 0
    if value < 1:  # said as the flag, not as the --set item it becomes
        raise MemlabError(f"--batch-size {batch_size!r}: expected a positive integer or 'max'")
    return [f"train.batch_size={value}"]


def _apply_batch_size(batch_size: str | None, experiment: str, profile: str, dev, overrides: list[str]) -> int | None:
    """--batch-size max: the largest micro-batch that fits, measured, with accumulation.steps appended to
    `overrides` to keep the effective batch; returns it (None for any other --batch-size)."""
    if batch_size != "max":
        return None
    from memlab.cli.batch import resolve_max_batch  # find-batch

    exp, prof = resolve(experiment, profile, dev.type, overrides)
    max_batch, accum = resolve_max_batch(exp, prof, dev, profile_ref=profile, experiment_ref=experiment, overrides=overrides)
    overrides.append(f"accumulation.steps={accum}")
    return max_batch


def _sinks(events: str | None, memory_snapshot: bool, dev) -> tuple[list, object | None]:
    """Where this rank's events go: rank 0 to the console (or JSON lines on stdout) and an --events file; the
    other ranks only report their own failure. With --memory-snapshot, the allocator recorder too."""
    from memlab.core import distributed
    from memlab.core.events import JsonLinesSink

    from memlab.cli.console import ConsoleSink

    rank0 = distributed.env_rank() == 0
    sinks: list = []
    if not rank0:
        sinks.append(_RankFailures(distributed.env_rank()))  # other ranks: no progress, no events; a failure is one line
    elif events == "-":  # a supervisor reads it: if it goes away, stop as interrupted (keeping the folder)
        from memlab.core.supervisor import interrupt_self

        sinks.append(JsonLinesSink(stream=sys.stdout, on_reader_gone=interrupt_self))
    else:
        if events:
            sinks.append(_events_file(events))
        sinks.append(ConsoleSink())
    snapshot = None
    if memory_snapshot and rank0:
        from memlab.core.memsnapshot import SnapshotSink  # issue 5: CUDA only (a DeviceError on CPU)

        snapshot = SnapshotSink(dev)
        sinks.append(snapshot)
    return sinks, snapshot


def _run_and_report(exp, prof, dev, runs_dir: str, sinks: list, snapshot, *, quiet: bool, meters: bool, max_batch: int | None) -> str:
    """The run itself; then, on rank 0 unless events go to stdout, its summary (and the snapshot's report)."""
    from memlab.core import distributed
    from memlab.core.errors import MemlabError
    from memlab.core.runner import run_profile

    from memlab.cli.console import print_summary

    try:
        summary, run_dir = run_profile(exp, prof, runs_dir=Path(runs_dir), device=dev, sinks=tuple(sinks), meters=meters, extra_info={"max_batch": max_batch, "process_start": _process_start()})
    except MemlabError:
        for sink in sinks:  # refused before any work: an --events file this command made (still empty) goes too
            if isinstance(sink, _EventsFile):
                sink.close()
                sink.remove_if_unused()
        raise
    if not quiet and distributed.env_rank() == 0:
        print_summary(summary, run_dir)
        if snapshot is not None:
            from memlab.cli.batch import print_memory_report

            print_memory_report(snapshot.result, snapshot.estimate)
    for sink in sinks:
        sink.close()
    return summary["status"]


def _events_file(path: str):
    """`--events FILE`: its folder is made as --runs-dir's is; a path that cannot be written is one line."""
    from memlab.core.errors import MemlabError

    folder = Path(path).parent
    if folder.exists() and not folder.is_dir():
        raise MemlabError(f"--events {path}: {folder} is a file, not a folder; give a file path, or '-' for stdout")
    made = [p for p in (folder, *folder.parents) if not p.exists()]
    try:
        folder.mkdir(parents=True, exist_ok=True)
        return _EventsFile(path, existed=Path(path).exists(), made=made)
    except OSError as e:
        raise MemlabError(f"--events {path}: cannot write there ({e.strerror or e}); give a file path, or '-' for stdout") from None


class _EventsFile:
    """The --events file's sink, which can take back what it made when the run is refused before any event."""

    def __init__(self, path: str, *, existed: bool, made: list[Path]):
        from memlab.core.events import JsonLinesSink

        self.path, self.existed, self.made = Path(path), existed, made
        self._sink = JsonLinesSink(path=path)
        self.emit, self.close = self._sink.emit, self._sink.close

    def remove_if_unused(self) -> None:
        if self.existed or self.path.stat().st_size:
            return
        self.path.unlink(missing_ok=True)
        for folder in self.made:  # innermost first; each only if it is still empty
            try:
                folder.rmdir()
            except OSError:
                break


class _RankFailures:
    """The sink of ranks other than 0 under torchrun: silent, but for their own failure as one line on stderr."""

    def __init__(self, rank: int):
        self.rank = rank

    def emit(self, ev: dict) -> None:
        if ev["event"] == "failed" and ev.get("reason") != "interrupted":
            typer.echo(f"memlab: rank {self.rank}: {ev['reason']}: {ev.get('message')}", err=True)

    def close(self) -> None:
        pass


def _exec_torchrun(nproc: int, args: list[str], exp, prof, dev) -> None:
    """Replace this process by `python -m torch.distributed.run --standalone --nproc_per_node N -m memlab <args>`.

    Replacing (not spawning) keeps the pid, so a supervisor's SIGINT reaches torchrun, which forwards it to every rank.
    """
    import os

    import torch

    from memlab.core import distributed
    from memlab.core.errors import DeviceError, MemlabError
    from memlab.core.techniques import check_techniques

    if nproc < 1:
        raise MemlabError(f"--nproc must be at least 1, got {nproc}")
    check_techniques(exp, prof, dev, nproc)  # the ranks' device is one GPU each: checked as this process sees them
    if dev.type == "cuda" and torch.cuda.device_count() < nproc:
        raise DeviceError(f"--nproc {nproc}: this host has {torch.cuda.device_count()} visible GPU(s); one rank needs one GPU")
    env = dict(os.environ)
    env["MEMLAB_PROCESS_START"] = repr(_process_start())  # time to first step counts from this command, not the ranks
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))  # (torchrun would say 1, loudly)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, distributed.torchrun_argv(nproc, args), env)


def _process_start() -> float:
    """When this memlab command started (so time to first step includes imports, as a user waits for them): memlab's
    own clock, taken as `memlab` starts; not the process's creation time, which is the shell's when a shell execs
    memlab (`bash -c '... && exec memlab run'`)."""
    import os

    from memlab.cli import STARTED_AT

    if os.environ.get("MEMLAB_PROCESS_START"):  # set by `memlab run --nproc` for the ranks it starts
        try:
            return float(os.environ["MEMLAB_PROCESS_START"])
        except ValueError:
            pass
    return STARTED_AT


def register(app: typer.Typer) -> None:
    app.command("run")(run)
