"""The run store: one folder per run, written atomically, readable at any moment.

runs/<run_id>/ run.json, events.jsonl, steps.parquet, gpu.parquet, summary.parquet (names in schema.py).
RunStore is a sink: it appends every event to events.jsonl, keeps step and GPU rows, rewrites steps.parquet
every few seconds (temp file + rename, so a reader never sees half a file) and writes summary.parquet and the
final status when the run ends, whatever the reason.
"""

from __future__ import annotations

import os
import secrets
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import polars as pl

from memlab.core import schema
from memlab.core.errors import MemlabError
from memlab.core.events import JsonLinesSink
from memlab.core.runfolder import (RESERVE, DiskFull, RunFolder, atomic_write_json, atomic_write_parquet, disk_full_message,
                                   is_disk_full, read_frame, read_run, reserve_space)


def new_run_id(profile: str) -> str:
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in profile) or "profile"
    return f"{stamp}-{safe}-{secrets.token_hex(2)}"


def ensure_runs_dir(runs_dir: Path, create: bool = True) -> Path:
    """The runs folder, made if missing (unless `create` is off: the TUI makes it with its first run); one line
    (a MemlabError) when it is a file, or cannot be made or written to."""
    if runs_dir.exists() and not runs_dir.is_dir():
        raise MemlabError(f"runs folder {runs_dir} is a file, not a folder; pass a writable --runs-dir")
    if not create and not runs_dir.exists():
        return runs_dir
    try:
        runs_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise MemlabError(f"runs folder {runs_dir} cannot be created ({e.strerror}); pass a writable --runs-dir") from None
    if not os.access(runs_dir, os.W_OK):
        raise MemlabError(f"runs folder {runs_dir} is not writable; pass a writable --runs-dir")
    return runs_dir


def create_run_dir(runs_dir: Path, profile: str) -> tuple[str, Path]:
    """A fresh, uniquely named folder; two memlab processes never get the same one (mkdir is atomic)."""
    ensure_runs_dir(runs_dir)
    for _ in range(100):
        run_id = new_run_id(profile)
        path = runs_dir / run_id
        try:
            path.mkdir()
            return run_id, path
        except FileExistsError:
            continue
    raise MemlabError(f"could not create a unique run folder under {runs_dir}")


def frame(rows: list[dict], schema_: dict[str, pl.DataType]) -> pl.DataFrame:
    return pl.DataFrame([{k: r.get(k) for k in schema_} for r in rows], schema=schema_, orient="row")


RANK_SCHEMA = schema.RANK_SCHEMA  # one row per rank of a distributed run (memlab.core.metrics: per_rank)


# What run.json keeps of the started event (memlab.core.events.StartedEvent).
STARTED_IN_RUN_JSON = ("profile", "experiment", "experiment_id", "environment", "attention_kernel", "device", "world_size", "distributed")


class RunStore:
    """Sink that persists one run. `flush_every_s` bounds what a hard kill (SIGKILL) can lose from steps.parquet."""

    FLUSH_EVERY_S = 5.0

    def __init__(self, path: Path, run_id: str, flush_every_s: float | None = None):
        self.path = Path(path)
        self.run_id = run_id
        self.flush_every_s = self.FLUSH_EVERY_S if flush_every_s is None else flush_every_s
        self._events = JsonLinesSink(path=str(self.path / schema.EVENTS))
        self._steps: list[dict] = []
        self._gpu: list[dict] = []
        self._last_flush = time.monotonic()
        self.run_json: dict[str, Any] = {"schema_version": schema.SCHEMA_VERSION, "run_id": run_id, "status": "running"}
        self._reserve = reserve_space(self.path)  # room for the outcome, should the disk fill up during the run
        self._writing = schema.EVENTS  # the file being written, for a full disk's message

    def write_run_json(self, **fields: Any) -> None:
        self.run_json.update(fields)
        atomic_write_json(self.path / schema.RUN_JSON, self.run_json)

    def emit(self, event: dict[str, Any]) -> None:
        """Persist one event; a full disk is a DiskFull whose message names the file and the folder (the engine
        ends the run with it, and finalize then writes the outcome into the space reserved for it)."""
        self._writing = schema.EVENTS
        try:
            self._emit(event)
        except Exception as e:
            if isinstance(e, DiskFull) or not is_disk_full(e):
                raise
            raise DiskFull(disk_full_message(self._writing, self.path, e)) from e

    def _emit(self, event: dict[str, Any]) -> None:
        kind = event["event"]
        if kind != "gpu_sample":  # samples go to gpu.parquet; events.jsonl keeps a thinned stream (see below)
            self._events.emit(event)
        if kind == "started":
            self.write_run_json(
                status="running",
                pid=os.getpid(),
                started_at=event.get("started_at"),
                **{k: event[k] for k in STARTED_IN_RUN_JSON if k in event},
            )
        elif kind == "step":
            self._steps.append(event)
            if time.monotonic() - self._last_flush > self.flush_every_s:
                self.flush()
        elif kind == "gpu_sample":
            self._gpu.append(event)
            if len(self._gpu) % 10 == 1:  # ~2 per second into the live stream for the TUI; all of them into Parquet
                self._events.emit(event)
        elif kind in ("finished", "failed"):
            self.finalize(event)

    def flush(self) -> None:
        self._writing = schema.STEPS
        if self._steps:
            atomic_write_parquet(self.path / schema.STEPS, frame(self._steps, schema.STEP_SCHEMA))
        if self._gpu:
            self._writing = schema.GPU
            atomic_write_parquet(self.path / schema.GPU, frame(self._gpu, schema.GPU_SCHEMA))
        self._last_flush = time.monotonic()

    def finalize(self, event: dict[str, Any]) -> None:
        """Write the outcome. Never raises: on a full or failing disk each file is tried on its own, the
        earlier complete steps.parquet stays as it was (writes are atomic), and run.json says what failed."""
        self._release_reserve()  # on a full disk, the room for what follows
        summary = dict(event.get("summary") or {})
        status = "finished" if event["event"] == "finished" else event.get("reason", "error")
        summary.update(schema_version=schema.SCHEMA_VERSION, run_id=self.run_id, status=status)
        problems, full = [], str(event.get("message") or "").startswith("disk full")
        ranks = event.get("ranks")  # distributed runs: every rank's own figures, gathered on rank 0
        for what, write in (
            ("steps", self.flush),
            ("summary", lambda: atomic_write_parquet(self.path / schema.SUMMARY, frame([summary], schema.SUMMARY_SCHEMA))),
            *([("ranks", lambda: atomic_write_parquet(self.path / schema.RANKS, frame(ranks, RANK_SCHEMA)))] if ranks else []),
        ):
            try:
                write()
            except OSError as e:
                problems.append(f"{what} not written ({e.strerror or e})")
                full = full or is_disk_full(e)
                if what == "summary":
                    status = "error"  # the figures are lost: not a finished run, whatever training did
        message = "; ".join(filter(None, [event.get("message"), *problems]))
        if full and not message.startswith("disk full"):
            message = f"disk full: {message}"
        try:
            self.write_run_json(
                status=status,
                reason="disk full" if full else event.get("reason"),
                message=message or None,
                ended_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                attention_kernel=summary.get("attention_kernel", self.run_json.get("attention_kernel")),
            )
        except OSError:
            pass  # nothing more can be written here; the supervisor marks a silent child as crashed

    def close(self) -> None:
        self._release_reserve()
        try:
            self._events.close()
        except OSError:
            pass  # its last lines could not be flushed (a full disk): run.json says how the run ended

    def _release_reserve(self) -> None:
        if self._reserve is not None:
            self._reserve.unlink(missing_ok=True)
            self._reserve = None


def mark_status(run_dir: Path, status: str, message: str, replace: bool = False) -> bool:
    """For a child that died without saying how (SIGKILL, segfault): run.json and summary.parquet say so.

    The summary keeps what the folder proves (steps completed, from steps.parquet); every figure it cannot
    know stays null. A folder that already reached an outcome is left as it is, unless `replace` (a lane whose GPU
    failed: the run's own `error` becomes `crashed`, its summary's status too). Never raises: a folder that
    vanished (a child that refused deletes its own) or cannot be written gets nothing; returns whether it was marked.
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        return False
    try:
        return _mark_status(run_dir, status, message, replace)
    except Exception:  # noqa: BLE001 (removed or unwritable meanwhile: the supervisor's outcome stands without it)
        return False


def _mark_status(run_dir: Path, status: str, message: str, replace: bool = False) -> bool:
    try:
        run = read_run(run_dir, gpu=False)
    except ValueError:  # no run.json yet, or a torn one: what the folder name says
        run = RunFolder(run_dir, {"schema_version": schema.SCHEMA_VERSION, "run_id": run_dir.name})
    if run.info.get("status") not in (None, "running") and not replace:
        return False
    (run_dir / RESERVE).unlink(missing_ok=True)  # the space a killed run held for its outcome
    run.info.update(status=status, message=message, ended_at=datetime.now(timezone.utc).isoformat(timespec="seconds"))
    atomic_write_json(run_dir / schema.RUN_JSON, run.info)
    summary = read_frame(run_dir / schema.SUMMARY) if replace else None
    if summary is not None and "status" in summary.columns:
        atomic_write_parquet(run_dir / schema.SUMMARY, summary.with_columns(pl.lit(status).alias("status")))
    elif not (run_dir / schema.SUMMARY).exists():
        atomic_write_parquet(run_dir / schema.SUMMARY, frame([_unfinished_summary(run, status)], schema.SUMMARY_SCHEMA))
    return True


def _unfinished_summary(run: RunFolder, status: str) -> dict:
    """The summary row of a run that never wrote one: who it was and how far it got, no figures."""
    info = run.info
    return {
        "schema_version": schema.SCHEMA_VERSION,
        "run_id": info.get("run_id", run.path.name),
        "profile": (info.get("profile") or {}).get("name"),
        "experiment": (info.get("experiment") or {}).get("name"),
        "experiment_id": info.get("experiment_id"),
        "status": status,
        "device": info.get("device"),
        "steps": run.steps.height if run.steps is not None else 0,
        "started_at": info.get("started_at"),
    }
