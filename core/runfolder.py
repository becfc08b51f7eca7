"""One run folder, read in one place and written atomically in one place.

    run = read_run(path)           # run.json, summary row, steps and GPU frames; ValueError (a short reason) if no run
    run.status                     # the summary's outcome, else run.json's, else "incomplete"
    atomic_write_json(path, obj)   # temp file + os.replace: a reader never sees half a file

Readers: memlab.core.compare (many folders: run.json here, summaries in one parquet scan), the TUI's run view and
open-run list, and memlab.core.runstore.mark_status. File names are in memlab.core.schema.
"""

from __future__ import annotations

import errno
import gzip
import io
import json
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import polars as pl

from memlab.core import schema
from memlab.core.errors import MemlabError

# ---------------------------------------------------------------------------------------------- writing


def current_umask() -> int:
    """The process's umask, read without changing it where Linux tells it (/proc), else set and restored at once."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _temp_beside(path: Path) -> tuple[int, str]:
    """A temp file in `path`'s folder, with the mode a plain open() would give it: mkstemp makes it 0600, and a
    rename keeps that, so colleagues on a shared host could not read the results."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o666 & ~current_umask())
    except OSError:
        pass  # a filesystem without modes (e.g. some network mounts): the file is still written
    return fd, tmp


def atomic_write_bytes(path: Path, data: bytes) -> None:
    fd, tmp = _temp_beside(path)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_json(path: Path, obj: Any) -> None:
    atomic_write_bytes(path, (json.dumps(obj, indent=2, default=str) + "\n").encode())


def atomic_write_parquet(path: Path, frame: pl.DataFrame) -> None:
    """As atomic_write_bytes. The file is made in memory and written by Python, so that a full disk is an
    OSError(ENOSPC) as from any other write: polars' own writer says `Invalid thrift: transport error` there."""
    buffer = io.BytesIO()
    frame.write_parquet(buffer)
    atomic_write_bytes(path, buffer.getvalue())


class DiskFull(Exception):
    """A run's file could not be written for want of space; the message is the one line the user reads."""


def disk_full_message(what: str, folder: Path, error: BaseException | None = None) -> str:
    why = error.strerror if isinstance(error, OSError) and error.strerror else "No space left on device"
    return f"disk full: {what} could not be written in {folder} ({why}); free space there, or pass another --runs-dir"


def reserve_space(folder: Path, size: int = 1 << 20) -> Path | None:
    """A file of `size` bytes that holds space for a run's last writes: freed when the disk fills up, it leaves room
    for run.json and summary.parquet to say what happened. None when it cannot be made (the disk is full already)."""
    path = folder / RESERVE
    try:
        with open(path, "wb") as f:
            try:
                os.posix_fallocate(f.fileno(), 0, size)  # blocks taken now, even on a filesystem that compresses zeros
            except (AttributeError, OSError):
                f.write(b"\0" * size)
        return path
    except OSError:
        Path(path).unlink(missing_ok=True)
        return None


RESERVE = ".memlab-space-reserve"
_DISK_FULL_ERRNOS = {errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)}
_DISK_FULL_TEXT = ("No space left on device", "os error 28", "Disk quota exceeded", "os error 122")


def is_disk_full(e: BaseException | None) -> bool:
    """Whether `e` (or what caused it) is a full disk or an exhausted quota, as OSError or as a library's own error."""
    seen = 0
    while e is not None and seen < 8:
        if isinstance(e, DiskFull) or isinstance(e, OSError) and e.errno in _DISK_FULL_ERRNOS:
            return True
        if any(t in str(e) for t in _DISK_FULL_TEXT):
            return True
        e, seen = e.__cause__ or e.__context__, seen + 1
    return False


# ---------------------------------------------------------------------------------------------- finding


def is_run_dir(d: str | os.PathLike) -> bool:
    """A folder is a run when it has a run.json or a summary.parquet."""
    return os.path.isfile(os.path.join(d, schema.RUN_JSON)) or os.path.isfile(os.path.join(d, schema.SUMMARY))


def _run_dirs_inside(d: str, depth: int, found: dict[str, Path]) -> None:
    try:
        entries = sorted((e for e in os.scandir(d) if e.is_dir() and not e.name.startswith(".")), key=lambda e: e.name)
    except OSError:
        return
    for e in entries:
        if is_run_dir(e.path):
            found.setdefault(os.path.realpath(e.path), Path(e.path))
        elif depth > 1:
            _run_dirs_inside(e.path, depth - 1, found)


def find_run_dirs(paths: Sequence[str | os.PathLike]) -> list[Path]:
    """Run folders under `paths`: a path that is a run folder itself, or the run folders inside it (two levels deep,
    so that `runs/` and `runs/<sweep>/` both work). A path that does not exist is a MemlabError."""
    found: dict[str, Path] = {}  # by real path (`runs/x` and `/home/me/runs/x` are one folder), insertion-ordered
    for p in paths:
        p = os.path.normpath(os.fspath(p))
        if not os.path.exists(p):
            raise MemlabError(f"{p}: no such folder")
        if not os.path.isdir(p):
            raise MemlabError(f"{p}: not a folder (give a run folder or a folder of runs)")
        if is_run_dir(p):
            found.setdefault(os.path.realpath(p), Path(p))
        else:
            _run_dirs_inside(p, 2, found)
    return list(found.values())


# ---------------------------------------------------------------------------------------------- reading


def open_events(d: Path) -> IO[str]:
    """A run's events.jsonl for reading, or the gzipped copy an archived run folder keeps (committed run
    folders are gzipped to stay small); OSError when it has neither."""
    plain = Path(d) / schema.EVENTS
    packed = plain.with_name(schema.EVENTS + ".gz")
    if not plain.exists() and packed.exists():
        return gzip.open(packed, "rt", encoding="utf-8")
    return open(plain, encoding="utf-8")  # noqa: SIM115 (the caller's with-block closes it)


def read_info(d: Path) -> dict:
    """run.json as a dict; raises ValueError with a short reason when it is missing, partial or not a run."""
    f = Path(d) / schema.RUN_JSON
    try:
        text = f.read_text()
    except FileNotFoundError:
        raise ValueError(f"no {schema.RUN_JSON}") from None
    except OSError as e:
        raise ValueError(f"{schema.RUN_JSON} unreadable ({e.strerror or e})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{schema.RUN_JSON} is not valid JSON (line {e.lineno}: {e.msg})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{schema.RUN_JSON} is not a JSON object")
    version = data.get("schema_version")
    if isinstance(version, int) and version > schema.SCHEMA_VERSION:
        raise ValueError(f"{schema.RUN_JSON} has schema_version {version}, newer than this memlab ({schema.SCHEMA_VERSION})")
    return data


def read_frame(path: Path) -> pl.DataFrame | None:
    """A parquet file of the folder, or None when it is missing or torn (a run killed mid-write)."""
    try:
        return pl.read_parquet(path)
    except Exception:  # noqa: BLE001 (polars raises its own types for corrupt or partial files)
        return None


@dataclass
class RunFolder:
    """What a run folder holds; a part that is missing or unreadable is empty ({} or None)."""

    path: Path
    info: dict  # run.json
    summary: dict = field(default_factory=dict)  # summary.parquet's row
    steps: pl.DataFrame | None = None
    gpu: pl.DataFrame | None = None

    @property
    def status(self) -> str:
        return self.summary.get("status") or self.info.get("status") or "incomplete"


def read_run(d: str | os.PathLike, *, steps: bool = True, gpu: bool = True) -> RunFolder:
    """The run folder `d`. Raises ValueError with a short reason when its run.json is missing or unreadable."""
    d = Path(d)
    run = RunFolder(path=d, info=read_info(d))
    summary = read_frame(d / schema.SUMMARY)
    if summary is not None and summary.height:
        run.summary = summary.row(0, named=True)
    run.steps = read_frame(d / schema.STEPS) if steps else None
    run.gpu = read_frame(d / schema.GPU) if gpu else None
    return run


def finished_runs(runs_dir: str | os.PathLike) -> dict[tuple[str, str, int], Path]:
    """The finished runs directly in `runs_dir`, by (profile name, experiment_id, world size): what a resumed sweep
    need not run again. The latest folder of each key wins; unreadable folders are passed over."""
    found: dict[tuple[str, str, int], Path] = {}
    if not os.path.isdir(runs_dir):
        return found
    for d in sorted(Path(runs_dir).iterdir()):
        try:
            info = read_info(d) if d.is_dir() else None
        except ValueError:
            continue
        profile = (info or {}).get("profile")
        if info and info.get("status") == "finished" and isinstance(profile, dict) and isinstance(info.get("experiment_id"), str):
            found[(str(profile.get("name")), info["experiment_id"], int(info.get("world_size") or 1))] = d
    return found
