"""Figures that hold off the calibrated path (issue 17) and figures that misled a new user (issue 20): wall-clock
throughput, MFU against one peak, the fp16 step's host syncs, the emulated card's arithmetic, time to first step and
the CPU backend's host memory."""

from __future__ import annotations

import subprocess
import sys


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
