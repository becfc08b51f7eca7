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
import pytest
from fake_children import fake_spec

from memlab.cli import main
from memlab.core.supervisor import ChildSpec

SWEEP = [sys.executable, "-m", "memlab", "sweep", "--experiment", "tiny", "--device", "cpu", "--set", "train.measure_after=1"]


@pytest.mark.slow
def test_a_failing_profile_is_recorded_and_the_sweep_goes_on(tmp_path):
    r = subprocess.run([*SWEEP, "--profiles", "baseline,tf32,gradcp", "--steps", "3", "--runs-dir", str(tmp_path)],
                       capture_output=True, text=True, timeout=240)
    assert r.returncode == 1, r.stderr  # not every run finished
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("[")]
    assert any(ln.startswith("[1/3] baseline: finished") for ln in lines)
    assert any(ln.startswith("[2/3] tf32: rejected") and "needs CUDA" in ln for ln in lines)
    assert any(ln.startswith("[3/3] gradcp: finished") for ln in lines)
    assert "sweep: 2/3 finished" in r.stderr
    statuses = sorted(pl.read_parquet(d / "summary.parquet")["profile"][0] for d in tmp_path.iterdir())
    assert statuses == ["baseline", "gradcp"]


@pytest.mark.slow
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


@pytest.mark.slow
def test_the_reproduction_of_issue_16_ends_with_an_outcome_for_each_run_and_no_traceback(tmp_path):
    """A child that refuses after `started` deletes its folder; the sweep used to die marking it (FileNotFoundError)."""
    r = subprocess.run([sys.executable, "-m", "memlab", "sweep", "--profiles", "baseline,bf16", "--experiment", "tiny", "--device", "cpu",
                        "--set", "data.val_tokens=10", "--steps", "2", "--runs-dir", str(tmp_path)], capture_output=True, text=True, timeout=240)
    assert "Traceback" not in r.stderr, r.stderr
    assert r.returncode == 1, r.stderr
    assert any(ln.startswith("[1/2] baseline: rejected") and "val_tokens" in ln for ln in r.stderr.splitlines()), r.stderr
    assert any(ln.startswith("[2/2] bf16: rejected") for ln in r.stderr.splitlines()), r.stderr
    assert "sweep: 0/2 finished" in r.stderr


def fake_sweep(monkeypatch, capsys, tmp_path, kinds: dict[str, str], args: list[str] = ()) -> tuple[int, list[str]]:
    """`memlab sweep` in process, each profile's child replaced by a fake one (tests/fake_children.py)."""
    monkeypatch.setattr(ChildSpec, "argv", lambda self: list(fake_spec(kinds[self.profile], self.runs_dir).command))
    device = [] if "MEMLAB_FAKE_GPU_COUNT" in os.environ else ["--device", "cpu"]
    try:
        main(["sweep", "--profiles", ",".join(kinds), *device, "--runs-dir", str(tmp_path), *args])
        code = 0  # main returns on success
    except SystemExit as e:
        code = e.code
    return code, capsys.readouterr().err.splitlines()


def test_sweep_exits_1_when_a_run_did_not_finish_and_says_how_each_ended(monkeypatch, capsys, tmp_path):
    code, lines = fake_sweep(monkeypatch, capsys, tmp_path, {"baseline": "finished", "gradcp": "sigkilled", "bf16": "refuses_after_started", "tf32": "garbage"})
    assert code == 1
    ended = [ln for ln in lines if ln.startswith("[") and not ln.endswith("...")]
    assert ended[0].startswith("[1/4] baseline: finished") and " · 1 step · " in ended[0]
    assert ended[1].startswith("[2/4] gradcp: crashed") and "killed by signal 9 (SIGKILL, e.g. the OOM killer)" in ended[1]
    assert ended[2].startswith("[3/4] bf16: rejected") and ended[2].endswith("validation slice of 10 tokens is shorter than one window · no run folder")
    assert ended[3].startswith("[4/4] tf32: error")
    assert lines[-1].startswith("sweep: 1/4 finished")


def test_sweep_exits_0_when_every_run_finished(monkeypatch, capsys, tmp_path):
    code, lines = fake_sweep(monkeypatch, capsys, tmp_path, {"baseline": "finished", "gradcp": "finished"})
    assert code == 0 and lines[-1].startswith("sweep: 2/2 finished")


def test_sweep_help_says_what_each_status_and_exit_code_means():
    r = subprocess.run([sys.executable, "-m", "memlab", "sweep", "--help"], capture_output=True, text=True, timeout=60, env={**os.environ, "COLUMNS": "200"})
    for status in ("finished:", "oom:", "nan:", "interrupted:", "rejected:", "crashed:", "error:", "skipped:"):
        assert status in r.stdout, status
    assert "0 when every run finished, 1 when any did not, 2 for bad input" in r.stdout


def test_progress_while_a_child_trains_in_place_on_a_terminal_plain_lines_otherwise():
    import io

    from memlab.cli.sweep import RunProgress

    now = [0.0]
    steps = [{"event": "step", "step": i, "total_steps": 20, "tokens_per_s": 1000.0} for i in range(20)]
    plain = io.StringIO()
    p = RunProgress(plain, interactive=False, clock=lambda: now[0])
    for ev in steps:
        now[0] += 1.0
        p.step(ev)
    lines = plain.getvalue().splitlines()
    assert len(lines) == 11 and lines[0] == "  step 1/20 · 1,000 tok/s"  # one line every 10%
    assert lines[1] == "  step 2/20 · 1,000 tok/s · ETA 0:18" and lines[-1].endswith("step 20/20 · 1,000 tok/s · ETA 0:00")
    tty = io.StringIO()
    p = RunProgress(tty, interactive=True, clock=lambda: now[0])
    for ev in steps:
        now[0] += 1.0
        p.step(ev)
    p.clear()
    text = tty.getvalue()
    assert "\n" not in text and text.count("\r\x1b[2K") == 21 and text.endswith("\r\x1b[2K")  # redrawn in place, then cleared


def test_sweep_on_two_gpu_lanes_names_the_lane_in_its_lines(monkeypatch, capsys, tmp_path):
    """Two faked GPUs: each run pinned to one (the fake child reports its CUDA_VISIBLE_DEVICES), each line names it."""
    import torch

    monkeypatch.setenv("MEMLAB_FAKE_GPU_COUNT", "2")
    monkeypatch.setattr("memlab.core.environment.resolve_device", lambda name: torch.device("cuda"))
    seen = {}  # item number -> the CUDA_VISIBLE_DEVICES its child saw
    monkeypatch.setattr("memlab.cli.sweep._result_line", lambda o, steps: seen.update({o.key: o.result.summary["cuda_visible_devices"]}) or f"{o.spec.name}: {o.status}")
    code, lines = fake_sweep(monkeypatch, capsys, tmp_path, {"baseline": "reports_gpu", "gradcp": "reports_gpu", "bf16": "reports_gpu"}, ["--experiment", "tiny"])
    assert code == 0, lines
    ended = [ln for ln in lines if ln.startswith("[") and not ln.endswith("...")]
    assert sorted(ended) == sorted(f"[{i}/3 gpu {seen[i]}] {n}: finished" for i, n in zip((1, 2, 3), ("baseline", "gradcp", "bf16")))
    assert set(seen.values()) <= {"0", "1"}


def _finished_run(runs, name: str, experiment_id: str) -> None:
    d = runs / f"20260101-000000-{name}-abcd"
    d.mkdir(parents=True)
    d.joinpath("run.json").write_text(json.dumps({"schema_version": 1, "status": "finished", "profile": {"name": name},
                                                  "experiment_id": experiment_id, "world_size": 1}))


def test_sweep_resumes_past_finished_runs_and_redo_runs_them_again(monkeypatch, capsys, tmp_path):
    from memlab.cli.options import resolve

    exp, _ = resolve("tiny", "baseline", "cpu", [])
    _finished_run(tmp_path, "baseline", exp.fingerprint())
    _finished_run(tmp_path, "gradcp", "another-experiment")  # another experiment: not this sweep's
    code, lines = fake_sweep(monkeypatch, capsys, tmp_path, {"baseline": "finished", "gradcp": "finished"}, ["--experiment", "tiny"])
    assert code == 0
    assert lines[0].startswith("[1/2] baseline: already finished · ") and lines[0].endswith("(--redo runs it again)")
    assert any(ln.startswith("[2/2] gradcp: finished") for ln in lines)
    assert not any(ln.startswith("[1/2] baseline: finished") for ln in lines)
    assert lines[-1].startswith("sweep: 2/2 finished")
    code, lines = fake_sweep(monkeypatch, capsys, tmp_path, {"baseline": "finished", "gradcp": "finished"}, ["--experiment", "tiny", "--redo"])
    assert code == 0 and any(ln.startswith("[1/2] baseline: finished") for ln in lines)


@pytest.mark.parametrize("args, expect", [
    (["--gpus", "0,0"], "--gpus 0,0: GPU 0 is listed twice; give each GPU once"),
    (["--gpus", "7"], "--gpus 7: GPU 7 is not visible (visible: 0,1,2,3)"),
    (["--gpus", "0,1", "--nproc", "4"], "--nproc 4 needs 4 GPUs a run but --gpus gives 2 (0,1)"),
])
def test_sweep_refuses_bad_gpus_in_one_line_before_any_work(monkeypatch, capsys, tmp_path, args, expect):
    monkeypatch.setenv("MEMLAB_FAKE_GPU_COUNT", "4")
    with pytest.raises(SystemExit) as exit_:
        main(["sweep", "--profiles", "ddp_bf16", "--experiment", "tiny", "--runs-dir", str(tmp_path / "runs"), *args])
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert exit_.value.code == 2 and len(err) == 1 and expect in err[0], err
    assert not (tmp_path / "runs").exists()
