"""One run = one child process: the supervisor reads its events and knows how it ended, even when it crashed."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import polars as pl

from memlab.core import schema
from memlab.core.supervisor import ChildRun, ChildSpec, run_child


def spec(tmp_path, profile="baseline", steps=4, **kw):
    return ChildSpec(profile=profile, experiment="tiny", device="cpu", runs_dir=str(tmp_path), overrides=[f"train.steps={steps}", "train.measure_after=1"], **kw)


def test_child_finishes_and_reports(tmp_path):
    seen = []
    result = run_child(spec(tmp_path), on_event=lambda e: seen.append(e["event"]))
    assert result.status == "finished" and result.returncode == 0
    assert seen[0] == "started" and seen[-1] == "finished" and seen.count("step") == 4
    assert result.summary["steps"] == 4 and Path(result.run_dir).is_dir()


def test_sigkilled_child_is_marked_crashed_and_its_folder_stays_readable(tmp_path):
    child: ChildRun

    def kill_at_step_3(event):
        if event["event"] == "step" and event["step"] == 3:
            os.kill(child.proc.pid, signal.SIGKILL)

    child = ChildRun(spec(tmp_path, steps=100000), on_event=kill_at_step_3)
    result = child.wait()
    assert result.status == "crashed" and result.returncode == -signal.SIGKILL
    run_dir = Path(result.run_dir)
    meta = json.loads((run_dir / schema.RUN_JSON).read_text())
    assert meta["status"] == "crashed" and "signal 9" in meta["message"]
    summary = pl.read_parquet(run_dir / schema.SUMMARY).row(0, named=True)
    assert summary["status"] == "crashed" and summary["profile"] == "baseline"
    assert summary["val_ppl"] is None  # unknown, not zero


def test_cancel_interrupts_the_child_which_keeps_its_run(tmp_path):
    child: ChildRun

    def cancel_at_step_2(event):
        if event["event"] == "step" and event["step"] == 2:
            child.cancel()

    child = ChildRun(spec(tmp_path, steps=100000), on_event=cancel_at_step_2)
    result = child.wait()
    assert result.status == "interrupted"
    run_dir = Path(result.run_dir)
    assert json.loads((run_dir / schema.RUN_JSON).read_text())["status"] == "interrupted"
    assert pl.read_parquet(run_dir / schema.SUMMARY)["status"].to_list() == ["interrupted"]
    assert pl.read_parquet(run_dir / schema.STEPS).height >= 2


def test_sigterm_is_an_interruption_too(tmp_path):
    child: ChildRun

    def term_at_step_2(event):
        if event["event"] == "step" and event["step"] == 2:
            child.proc.send_signal(signal.SIGTERM)

    child = ChildRun(spec(tmp_path, steps=100000), on_event=term_at_step_2)
    assert child.wait().status == "interrupted"


def test_bad_input_is_rejected_with_the_one_line_reason(tmp_path):
    result = run_child(spec(tmp_path, profile="no_such_profile"))
    assert result.status == "rejected" and result.returncode == 2
    assert "unknown profile 'no_such_profile'" in result.message
    assert list(tmp_path.iterdir()) == []


def test_two_processes_in_one_runs_folder_never_collide(tmp_path):
    a, b = ChildRun(spec(tmp_path)), ChildRun(spec(tmp_path))
    ra, rb = a.wait(), b.wait()
    assert ra.status == rb.status == "finished"
    assert ra.run_dir != rb.run_dir
    assert len(list(tmp_path.iterdir())) == 2
