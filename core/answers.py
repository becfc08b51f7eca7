"""Whole answers of the planning commands (`memlab estimate`, `memlab fit`), kept on disk: a question asked before on a
machine without a GPU is answered from here before torch is imported. torch's import alone takes about a second, and a
cached shape must answer in less.

An answer is what the command printed. Its key is everything that decides that output:
- the command's resolved inputs;
- how the output is shown (a terminal's width, a pipe);
- the installed torch and libraries, read from their metadata without importing them;
- the source of memlab's engine and commands.
A new release or an edit never reads an old answer. The prediction cache (memlab.core.predict.cache) keeps the
figures beneath; this keeps the page.

Imports nothing heavy.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from memlab.core.paths import cache_root
from memlab.core.releases import LIBRARIES, installed_version

FOLDER = "answers"
SWITCH_ENV = "MEMLAB_ANSWERS"  # "off": keep and read no answers (the test suite, which patches what decides them)
ENGINE = Path(__file__).resolve().parent  # memlab.core's source
# The distributions whose release can change an answer: torch, transformers and peft (the models and adapters
# traced), rich (the page), and the libraries whose stand-ins are keyed (memlab.core.releases.LIBRARIES).
DISTRIBUTIONS = ("torch", "transformers", "peft", "rich", *LIBRARIES)


def key(command: str, inputs: dict[str, Any], sources: tuple[Path, ...] = (ENGINE,)) -> str:
    parts = {"command": command, "inputs": inputs, "versions": {d: installed_version(d) for d in DISTRIBUTIONS},
             "code": [source_fingerprint(root) for root in sources]}
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:24]


def read(name: str) -> dict[str, str] | None:
    try:
        kept = json.loads(_path(name).read_text())
    except (OSError, ValueError):
        return None
    return kept if isinstance(kept, dict) and isinstance(kept.get("stdout"), str) else None


def write(name: str, stdout: str) -> None:
    """Best effort, atomic by rename: a read-only cache folder only costs the next call the prediction again."""
    path = _path(name)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_text(json.dumps({"stdout": stdout}))
        os.replace(tmp, path)
    except OSError:
        pass


def source_fingerprint(root: Path) -> str:
    """The .py files under `root`, hashed with their paths (the code: not data such as predict/inductor_traces.json,
    the tracer's output, whose keys name their torch release)."""
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:12]


def kept_here() -> bool:
    """Whether answers are kept and read in this process: not where MEMLAB_ANSWERS=off, not where a GPU may be."""
    return os.environ.get(SWITCH_ENV, "on") != "off" and not gpu_visible()


def gpu_visible() -> bool:
    """Whether an NVIDIA GPU may be visible to this process, asked of NVML (not torch). A kept answer is read only
    where there is none: with a GPU the card, its name and its driver's reserve decide the answer. No NVML, no
    driver: torch sees no CUDA device either."""
    if os.environ.get("CUDA_VISIBLE_DEVICES", "unset").strip() in ("", "-1"):
        return False
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return pynvml.nvmlDeviceGetCount() > 0
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 (any NVML failure: no usable driver here)
        return False


def _path(name: str) -> Path:
    return cache_root() / FOLDER / f"{name}.json"
