"""Shared fixtures. Everything here runs on the CPU backend; GPU tests carry the requires_cuda marker."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

# One token cache for the whole session (tokenizing the tiny corpus once), outside the user's real cache.
_CACHE = Path(os.environ.get("MEMLAB_TEST_CACHE", Path(__file__).resolve().parent.parent / ".pytest_cache" / "memlab-cache"))
os.environ.setdefault("MEMLAB_CACHE", str(_CACHE))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# No kept answers of estimate and fit (memlab.core.answers): tests patch what decides an answer and ask again;
# tests/test_answers.py turns them on in a cache of its own.
os.environ["MEMLAB_ANSWERS"] = "off"
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
# pytest-xdist runs two workers (pyproject addopts): one thread each, so together they fill the 2 cores CI has.
torch.set_num_threads(1 if os.environ.get("PYTEST_XDIST_WORKER") else min(2, os.cpu_count() or 1))
if os.environ.get("PYTEST_XDIST_WORKER"):
    # Their child processes too (memlab run, torchrun's ranks, the tracer): with a thread per core, a child's OpenMP
    # threads spin against the other worker, up to twice a child's CPU time on 2 cores.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
# Inductor compiles in the process that asks, not in a pool of workers that each import torch first: the same code,
# less than half the CPU time of the compiling tests on 2 cores.
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
# Bytecode is cached (__pycache__, git-ignored) even where the image sets PYTHONDONTWRITEBYTECODE: else each worker
# rewrites and compiles every test module (~4 s of its collection) and each child process compiles memlab's modules
# from source (~0.3 s each, some 80 children) on every run.
sys.dont_write_bytecode = False
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)


def pytest_collection_finish(session):
    """Everything imported so far (torch, the test modules) lives until the end: out of the collector's sight, so
    that each full collection (the engine's own gc.collect() before every run, Python's automatic ones) walks only
    what the tests make. About 0.6 s less for every run trained in a test process."""
    gc.collect()
    gc.freeze()


def pytest_collection_modifyitems(config, items):
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU (requires_cuda); this machine has none")
    if not torch.cuda.is_available():
        for item in items:
            if "requires_cuda" in item.keywords:
                item.add_marker(skip)
    # The slow tests first (a stable sort): xdist hands tests out in this order, so none of them starts last on one
    # worker while the other has run out of work.
    items.sort(key=lambda item: "slow" not in item.keywords)


@pytest.fixture
def tiny():
    """The tiny experiment, shortened: a handful of steps on CPU."""
    from memlab.core.config import load_experiment

    e = load_experiment("tiny")
    e.train.steps = 6
    e.train.measure_after = 1
    return e


@pytest.fixture(scope="session")
def profiles_listing() -> subprocess.CompletedProcess:
    """`memlab profiles` as a user runs it, in a child process (well under a second: it imports no torch), run once
    for the tests of three files that read it; they carry @pytest.mark.xdist_group("memlab-profiles") so that
    they share a worker and the child runs once."""
    return subprocess.run([sys.executable, "-m", "memlab", "profiles"], capture_output=True, text=True, timeout=120)


@pytest.fixture
def profile():
    from memlab.core.config import load_profile

    return load_profile
