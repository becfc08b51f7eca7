"""The token cache: one folder per (source, field, document cap, tokenizer), built once, trusted only when complete.

    <root>/tokens/<slug>-<hash>/
        tokens.bin      every token of every document, EOS after each, raw uint16 or uint32 (memory-mapped)
        tokenizer.json  the tokenizer that made them (for a trained BPE, the only copy)
        meta.json       written last: format, key, descriptions, vocab, EOS id, dtype, token and document counts

An entry is built in <root>/tokens/.tmp-<name>-<host>-<pid>-<rand>/ and renamed into place at the end, so a build
killed at any moment leaves nothing a later run would trust (its temp folder is removed by the next build on this
host once its process is gone). A lock file per entry makes concurrent runs of one experiment build it once.
Root: $MEMLAB_CACHE, else $XDG_CACHE_HOME/memlab, else ~/.cache/memlab.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import secrets
import shutil
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from memlab.core.errors import DataError
from memlab.core.paths import cache_root

FORMAT = 1  # bump when the layout or the way tokens are made changes: old entries are then simply not found


def tokens_dir() -> Path:
    return cache_root() / "tokens"


def _root_setting() -> str:
    """Which setting put the cache where it is, as a user would change it."""
    if os.environ.get("MEMLAB_CACHE"):
        return f"MEMLAB_CACHE={os.environ['MEMLAB_CACHE']}"
    if os.environ.get("XDG_CACHE_HOME"):
        return f"XDG_CACHE_HOME={os.environ['XDG_CACHE_HOME']} (the cache is its memlab/)"
    return f"the default {cache_root()} (from HOME)"


def writable_tokens_dir() -> Path:
    """The tokens folder, made if missing; a DataError in one line, naming the setting and the path, when it is not a
    folder this process can write (MEMLAB_CACHE pointing at a file, or into a read-only mount), before any work."""
    root = tokens_dir()
    blocker = next((p for p in (root, *root.parents) if p.exists()), None)
    fix = "point MEMLAB_CACHE at a writable folder, e.g. export MEMLAB_CACHE=$HOME/.cache/memlab"
    if blocker is not None and not blocker.is_dir():
        raise DataError(f"token cache {root} cannot be made: {blocker} is a file, not a folder ({_root_setting()}); {fix}")
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise DataError(f"token cache {root} cannot be made ({e.strerror or e}; {_root_setting()}); {fix}") from None
    if not os.access(root, os.W_OK | os.X_OK):
        raise DataError(f"token cache {root} is not writable ({_root_setting()}); {fix}")
    return root


def entry_name(slug: str, key: dict) -> str:
    digest = hashlib.sha256(json.dumps({"format": FORMAT, **key}, sort_keys=True).encode()).hexdigest()[:16]
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", slug).strip("-.")[:48] or "data"
    return f"{slug}-{digest}"


def read_meta(entry: Path) -> dict | None:
    """The entry's meta.json if the entry is complete and consistent, else None (a later build replaces it)."""
    try:
        meta = json.loads((entry / "meta.json").read_text(encoding="utf-8"))
        size = (entry / "tokens.bin").stat().st_size
        ok = meta["format"] == FORMAT and size == int(meta["n_tokens"]) * np.dtype(meta["dtype"]).itemsize
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return meta if ok else None


def write_meta(folder: Path, meta: dict) -> None:
    tmp = folder / "meta.json.tmp"
    tmp.write_text(json.dumps({"format": FORMAT, **meta}, indent=2, sort_keys=True), encoding="utf-8")
    os.replace(tmp, folder / "meta.json")


def open_tokens(entry: Path, meta: dict, start: int, stop: int) -> np.ndarray:
    """Tokens [start, stop) of an entry as a read-only memory map (its own offset, so it travels to loader workers)."""
    dtype = np.dtype(meta["dtype"])
    return np.memmap(entry / "tokens.bin", dtype=dtype, mode="r", offset=start * dtype.itemsize, shape=(stop - start,))


@contextlib.contextmanager
def locked(name: str) -> Iterator[None]:
    """An exclusive lock for building entry `name` (POSIX flock; elsewhere none, and the rename still keeps it safe).

    The lock file is removed when the lock is released, so that no empty `.lock` file outlives the build. A waiter
    may then hold a lock on the removed file: after locking it checks that the path still names the file it
    locked, and otherwise locks again (the usual flock + unlink protocol)."""
    root = writable_tokens_dir()
    try:
        import fcntl
    except ImportError:
        yield
        return
    path = root / f".{name}.lock"
    while True:
        with open(path, "a+") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            if not _same_file(f, path):
                continue  # removed by the holder we waited for: lock the new one
            try:
                yield
            finally:
                path.unlink(missing_ok=True)  # while still holding it (see above)
                fcntl.flock(f, fcntl.LOCK_UN)
            return


def _same_file(f, path: Path) -> bool:
    try:
        return os.path.samestat(os.fstat(f.fileno()), os.stat(path))
    except FileNotFoundError:
        return False


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9.]", "", socket.gethostname()) or "host"


def clean_stale() -> None:
    """Remove temp folders left by builds on this host whose process is gone (killed, crashed)."""
    for tmp in tokens_dir().glob(".tmp-*"):
        m = re.fullmatch(r"\.tmp-.+-(?P<host>[^-]+)-(?P<pid>\d+)-[0-9a-f]+", tmp.name)
        if m and m["host"] == _host() and not _alive(int(m["pid"])):
            shutil.rmtree(tmp, ignore_errors=True)


@contextlib.contextmanager
def staging(name: str) -> Iterator[Path]:
    """A temp folder to build entry `name` in; renamed to the entry when the block ends normally, removed otherwise.
    The block should hold `locked(name)`."""
    root = writable_tokens_dir()
    clean_stale()
    tmp = root / f".tmp-{name}-{_host()}-{os.getpid()}-{secrets.token_hex(4)}"
    tmp.mkdir()
    try:
        yield tmp
        shutil.rmtree(tmp / "scratch", ignore_errors=True)
        final = root / name
        if final.exists():  # an incomplete or stale entry with this name: it was not trusted, replace it
            shutil.rmtree(final, ignore_errors=True)
        try:
            os.rename(tmp, final)
        except OSError as e:
            raise DataError(f"cannot move the token cache entry into place at {final}: {e.strerror}") from None
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


# ---------------------------------------------------------------------------------------------- listing, removing


@dataclass
class Entry:
    """One cache entry as `memlab data list` shows it; `meta` is None for an incomplete entry (never trusted)."""

    name: str
    path: Path
    size_bytes: int
    meta: dict | None


def entries() -> list[Entry]:
    """Every entry under the cache root, by name (temp folders of builds in progress are left out)."""
    root = tokens_dir()
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")]
    return [Entry(p.name, p, _folder_bytes(p), read_meta(p)) for p in sorted(found, key=lambda p: p.name)]


def _folder_bytes(path: Path) -> int:
    total = 0
    for p in path.rglob("*"):
        try:
            total += p.stat().st_size if p.is_file() else 0
        except OSError:
            pass
    return total


def find_entries(keys: list[str]) -> list[Entry]:
    """The entries named by `keys` (a full name or a prefix that names one entry); a DataError names the valid ones."""
    every = entries()
    chosen = []
    for key in keys:
        matches = [e for e in every if e.name == key] or [e for e in every if e.name.startswith(key)]
        if len(matches) != 1:
            known = ", ".join(e.name for e in every) or "none (the cache is empty)"
            what = "matches several entries" if matches else "is not in the cache"
            raise DataError(f"{key!r} {what}; entries: {known}")
        chosen.append(matches[0])
    return chosen


def remove(entry: Entry) -> None:
    """Delete an entry, under its build lock (a build of it in progress finishes first). A run that has it open keeps
    reading it (the memory map holds the file); the next run tokenizes again."""
    with locked(entry.name):
        shutil.rmtree(entry.path, ignore_errors=True)
