"""`memlab fit`'s rows predicted several at once, one child process each.

A large model's searched row takes tens of seconds of tracing on one core (Llama-3.1-8B: about 7 traces of 1-1.5 s
each, made from five blocks, memlab.core.predict.deepen). Each such row not yet in the prediction cache is therefore
predicted by a child process of its own, up to one per CPU core. The children fill the prediction cache, and the
command then reads every row from it. On Linux a child is this process forked (torch, transformers and peft already
imported: 5-6 s a child saved); elsewhere, where forking a process that imported torch is not safe (macOS), a child
`memlab fit` of that one profile. A small model's rows stay in this process: below FORKED_PARAMS where a child is a
fork, below LARGE_PARAMS where it is a new process.

A child that fails leaves its row to this process, which predicts it (or says why it cannot) as it would alone.
Ctrl-C stops the children with the command.
"""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import time
from typing import Callable

# Below about this many parameters, a row's traces take no longer than a child's start: a new process's (5-6 s), or
# a fork's (a fraction of a second). GPT-2-small's rows on the default 80 GB card search to 452 sequences of 1024
# tokens and to 452k tokens, about 30 traces each: `memlab fit` alone took 9 min 12 s on two cores in one process.
LARGE_PARAMS = 100_000_000
FORKED_PARAMS = 1_000_000
POLL_S = 0.2


def worth_children(n_layer: int, d_model: int, pending: int) -> bool:
    """Several rows to predict, a model large enough for a child's start to pay, and more than one core."""
    large = FORKED_PARAMS if FORK_SAFE else LARGE_PARAMS
    return pending > 1 and (os.cpu_count() or 1) > 1 and 12 * n_layer * d_model**2 >= large


def predict_in_children(experiment: str, overrides: list[str], gpu_memory: str | None, names: list[str],
                        say: Callable[[str], None], meanwhile: Callable[[], object] = lambda: None,
                        row: Callable[[str], object] | None = None) -> None:
    """Each profile of `names` predicted by a child of its own, one per core at a time, into the cache: `row(name)`
    in a fork of this process where given and forking is safe, else a child `memlab fit`; `meanwhile` runs here
    once the first children have started."""
    jobs = min(len(names), os.cpu_count() or 1)
    say(f"predicting {len(names)} profiles, {jobs} at a time, each in its own process…")
    waiting, running, started = list(names), [], False
    try:
        while waiting or running:
            while waiting and len(running) < jobs:
                name = waiting.pop(0)
                forked = row is not None and FORK_SAFE
                child = _fork(row, name) if forked else _start(experiment, overrides, gpu_memory, name)
                running.append((name, child))
            if not started:
                started = True
                meanwhile()
            time.sleep(POLL_S)
            for name, child in [(n, c) for n, c in running if c.poll() is not None]:
                running.remove((name, child))
                say(f"{name}: predicted" if child.returncode == 0 else
                    f"{name}: its child ended with status {child.returncode}; predicting it here")
    finally:
        for _, child in running:  # Ctrl-C, or an error here: no child outlives the command
            child.terminate()
            child.wait()


FORK_SAFE = sys.platform == "linux"  # macOS's system libraries do not survive a fork; Windows has none


class _Forked:
    """A forked child with the part of Popen's interface the queue above uses."""

    def __init__(self, process: multiprocessing.process.BaseProcess) -> None:
        self.process = process

    @property
    def returncode(self) -> int | None:
        return self.process.exitcode

    def poll(self) -> int | None:
        return self.process.exitcode

    def terminate(self) -> None:
        self.process.terminate()

    def wait(self) -> int | None:
        self.process.join()
        return self.process.exitcode


def _fork(row: Callable[[str], object], name: str) -> _Forked:
    process = multiprocessing.get_context("fork").Process(target=_quietly, args=(row, name), daemon=True)
    process.start()
    return _Forked(process)


def _quietly(row: Callable[[str], object], name: str) -> None:
    """row(name), its failure an exit status and no traceback: the command says so and predicts the row itself,
    which shows the error in its one line; Ctrl-C reaches the children too, and the command stops them."""
    try:
        row(name)
    except KeyboardInterrupt:
        raise SystemExit(130) from None
    except Exception:  # noqa: BLE001
        raise SystemExit(1) from None


def _start(experiment: str, overrides: list[str], gpu_memory: str | None, name: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "memlab", "fit", "--experiment", experiment, "--profiles", name, "--format", "csv",
           *(["--gpu-memory", gpu_memory] if gpu_memory else []), *[a for o in overrides for a in ("--set", o)]]
    env = {**os.environ, "MEMLAB_ANSWERS": "off"}  # the row goes to the prediction cache; no page to keep
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
