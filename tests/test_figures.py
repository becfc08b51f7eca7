"""Figures that hold off the calibrated path (issue 17) and figures that misled a new user (issue 20): wall-clock
throughput, MFU against one peak, the fp16 step's host syncs, the emulated card's arithmetic, time to first step and
the CPU backend's host memory."""

from __future__ import annotations

import subprocess
import sys

import pytest


def test_time_to_first_step_counts_from_memlab_not_from_the_shell_that_execs_it():
    """`bash -c 'sleep 2; exec memlab run ...'`: the process is the shell's, created 2 s before memlab starts."""
    code = "import time; from memlab.cli.run import _process_start; print(time.time() - _process_start())"
    out = subprocess.run(["bash", "-c", f'sleep 2; exec "{sys.executable}" -c "{code}"'], capture_output=True, text=True, timeout=60, check=True)
    since_start = float(out.stdout.strip())
    assert 0 <= since_start < 1.5  # the imports only, not the shell's 2 s sleep


def test_time_to_first_step_under_torchrun_counts_from_the_command_that_started_it(monkeypatch):
    from memlab.cli.run import _process_start

    monkeypatch.setenv("MEMLAB_PROCESS_START", "1234.5")
    assert _process_start() == 1234.5


def test_wall_tokens_per_s_counts_a_slow_loader_that_the_step_timer_does_not(tiny, monkeypatch):
    """Step time runs from a step's start to its end; the wall figure also counts the host's time between steps."""
    import time

    from memlab.core import data as data_mod
    from memlab.core.config import load_profile
    from memlab.core.engine import train
    from memlab.core.events import ListSink

    real = data_mod.batch_iterator

    def slow_loader(*args, **kwargs):
        for batch in real(*args, **kwargs):
            time.sleep(0.2)  # a loader far slower than a tiny CPU step
            yield batch

    monkeypatch.setattr(data_mod, "batch_iterator", slow_loader)
    summary = train(tiny, load_profile("baseline"), ListSink(), device="cpu")
    assert summary["status"] == "finished"
    tokens_per_step = tiny.train.batch_size * tiny.model.seq_len
    assert summary["tokens_per_s_wall"] < summary["tokens_per_s"]
    assert summary["tokens_per_s_wall"] < tokens_per_step / 0.2  # every measured step waited 0.2 s for its batch
    measured = tiny.train.steps - tiny.train.measure_after
    assert summary["tokens_per_s_wall"] * summary["total_s"] > measured * tokens_per_step  # within the run's own time


@pytest.mark.slow
def test_host_memory_on_cpu_is_the_same_whether_or_not_the_token_cache_was_warm(tmp_path):
    """Tokenizing (a cold cache) happens in a child process and before the host peak's reset: two identical runs,
    the first of which builds the cache, report the same peak RSS (issue 20: 0.57 and 0.36 GiB before)."""
    import os

    import polars as pl

    env = dict(os.environ, MEMLAB_CACHE=str(tmp_path / "cache"))
    cmd = [sys.executable, "-m", "memlab", "run", "-p", "baseline", "-e", "tiny", "--device", "cpu", "--steps", "4",
           "--runs-dir", str(tmp_path / "runs")]
    for _ in range(2):
        subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, check=True)
    cold, warm = (pl.read_parquet(f)["peak_host_rss_bytes"][0] for f in sorted((tmp_path / "runs").glob("*/summary.parquet")))
    assert abs(cold - warm) / warm < 0.05, (cold, warm)
