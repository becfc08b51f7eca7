"""The cuBLASLt algorithms memlab chose by timing, remembered across processes (memlab.core.fused.cublaslt).

One JSON file per GPU model and cuBLASLt version, <cache root>/cublaslt/<gpu>-<version>.json (the cache root is
memlab's: $MEMLAB_CACHE, else $XDG_CACHE_HOME/memlab, else ~/.cache/memlab), mapping a matmul's shape and
epilogue to the chosen algorithm (its 64 bytes in hex, or "torch" for torch's own call). A shape is then timed
once per machine, not once per process: a sweep or a find-batch search runs a process per profile or probe.
Delete the file to time again. Writes merge with what other processes wrote and replace the file whole, so a
reader never sees half a file; an unreadable file counts as empty.
"""

from __future__ import annotations

import json
import os
import re
import secrets
from pathlib import Path

from memlab.core.data.cache import cache_root


def choices_path(gpu_name: str, library_version: int) -> Path:
    slug = re.sub(r"[^A-Za-z0-9.]+", "-", gpu_name).strip("-")
    return cache_root() / "cublaslt" / f"{slug}-{library_version}.json"


def load(path: Path) -> dict[str, str]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}


def remember(path: Path, key: str, choice: str) -> None:
    """Add one choice to the file, keeping every other process's; a cache that cannot be written is skipped
    (the choice still holds for this process)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        merged = load(path) | {key: choice}
        tmp = path.with_name(f".{path.name}.{os.getpid()}-{secrets.token_hex(4)}.tmp")
        tmp.write_text(json.dumps(merged, indent=1, sort_keys=True), encoding="utf-8")
        os.replace(tmp, path)
    except OSError:
        return
