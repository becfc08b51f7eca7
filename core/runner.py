"""Run one profile into a run folder: prepares (every refusal), then creates the folder, wires the run store to
the engine, keeps what it had.

This is what `memlab run` calls in its own process (one run = one process: the supervisor spawns it). A refusal
comes from `engine.prepare`, before the folder exists; once the folder exists the run always ends with a status.
"""

from __future__ import annotations

import shutil
import signal
from pathlib import Path
from typing import Any

import torch

from memlab.core import distributed
from memlab.core.config import Experiment, Profile, to_dict
from memlab.core.engine import Interrupted, prepare, train
from memlab.core.errors import MemlabError
from memlab.core.events import MultiSink, Sink
from memlab.core.runfolder import disk_full_message, is_disk_full
from memlab.core.runstore import RunStore, create_run_dir


def _raise_interrupted(signum: int, frame: Any) -> None:
    # Several ranks: a first signal asks every rank to stop at the same step (the flag travels with the loss's
    # all-reduce, see memlab.core.distributed), so the run still ends with one summary; a second one stops now.
    if distributed.world_size() > 1 and not distributed.stop_requested():
        distributed.request_stop()
        return
    raise Interrupted(f"signal {signum}")


def run_profile(
    experiment: Experiment,
    profile: Profile,
    *,
    runs_dir: Path,
    device: torch.device,
    sinks: tuple[Sink, ...] = (),
    meters: bool = True,
    extra_info: dict[str, Any] | None = None,
) -> tuple[dict[str, Any], Path | None]:  # run folder: None on ranks other than 0
    prepared = prepare(experiment, profile, device)  # every refusal (MemlabError), before the folder exists
    run_id = run_dir = store = None
    if distributed.env_rank() == 0:  # under torchrun only rank 0 writes the run folder; the others report to it
        run_id, run_dir = create_run_dir(Path(runs_dir), profile.name)
        store = _open_store(run_dir, run_id, experiment, profile, device)
    sink = MultiSink(store, *sinks)
    previous = signal.signal(signal.SIGTERM, _raise_interrupted) if _main_thread() else None
    # several ranks: SIGINT too raises the stop flag first (torchrun forwards a Ctrl-C to each rank as SIGINT)
    previous_int = signal.signal(signal.SIGINT, _raise_interrupted) if _main_thread() and distributed.world_size() > 1 else None
    try:
        info = {"run_dir": str(run_dir) if run_dir else None, **(extra_info or {})}
        summary = train(experiment, profile, sink, device=device, run_id=run_id, meters=meters, extra_info=info, prepared=prepared)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
        if previous_int is not None:
            signal.signal(signal.SIGINT, previous_int)
    if store is not None:
        store.close()
    return summary, run_dir


def _open_store(run_dir: Path, run_id: str, experiment: Experiment, profile: Profile, device: torch.device) -> RunStore:
    """The run's store with run.json written: what was asked for is on disk from the start, so even a run that dies
    in setup says what it was. A disk too full for that is one line (MemlabError), and the empty folder goes."""
    try:
        store = RunStore(run_dir, run_id)
        store.write_run_json(profile=to_dict(profile), experiment=to_dict(experiment), experiment_id=experiment.fingerprint(), device=device.type)
        return store
    except OSError as e:
        shutil.rmtree(run_dir, ignore_errors=True)
        if is_disk_full(e):
            raise MemlabError(disk_full_message("run.json", run_dir.parent, e)) from None
        raise MemlabError(f"cannot write the run folder {run_dir} ({e.strerror or e}); pass a writable --runs-dir") from None


def _main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()
