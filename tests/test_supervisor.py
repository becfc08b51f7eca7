"""One run = one child process: the supervisor reads its events and knows how it ended, even when it crashed."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import polars as pl
import pytest
from fake_children import fake_spec

from memlab.core import schema
from memlab.core.runstore import mark_status
from memlab.core.supervisor import ChildRun, ChildSpec, parse_event, run_child


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


@pytest.mark.slow
def test_two_processes_in_one_runs_folder_never_collide(tmp_path):
    a, b = ChildRun(spec(tmp_path)), ChildRun(spec(tmp_path))
    ra, rb = a.wait(), b.wait()
    assert ra.status == rb.status == "finished"
    assert ra.run_dir != rb.run_dir
    assert len(list(tmp_path.iterdir())) == 2


# ---------------------------------------------------------------------------------------------- children that misbehave
# Fake children (tests/fake_children.py: python -c scripts, no torch): whatever they do, wait() returns an outcome.


def test_a_refusal_after_started_whose_folder_vanished_is_rejected_with_its_reason(tmp_path):
    result = run_child(fake_spec("refuses_after_started", tmp_path))
    assert result.status == "rejected" and result.returncode == 2
    assert result.message == "validation slice of 10 tokens is shorter than one window"
    assert result.run_dir is None and list(tmp_path.iterdir()) == []  # nothing recreated


def test_a_refusal_after_started_that_kept_its_folder_marks_it_rejected(tmp_path):
    result = run_child(fake_spec("refuses_keeping_folder", tmp_path))
    assert result.status == "rejected" and result.message == "attention.window needs the flash kernel"
    meta = json.loads((Path(result.run_dir) / schema.RUN_JSON).read_text())
    assert meta["status"] == "rejected" and meta["message"] == result.message


def test_a_sigkill_is_a_crash_that_names_the_signal_and_the_oom_killer(tmp_path):
    result = run_child(fake_spec("sigkilled", tmp_path))
    assert result.status == "crashed" and result.returncode == -signal.SIGKILL and result.killed_by_sigkill
    assert result.message == ("child killed by signal 9 (SIGKILL, e.g. the OOM killer) without reporting an outcome: "
                              "allocating a lot of host memory")
    assert json.loads((Path(result.run_dir) / schema.RUN_JSON).read_text())["status"] == "crashed"
    assert pl.read_parquet(Path(result.run_dir) / schema.SUMMARY)["status"].to_list() == ["crashed"]


def test_garbage_on_stdout_is_skipped_and_bad_fields_are_not_trusted(tmp_path):
    seen: list[dict] = []
    result = run_child(fake_spec("garbage", tmp_path), on_event=seen.append)
    assert [e["event"] for e in seen] == ["started", "step", "failed"]  # only sound events of known kinds
    assert seen[-1]["reason"] == "error" and isinstance(seen[-1]["message"], str) and "summary" not in seen[-1]
    assert result.status == "error"  # reason 123 is not a reason
    assert result.message == "['not', 'a', 'string']" and result.summary is None
    assert json.loads((Path(result.run_dir) / schema.RUN_JSON).read_text())["status"] == "error"


def test_a_clean_exit_without_an_outcome_is_a_crash(tmp_path):
    result = run_child(fake_spec("silent_exit_0", tmp_path))
    assert result.status == "crashed" and result.returncode == 0
    assert result.message == "child exited with status 0 without reporting an outcome"
    assert result.run_dir is None  # its `started` named no folder


def test_a_child_that_cannot_start_is_a_crash_with_the_os_error(tmp_path):
    result = run_child(fake_spec("unstartable", tmp_path))
    assert result.status == "crashed" and result.returncode is None
    assert result.message.startswith("could not start the child process: FileNotFoundError")
    assert "no-such-executable" in result.message


def test_a_folder_outside_the_runs_folder_is_never_written(tmp_path):
    runs = tmp_path / "runs"
    runs.mkdir()
    result = run_child(fake_spec("claims_a_foreign_folder", runs))
    assert result.status == "crashed" and result.run_dir is None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runs"]  # no run.json beside it


def test_a_child_that_inherits_sigint_ignored_still_stops_on_cancel(tmp_path):
    """A supervisor started with SIGINT ignored (a shell's `cmd &` without job control) passes that to its children,
    and Python keeps it: cancel()'s SIGINT then did nothing for its 20 s grace. The child takes SIGINT back
    (supervisor.honour_sigint, which `memlab run --events -` and the fake children call): here it starts ignored."""
    import dataclasses
    import sys
    import time

    child: ChildRun
    spec = fake_spec("sleeps", tmp_path)
    ignored = "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_IGN); os.execv(sys.executable, sys.argv[1:])"
    spec = dataclasses.replace(spec, command=[sys.executable, "-c", ignored, *spec.command])

    def cancel_at_step(event):
        if event["event"] == "step":
            child.cancel(grace_s=5.0)

    started = time.monotonic()
    child = ChildRun(spec, on_event=cancel_at_step)
    result = child.wait()
    assert result.status == "interrupted" and "KeyboardInterrupt" in result.message
    assert time.monotonic() - started < 5.0  # SIGINT, not SIGTERM after the grace


def test_a_cancelled_child_that_reports_nothing_is_interrupted(tmp_path):
    child: ChildRun

    def cancel_at_step(event):
        if event["event"] == "step":
            child.cancel()

    child = ChildRun(fake_spec("sleeps", tmp_path), on_event=cancel_at_step)
    result = child.wait()
    assert result.status == "interrupted" and result.returncode != 0
    assert "after it was asked to stop without reporting an outcome: KeyboardInterrupt" in result.message
    assert json.loads((Path(result.run_dir) / schema.RUN_JSON).read_text())["status"] == "interrupted"


def test_an_on_event_callback_that_raises_is_noted_and_the_child_still_read_to_its_end(tmp_path):
    calls = []

    def broken(event):
        calls.append(event["event"])
        raise KeyError("oops")

    result = run_child(fake_spec("finished", tmp_path), on_event=broken)
    assert result.status == "finished" and result.summary["steps"] == 1
    assert calls == ["started"]  # not called again after it raised
    assert result.callback_error == "on_event raised KeyError: 'oops'"


def test_mark_status_never_raises(tmp_path):
    assert mark_status(tmp_path / "vanished", "crashed", "gone") is False
    assert not (tmp_path / "vanished").exists()
    torn = tmp_path / "torn"
    torn.mkdir()
    (torn / schema.RUN_JSON).write_text('["not", "an object"]')
    assert mark_status(torn, "crashed", "killed") is True
    assert json.loads((torn / schema.RUN_JSON).read_text())["status"] == "crashed"
    assert mark_status(torn, "interrupted", "again") is False  # an outcome already recorded stays


def test_parse_event_skips_everything_that_is_not_an_event():
    good = '{"event": "step", "step": 1, "loss": 2.5, "measured": true}'
    assert parse_event(good) == {"event": "step", "step": 1, "loss": 2.5, "measured": True}
    for line in ("", "text", "[1]", '"s"', '{"event": 1}', '{"x": 1}', '{"event": "st', "{" * 100000 + "}" * 100000,
                 '{"event": "party"}', '{"event": "step"}', '{"event": "step", "step": "1"}', '{"event": "eval", "step": 1, "val_ppl": "3"}',
                 '{"event": "started"}', '{"event": "started", "run_dir": "r", "total_steps": "many"}'):
        assert parse_event(line) is None, line[:40]
    failed = parse_event('{"event": "failed", "reason": 5, "message": null, "summary": [1]}')
    assert failed == {"event": "failed", "reason": "error", "message": ""}


@pytest.mark.slow
def test_a_child_whose_supervisor_is_killed_stops_itself_and_keeps_its_folder(tmp_path):
    """A supervisor SIGKILLed (e.g. by a timeout) leaves its child in a session of its own: the child notices it was
    re-parented and interrupts itself, rather than holding the GPU until it ends."""
    import subprocess
    import sys
    import time

    supervisor = f"""
import sys, time
from memlab.core.supervisor import ChildRun, ChildSpec
child = ChildRun(ChildSpec(profile="baseline", experiment="tiny", device="cpu", runs_dir={str(tmp_path)!r},
                           overrides=["train.steps=100000", "train.measure_after=1"]))
for line in child.proc.stdout:  # until it trains
    if '"step"' in line:
        print(child.proc.pid, flush=True)
        break
time.sleep(600)
"""
    proc = subprocess.Popen([sys.executable, "-c", supervisor], stdout=subprocess.PIPE, text=True)
    pid = int(proc.stdout.readline())
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and _alive(pid):
        time.sleep(0.2)
    assert not _alive(pid), "the orphaned child still runs"
    (run_dir,) = [d for d in tmp_path.iterdir() if d.is_dir()]
    assert json.loads((run_dir / "run.json").read_text())["status"] == "interrupted"


def _alive(pid: int) -> bool:
    """Running, neither gone nor a zombie (an orphan's zombie waits for init to reap it)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_the_orphan_watch_interrupts_once_the_parent_changes():
    from memlab.core.supervisor import stop_when_orphaned

    parents = iter([41, 41, 41, 1])
    stopped = []
    stop_when_orphaned(poll_s=0.001, getppid=lambda: next(parents), interrupt=lambda: stopped.append(True)).join(timeout=5)
    assert stopped == [True]


def test_only_a_supervisors_children_are_told_they_are_supervised(tmp_path):
    """The orphan watch runs where MEMLAB_SUPERVISED is set: in ChildRun's children, not in a run the user started
    with --events - under nohup (its shell may go, and the run must not stop for that)."""
    import sys

    from memlab.core.supervisor import SUPERVISED_ENV

    seen = tmp_path / "env.txt"
    code = f"import os; open({str(seen)!r}, 'w').write(os.environ.get({SUPERVISED_ENV!r}, 'unset'))"
    run_child(ChildSpec(profile="x", command=[sys.executable, "-c", code]))
    assert seen.read_text() == "1" and SUPERVISED_ENV not in os.environ
