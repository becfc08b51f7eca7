"""Predictions kept on disk, keyed by everything that decides them: the resolved experiment and profile, the
micro-batch, the card, the method, the torch and library releases, and memlab.core's own source (a new release or an
edit to the tracer never reads an old answer). A cached shape answers in well under a second."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import torch

from memlab.core.config import Experiment, Profile, to_dict
from memlab.core.data.cache import cache_root
from memlab.core.predict.inductor import tracer_fingerprint
from memlab.core.releases import LIBRARIES, installed_version
from memlab.core.runfolder import atomic_write_json

FOLDER = "predictions"


def key(experiment: Experiment, profile: Profile, micro_batch: int, card: dict[str, Any], method: str, world_size: int) -> str:
    parts = {"experiment": to_dict(experiment), "profile": to_dict(profile), "micro_batch": micro_batch, "card": card,
             "method": method, "world_size": world_size, "torch": torch.__version__, "code": tracer_fingerprint(),
             "libraries": {d: installed_version(d) for d in LIBRARIES}}
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:24]


def _path(name: str) -> Path:
    return cache_root() / FOLDER / f"{name}.json"


def read(name: str) -> dict | None:
    try:
        return json.loads(_path(name).read_text())
    except (OSError, ValueError):
        return None


def write(name: str, value: dict) -> None:
    """Best effort: a read-only cache folder only costs the next call the trace again."""
    path = _path(name)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(path, value)
    except OSError:
        pass
