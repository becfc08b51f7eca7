"""Where memlab keeps what it computes once: the cache folder (tokens, predictions, kept answers). Imports nothing
heavy: the planning commands' kept answers are read before torch is imported (memlab.core.answers)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    if os.environ.get("MEMLAB_CACHE"):
        return Path(os.environ["MEMLAB_CACHE"]).expanduser()
    if os.environ.get("XDG_CACHE_HOME"):
        return Path(os.environ["XDG_CACHE_HOME"]).expanduser() / "memlab"
    return Path.home() / ".cache" / "memlab"
