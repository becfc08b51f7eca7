"""`memlab sweep`: the queue runs through the supervisor; a failed run is recorded and the sweep goes on;
Ctrl-C stops it cleanly, keeping finished runs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import polars as pl

SWEEP = [sys.executable, "-m", "memlab", "sweep", "--experiment", "tiny", "--device", "cpu", "--set", "train.measure_after=1"]


def test_a_failing_profile_is_recorded_and_the_sweep_goes_on(tmp_path):
    r = subprocess.run([*SWEEP, "--profiles", "baseline,tf32,gradcp", "--steps", "3", "--runs-dir", str(tmp_path)],
                       capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("[")]
    assert any(ln.startswith("[1/3] baseline: finished") for ln in lines)
    assert any(ln.startswith("[2/3] tf32: rejected") and "needs CUDA" in ln for ln in lines)
    assert any(ln.startswith("[3/3] gradcp: finished") for ln in lines)
    assert "sweep: 2/3 finished" in r.stderr
    statuses = sorted(pl.read_parquet(d / "summary.parquet")["profile"][0] for d in tmp_path.iterdir())
    assert statuses == ["baseline", "gradcp"]


def test_ctrl_c_stops_the_sweep_and_keeps_finished_runs(tmp_path):
    proc = subprocess.Popen([*SWEEP, "--profiles", "baseline,gradcp,bf16", "--runs-dir", str(tmp_path), "--set", "train.steps=100000"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.time() + 120
    while time.time() < deadline:  # wait until the first child has written steps
        runs = list(tmp_path.iterdir()) if tmp_path.exists() else []
        if runs and (runs[0] / "steps.parquet").exists():
            break
        time.sleep(0.5)
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: the whole foreground group
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "stopped early" in err
    (run,) = list(tmp_path.iterdir())  # the queue did not go on
    assert json.loads((run / "run.json").read_text())["status"] == "interrupted"
    assert pl.read_parquet(run / "summary.parquet")["status"].to_list() == ["interrupted"]
