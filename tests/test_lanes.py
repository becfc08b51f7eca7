"""Lanes (memlab.core.lanes): one queue drained over several GPUs, each child pinned with CUDA_VISIBLE_DEVICES.
Fake children (tests/fake_children.py) report the CUDA_VISIBLE_DEVICES they saw; the GPU count is faked."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import polars as pl
import pytest
from fake_children import fake_spec

from memlab.core.errors import ConfigError
from memlab.core.lanes import CPU_LANE, FAKE_COUNT_ENV, Lane, LaneQueue, map_on_lanes, plan_lanes

GPU0, GPU1 = Lane((0,), ("0",)), Lane((1,), ("1",))


def _seen(outcome) -> str | None:
    return (outcome.result.summary or {}).get("cuda_visible_devices")


def test_the_next_item_goes_to_whichever_lane_is_free_each_child_pinned_to_its_gpu(tmp_path):
    """`slow` holds one lane until the three quick ones have run, one after another, on the other lane."""
    kinds = {"slow": "waits_for_release", "b": "reports_gpu", "c": "reports_gpu", "d": "reports_gpu"}
    claimed: list[tuple[str, Lane]] = []

    def on_result(outcome):
        if sum(o.key in "bcd" for o in queue_outcomes + [outcome]) == 3:
            (tmp_path / "release-slow").touch()
        queue_outcomes.append(outcome)

    queue_outcomes: list = []
    queue = LaneQueue([GPU0, GPU1], on_start=lambda key, spec, lane: claimed.append((key, lane)), on_result=on_result)
    outcomes = queue.run((k, fake_spec(kind, tmp_path, profile=k)) for k, kind in kinds.items())
    assert [o.key for o in outcomes] == ["b", "c", "d", "slow"]  # the quick ones ended while `slow` still ran
    assert all(o.status == "finished" for o in outcomes)
    assert sorted(k for k, _ in claimed) == ["b", "c", "d", "slow"]
    lane_of = {o.key: o.lane for o in outcomes}
    assert lane_of["b"] == lane_of["c"] == lane_of["d"] != lane_of["slow"]  # one lane drained the rest
    for o in outcomes:
        assert _seen(o) == o.lane.ids[0]  # each child saw exactly its lane's GPU


def test_a_lane_whose_gpu_fails_is_taken_out_its_run_crashed_and_the_others_go_on(tmp_path):
    kinds = ["gpu_fault", "reports_gpu", "reports_gpu", "reports_gpu", "reports_gpu"]
    queue = LaneQueue([GPU0, GPU1])
    outcomes = queue.run((i, fake_spec(k, tmp_path, profile=f"p{i}")) for i, k in enumerate(kinds))
    by_key = {o.key: o for o in outcomes}
    bad = by_key[0]
    assert bad.status == "crashed" and "uncorrectable ECC error" in bad.result.message and "taken out" in bad.result.message
    assert list(queue.out) == [bad.lane]
    run = bad.result.run_dir
    assert json.loads((Path(run) / "run.json").read_text())["status"] == "crashed"
    rest = [by_key[i] for i in range(1, 5)]
    assert all(o.status == "finished" for o in rest)
    good = {o.lane for o in rest}
    assert len(good) == 1 and bad.lane not in good
    assert all(_seen(o) == o.lane.ids[0] for o in rest)


def test_when_every_lane_is_out_the_rest_is_skipped(tmp_path):
    outcomes = LaneQueue([GPU0]).run((i, fake_spec(k, tmp_path, profile=f"p{i}")) for i, k in enumerate(["gpu_fault", "finished", "finished"]))
    assert [o.status for o in outcomes] == ["crashed", "skipped", "skipped"]
    assert "every lane's GPU failed" in outcomes[1].result.message


def test_a_run_that_fails_on_its_own_leaves_its_lane_in(tmp_path, monkeypatch):
    monkeypatch.setattr("memlab.core.lanes.nvml_fault", lambda lane: None)  # NVML (if any) says the GPU is fine
    queue = LaneQueue([GPU0])
    outcomes = queue.run((i, fake_spec(k, tmp_path, profile=f"p{i}")) for i, k in enumerate(["sigkilled", "oom", "finished"]))
    assert [o.status for o in outcomes] == ["crashed", "oom", "finished"]
    assert queue.out == {}


def test_stop_stops_every_lane_keeps_their_folders_and_skips_the_rest(tmp_path):
    stepping: set[str] = set()
    lock = threading.Lock()

    def on_event(key, event):
        if event["event"] == "step":
            with lock:
                stepping.add(key)
                if stepping == {"a", "b"}:
                    queue.stop(grace_s=5)

    queue = LaneQueue([GPU0, GPU1], on_event=on_event)
    items = [("a", "sleeps"), ("b", "sleeps"), ("c", "finished"), ("d", "finished")]
    outcomes = queue.run((k, fake_spec(kind, tmp_path, profile=k)) for k, kind in items)
    status = {o.key: o.status for o in outcomes}
    assert status == {"a": "interrupted", "b": "interrupted", "c": "skipped", "d": "skipped"}
    for o in outcomes[:2]:
        assert pl.read_parquet(f"{o.result.run_dir}/summary.parquet")["status"].to_list() == ["interrupted"]


def test_map_on_lanes_keeps_the_items_order_and_raises_what_work_raised():
    seen = map_on_lanes(lambda item, lane: (item, lane.name), [1, 2, 3, 4], [GPU0, GPU1])
    assert [s[0] for s in seen] == [1, 2, 3, 4] and {s[1] for s in seen} <= {"gpu 0", "gpu 1"}

    def work(item, lane):
        if item == 3:
            raise ValueError("probe broke")
        return item

    with pytest.raises(ValueError, match="probe broke"):
        map_on_lanes(work, [1, 2, 3, 4], [GPU0])


def test_plan_lanes_one_per_gpu_or_per_nproc_gpus_one_cpu_lane_without(monkeypatch):
    monkeypatch.setenv(FAKE_COUNT_ENV, "4")
    assert [lane.name for lane in plan_lanes(None, "cuda")] == ["gpu 0", "gpu 1", "gpu 2", "gpu 3"]
    assert [lane.env for lane in plan_lanes("2,0", "cuda")] == [{"CUDA_VISIBLE_DEVICES": "2"}, {"CUDA_VISIBLE_DEVICES": "0"}]
    assert [lane.name for lane in plan_lanes(None, "cuda", nproc=2)] == ["gpus 0,1", "gpus 2,3"]
    assert [lane.env for lane in plan_lanes("3,1,0", "cuda", nproc=3)] == [{"CUDA_VISIBLE_DEVICES": "3,1,0"}]
    assert plan_lanes(None, "cpu") == [CPU_LANE] and CPU_LANE.env == {}
    monkeypatch.setenv(FAKE_COUNT_ENV, "0")
    assert plan_lanes(None, "cuda") == [CPU_LANE]


@pytest.mark.parametrize("gpus, nproc, device, expect", [
    ("4", None, "cuda", "--gpus 4: GPU 4 is not visible (visible: 0,1,2,3)"),
    ("0,0", None, "cuda", "--gpus 0,0: GPU 0 is listed twice; give each GPU once"),
    ("0,1", 3, "cuda", "--nproc 3 needs 3 GPUs a run but --gpus gives 2 (0,1); give more GPUs or fewer ranks"),
    (None, 5, "cuda", "--nproc 5 needs 5 GPUs a run but --gpus gives 4"),
    ("one", None, "cuda", "--gpus one: 'one' is not a GPU index (visible: 0,1,2,3)"),
    ("0,,1", None, "cuda", "--gpus '0,,1': give comma-separated GPU indices"),
    ("0", None, "cpu", "--gpus 0 picks GPUs for CUDA runs; with --device cpu leave it out"),
])
def test_bad_gpus_are_one_line(monkeypatch, gpus, nproc, device, expect):
    monkeypatch.setenv(FAKE_COUNT_ENV, "4")
    with pytest.raises(ConfigError) as e:
        plan_lanes(gpus, device, nproc)
    assert expect in str(e.value) and "\n" not in str(e.value)


def test_no_gpu_here_says_so(monkeypatch):
    monkeypatch.setenv(FAKE_COUNT_ENV, "0")
    with pytest.raises(ConfigError, match="this host has no visible GPU; leave --gpus out to run on the CPU"):
        plan_lanes("0", "cuda")


class _FakeNvml:
    """pynvml's calls gpu_identity makes: GPU 3 has a serial number, GPU 2 (a consumer card) has none."""

    class NVMLError_NotSupported(Exception):
        pass

    def nvmlInit(self):
        pass

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetSerial(self, h):
        if h == 2:
            raise self.NVMLError_NotSupported("Not Supported")
        return b"1654922003177"

    def nvmlDeviceGetUUID(self, h):
        return f"GPU-{h}"


def test_a_run_records_which_physical_gpus_it_used_and_a_missing_serial_is_blank():
    from memlab.core.environment import gpu_identity

    assert gpu_identity([3], _FakeNvml()) == {"gpu_index": "3", "gpu_serial": "1654922003177", "gpu_uuid": "GPU-3"}
    assert gpu_identity([2], _FakeNvml()) == {"gpu_index": "2", "gpu_serial": None, "gpu_uuid": "GPU-2"}
    assert gpu_identity([2, 3], _FakeNvml())["gpu_serial"] == "?,1654922003177"


def test_without_nvml_a_run_records_the_index_alone():
    from memlab.core.environment import gpu_identity

    class NoDriver(_FakeNvml):
        def nvmlInit(self):
            raise OSError("NVML Shared Library Not Found")

    assert gpu_identity([1], NoDriver()) == {"gpu_index": "1", "gpu_serial": None, "gpu_uuid": None}


def test_summary_and_run_json_carry_the_gpu_columns():
    from memlab.core.metrics import BY_NAME

    assert {"gpu_index", "gpu_serial", "gpu_name"} <= set(BY_NAME)


def test_a_study_stopped_on_two_lanes_resumes_on_the_gpu_it_is_given_now(tmp_path, monkeypatch):
    """Two lanes, stopped while two runs train: the finished run is kept, the stopped ones are interrupted; the
    resumed study, given GPU 3 alone, runs those two there and leaves the finished one alone."""
    import time

    from memlab.core.config import load_experiment, load_profile
    from memlab.core.study import Options, Study, StudyState
    from memlab.core.study.plan import Plan

    names = ["baseline", "bf16", "gradcp"]
    options = Options(profiles=names, experiment="tiny", device="cpu")
    plan = Plan(options, load_experiment("tiny"), {n: load_profile(n) for n in names}, "baseline", None, None)
    state = StudyState(options, {})
    for n in names:
        state.item("max", n).status = "predicted"
    (tmp_path / "runs").mkdir()
    kinds = {"baseline": "reports_gpu", "bf16": "sleeps", "gradcp": "sleeps"}
    monkeypatch.setattr(Study, "_spec", lambda self, item: fake_spec(kinds[item.profile], self.out / "runs", profile=item.profile))
    lines: list[str] = []
    first = Study(plan, state, tmp_path, lines.append, lanes=[GPU0, GPU1])
    worker = threading.Thread(target=first._one_queue, args=(["common"],))
    worker.start()
    deadline = time.time() + 60
    while time.time() < deadline and not (state.item("common", "baseline").final and len(list((tmp_path / "runs").iterdir())) == 3):
        time.sleep(0.05)
    time.sleep(0.3)  # the sleeping runs have stepped
    first.stop()
    worker.join(timeout=60)
    assert {n: state.item("common", n).status for n in names} == {"baseline": "finished", "bf16": "interrupted", "gradcp": "interrupted"}
    kept = state.item("common", "baseline").run_dir

    kinds.update(bf16="reports_gpu", gradcp="reports_gpu")
    seen: dict[str, str] = {}
    gpu3 = Lane((3,), ("3",))
    second = Study(plan, state, tmp_path, lines.append, lanes=[gpu3])
    monkeypatch.setattr(second, "_ended", lambda o, inner=second._ended: seen.update({o.key.profile: _seen(o)}) or inner(o))
    second._one_queue(["common"])
    assert seen == {"bf16": "3", "gradcp": "3"}  # the finished run was not run again
    assert {n: state.item("common", n).status for n in names} == {n: "finished" for n in names}
    assert state.item("common", "baseline").run_dir == kept and state.item("common", "bf16").lane == "gpu 3"
    assert any(ln.startswith("[common bf16] common batch None on gpu 3") for ln in lines)


@pytest.mark.parametrize("gpus, expect", [("0,0", "--gpus 0,0: GPU 0 is listed twice"), ("9", "--gpus 9: GPU 9 is not visible")])
def test_study_refuses_bad_gpus_before_the_study_folder_exists(monkeypatch, capsys, tmp_path, gpus, expect):
    from memlab.cli import main

    monkeypatch.setenv(FAKE_COUNT_ENV, "4")
    with pytest.raises(SystemExit) as exit_:
        main(["study", "--out", str(tmp_path / "study"), "--profiles", "baseline,bf16", "--experiment", "tiny", "--device", "cpu", "--gpus", gpus])
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert exit_.value.code == 2 and len(err) == 1 and expect in err[0], err
    assert not (tmp_path / "study").exists()


def test_a_search_whose_gpu_fails_takes_its_lane_out_and_the_other_lane_searches_the_rest(tmp_path, monkeypatch):
    from memlab.core.config import load_experiment, load_profile
    from memlab.core.study import Options, Study, StudyState
    from memlab.core.study import execute
    from memlab.core.study.plan import Plan

    names = ["bf16", "baseline", "gradcp", "gradcp_bf16"]
    options = Options(profiles=names, experiment="tiny", device="cuda")
    plan = Plan(options, load_experiment("tiny"), {n: load_profile(n) for n in names}, "baseline", None, "NVIDIA Fake")

    def fake_find_max(plan, item, on_probe, stopping, live=None, env=None, apart=False):
        item.status, item.max_batch = "measured", 8
        if item.profile == "bf16":
            item.status, item.message = "error", "probe at micro-batch 8 ended with 'error': CUDA error: uncorrectable ECC error encountered"

    monkeypatch.setattr(execute, "find_max", fake_find_max)
    state = StudyState(options, {})
    study = Study(plan, state, tmp_path, lambda line: None, lanes=[GPU0, GPU1])
    study._max_phase()
    bad = state.item("max", "bf16")
    assert bad.status == "crashed" and "uncorrectable ECC" in bad.message and "the lane is taken out (1 lane(s) go on)" in bad.message
    assert {lane.name for lane in study.out_lanes} == {bad.lane}
    rest = [state.item("max", n) for n in names[1:]]
    assert all(i.status == "measured" for i in rest) and {i.lane for i in rest} == {"gpu 0", "gpu 1"} - {bad.lane}


def test_a_lane_whose_search_has_ended_trains_while_another_lane_still_searches(tmp_path, monkeypatch):
    """The study's phases are one queue (core.study.ready): on two lanes, the quick profile's run starts while the
    slow profile's search is still going. On a 4-GPU H200 host every run waited for the slowest search (90 s)."""
    run_started = threading.Event()
    slow_search_saw_the_run: list[bool] = []

    def fake_find_max(plan, item, on_probe, stopping, live=None, env=None, apart=False):
        if item.profile == "gradcp":  # the slow search: still going until a run has started, or 30 s
            slow_search_saw_the_run.append(run_started.wait(timeout=30))
        item.status, item.max_batch = "measured", 8

    study, state = _two_lane_study(tmp_path, monkeypatch, fake_find_max, on_run=lambda item: run_started.set())
    names = ["bf16", "gradcp"]
    study.run()
    assert slow_search_saw_the_run == [True]
    assert {n: state.item("common", n).status for n in names} == {n: "finished" for n in names}
    assert state.item("common", "bf16").lane != state.item("max", "gradcp").lane  # trained beside the slow search


def test_a_run_starts_beside_its_own_search_once_a_probe_has_fitted_its_micro_batch(tmp_path, monkeypatch):
    """The common run's micro-batch is known once a probe fitted it: the run goes on a free lane while its search
    goes on (on a 4-GPU H200 the study ended with sac_ops' run, 26 s after its 197 s search)."""
    own_run_started = threading.Event()
    search_saw_its_run: list[bool] = []

    def fake_find_max(plan, item, on_probe, stopping, live=None, env=None, apart=False):
        if item.profile == "gradcp":
            item.known_fit = 16  # a probe fitted 16: the run's 8 (the experiment's batch) fits
            search_saw_its_run.append(own_run_started.wait(timeout=30))
        item.status, item.max_batch = "measured", 32

    study, state = _two_lane_study(tmp_path, monkeypatch, fake_find_max,
                                   on_run=lambda item: item.profile == "gradcp" and own_run_started.set())
    study.run()
    assert search_saw_its_run == [True]
    assert state.item("common", "gradcp").status == "finished" and state.item("common", "gradcp").accumulation is None


def _two_lane_study(tmp_path, monkeypatch, fake_find_max, on_run):
    """A study of bf16 and gradcp on tiny over two fake GPU lanes: searches by `fake_find_max`, runs by fake children
    (`on_run(item)` as each starts)."""
    from memlab.core.config import load_experiment, load_profile
    from memlab.core.study import Options, Study, StudyState
    from memlab.core.study import execute
    from memlab.core.study.plan import Plan

    names = ["bf16", "gradcp"]
    options = Options(profiles=names, experiment="tiny", device="cuda")
    plan = Plan(options, load_experiment("tiny"), {n: load_profile(n) for n in names}, "baseline", None, "NVIDIA Fake")
    monkeypatch.setattr(execute, "find_max", fake_find_max)
    monkeypatch.setattr(Study, "_spec", lambda self, item: fake_spec("reports_gpu", self.out / "runs", profile=item.profile))
    (tmp_path / "runs").mkdir()
    state = StudyState(options, {})
    study = Study(plan, state, tmp_path, lambda line: None, lanes=[GPU0, GPU1])
    monkeypatch.setattr(study, "_started", lambda item, spec, lane, inner=study._started: (inner(item, spec, lane), on_run(item)))
    return study, state


def test_a_run_waits_for_its_search_until_a_probe_fits_its_micro_batch():
    from memlab.core.config import load_experiment, load_profile
    from memlab.core.study import Options, Study, StudyState
    from memlab.core.study.plan import Plan

    def needs(known_fit, batch="experiment", on="NVIDIA Fake"):
        options = Options(profiles=["gradcp"], experiment="tiny", device="cuda", batch=batch)
        plan = Plan(options, load_experiment("tiny"), {"gradcp": load_profile("gradcp")}, "baseline", None, on)
        state = StudyState(options, {})
        state.item("max", "gradcp").known_fit = known_fit
        return Study(plan, state, Path("."), lambda line: None)._needs(state.item("common", "gradcp"))

    assert needs(None) == needs(7) == ["max/gradcp"]  # nothing fitted yet, or below the experiment's batch of 8
    assert needs(8) == [] and needs(8, batch="4") == []
    assert needs(8, batch="16") == ["max/gradcp"]
    assert needs(64, batch="baseline-max") == ["max/gradcp", "max/baseline"]  # the batch is the baseline's: unknown yet


def test_a_run_waits_for_the_searches_it_needs():
    """A run needs its own profile's search, and with --batch baseline-max the baseline's; an item final before
    the pass is no reason to wait."""
    from memlab.core.study.ready import ReadyItems
    from memlab.core.study.state import Item

    needs = {"max/a": [], "max/baseline": [], "common/a": ["max/a", "max/baseline"], "common/b": ["max/b"]}
    items = [Item("max/baseline", "max", "baseline"), Item("max/a", "max", "a"), Item("common/a", "common", "a"), Item("common/b", "common", "b")]
    ready = ReadyItems(items, lambda i: needs[i.key])
    first, second = ready.take(lambda: False), ready.take(lambda: False)
    assert (first.key, second.key) == ("max/baseline", "max/a")
    assert ready.take(lambda: False).key == "common/b"  # max/b was final before the pass
    assert ready.take(lambda: True) is None  # common/a is not ready: the lane gives up when told to
    ready.ended(second)
    asked: list[int] = []
    assert ready.take(lambda: asked.append(1) or len(asked) > 2) is None  # still waits for the baseline's search
    ready.ended(first)
    assert ready.take(lambda: False).key == "common/a" and ready.left == []
