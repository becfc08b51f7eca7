"""One list of metrics, one declaration per event kind, one run-folder reader, one GiB formatter: every view derives
from them (memlab.core.metrics, events, runfolder, units)."""

from __future__ import annotations

import inspect
import json
import re

import polars as pl
import pytest
import torch

from memlab.core import compare, distributed, engine, events, metrics, runfolder, runstore, schema
from memlab.core.config import load_experiment, load_profile
from memlab.core.errors import ConfigError
from memlab.core.units import gib, gib_number, parse_size

# ---------------------------------------------------------------------------------------------- metrics


def test_every_key_of_the_engine_summary_is_declared_in_order():
    run = engine._Run(load_experiment("tiny"), load_profile("baseline"), torch.device("cpu"))
    keys = list(run.summary("finished"))
    declared = [m.name for m in metrics.SUMMARY]
    assert [k for k in declared if k != "schema_version"] == keys  # the run store adds schema_version


def test_summary_schema_and_rank_schema_derive_from_the_list():
    assert schema.SUMMARY_SCHEMA == {m.name: m.dtype for m in metrics.SUMMARY}
    per_rank = [m.name for m in metrics.METRICS if m.per_rank]
    assert list(schema.RANK_SCHEMA)[5:] == per_rank
    assert runstore.RANK_SCHEMA is schema.RANK_SCHEMA
    assert distributed.RANK_COLUMNS == tuple(per_rank)


def test_rank_reduction_reads_the_list():
    assert distributed.MAX_OVER_RANKS == tuple(m.name for m in metrics.SUMMARY if m.reduce == "max")
    assert distributed.SUM_OVER_RANKS == ("alloc_retries", "ooms")
    assert set(distributed.AT_SLOWEST_PACE) == {"tokens_per_s", "mfu", "mfu_bf16_peak"}
    # every summary metric says how ranks reduce it; relative columns are not per run, so they do not
    assert all(m.reduce is not None for m in metrics.SUMMARY)
    assert all(m.reduce is None for m in metrics.RELATIVE)


def test_aggregate_applies_the_declared_reductions():
    a = {"status": "finished", "peak_alloc_bytes": 5, "ooms": 1, "step_ms_median": 100.0, "tokens_per_s": 1000.0, "mfu": 0.4, "val_ppl": 9.0}
    b = {"status": "oom", "peak_alloc_bytes": 7, "ooms": 2, "step_ms_median": 200.0, "tokens_per_s": 500.0, "mfu": 0.2, "val_ppl": 3.0}
    out = distributed.aggregate([a, b], world=2)
    want = {"status": "oom", "peak_alloc_bytes": 7, "ooms": 3, "step_ms_median": 200.0, "tokens_per_s": 500.0, "mfu": 0.2, "val_ppl": 9.0}
    assert {k: out[k] for k in want} == want  # worst, max, sum, max, pace, pace, rank0


def test_table_columns_derive_from_the_list():
    shown = [m for m in metrics.METRICS if m.table is not None]
    assert [c.name for c in compare.DISPLAY_COLUMNS] == [m.name for m in sorted(shown, key=lambda m: m.table)]
    assert len({m.table for m in shown}) == len(shown), "two columns at the same place"
    assert compare.RELATIVE_COLUMNS == ("mem_saved_pct", "speedup_x", "ppl_change_pct")
    assert [c.header for c in compare.DISPLAY_COLUMNS][:4] == ["profile", "status", "batch", "GPUs"]


@pytest.mark.parametrize("m", metrics.METRICS, ids=lambda m: m.name)
def test_units_agree_with_the_names(m):
    """STYLE.md 6: the unit is in the name, and the name's unit is the declared one."""
    by_suffix = {"_bytes": "bytes", "_pct": "pct", "_x": "x"}
    for suffix, unit in by_suffix.items():
        assert m.name.endswith(suffix) == (m.unit == unit), m.name
    assert ("_ms" in m.name) == (m.unit == "ms"), m.name
    assert (m.name.endswith("_s") and not m.name.endswith("_per_s")) == (m.unit == "s"), m.name
    assert m.kind in metrics.KIND_OF_UNIT.values()
    assert compare.format_value(1, m.kind) != compare.format_value(None, m.kind) == "—"


# ---------------------------------------------------------------------------------------------- events


def test_make_event_checks_required_fields():
    ev = events.make_event("eval", step=3, val_loss=2.0, val_ppl=7.4)
    assert ev["event"] == "eval" and ev["step"] == 3 and isinstance(ev["t"], float)
    with pytest.raises(ValueError, match="eval event without val_loss, val_ppl"):
        events.make_event("eval", step=3)
    with pytest.raises(ValueError, match="unknown event kind 'stepp'"):
        events.make_event("stepp", step=1)


def test_optional_fields_are_not_required():
    assert "ranks" not in events.REQUIRED["finished"] and "ranks" in events.FIELDS["finished"]
    assert events.make_event("finished", summary={})["summary"] == {}


def test_the_parquet_rows_are_declared_event_fields():
    assert set(schema.STEP_SCHEMA) <= events.FIELDS["step"]
    assert set(schema.GPU_SCHEMA) <= events.FIELDS["gpu_sample"]
    assert set(runstore.STARTED_IN_RUN_JSON) <= events.FIELDS["started"]


def _fields_read(fn) -> set[str]:
    return set(re.findall(r'\bev(?:ent)?(?:\.get\(|\[)"(\w+)"', inspect.getsource(fn)))


def test_readers_look_up_only_declared_fields():
    from memlab.cli.console import ConsoleSink
    from memlab.tui.model import LiveState

    declared = set().union(*events.FIELDS.values())
    for reader in (LiveState.apply, runstore.RunStore._emit, runstore.RunStore.finalize, ConsoleSink.emit, ConsoleSink._line):
        read = _fields_read(reader)
        assert read, f"{reader.__qualname__}: no field lookups found (the pattern is stale)"
        assert read <= declared, f"{reader.__qualname__} reads undeclared fields {read - declared}"


# ---------------------------------------------------------------------------------------------- run folder


def _run_folder(tmp_path, status="running"):
    d = tmp_path / "20260101-000000-baseline-abcd"
    d.mkdir()
    (d / schema.RUN_JSON).write_text(json.dumps({"schema_version": 1, "run_id": d.name, "status": status, "profile": {"name": "baseline"}}))
    return d


def test_read_run_gives_every_part_and_the_status(tmp_path):
    d = _run_folder(tmp_path)
    pl.DataFrame({"step": [0, 1]}).write_parquet(d / schema.STEPS)
    run = runfolder.read_run(d)
    assert (run.info["run_id"], run.summary, run.steps.height, run.gpu, run.status) == (d.name, {}, 2, None, "running")
    with pytest.raises(ValueError, match="no run.json"):
        runfolder.read_run(tmp_path)


def test_mark_status_writes_the_outcome_once(tmp_path):
    d = _run_folder(tmp_path)
    runstore.mark_status(d, "crashed", "killed")
    runstore.mark_status(d, "interrupted", "later")  # an outcome is final
    run = runfolder.read_run(d)
    assert (run.info["status"], run.info["message"], run.status, run.summary["steps"]) == ("crashed", "killed", "crashed", 0)


def test_mark_status_on_a_removed_folder_is_no_error(tmp_path):
    runstore.mark_status(tmp_path / "gone", "crashed", "killed")
    assert not (tmp_path / "gone").exists()


def test_atomic_json_leaves_no_temp_file(tmp_path):
    runfolder.atomic_write_json(tmp_path / "run.json", {"a": 1})
    assert [p.name for p in tmp_path.iterdir()] == ["run.json"]
    assert runfolder.read_info(tmp_path) == {"a": 1}


# ---------------------------------------------------------------------------------------------- units


def test_gib_formats_and_sizes_parse():
    assert (gib(3 * 2**30), gib(None), gib_number(2**29), gib(2**30, 1)) == ("3.00 GiB", "—", "0.50", "1.0 GiB")
    assert parse_size("24GiB") == 24 * 2**30 and parse_size("40GB") == 40 * 10**9
    with pytest.raises(ConfigError, match="unknown unit"):
        parse_size("3 parsecs")
