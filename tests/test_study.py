"""`memlab study` on the CPU: a small study end to end, resuming it, Ctrl-C in the middle, a refused profile inside
it, the report's numbers against the runs' own summary.parquet, and bad input (one line, exit 2, nothing written)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import pytest

from memlab.cli import main
from memlab.core import gpu_memory
from memlab.core.compare import format_value

# tiny, 3 steps; at its own max under a pretend card of 84 MiB plus the CUDA context (1247 MiB): the estimator predicts micro-batch 7 (baseline)
STUDY = ["study", "--experiment", "tiny", "--device", "cpu", "--steps", "3", "--gpu-memory", "1331MiB"]


def _study(args: list[str]) -> int:
    try:
        main(args)
    except SystemExit as e:
        return int(e.code or 0)
    return 0


def _state(out: Path) -> dict:
    return json.loads((out / "study.json").read_text())


# The tests that read `done` share one xdist worker (pyproject: --dist loadgroup), so the study is made once, not on each.
# Marked slow as a whole (the study takes ~20 s, the group ~40): handed out first, it never runs last on one worker
# while the other has nothing left.
def SHARES_DONE(test):
    return pytest.mark.slow(pytest.mark.xdist_group("study-done")(test))


@pytest.fixture(scope="module")
def done(tmp_path_factory) -> tuple[Path, int]:
    """baseline and bf16 at the common batch and at their own (predicted) max; tf32 is refused on the CPU."""
    out = tmp_path_factory.mktemp("study") / "s"
    return out, _study([*STUDY, "--profiles", "baseline,bf16,tf32", "--at-max", "--out", str(out)])


@SHARES_DONE
def test_a_study_records_every_profile_and_goes_on_past_a_refusal(done):
    out, code = done
    assert code == 1  # a run did not finish (tf32), as `memlab sweep` says it
    items = _state(out)["items"]
    assert {k: v["status"] for k, v in items.items()} == {
        "max/baseline": "predicted", "max/bf16": "predicted", "max/tf32": "predicted",
        "common/baseline": "finished", "common/bf16": "finished", "common/tf32": "rejected",
        "at_max/baseline": "finished", "at_max/bf16": "finished", "at_max/tf32": "rejected",
    }
    assert "tf32 needs CUDA" in items["common/tf32"]["message"]
    assert items["max/baseline"]["max_batch"] is None and items["max/baseline"]["predicted_max_batch"] == 7
    assert "not measured (CPU)" in items["max/baseline"]["message"]
    assert (items["at_max/baseline"]["batch"], items["at_max/baseline"]["accumulation"]) == (7, 1)
    assert items["common/bf16"]["batch"] == 8  # the experiment's batch


@SHARES_DONE
def test_the_report_labels_predictions_at_max_rows_and_the_refusal(done):
    out, _ = done
    md = (out / "report.md").read_text()
    assert "~7 predicted (not measured)" in md
    assert "| baseline † | finished | 7 (7 × 1) |" in md and "(not comparable)" in md
    assert "| tf32 | rejected |" in md and "tf32 (common batch): rejected: precision.dtype = tf32 needs CUDA" in md
    assert "Where baseline's peak goes (the estimator, micro-batch 8" in md
    html = (out / "report.html").read_text()
    assert html.count("data:image/png;base64,") == 5 and 'src="figures/' not in html
    assert sorted(p.name for p in (out / "figures").glob("*.png")) == [
        "max_batch.png", "memory_by_phase.png", "memory_vs_time.png", "ppl_vs_memory.png", "step_time.png"]
    commands = (out / "commands.txt").read_text()
    assert "memlab study --experiment tiny --profiles baseline,bf16,tf32" in commands
    assert "memlab run --profile bf16 --experiment tiny --device cpu" in commands and "--set train.batch_size=10 --set accumulation.steps=1" in commands


@SHARES_DONE
def test_the_reports_numbers_are_the_runs_own(done):
    out, _ = done
    table = pl.read_parquet(out / "comparison.parquet")
    md = (out / "report.md").read_text()
    runs = table.filter(pl.col("status") == "finished")
    assert runs.height == 4
    base = pl.read_parquet(Path(table.filter((pl.col("profile") == "baseline") & (pl.col("study_kind") == "common"))["path"][0]) / "summary.parquet").row(0, named=True)
    for row in runs.iter_rows(named=True):
        own = pl.read_parquet(Path(row["path"]) / "summary.parquet").row(0, named=True)
        for column in ("peak_host_rss_bytes", "step_ms_median", "tokens_per_s", "val_ppl", "batch_size", "micro_batch", "total_s"):
            assert row[column] == own[column], (row["profile"], column)
        mark = " †" if row["study_kind"] == "at_max" else ""
        line = next(ln for ln in md.splitlines() if ln.startswith(f"| {row['profile']}{mark} | finished |"))
        assert f"| {format_value(own['val_ppl'], 'ppl')}" in line and f"| {format_value(own['step_ms_median'], 'ms')} |" in line
        if row["study_kind"] == "common":
            assert row["mem_saved_pct"] == pytest.approx(100 * (1 - own["peak_host_rss_bytes"] / base["peak_host_rss_bytes"]))
            assert row["speedup_x"] == pytest.approx(base["step_ms_median"] / own["step_ms_median"])
        else:
            assert row["mem_saved_pct"] is None and row["throughput_x"] == pytest.approx(own["tokens_per_s"] / base["tokens_per_s"])


@SHARES_DONE
def test_a_second_invocation_redoes_nothing_finished(done):
    out, _ = done
    before = sorted(p.name for p in (out / "runs").iterdir())
    assert _study(["study", "--out", str(out)]) == 1
    assert sorted(p.name for p in (out / "runs").iterdir()) == before
    assert len(_state(out)["invocations"]) == 2


@SHARES_DONE
def test_redo_measures_a_profile_again_and_keeps_its_old_runs_aside(done, tmp_path):
    import shutil

    out = tmp_path / "s"
    shutil.copytree(done[0], out)
    old = {k: v["run_dir"] for k, v in _state(out)["items"].items() if v["profile"] == "bf16" and v["run_dir"]}
    assert _study(["study", "--out", str(out), "--redo", "bf16"]) == 1  # tf32 is still refused
    items = _state(out)["items"]
    assert {k: items[k]["status"] for k in old} == {"common/bf16": "finished", "at_max/bf16": "finished"}
    assert all(items[k]["run_dir"] != v and (out / items[k]["run_dir"]).is_dir() for k, v in old.items())
    assert sorted(p.name for p in (out / "superseded").iterdir()) == sorted(Path(v).name for v in old.values())
    assert _state(out)["invocations"][-1].endswith("--redo bf16")
    assert pl.read_parquet(out / "comparison.parquet").filter(pl.col("profile") == "bf16")["path"].str.contains("superseded").sum() == 0


@SHARES_DONE
def test_redo_max_measures_the_max_batch_again_and_only_the_runs_that_used_it(done, tmp_path):
    import shutil

    out = tmp_path / "s"
    shutil.copytree(done[0], out)
    before = _state(out)["items"]
    assert _study(["study", "--out", str(out), "--redo-max", "bf16"]) == 1  # tf32 is still refused
    items = _state(out)["items"]
    assert items["common/bf16"] == before["common/bf16"] and items["common/baseline"] == before["common/baseline"]
    assert items["at_max/bf16"]["status"] == "finished" and items["at_max/bf16"]["run_dir"] != before["at_max/bf16"]["run_dir"]
    assert items["max/bf16"]["status"] == "predicted" and items["at_max/baseline"] == before["at_max/baseline"]
    assert [p.name for p in (out / "superseded").iterdir()] == [Path(before["at_max/bf16"]["run_dir"]).name]
    assert _state(out)["invocations"][-1].endswith("--redo-max bf16")


def test_a_second_signal_quits_a_stopping_study_at_once():
    from types import SimpleNamespace

    from memlab.cli.study import _on_signal

    said, quit_with = [], []
    runner = SimpleNamespace(stopping=False)
    runner.stop = lambda: setattr(runner, "stopping", True)
    on_signal = _on_signal(runner, said.append, quit_with.append)
    on_signal(2, None)
    assert runner.stopping and not quit_with and "again to quit now" in said[-1]
    on_signal(2, None)  # a lane still tracing its prediction would hold the first stop for minutes
    assert quit_with == [130] and "finished items are saved" in said[-1]


def test_redo_max_of_the_baseline_redoes_every_common_run_when_they_ran_at_its_max(tmp_path):
    from memlab.core.study import Options, StudyState

    for batch, forgotten in (("baseline-max", {"max/baseline", "common/baseline", "common/bf16"}), ("experiment", {"max/baseline"})):
        state = StudyState(Options(profiles=["baseline", "bf16"], experiment="tiny", device="cuda", batch=batch), {})
        for key in ("max/baseline", "max/bf16", "common/baseline", "common/bf16"):
            state.item(*key.split("/")).status = "finished"
        state.redo(["baseline"], tmp_path, max_only=True)
        assert {k for k, i in state.items.items() if i.status == "pending"} == forgotten


@SHARES_DONE
def test_redo_of_a_profile_the_study_has_not_run_is_refused_untouched(done, capsys):
    out, _ = done
    before = (out / "study.json").read_bytes()
    assert _study(["study", "--out", str(out), "--redo", "bf16,flash"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith("--redo flash: not a profile this study has run; valid: baseline, bf16, tf32") and len(err.splitlines()) == 1
    assert (out / "study.json").read_bytes() == before


@pytest.mark.parametrize("args, expect", [
    (["--recipe", "nope", "--profiles", "baseline"], "unknown recipe 'nope'; recipes: seed-plwiki, seed-shopping, seed-so-posts"),
    (["--experiment", "tiny", "--profiles", "baseline,nope"], "unknown profile 'nope'"),
    (["--experiment", "tiny", "--profiles", "baseline", "--batch", "huge"], "--batch 'huge'"),
    (["--experiment", "tiny", "--profiles", "bf16", "--batch", "baseline-max"], "add baseline to --profiles"),
    (["--experiment", "tiny"], "--profiles is required for a new study"),
])
def test_bad_input_is_one_line_exit_2_and_writes_nothing(args, expect, tmp_path, capsys):
    out = tmp_path / "s"
    assert _study(["study", "--device", "cpu", "--out", str(out), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert expect in err and len(err.splitlines()) == 1 and "Traceback" not in err
    assert not out.exists()


def test_an_out_that_is_a_file_or_under_one_is_refused(tmp_path, capsys):
    f = tmp_path / "f"
    f.write_text("keep")
    for out, expect in ((f, "is a file; give a folder"), (f / "sub", "is a file, so the folder cannot be made")):
        assert _study(["study", "--experiment", "tiny", "--device", "cpu", "--profiles", "baseline", "--out", str(out)]) == 2
        assert expect in capsys.readouterr().err
    assert f.read_text() == "keep"


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes anywhere: a read-only folder cannot be made here")
def test_an_out_that_is_not_writable_is_refused(tmp_path, capsys):
    tmp_path.chmod(0o500)
    try:
        assert _study(["study", "--experiment", "tiny", "--device", "cpu", "--profiles", "baseline", "--out", str(tmp_path / "s")]) == 2
    finally:
        tmp_path.chmod(0o700)
    assert "is not writable" in capsys.readouterr().err


@SHARES_DONE
def test_a_folder_of_another_experiment_is_refused_untouched(done, capsys):
    out, _ = done
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    assert _study([*STUDY[:-4], "--steps", "5", "--profiles", "baseline", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "holds a study of another experiment" in err and "steps 3 there, 5 here" in err
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before


def test_gpu_memory_above_the_card_is_refused(monkeypatch):
    from memlab.core.errors import MemlabError
    from memlab.core.study import Options, make_plan

    monkeypatch.setattr(gpu_memory, "gpu_info", lambda index=0: gpu_memory.GpuInfo("NVIDIA Fake 24GB", 24 * 2**30))
    with pytest.raises(MemlabError, match=r"--gpu-memory 80GiB \(80.00 GiB\) is more than this GPU has \(NVIDIA Fake 24GB: 24.00 GiB\)"):
        make_plan(Options(profiles=["baseline"], experiment="tiny", device="cuda", gpu_memory="80GiB"))


def test_a_recipe_offline_says_so_in_one_line_with_the_same_shape_on_the_built_in_corpus(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    out = tmp_path / "s"
    assert _study(["study", "--recipe", "seed-so-posts", "--device", "cpu", "--profiles", "baseline", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "hf:mikex86/stackoverflow-posts and hf:gpt2" in err and "offline mode is set" in err
    assert "memlab study --recipe seed-so-posts --profiles baseline" in err and "--data stdlib --tokenizer bpe:8192" in err
    assert not out.exists()


@pytest.mark.slow
def test_ctrl_c_keeps_what_is_done_and_the_same_command_resumes(tmp_path):
    out = tmp_path / "s"
    cmd = [sys.executable, "-m", "memlab", *STUDY[:-4], "--steps", "8", "--profiles", "baseline,bf16", "--out", str(out)]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    seen = []
    for line in proc.stderr:  # wait until baseline has finished and bf16 is training
        seen.append(line)
        if line.startswith("  bf16: step"):
            proc.send_signal(signal.SIGINT)
            break
    rest = proc.communicate(timeout=60)[1]
    assert proc.returncode == 130, "".join(seen) + rest
    assert "stopped; run the same command to resume" in rest
    items = _state(out)["items"]
    assert items["common/baseline"]["status"] == "finished" and items["common/bf16"]["status"] == "interrupted"
    kept = items["common/baseline"]["run_dir"]
    t0 = time.monotonic()
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr
    items = _state(out)["items"]
    assert items["common/bf16"]["status"] == "finished" and items["common/baseline"]["run_dir"] == kept
    assert "[common baseline]" not in again.stderr and time.monotonic() - t0 < 60
    assert "| bf16 | finished |" in (out / "report.md").read_text()


@pytest.mark.parametrize("answer, expect", [
    (37, ("measured", 37, "")),
    (0, ("does not fit", 0, "even micro-batch 1 runs out of memory")),
    ("refuse", ("rejected", None, "profile baseline refused")),
])
def test_on_cuda_the_max_batch_is_measured_by_find_batchs_search(answer, expect, tmp_path, monkeypatch):
    """The CUDA path without a GPU: find-batch's search over a fake probe, its bounds cached, each outcome recorded."""
    from memlab.core import batchfind as bf
    from memlab.core.config import load_experiment, load_profile
    from memlab.core.study.maxbatch import find_max
    from memlab.core.study.plan import Plan
    from memlab.core.study.state import Item, Options

    monkeypatch.setenv("MEMLAB_CACHE", str(tmp_path))
    made = []

    class FakeProbe:
        def __init__(self, profile_ref, experiment_ref, overrides, **kw):
            made.append((profile_ref, experiment_ref, list(overrides), kw["cap_bytes"]))

        def __call__(self, b):
            if answer == "refuse":
                raise bf.ProbeRejected(f"profile baseline refused (probe at micro-batch {b}): no")
            return bf.ProbeResult(b, b <= answer, message="" if b <= answer else "CUDA out of memory")

        def close(self):
            pass

    monkeypatch.setattr(bf, "ChildProbe", FakeProbe)
    options = Options(profiles=["baseline"], experiment="tiny", device="cuda", gpu_memory="24GiB", steps=3)
    plan = Plan(options, load_experiment("tiny"), {"baseline": load_profile("baseline")}, "baseline", 24 * 2**30, "NVIDIA Fake")
    item = Item("max/baseline", "max", "baseline")
    find_max(plan, item, lambda line: None, lambda: False)
    assert (item.status, item.max_batch) == expect[:2] and expect[2] in item.message
    assert item.predicted_max_batch and item.command.startswith("memlab find-batch --profile baseline --experiment tiny --gpu-memory 24GiB")
    assert made == [("baseline", "tiny", ["train.steps=3"], 24 * 2**30)]
    if answer == 37:
        key = bf.cache_key(plan.experiment, plan.profiles["baseline"], "NVIDIA Fake", 24 * 2**30, steps=3)
        assert bf.cached_bounds(key)[:2] == (37, 38)


def test_a_stop_cuts_the_replayed_prediction_short_between_traces(tmp_path, monkeypatch):
    """On a GPU the prediction replays the step's trace for up to minutes (compile_budget held a stop on the H100 past
    timeout's grace): a stop now ends it at the next trace, the item interrupted, with no prediction recorded (not
    the analytic figure it would otherwise fall back to), and no probe run."""
    from memlab.core.predict import trace as allocation_trace
    from memlab.core import batchfind as bf
    from memlab.core.config import load_experiment, load_profile
    from memlab.core.predict import card
    from memlab.core.study.maxbatch import find_max
    from memlab.core.study.plan import Plan
    from memlab.core.study.state import Item, Options

    monkeypatch.setenv("MEMLAB_CACHE", str(tmp_path))
    monkeypatch.setattr(card, "cuda_here", lambda: True)
    monkeypatch.setattr(bf, "ChildProbe", lambda *a, **k: pytest.fail("a probe ran after the stop"))
    traced, real = [], allocation_trace.step_trace
    monkeypatch.setattr(allocation_trace, "step_trace", lambda *a, **k: traced.append(k["micro_batch"]) or real(*a, **k))
    options = Options(profiles=["baseline"], experiment="tiny", device="cuda", gpu_memory="24GiB", steps=3)
    plan = Plan(options, load_experiment("tiny"), {"baseline": load_profile("baseline")}, "baseline", 24 * 2**30, "NVIDIA Fake")
    item = Item("max/baseline", "max", "baseline")
    find_max(plan, item, lambda line: None, lambda: bool(traced))  # the stop comes during the first trace
    assert (item.status, item.predicted_max_batch, item.max_batch) == ("interrupted", None, None)
    assert "stopped while predicting" in item.message and len(traced) == 1


def test_findings_from_the_h100_seed_shape_runs(tmp_path):
    """The report over real H100 runs (tests/data/gpu/seed-shape-h100, committed): findings computed from them."""
    import shutil

    from memlab.core.runfolder import read_info
    from memlab.core.study import Options, StudyState, write_report

    src = Path(__file__).resolve().parent / "data" / "gpu" / "seed-shape-h100" / "runs"
    state = StudyState(Options(profiles=[], experiment="seed_shape", device="cuda", gpu_memory="24GiB"), {})
    for d in sorted(p for p in src.iterdir() if (p / "summary.parquet").exists()):
        name = read_info(d)["profile"]["name"]
        if name in ("baseline", "window", "chunked_ce", "tf32", "compile") and name not in state.options.profiles:
            shutil.copytree(d, tmp_path / "runs" / d.name)
            state.options.profiles.append(name)
            item = state.item("common", name)
            item.status, item.run_dir = "finished", f"runs/{d.name}"
            state.item("max", name).status = "measured"
    write_report(state, tmp_path, "baseline")
    md = (tmp_path / "report.md").read_text()
    assert ("The B×T×V logits (B=64, T=256, V=50,304) are 79% of the peak, so attention kernels cannot move it; "
            "chunked cross-entropy does: chunked_ce measured 72% less.") in md
    assert "window: its window had no effect: window 512 >= seq_len 256: full causal attention" in md
    assert "tf32: no effect on memory (+0.0% against baseline); the estimator predicts the same peak" in md
    assert "**compile** is the fastest at the common batch: 9.9 ms a step, 5.49× baseline" in md
    assert "| baseline | 8.58 | 11.65 | 0.36 | 11.65 | 14.66 | 15.86 |" in md  # memory by phase, allocated / reserved / device


@pytest.mark.parametrize("lanes, device, memory, expect", [
    (0, "cuda", "24GiB", "--lanes 0: give 1 or more"),
    (2, "cpu", None, "it needs --device cuda and --gpu-memory"),
    (2, "cuda", None, "it needs --device cuda and --gpu-memory"),
    (4, "cuda", "24GiB", "--lanes 4 x --gpu-memory 24GiB is more than this GPU has (80.00 GiB); at most 3 lanes of 24GiB fit"),
])
def test_lanes_that_cannot_share_the_card_are_refused(lanes, device, memory, expect, monkeypatch):
    from memlab.core.errors import MemlabError
    from memlab.core.study import Options, check_lanes, make_plan

    monkeypatch.setattr(gpu_memory, "gpu_info", lambda index=0: gpu_memory.GpuInfo("NVIDIA Fake 80GB", 80 * 2**30))
    plan = make_plan(Options(profiles=["baseline"], experiment="tiny", device=device, gpu_memory=memory))
    with pytest.raises(MemlabError) as e:
        check_lanes(lanes, plan)
    assert expect in str(e.value)
    assert check_lanes(1, plan) == 1


def _three_lanes(names: list[str]):
    """A CUDA study plan of `names` on tiny, 24 GiB lanes on a pretend 80 GiB card, searched three at a time."""
    from memlab.core.config import load_experiment, load_profile
    from memlab.core.study import Options
    from memlab.core.study.plan import Plan

    options = Options(profiles=names, experiment="tiny", device="cuda", gpu_memory="24GiB", steps=3)
    return options, Plan(options, load_experiment("tiny"), {n: load_profile(n) for n in names}, "baseline", 24 * 2**30,
                         "NVIDIA Fake", 80 * 2**30, lanes=3)


def test_lanes_search_several_profiles_at_once_each_recorded(tmp_path, monkeypatch):
    """--lanes 3: three searches overlap (each its own probes), every profile gets its own answer in the state and the
    cache, and the probes are told that other processes share the card (NVML per-process figures only)."""
    import threading

    from memlab.core import batchfind as bf
    from memlab.core.study import Study, StudyState

    monkeypatch.setenv("MEMLAB_CACHE", str(tmp_path / "cache"))
    names = ["baseline", "bf16", "gradcp_bf16", "chunked_ce"]
    limits = dict(zip(names, (11, 13, 17, 19)))
    active, most, envs, lock = [0], [0], [], threading.Lock()

    class FakeProbe:
        def __init__(self, profile_ref, experiment_ref, overrides, **kw):
            self.name = profile_ref
            envs.append(kw.get("env"))

        def __call__(self, b):
            with lock:
                active[0] += 1
                most[0] = max(most[0], active[0])
            time.sleep(0.02)
            with lock:
                active[0] -= 1
            return bf.ProbeResult(b, b <= limits[self.name], message="" if b <= limits[self.name] else "CUDA out of memory")

        def close(self):
            pass

    monkeypatch.setattr(bf, "ChildProbe", FakeProbe)
    options, plan = _three_lanes(names)
    state = StudyState(options, {})
    lines: list[str] = []
    Study(plan, state, tmp_path, lines.append)._max_phase()
    assert {n: (state.item("max", n).status, state.item("max", n).max_batch) for n in names} == {n: ("measured", limits[n]) for n in names}
    assert most[0] == 3  # never more searches at once than lanes, and they did overlap
    assert envs == [{gpu_memory.PER_PROCESS_ENV: "1"}] * 4
    saved = json.loads((tmp_path / "study.json").read_text())
    assert sorted(k for k in saved["items"] if k.startswith("max/")) == sorted(f"max/{n}" for n in names)
    for n in names:
        key = bf.cache_key(plan.experiment, plan.profiles[n], "NVIDIA Fake", 24 * 2**30, steps=3)
        assert bf.cached_bounds(key)[:2] == (limits[n], limits[n] + 1)


def test_a_shared_card_without_per_process_nvml_is_refused_not_guessed(monkeypatch):
    """In a lane, the device-wide NVML figure would count the other lanes' memory: refused in one line instead."""
    from memlab.core.errors import DeviceError

    assert gpu_memory.process_use(5, lambda: 7) == 5 and gpu_memory.process_use(None, lambda: 7) == 7  # alone on the card
    monkeypatch.setenv(gpu_memory.PER_PROCESS_ENV, "1")
    assert gpu_memory.process_use(5, lambda: 7) == 5
    with pytest.raises(DeviceError, match="other processes share the card"):
        gpu_memory.process_use(None, lambda: 7)


def test_a_profile_with_its_own_overrides_is_said_to_be_another_experiment():
    from memlab.core.study.report import _own_overrides

    frame = pl.DataFrame({"profile": ["baseline", "optim_in_bwd", "optim_in_bwd"], "overrides": [None, "train.clip=0.0", "train.clip=0.0"]})
    assert _own_overrides(frame) == ["optim_in_bwd ran with its own experiment overrides (train.clip=0.0): another experiment than "
                                     "the baseline's, so it has no relative columns and its perplexity is not comparable."]
    assert _own_overrides(frame.drop("overrides")) == []


def test_a_stop_cancels_the_probes_in_flight_instead_of_waiting_for_them(tmp_path, monkeypatch):
    """--lanes 3 and a stop (Ctrl-C, or `timeout`'s SIGINT): each search's probe in flight is cancelled at once (a
    compiled probe runs for minutes), its profile recorded as interrupted, and nothing new starts."""
    import threading

    from memlab.core import batchfind as bf
    from memlab.core.study import Study, StudyState

    monkeypatch.setenv("MEMLAB_CACHE", str(tmp_path / "cache"))
    names = ["baseline", "bf16", "gradcp_bf16", "chunked_ce"]
    started, calls = threading.Semaphore(0), []

    class SlowProbe:
        def __init__(self, profile_ref, experiment_ref, overrides, **kw):
            self.cancelled = threading.Event()

        def __call__(self, b):
            calls.append(b)
            started.release()
            if not self.cancelled.wait(timeout=30):
                return bf.ProbeResult(b, True)
            raise bf.ProbeError(f"probe at micro-batch {b} ended with 'interrupted', not out of memory")

        def cancel(self):
            self.cancelled.set()

        def close(self):
            pass

    monkeypatch.setattr(bf, "ChildProbe", SlowProbe)
    options, plan = _three_lanes(names)
    study = Study(plan, StudyState(options, {}), tmp_path, lambda line: None)
    phase = threading.Thread(target=study._max_phase)
    phase.start()
    for _ in range(3):
        assert started.acquire(timeout=10)  # three lanes, each in a probe
    t0 = time.monotonic()
    study.stop()
    phase.join(timeout=10)
    assert not phase.is_alive() and time.monotonic() - t0 < 5
    statuses = {n: study.state.item("max", n).status for n in names}
    assert sorted(statuses.values()) == ["interrupted"] * 3 + ["pending"], statuses
    assert len(calls) == 3  # the fourth profile never started a probe


@pytest.mark.slow
def test_a_cancelled_probe_child_ends_as_interrupted_not_as_a_fit(tmp_path):
    """The real probe: a `memlab run` child cancelled mid-run is a ProbeError (interrupted), never a fit or an OOM."""
    import threading

    from memlab.core import batchfind as bf
    from memlab.core.config import load_experiment

    probe = bf.ChildProbe("baseline", "tiny", [], seq_len=load_experiment("tiny").model.seq_len, steps=100000, device="cpu",
                          runs_dir=tmp_path)
    threading.Timer(4.0, probe.cancel).start()
    t0 = time.monotonic()
    with pytest.raises(bf.ProbeError) as e:
        probe(2)
    assert "'interrupted'" in str(e.value) and time.monotonic() - t0 < 30


def test_a_partial_study_says_what_is_left_and_mixed_versions_are_named(tmp_path):
    """A stopped (or resumed-after-an-upgrade) study's report: the profiles not done yet at the top, and runs from
    different memlab commits or torch versions named with the profiles each ran (committed H100 runs of the seed
    shape, copied: no training here)."""
    import shutil

    from memlab.core.runfolder import read_info
    from memlab.core.study import Options, StudyState, write_report

    src = Path(__file__).resolve().parent / "data" / "gpu" / "seed-shape-h100" / "runs"
    state = StudyState(Options(profiles=["baseline", "bf16", "chunked_ce"], experiment="seed_shape", device="cuda", gpu_memory="24GiB"), {})
    for name in ("baseline", "bf16"):
        d = next(d for d in sorted(src.iterdir()) if (d / "summary.parquet").exists() and read_info(d)["profile"]["name"] == name)
        shutil.copytree(d, tmp_path / "runs" / d.name)
        item = state.item("common", name)
        item.status, item.run_dir = "finished", f"runs/{d.name}"
        state.item("max", name).status, state.item("max", name).max_batch = "measured", 102
    state.item("max", "chunked_ce").status, state.item("max", "chunked_ce").max_batch = "measured", 1961
    base_run = tmp_path / state.items["common/baseline"].run_dir / "run.json"
    info = json.loads(base_run.read_text())
    info["environment"]["git_sha"] = "0123abc"
    base_run.write_text(json.dumps(info))
    write_report(state, tmp_path, "baseline")
    md = (tmp_path / "report.md").read_text()
    assert "Not done yet: 1 of 3 profiles; the same command resumes. chunked_ce (max batch 1,961 measured; to do: run at the common batch)." in md
    note = next(line for line in md.splitlines() if "NOTE: these runs come from" in line)
    assert note.startswith("- NOTE: these runs come from 2 different versions (memlab commit, torch): memlab 0123abc · torch ")
    assert note.split("0123abc")[1].split(";")[0].endswith(": baseline") and "bf16" in note.split(";")[1]


def test_the_readmes_study_table_is_printed_from_the_committed_study():
    from bench_helpers import bench_module

    root = Path(__file__).resolve().parents[1]
    table = bench_module("study_readme_table").table(root / "bench/results/study-so-posts-h100")
    assert table.count("\n") == 35 and table in (root / "README.md").read_text()


@pytest.mark.parametrize("ms, expect", [(23.2, "2.32× as fast (23.2 ms"), (80.7, "50% slower (80.7 ms"), (53.9, "at the same speed")])
def test_the_speed_cost_of_the_memory_finding_reads_as_a_ratio(ms, expect):
    from memlab.core.study.findings import _speed_cost

    assert _speed_cost({"step_ms_median": ms}, {"step_ms_median": 53.8}).startswith(expect)


def _probes_up_to(limit, monkeypatch, budget=None):
    """find-batch's probe, faked: micro-batches up to `limit` fit (each measuring `budget`); the batches asked."""
    from memlab.core import batchfind as bf

    probed = []

    class FakeProbe:
        def __init__(self, *a, **k):
            pass

        def __call__(self, b):
            probed.append(b)
            return bf.ProbeResult(b, b <= limit, allocator_budget_bytes=budget, message="" if b <= limit else "CUDA out of memory")

        def close(self):
            pass

    monkeypatch.setattr(bf, "ChildProbe", FakeProbe)
    return probed


def _cuda_plan():
    """The study's plan for baseline on tiny, on a (fake) GPU under a 24 GiB card."""
    from memlab.core.config import load_experiment, load_profile
    from memlab.core.study.plan import Plan
    from memlab.core.study.state import Options

    options = Options(profiles=["baseline"], experiment="tiny", device="cuda", gpu_memory="24GiB", steps=3)
    return Plan(options, load_experiment("tiny"), {"baseline": load_profile("baseline")}, "baseline", 24 * 2**30, "NVIDIA Fake")


def test_a_resumed_search_keeps_the_prediction_it_started_from(tmp_path, monkeypatch):
    """On the H100 leanest's replayed prediction took ~5 minutes and was made again by every resume, each then stopped
    before its probe: an interrupted item keeps its prediction, and the search resumes from it and the cached bounds."""
    from memlab.core import batchfind as bf
    from memlab.core.study import maxbatch
    from memlab.core.study.state import Item

    monkeypatch.setenv("MEMLAB_CACHE", str(tmp_path))
    monkeypatch.setattr(maxbatch, "predicted_max", lambda *a, **k: pytest.fail("the prediction was made again"))
    probed = _probes_up_to(37, monkeypatch)
    item = Item("max/baseline", "max", "baseline", status="interrupted", predicted_max_batch=36, searched_on="NVIDIA Fake")
    maxbatch.find_max(_cuda_plan(), item, lambda line: None, lambda: False)
    assert (item.status, item.max_batch, item.predicted_max_batch) == ("measured", 37, 36)
    assert probed[0] == bf.start_below(36)


def test_a_search_resumed_on_another_gpu_model_starts_over(tmp_path, monkeypatch):
    """The kept prediction and bounds are for one GPU model (its reserve sets the allocator's budget under the cap)."""
    from memlab.core.study import maxbatch
    from memlab.core.study.state import Item

    monkeypatch.setenv("MEMLAB_CACHE", str(tmp_path))
    monkeypatch.setattr(maxbatch, "predicted_max", lambda *a, **k: (30, "24.00 GiB"))
    probed = _probes_up_to(37, monkeypatch)
    item = Item("max/baseline", "max", "baseline", status="interrupted", predicted_max_batch=36, known_fit=40,
                searched_on="NVIDIA H200")
    maxbatch.find_max(_cuda_plan(), item, lambda line: None, lambda: False)
    assert (item.max_batch, item.predicted_max_batch, item.searched_on) == (37, 30, "NVIDIA Fake")
    assert probed[0] == 16  # start_below(30), not past the H200's 40


def test_a_search_resumed_on_another_machine_starts_from_the_bounds_in_the_study_folder(tmp_path, monkeypatch):
    """find-batch's cache stays on the machine that searched (on the H100 a fresh machine would have begun
    compile_budget's search again, at ~100 s a probe): the item keeps its bounds in study.json, even when stopped."""
    from memlab.core.study.maxbatch import find_max
    from memlab.core.study.state import Item, StudyState, load_state

    probed, plan = _probes_up_to(37, monkeypatch), _cuda_plan()
    item = Item("max/baseline", "max", "baseline", predicted_max_batch=36, searched_on="NVIDIA Fake")
    monkeypatch.setenv("MEMLAB_CACHE", str(tmp_path / "first-machine"))
    find_max(plan, item, lambda line: None, lambda: len(probed) >= 2)  # stopped after two probes
    assert item.status == "interrupted" and (item.known_fit, item.known_oom) == (32, 64)
    StudyState(plan.options, {}, {item.key: item}).save(tmp_path)
    resumed = load_state(tmp_path).items[item.key]
    monkeypatch.setenv("MEMLAB_CACHE", str(tmp_path / "second-machine"))  # an empty cache
    probed.clear()
    find_max(plan, resumed, lambda line: None, lambda: False)
    assert (resumed.status, resumed.max_batch, resumed.known_fit, resumed.known_oom) == ("measured", 37, 37, 38)
    assert 32 not in probed and 64 not in probed and probed[0] == 48


def test_a_max_batch_item_records_the_allocator_budget_its_probes_measured(tmp_path, monkeypatch):
    """Under --gpu-memory each probe measures what the card leaves the allocator (NVML: context, driver's reserve);
    find-batch printed it, the study's report only said "capped at 24GiB"."""
    from memlab.core.study.maxbatch import find_max
    from memlab.core.study.report import _budget_text
    from memlab.core.study.state import Item, StudyState

    budget = int(22.79 * 2**30)
    monkeypatch.setenv("MEMLAB_CACHE", str(tmp_path))
    _probes_up_to(37, monkeypatch, budget)
    plan = _cuda_plan()
    item = Item("max/baseline", "max", "baseline", predicted_max_batch=36)
    find_max(plan, item, lambda line: None, lambda: False)
    assert (item.max_batch, item.allocator_budget_bytes) == (37, budget)
    other = Item("max/bf16", "max", "bf16", allocator_budget_bytes=budget - 2**28)
    options = plan.options
    assert "probes measured: 22.79 GiB;" in _budget_text(StudyState(options, {}, {item.key: item}))
    assert "probes measured: 22.54 GiB to 22.79 GiB;" in _budget_text(StudyState(options, {}, {item.key: item, other.key: other}))
    assert _budget_text(StudyState(options, {}, {})) == ""


def test_the_report_names_the_memlab_commits_its_max_batch_searches_ran(tmp_path, monkeypatch):
    """Probes are child runs, not run folders, so the runs' versions do not cover them: each max item keeps the
    commits its probes ran under, a search resumed after an update names both, another GPU model starts over."""
    from memlab.core import environment
    from memlab.core.config import load_profile
    from memlab.core.study import maxbatch
    from memlab.core.study.maxbatch import find_max
    from memlab.core.study.report import _searches_made_with
    from memlab.core.study.state import Item, StudyState

    monkeypatch.setenv("MEMLAB_CACHE", str(tmp_path))
    monkeypatch.setattr(maxbatch, "predicted_max", lambda *a, **k: (36, "24.00 GiB"))
    probed, plan = _probes_up_to(37, monkeypatch), _cuda_plan()
    plan.profiles["bf16"] = load_profile("bf16")
    monkeypatch.setattr(environment, "git_sha", lambda: "66f2cd9a1b2c")
    resumed = Item("max/baseline", "max", "baseline", predicted_max_batch=36)
    find_max(plan, resumed, lambda line: None, lambda: len(probed) >= 2)  # stopped, then resumed after an update
    monkeypatch.setattr(environment, "git_sha", lambda: "a5db0201c3d4")
    find_max(plan, resumed, lambda line: None, lambda: False)
    whole = Item("max/bf16", "max", "bf16", predicted_max_batch=36)
    find_max(plan, whole, lambda line: None, lambda: False)
    assert resumed.searched_with == ["66f2cd9a1b2c", "a5db0201c3d4"] and whole.searched_with == ["a5db0201c3d4"]
    assert _searches_made_with(StudyState(plan.options, {}, {whole.key: whole})) == ["max-batch searches: memlab a5db0201c3d4 (1 profile)"]
    assert _searches_made_with(StudyState(plan.options, {}, {resumed.key: resumed, whole.key: whole})) == [
        "max-batch searches by different memlab commits: memlab 66f2cd9a1b2c then a5db0201c3d4: baseline; memlab a5db0201c3d4: bf16"]
    moved = Item("max/bf16", "max", "bf16", predicted_max_batch=36, searched_on="NVIDIA H200", searched_with=["66f2cd9a1b2c"])
    find_max(plan, moved, lambda line: None, lambda: False)
    assert moved.searched_with == ["a5db0201c3d4"]


def test_resuming_with_other_profiles_adds_them_and_keeps_the_measured_ones(tmp_path, capsys, monkeypatch):
    """Issue 50: `--profiles` given again used to replace the study's list, dropping measured profiles from the
    report. The work itself is left out here (Study.run, the report): only what the study records is the point."""
    from memlab.core import study as st

    monkeypatch.setattr(st.Study, "run", lambda self: None)
    monkeypatch.setattr(st, "write_report", lambda *a, **k: None)
    out = tmp_path / "s"
    _study([*STUDY, "--profiles", "baseline,gradcp", "--out", str(out)])
    capsys.readouterr()
    _study([*STUDY, "--profiles", "bf16,baseline", "--out", str(out)])
    assert _state(out)["options"]["profiles"] == ["baseline", "gradcp", "bf16"]
    assert "study: adding bf16 to this study's profiles (baseline, gradcp)" in capsys.readouterr().err
    _study(["study", "--out", str(out)])  # no --profiles: the study's own list
    assert _state(out)["options"]["profiles"] == ["baseline", "gradcp", "bf16"]


def test_an_out_that_holds_other_files_and_no_study_is_refused_untouched(tmp_path, capsys):
    out = tmp_path / "runs"
    (out / "20261128-012343-baseline-cdb5").mkdir(parents=True)
    (out / "comparison.parquet").write_bytes(b"x")
    assert _study([*STUDY, "--profiles", "baseline", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"--out {out} is not empty and holds no study" in err and "no study.json" in err
    assert sorted(p.name for p in out.iterdir()) == ["20261128-012343-baseline-cdb5", "comparison.parquet"]


def _findings_frame(saved: dict[str, float]) -> pl.DataFrame:
    """A study's frame of finished common runs on the CPU: each profile's saving against baseline (in %), from which
    its peak follows; gradcp_bf16 checkpoints, chunked_ce chunks the loss."""
    base_peak, base_ms = 400 * 2**20, 100.0
    rows = []
    for i, (name, pct) in enumerate({"baseline": 0.0, **saved}.items()):
        ms = base_ms * (1 + 0.1 * i)
        rows.append({"profile": name, "study_kind": "common", "status": "finished", "study_status": "finished", "study_message": None,
                     "mem_saved_pct": pct, "peak_host_rss_bytes": int(base_peak * (1 - pct / 100)), "peak_alloc_bytes": None,
                     "step_ms_median": ms, "tokens_per_s": 8 * 64 * 1000 / ms, "speedup_x": base_ms / ms,
                     "checkpointing": "full" if name.startswith("gradcp") else "none", "attention_kernel": "sdpa",
                     "seq_len": 64, "micro_batch": 8, "batch_size": 8, "estimate_error_pct": None})
    return pl.DataFrame(rows)


def _breakdown(top: str):
    from memlab.core.predict.analytic import Estimate

    parts = {"logits_loss": 10, "activations": 10, "weights": 5, "gradients": 5, "optimizer_state": 5, "temporaries": 1, "workspace": 1}
    parts[top] = 100
    return {"baseline": Estimate("baseline", "tiny", 8, 1, 512, 1000, {k: v * 2**20 for k, v in parts.items()}, "backward", {})}


@pytest.mark.parametrize("top", ["logits_loss", "activations"])
@pytest.mark.parametrize("saved", [
    {"gradcp_bf16": 30.0, "chunked_ce": 55.0, "tf32": 0.4},
    {"gradcp_bf16": -3.8, "chunked_ce": -12.0, "tf32": -0.4},  # issue 50: "gradcp_bf16 measured -4% less"
])
def test_every_findings_sentence_says_the_direction_the_figures_have(top, saved):
    import re

    from memlab.core.study.findings import findings

    pct = {"baseline": 0.0, **saved}
    text = "\n".join(findings(_findings_frame(saved), _breakdown(top), "baseline"))
    assert not re.search(r"-\d[\d.]*% (less|more)", text), text
    claims = 0
    for name, n, way in re.findall(r"(\w+) measured (\d+)% (less|more)", text):
        assert way == ("less" if pct[name] > 0 else "more") and int(n) == round(abs(pct[name])), text
        claims += 1
    for name, n in re.findall(r"\*\*(\w+)\*\* saves the most memory: .*?\(([\d.]+)% less\)", text):
        assert pct[name] == max(pct.values()) > 0 and float(n) == pytest.approx(pct[name], abs=0.05)
        claims += 1
    for name, change in re.findall(r"(\w+): no effect on memory \(([+-][\d.]+)% against", text):
        assert float(change) == pytest.approx(-pct[name], abs=0.05), text  # + is more memory, as the estimator's
        claims += 1
    for technique, verb in re.findall(r"(chunked cross-entropy|checkpointing and activation offload) (does|should)", text):
        mover = "chunked_ce" if technique.startswith("chunked") else "gradcp_bf16"
        assert (verb == "does") == (pct[mover] >= 1), text
        claims += 1
    for name, n in re.findall(r"\*\*(\w+)\*\* saves the most memory: .*?, (\d+)% slower", text):
        assert int(n) > 0  # every profile here is slower than the baseline, by construction
    assert claims >= 3, text  # the sentences checked were there to check


def test_study_figures_tick_plain_numbers_and_keep_their_labels_inside():
    """Issue 50: ppl_vs_memory.png showed `+4.8651e2` and ticks of 0.0025; max_batch.png cut its y label."""
    from memlab.core.study import figures as F

    rows = [{"profile": p, "peak_host_rss_bytes": int(g * 2**30), "val_ppl": v, "step_ms_median": 10.0 + i,
             "max_batch_measured": False, "max_batch": None, "predicted_max_batch": b}
            for i, (p, g, v, b) in enumerate([("baseline", 0.3550, 486.51951, 7), ("gradcp", 0.3578, 486.51950, None), ("bf16", 0.3664, 486.51782, 10)])]
    fig = F.figure("ppl", lambda ax: F._scatter(ax, rows, "peak_host_rss_bytes", "val_ppl", "peak", "val ppl", front=False))
    fig.canvas.draw()
    ax = fig.axes[0]
    for axis, values in ((ax.yaxis, [r["val_ppl"] for r in rows]), (ax.xaxis, [r["peak_host_rss_bytes"] / 2**30 for r in rows])):
        assert axis.get_offset_text().get_text() == ""
        labels = [t.get_text() for t in axis.get_ticklabels() if t.get_visible() and t.get_text()]
        ticks = [float(t.replace(",", "")) for t in labels]
        assert len(set(labels)) == len(labels) >= 3 and not any("e" in t for t in labels)  # each tick its own number
        assert min(ticks) <= max(values) and max(ticks) >= min(values)  # the values themselves, not offsets from one
    fig = F.figure("max", lambda ax: F._max_batch(ax, rows))
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    label = fig.axes[0].yaxis.label.get_window_extent(renderer)
    page = fig.bbox
    assert page.y0 <= label.y0 and label.y1 <= page.y1 and page.x0 <= label.x0  # the y label is whole on the page


def test_the_common_batch_is_accumulated_where_a_profiles_measured_micro_batch_is_smaller(tmp_path):
    """On the H100 a Llama-3.2-1B study under 24 GiB measured max micro-batch 1 for gradcp_bf16 and ran its common
    batch 2 as micro-batch 2 anyway (out of memory). The common batch stays the same (the same math); it is split
    into micro-batch x accumulation within what the search measured, and not run where micro-batch 1 does not fit."""
    from memlab.core.study import Study, StudyState

    names = ["baseline", "bf16", "gradcp_bf16", "accum", "chunked_ce"]
    options, plan = _three_lanes(names)
    options.batch = "12"
    state = StudyState(options, {})
    for name, status, found in (("baseline", "measured", 40), ("bf16", "measured", 5), ("gradcp_bf16", "measured", 1),
                                ("accum", "measured", 2), ("chunked_ce", "does not fit", 0)):
        state.item("max", name).status, state.item("max", name).max_batch = status, found
    study = Study(plan, state, tmp_path, lambda line: None)
    split = {n: study._batch_for(state.item("common", n)) for n in names}
    assert split["baseline"] == (12, None, "")  # fits whole: the profile's own accumulation (1)
    assert split["bf16"] == (12, 3, "")  # micro-batch 4 x 3: the largest divisor of 12 within 5
    assert split["gradcp_bf16"] == (12, 12, "")
    assert split["accum"] == (12, 6, "")  # its own 4 steps would need micro-batch 3 > 2: 2 x 6
    assert split["chunked_ce"][0] is None and "even micro-batch 1 does not fit" in split["chunked_ce"][2]
    # final, not "not run": the report does not list it as left to do, and a resume does not try it again
    assert study._spec(state.item("common", "chunked_ce")) is None and state.item("common", "chunked_ce").final


def test_an_out_of_memory_at_an_accumulated_micro_batch_the_search_fitted_says_why():
    """The H200's Llama-3.2-1B study under 24 GiB: micro-batch 1 fitted alone, its common batch 2 as 1 x 2 did not."""
    from memlab.core.study.findings import _accumulated

    row = {"study_status": "oom", "micro_batch": 1, "grad_accum": 2, "max_batch": 1}
    assert "the earlier micro-batches' gradients stay alive through the later ones' forward" in _accumulated(row)
    assert _accumulated(row | {"grad_accum": 1}) == _accumulated(row | {"micro_batch": 2}) == ""
    assert _accumulated(row | {"study_status": "nan"}) == ""


def test_a_failures_finding_keeps_an_out_of_memory_message_to_the_allocation_that_failed():
    """The allocator's paragraph of advice stays in the run's folder; the finding is one line."""
    from memlab.core.study.findings import _first_sentence

    oom = ("CUDA out of memory in backward: CUDA out of memory. Tried to allocate 1.96 GiB. GPU 0 has a total capacity of "
           "79.18 GiB of which 56.13 GiB is free. If reserved but unallocated memory is large try setting ...")
    assert _first_sentence(oom) == "CUDA out of memory in backward: CUDA out of memory. Tried to allocate 1.96 GiB."
    assert _first_sentence("nan: the loss went NaN at step 3") == "nan: the loss went NaN at step 3"


def test_where_the_peak_goes_is_the_formulas_for_memlabs_gpt_and_the_traces_for_a_transformers_model():
    """The GPT-2 formula counts memlab's GPT's logits apart; a transformers model's breakdown is its trace's, which
    does not, so the finding names one fp32 logits copy's size from the shape, where the run computed full logits."""
    from memlab.core.config import load_experiment, load_profile
    from memlab.core.predict.analytic import vocab_for
    from memlab.core.study.findings import _where_the_peak_goes, breakdown
    from memlab.core.units import gib

    gpt = breakdown(load_experiment("tiny"), load_profile("bf16"), 512, 2, "cpu")
    assert gpt.method == "analytic" and gpt.components["logits_loss"] > 0
    e = load_experiment("llama-tiny")
    vocab = vocab_for(e)[0]
    hf = breakdown(e, load_profile("baseline"), vocab, 2, "cpu")
    assert hf.method == "fake" and hf.components["logits_loss"] == 0 and hf.components["optimizer_state"] > 0
    row = {"profile": "baseline", "seq_len": e.model.seq_len, "loss_kernel": "full logits", "checkpointing": "none"}
    (line,) = _where_the_peak_goes(hf, [row], None)
    assert line.startswith(f"Where baseline's peak goes (the trace, micro-batch 2, {gib(hf.total_bytes)}): ")
    assert f"(B=2, T={e.model.seq_len}, V={vocab:,}; the loss upcasts them) is {gib(2 * e.model.seq_len * vocab * 4)}" in line
    (chunked,) = _where_the_peak_goes(hf, [row | {"loss_kernel": "chunked (1024 rows)"}], None)
    assert "logits" not in chunked


def test_where_the_baseline_did_not_finish_the_peak_told_is_the_first_finished_profiles():
    """A baseline that did not fit the card (Llama-3.2-1B's bf16 under 24 GiB) has no run to break down."""
    import dataclasses

    from memlab.core.study.findings import findings

    est = dataclasses.replace(_breakdown("activations")["baseline"], profile="gradcp_bf16")
    text = "\n".join(findings(_findings_frame({"gradcp_bf16": 30.0, "chunked_ce": 5.0, "tf32": 0.4}), {"gradcp_bf16": est}, "baseline"))
    assert "Where gradcp_bf16's peak goes (the estimator, micro-batch 8" in text


def test_a_prediction_made_apart_is_the_one_made_in_process():
    """Lanes predict in processes of their own (a GIL each); the answer is the same one."""
    from memlab.core.study import maxbatch

    plan = _cuda_plan()
    here = maxbatch.predicted_max(plan, "baseline")
    apart = maxbatch.predicted_max(plan, "baseline", apart_env={"CUDA_VISIBLE_DEVICES": ""})
    assert here == apart and here[0] and here[0] > 0


def test_a_stop_ends_a_prediction_made_apart():
    import time

    from memlab.core.predict.trace import SearchStopped
    from memlab.core.study import maxbatch

    t0 = time.monotonic()
    with pytest.raises(SearchStopped):
        maxbatch.predicted_max(_cuda_plan(), "baseline", stopping=lambda: time.monotonic() - t0 > 0.3, apart_env={})
    assert time.monotonic() - t0 < 10
