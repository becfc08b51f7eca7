"""The engine and the run store on the CPU backend: a real tiny run, its events, its folder, its summary."""

from __future__ import annotations

import json
import math

import polars as pl
import pytest
import torch

from memlab.core import schema
from memlab.core.config import load_profile
from memlab.core.engine import train
from memlab.core.events import ListSink
from memlab.core.runner import run_profile

CPU = torch.device("cpu")
REQUIRED_SUMMARY = (
    "run_id profile experiment status device gpu_name params batch_size grad_accum seq_len precision attention_kernel "
    "checkpointing steps tokens peak_alloc_fwd_bytes peak_alloc_bwd_bytes peak_alloc_opt_bytes peak_alloc_bytes "
    "peak_reserved_bytes peak_nvml_bytes peak_host_rss_bytes step_ms_median step_ms_p90 tokens_per_s mfu "
    "time_to_first_step_s total_s val_loss val_ppl torch_version"
).split()


def test_train_emits_events_in_order_and_learns(tiny):
    tiny.train.steps = 12
    sink = ListSink()
    summary = train(tiny, load_profile("baseline"), sink, device=CPU)
    kinds = [e["event"] for e in sink.events]
    assert kinds[0] == "started" and kinds[-1] == "finished"
    steps = sink.of("step")
    assert [e["step"] for e in steps] == list(range(12))
    assert steps[-1]["loss"] < steps[0]["loss"]  # it trains
    assert summary["status"] == "finished" and summary["steps"] == 12
    assert summary["tokens"] == 12 * tiny.train.batch_size * tiny.model.seq_len
    assert math.isclose(summary["val_ppl"], math.exp(summary["val_loss"]))
    assert summary["attention_kernel"] == "eager"
    # warm-up: lr rises linearly over warmup_steps, then decays
    lrs = [e["lr"] for e in steps]
    assert lrs[0] == pytest.approx(tiny.train.lr / tiny.train.warmup_steps)
    assert max(lrs) == pytest.approx(lrs[tiny.train.warmup_steps - 1]) and lrs[-1] < max(lrs)


def test_cpu_figures_are_null_not_zero(tiny):
    summary = train(tiny, load_profile("bf16"), ListSink(), device=CPU)
    for key in ("peak_alloc_fwd_bytes", "peak_alloc_bwd_bytes", "peak_alloc_opt_bytes", "peak_alloc_bytes", "peak_reserved_bytes", "peak_nvml_bytes", "mfu", "gpu_name"):
        assert summary[key] is None, key
    assert summary["peak_host_rss_bytes"] > 10 * 2**20
    assert summary["step_ms_median"] > 0 and summary["tokens_per_s"] > 0
    assert summary["step_ms_p90"] >= summary["step_ms_median"]
    assert summary["precision"] == "bf16"


def test_same_seed_same_losses(tiny):
    a, b = ListSink(), ListSink()
    train(tiny, load_profile("baseline"), a, device=CPU)
    train(tiny, load_profile("baseline"), b, device=CPU)
    assert [e["loss"] for e in a.of("step")] == [e["loss"] for e in b.of("step")]


def test_every_profile_of_an_experiment_is_evaluated_on_the_same_tokens(tiny):
    a, b = ListSink(), ListSink()
    train(tiny, load_profile("baseline"), a, device=CPU)
    train(tiny, load_profile("gradcp"), b, device=CPU)
    # gradient checkpointing recomputes, it does not change the math: same losses, same validation
    assert [e["loss"] for e in a.of("step")] == pytest.approx([e["loss"] for e in b.of("step")], rel=1e-5)
    assert a.of("eval")[-1]["val_loss"] == pytest.approx(b.of("eval")[-1]["val_loss"], rel=1e-5)


def test_accumulation_keeps_the_effective_batch(tiny):
    p = load_profile("baseline")
    p.accumulation.steps = 2
    sink = ListSink()
    summary = train(tiny, p, sink, device=CPU)
    assert (summary["batch_size"], summary["micro_batch"], summary["grad_accum"]) == (8, 4, 2)
    plain = ListSink()
    train(tiny, load_profile("baseline"), plain, device=CPU)
    assert [e["loss"] for e in sink.of("step")] == pytest.approx([e["loss"] for e in plain.of("step")], rel=1e-4)


def test_eval_every(tiny):
    tiny.train.eval_every = 2
    sink = ListSink()
    train(tiny, load_profile("baseline"), sink, device=CPU)
    assert [e["step"] for e in sink.of("eval")] == [2, 4, 6]


def test_run_store_folder(tiny, tmp_path):
    summary, run_dir = run_profile(tiny, load_profile("baseline"), runs_dir=tmp_path, device=CPU)
    run_id = run_dir.name
    assert run_id.split("-")[2] == "baseline" and len(run_id.split("-")[-1]) == 4
    meta = json.loads((run_dir / schema.RUN_JSON).read_text())
    assert meta["status"] == "finished" and meta["schema_version"] == schema.SCHEMA_VERSION
    assert meta["profile"]["name"] == "baseline" and meta["experiment"]["model"]["d_model"] == tiny.model.d_model
    assert meta["environment"]["torch"] == torch.__version__
    events = [json.loads(line) for line in (run_dir / schema.EVENTS).read_text().splitlines()]
    assert events[0]["event"] == "started" and events[-1]["event"] == "finished"
    steps = pl.read_parquet(run_dir / schema.STEPS)
    assert steps.height == tiny.train.steps and steps["step"].to_list() == list(range(tiny.train.steps))
    assert steps.schema == pl.Schema(schema.STEP_SCHEMA)
    s = pl.read_parquet(run_dir / schema.SUMMARY)
    assert s.height == 1 and set(REQUIRED_SUMMARY) <= set(s.columns)
    row = s.row(0, named=True)
    assert row["status"] == "finished" and row["run_id"] == run_id
    measured = steps.filter(pl.col("measured"))["step_ms"]
    assert row["step_ms_median"] == pytest.approx(measured.median())
    assert not (run_dir / schema.GPU).exists()  # no NVML on this machine: no file, not an empty one
    assert not list(run_dir.glob(".*.tmp"))  # atomic writes left no temp files


def test_interrupt_keeps_a_readable_run(tiny, tmp_path, monkeypatch):
    """Ctrl-C at step 3: status interrupted, the finished steps kept in readable Parquet."""
    from memlab.core import optim

    real = optim.lr_at
    calls = {"n": 0}

    def lr_then_interrupt(step, train_cfg, total):
        calls["n"] += 1
        if step == 3:
            raise KeyboardInterrupt
        return real(step, train_cfg, total)

    monkeypatch.setattr("memlab.core.engine.lr_at", lr_then_interrupt)
    summary, run_dir = run_profile(tiny, load_profile("baseline"), runs_dir=tmp_path, device=CPU)
    assert summary["status"] == "interrupted"
    assert json.loads((run_dir / schema.RUN_JSON).read_text())["status"] == "interrupted"
    assert pl.read_parquet(run_dir / schema.SUMMARY)["status"].to_list() == ["interrupted"]
    # The lagged read publishes steps 0..1; the summary counts the steps steps.parquet holds (issue 20: they agree)
    assert summary["steps"] == pl.read_parquet(run_dir / schema.STEPS).height == 2
    assert summary["tokens"] == 2 * tiny.train.batch_size * tiny.model.seq_len
    assert json.loads((run_dir / schema.RUN_JSON).read_text())["message"] == "stopped after step 2"


def test_nan_loss_stops_the_run_with_status_nan(tiny, tmp_path):
    tiny.train.lr = 1e6
    tiny.train.warmup_steps = 0
    tiny.train.clip = 0.0
    tiny.train.steps = 30
    summary, run_dir = run_profile(tiny, load_profile("baseline"), runs_dir=tmp_path, device=CPU)
    assert summary["status"] == "nan"
    assert json.loads((run_dir / schema.RUN_JSON).read_text())["status"] == "nan"
    assert summary["steps"] < 30


def test_bad_input_leaves_no_run_folder(tiny, tmp_path):
    from memlab.core.errors import DeviceError

    with pytest.raises(DeviceError, match="tf32 needs CUDA"):
        run_profile(tiny, load_profile("tf32"), runs_dir=tmp_path, device=CPU)
    assert list(tmp_path.iterdir()) == []


def test_phase_meter_reads_both_allocator_peaks_from_one_nested_stats_read(monkeypatch):
    """The CUDA path of the meter without a GPU: each phase's end reads the allocator once (nested stats, not the
    flattened max_memory_* calls: 3.3 ms of the host's step under cProfile on the H100); the peaks land on their
    phase."""
    from memlab.core import meters

    reads = []
    peaks = iter([(100, 1000), (300, 1200), (200, 1100)])

    def nested():
        alloc, reserved = next(peaks)
        reads.append(alloc)
        return {"allocated_bytes": {"all": {"peak": alloc, "current": 0}}, "reserved_bytes": {"all": {"peak": reserved}}}

    monkeypatch.setattr(torch.cuda, "memory_stats_as_nested_dict", nested)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda *a: None)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda *a: pytest.fail("flattening read"))
    meter = meters.PhaseMeter(torch.device("cuda"))
    monkeypatch.setattr(meter, "_mark", lambda: 0.0)
    meter.start_step(0)
    for phase in meters.PHASES:
        meter.begin(phase)
        meter.end(phase)
    rec = meter._record
    assert reads == [100, 300, 200]
    assert rec.peak == {"fwd": 100, "bwd": 300, "opt": 200} and rec.peak_reserved == 1200


def test_the_run_keeps_each_steps_loss_and_gradient_norm_as_floats(tiny):
    """Every step's record stays with the run to its end: a tensor each (pinned host memory on CUDA, never given
    back while referenced) would grow with the steps."""
    from memlab.core import engine

    runs = []
    real = engine._StepPublisher.publish
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(engine._StepPublisher, "publish", lambda self, rec: runs.append(self.run) or real(self, rec))
        tiny.train.steps = 4
        train(tiny, load_profile("baseline"), ListSink(), device=CPU)
    records = runs[-1].records
    assert len(records) == 4
    assert all(type(r.loss) is float and type(r.grad_norm) is float for r in records)


def test_the_summary_names_memlabs_commit(tiny, monkeypatch):
    """memlab_version is one number for many commits; the summary also carries the source's commit (the table's
    groups say when it differs)."""
    from memlab.core import environment

    monkeypatch.setattr(environment, "git_sha", lambda: "a5db0201c3d4+dirty")
    tiny.train.steps = 3
    summary = train(tiny, load_profile("baseline"), ListSink(), device=CPU)
    assert summary["memlab_commit"] == "a5db0201c3d4+dirty"


def test_a_step_is_read_back_without_waiting_for_the_step_queued_behind_it(monkeypatch):
    """The loss and gradient norm reach the host through copies queued before the step's end mark. Reading the device
    tensors themselves one step late (.item()) would queue the read behind the next step and wait for it too, leaving
    the GPU idle through the host's work between steps."""
    from unittest import mock

    from memlab.core import meters
    from memlab.core.distributed import DistContext

    timeline = []

    class Event:
        def __init__(self, enable_timing: bool):
            self.at = None

        def record(self):
            self.at = len(timeline)
            timeline.append("mark")

        def synchronize(self):
            timeline.append("wait for mark")

        def elapsed_time(self, other):
            return 2.0

    def on_device(value: float):  # a 0-d CUDA tensor as far as the meter can tell
        t = mock.MagicMock(spec=torch.Tensor)
        t.device = torch.device("cuda")
        t.item.side_effect = lambda: pytest.fail("a device read waits for every step queued before it")
        t.to.side_effect = lambda *a, **k: timeline.append(("copy", a, k)) or torch.tensor(value)
        t.detach.return_value = t
        return t

    monkeypatch.setattr(torch.cuda, "Event", Event)
    meter = meters.PhaseMeter(torch.device("cuda"), enabled=False)
    for step, loss in enumerate((3.0, 2.5)):
        meter.start_step(step)
        assert meter.finish_step(on_device(loss), on_device(loss * 10)) is None or step == 1
    rec = meter.flush()
    copies = [i for i, e in enumerate(timeline) if isinstance(e, tuple)]
    assert len(copies) == 4 and all(timeline[i][1:] == (("cpu",), {"non_blocking": True}) for i in copies)
    assert timeline[copies[3] + 1] == "mark"  # the last step's copies are queued before its end mark
    assert DistContext().read_loss(rec.loss) == 2.5 and rec.grad_norm.item() == 25.0
