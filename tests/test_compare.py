"""core.compare: reading run folders (good, incomplete, corrupt), grouping, baselines and relative columns.

The run folders here are written by `write_run` with the run store's own schema (core.schema); the tests that use
real runs from the engine are in test_cli_table.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from run_helpers import EXP_ID, GIB, write_run

from memlab.core import compare, schema
from memlab.core.errors import MemlabError

def row(table: pl.DataFrame, profile: str) -> dict:
    rows = table.filter(pl.col("profile") == profile).to_dicts()
    assert len(rows) == 1, f"{profile}: {len(rows)} rows"
    return rows[0]


@pytest.fixture
def runs(tmp_path):
    root = tmp_path / "runs"
    write_run(root, "baseline", peak_alloc_bytes=4 * GIB, step_ms_median=100.0, tokens_per_s=5120.0, val_ppl=50.0)
    write_run(root, "gradcp", peak_alloc_bytes=1 * GIB, step_ms_median=125.0, tokens_per_s=4096.0, val_ppl=50.5)
    write_run(root, "bf16", peak_alloc_bytes=3 * GIB, step_ms_median=50.0, tokens_per_s=10240.0, val_ppl=49.0, mfu=0.42)
    return root


# ---------------------------------------------------------------------------------------------- reading


def test_read_runs_one_row_per_folder_with_the_summary_values(runs):
    frame, skipped = compare.read_runs([runs])
    assert skipped == []
    assert frame.height == 3
    assert set(frame["profile"]) == {"baseline", "gradcp", "bf16"}
    assert frame.schema == pl.Schema(compare.FRAME_SCHEMA)
    for d in runs.iterdir():
        want = pl.read_parquet(d / schema.SUMMARY).row(0, named=True)
        got = frame.filter(pl.col("run_id") == want["run_id"]).row(0, named=True)
        assert {k: got[k] for k in want} == want
        assert got["path"] == str(d) and got["complete"] is True


def test_read_runs_accepts_a_run_folder_and_nested_folders(tmp_path):
    a = write_run(tmp_path / "runs", "baseline")
    write_run(tmp_path / "runs" / "sweep-1", "gradcp")
    frame, _ = compare.read_runs([tmp_path / "runs"])
    assert sorted(frame["profile"]) == ["baseline", "gradcp"]
    frame, _ = compare.read_runs(a)  # a single run folder
    assert frame["profile"].to_list() == ["baseline"]


def test_a_folder_named_twice_is_read_and_reported_once(tmp_path, monkeypatch):
    """Issue 50: `memlab table runs /abs/path/runs` warned twice about one bad summary.parquet (and counted runs twice)."""
    write_run(tmp_path / "runs", "baseline")
    bad = write_run(tmp_path / "runs", "gradcp")
    (bad / schema.SUMMARY).write_bytes(b"junk")
    monkeypatch.chdir(tmp_path)
    frame, skipped = compare.read_runs(["runs", tmp_path / "runs", f"runs/{bad.name}", tmp_path / "runs" / ".." / "runs"])
    assert frame["profile"].to_list() == ["baseline"]
    assert [folder for folder, _ in skipped] == [f"runs/{bad.name}"]


def test_read_runs_missing_path_is_an_error(tmp_path):
    with pytest.raises(MemlabError, match="no such folder"):
        compare.read_runs([tmp_path / "nope"])


def _corrupt(d: Path) -> None:
    (d / schema.SUMMARY).write_bytes(b"not parquet at all")


def _truncate(d: Path) -> None:
    b = (d / schema.SUMMARY).read_bytes()
    (d / schema.SUMMARY).write_bytes(b[: len(b) // 2])


def _two_rows(d: Path) -> None:
    df = pl.read_parquet(d / schema.SUMMARY)
    pl.concat([df, df]).write_parquet(d / schema.SUMMARY)


def _no_rows(d: Path) -> None:
    pl.read_parquet(d / schema.SUMMARY).head(0).write_parquet(d / schema.SUMMARY)


def _bad_json(d: Path) -> None:
    (d / schema.RUN_JSON).write_text('{"schema_version": 1, "run_')


def _no_json(d: Path) -> None:
    (d / schema.RUN_JSON).unlink()


def _json_list(d: Path) -> None:
    (d / schema.RUN_JSON).write_text("[1, 2]")


def _newer_json(d: Path) -> None:
    info = json.loads((d / schema.RUN_JSON).read_text())
    (d / schema.RUN_JSON).write_text(json.dumps(info | {"schema_version": schema.SCHEMA_VERSION + 1}))


def _newer_summary(d: Path) -> None:
    df = pl.read_parquet(d / schema.SUMMARY)
    df.with_columns(pl.lit(schema.SCHEMA_VERSION + 1, dtype=pl.Int64).alias("schema_version")).write_parquet(d / schema.SUMMARY)


BAD = {
    "corrupt summary": (_corrupt, "summary.parquet is corrupt or partial"),
    "truncated summary": (_truncate, "summary.parquet is corrupt or partial"),
    "two-row summary": (_two_rows, "summary.parquet has 2 rows, expected 1"),
    "empty summary": (_no_rows, "summary.parquet has 0 rows, expected 1"),
    "partial run.json": (_bad_json, "run.json is not valid JSON"),
    "missing run.json": (_no_json, "no run.json"),
    "run.json not an object": (_json_list, "run.json is not a JSON object"),
    "newer run.json": (_newer_json, "run.json has schema_version 2, newer than this memlab"),
    "newer summary": (_newer_summary, "summary.parquet has schema_version 2, newer than this memlab"),
}


@pytest.mark.parametrize("damage, reason", BAD.values(), ids=BAD.keys())
def test_a_bad_folder_is_skipped_with_its_reason_and_the_rest_still_read(runs, damage, reason):
    bad = write_run(runs, "broken")
    damage(bad)
    frame, skipped = compare.read_runs([runs])
    assert sorted(frame["profile"]) == ["baseline", "bf16", "gradcp"]
    assert len(skipped) == 1
    folder, why = skipped[0]
    assert folder == str(bad)
    assert why.startswith(reason), why
    assert "\n" not in why

    with pytest.raises(MemlabError) as e:
        compare.read_runs([runs], strict=True)
    assert str(bad) in str(e.value) and reason in str(e.value)


def test_scan_falls_back_and_names_every_bad_file_among_many(tmp_path):
    root = tmp_path / "runs"
    dirs = [write_run(root, f"p{i}", step_ms_median=float(i + 1)) for i in range(40)]
    for i in (3, 17, 31):
        _corrupt(dirs[i])
    frame, skipped = compare.read_runs([root])
    assert frame.height == 37
    assert [s[0] for s in skipped] == [str(dirs[i]) for i in (3, 17, 31)]
    # Every good row still carries its own figures after the fallback.
    for d in dirs:
        got = frame.filter(pl.col("path") == str(d))
        if d in (dirs[3], dirs[17], dirs[31]):
            assert got.height == 0
        else:
            i = int(got["profile"][0][1:])
            assert got["step_ms_median"][0] == float(i + 1)


def test_summaries_of_an_older_schema_are_read(runs):
    # Missing columns, an extra one, and an integer where the schema says float: all read, nulls where missing.
    d = write_run(runs, "older")
    df = pl.read_parquet(d / schema.SUMMARY)
    df.drop("mfu", "val_ppl").with_columns(pl.col("step_ms_median").cast(pl.Int64), pl.lit(1).alias("extra")).write_parquet(d / schema.SUMMARY)
    frame, skipped = compare.read_runs([runs])
    assert skipped == []
    r = row(frame, "older")
    assert r["step_ms_median"] == 100.0 and r["val_ppl"] is None and r["mfu"] is None


def test_folder_without_summary_is_an_incomplete_row(runs):
    write_run(runs, "killed", status="running", summary=False)
    write_run(runs, "crashed_one", status="crashed", summary=False, reason="child exited with signal 9")
    frame, skipped = compare.read_runs([runs])
    assert skipped == []
    killed, crashed = row(frame, "killed"), row(frame, "crashed_one")
    assert killed["status"] == "incomplete" and killed["complete"] is False
    assert killed["experiment_id"] == EXP_ID and killed["batch_size"] == 8
    assert crashed["status"] == "crashed" and crashed["reason"] == "child exited with signal 9"
    table = compare.comparison(frame)
    assert row(table, "killed")["step_ms_median"] is None
    assert row(table, "killed")["mem_saved_pct"] is None


def test_folder_without_summary_or_profile_is_skipped(runs):
    d = write_run(runs, "x", status="running", summary=False)
    (d / schema.RUN_JSON).write_text(json.dumps({"schema_version": 1, "status": "running", "experiment": {"train": {"batch_size": "x"}}}))
    frame, skipped = compare.read_runs([runs])
    assert frame.height == 3
    assert skipped == [(str(d), "no summary.parquet, and run.json names no profile")]


def test_folder_without_summary_whose_process_lives_is_running(runs):
    import os

    d = write_run(runs, "live", status="running", summary=False)
    info = json.loads((d / schema.RUN_JSON).read_text())
    (d / schema.RUN_JSON).write_text(json.dumps(info | {"pid": os.getpid()}))
    r = row(compare.read_runs([runs])[0], "live")
    assert r["status"] == "running" and r["reason"] == "no summary.parquet yet"


def test_folders_that_are_not_runs_are_ignored(runs):
    (runs / "notes").mkdir()
    (runs / "notes" / "readme.txt").write_text("hello")
    (runs / "comparison.parquet").write_bytes(b"x")
    frame, skipped = compare.read_runs([runs])
    assert frame.height == 3 and skipped == []


# ---------------------------------------------------------------------------------------------- comparison


def test_relative_columns_against_the_default_baseline(runs):
    table = compare.comparison(compare.read_runs([runs])[0])
    assert table.height == 3
    assert set(table["baseline"]) == {"baseline"}
    assert row(table, "baseline")["is_baseline"] is True
    g = row(table, "gradcp")
    assert g["mem_saved_pct"] == pytest.approx(75.0)  # 100 (1 - 1/4)
    assert g["speedup_x"] == pytest.approx(0.8)  # 100 ms / 125 ms
    assert g["ppl_change_pct"] == pytest.approx(1.0)  # 100 (50.5 / 50 - 1)
    b = row(table, "bf16")
    assert b["mem_saved_pct"] == pytest.approx(25.0)
    assert b["speedup_x"] == pytest.approx(2.0)
    assert b["ppl_change_pct"] == pytest.approx(-2.0)
    base = row(table, "baseline")
    assert (base["mem_saved_pct"], base["speedup_x"], base["ppl_change_pct"]) == (0.0, 1.0, 0.0)


def test_the_baseline_against_itself_is_exact(tmp_path):
    write_run(tmp_path, "baseline", val_ppl=56.54581138127561, step_ms_median=149.93325, peak_alloc_bytes=7 * GIB + 3)
    write_run(tmp_path, "oom_base", status="oom")
    for baseline in ("baseline", "oom_base"):
        base = compare.comparison(compare.read_runs([tmp_path])[0], baseline=baseline).filter(pl.col("is_baseline")).row(0, named=True)
        want = (0.0, 1.0, 0.0) if baseline == "baseline" else (None, None, None)  # a failed baseline: nothing to compare
        assert (base["mem_saved_pct"], base["speedup_x"], base["ppl_change_pct"]) == want


def test_explicit_baseline(runs):
    table = compare.comparison(compare.read_runs([runs])[0], baseline="gradcp")
    assert row(table, "gradcp")["is_baseline"] is True
    assert row(table, "baseline")["mem_saved_pct"] == pytest.approx(-300.0)  # 4 GiB against 1 GiB
    assert row(table, "baseline")["speedup_x"] == pytest.approx(1.25)


def test_default_baseline_is_the_first_run_when_none_is_called_baseline(tmp_path):
    write_run(tmp_path, "fp16", peak_alloc_bytes=2 * GIB)
    write_run(tmp_path, "gradcp", peak_alloc_bytes=1 * GIB)
    table = compare.comparison(compare.read_runs([tmp_path])[0])
    assert set(table["baseline"]) == {"fp16"}
    assert row(table, "gradcp")["mem_saved_pct"] == pytest.approx(50.0)


def test_unknown_baseline_lists_the_profiles_present(runs):
    with pytest.raises(MemlabError, match=r"unknown baseline 'nope'; profiles present: baseline, bf16, gradcp"):
        compare.comparison(compare.read_runs([runs])[0], baseline="nope")


def test_speedup_uses_throughput_when_the_work_per_step_differs(tmp_path):
    write_run(tmp_path, "baseline", step_ms_median=100.0, tokens_per_s=5000.0)
    write_run(tmp_path, "bigbatch", batch_size=32, step_ms_median=200.0, tokens_per_s=10000.0)
    table = compare.comparison(compare.read_runs([tmp_path])[0])
    assert row(table, "bigbatch")["speedup_x"] == pytest.approx(2.0)  # not 0.5: 4x the tokens in 2x the time


def test_cpu_groups_compare_host_memory(tmp_path):
    none = dict(peak_alloc_fwd_bytes=None, peak_alloc_bwd_bytes=None, peak_alloc_opt_bytes=None, peak_alloc_bytes=None, peak_reserved_bytes=None)
    write_run(tmp_path, "baseline", peak_host_rss_bytes=2 * GIB, **none)
    write_run(tmp_path, "gradcp", peak_host_rss_bytes=GIB + GIB // 2, **none)
    table = compare.comparison(compare.read_runs([tmp_path])[0])
    assert row(table, "gradcp")["mem_saved_pct"] == pytest.approx(25.0)


def test_latest_of_each_profile_unless_all(tmp_path):
    write_run(tmp_path, "baseline", started_at="2026-01-01T00:00:00+00:00", step_ms_median=90.0)
    write_run(tmp_path, "baseline", started_at="2026-01-02T00:00:00+00:00", step_ms_median=100.0)
    write_run(tmp_path, "gradcp", started_at="2026-01-01T12:00:00+00:00", step_ms_median=200.0)
    frame = compare.read_runs([tmp_path])[0]
    latest = compare.comparison(frame)
    assert latest.height == 2
    assert row(latest, "baseline")["step_ms_median"] == 100.0
    assert row(latest, "gradcp")["speedup_x"] == pytest.approx(0.5)
    every = compare.comparison(frame, latest_only=False)
    assert every.height == 3
    # Rows in run order; the baseline is the latest baseline run.
    assert every["step_ms_median"].to_list() == [90.0, 200.0, 100.0]
    assert every["is_baseline"].to_list() == [False, False, True]


@pytest.mark.parametrize("later", [
    {"status": "interrupted", "reason": "interrupted"},
    {"status": "error", "reason": "disk full: steps.parquet could not be written"},
    {"status": "running", "summary": False},  # killed mid-run: no summary, its process gone
])
def test_a_later_run_that_did_not_finish_does_not_hide_the_finished_one(later, tmp_path):
    """Issue 50: an interrupted retry hid the finished run before it ("no finished runs in this experiment")."""
    write_run(tmp_path, "baseline", started_at="2026-01-01T00:00:00+00:00", step_ms_median=90.0)
    write_run(tmp_path, "gradcp", started_at="2026-01-01T01:00:00+00:00", step_ms_median=150.0)
    retry = write_run(tmp_path, "gradcp", started_at="2026-01-02T00:00:00+00:00", step_ms_median=5.0, **later)
    table = compare.comparison(compare.read_runs([tmp_path])[0])
    assert table.height == 2
    g = row(table, "gradcp")
    assert (g["status"], g["step_ms_median"], g["later_run"]) == ("finished", 150.0, f"{row_status(later)} ({retry.name})")
    assert row(table, "baseline")["later_run"] is None
    notes = compare.group_notes(table, [])
    assert f"gradcp: its latest finished run is shown; a later run was {row_status(later)} ({retry.name}) (--all shows every run)" in notes
    assert "no finished runs in this experiment" not in notes
    every = compare.comparison(compare.read_runs([tmp_path])[0], latest_only=False)
    assert every.height == 3 and every["later_run"].null_count() == 3


def row_status(written: dict) -> str:
    return "incomplete" if written["status"] == "running" else written["status"]


def test_a_profile_that_never_finished_shows_its_latest_run(tmp_path):
    write_run(tmp_path, "baseline", started_at="2026-01-01T00:00:00+00:00", status="oom", reason="oom")
    last = write_run(tmp_path, "baseline", started_at="2026-01-02T00:00:00+00:00", status="interrupted", reason="interrupted")
    table = compare.comparison(compare.read_runs([tmp_path])[0])
    assert table["run_id"].to_list() == [last.name] and table["later_run"].to_list() == [None]


def test_experiments_and_hardware_are_never_mixed(tmp_path):
    write_run(tmp_path, "baseline", peak_alloc_bytes=4 * GIB)
    write_run(tmp_path, "gradcp", peak_alloc_bytes=2 * GIB)
    write_run(tmp_path, "baseline", experiment="gpt2s", experiment_id="cccc2222dddd", peak_alloc_bytes=40 * GIB)
    write_run(tmp_path, "gradcp", experiment="gpt2s", experiment_id="cccc2222dddd", peak_alloc_bytes=10 * GIB)
    write_run(tmp_path, "gradcp", device="cuda", gpu_name="NVIDIA H100 80GB HBM3", peak_alloc_bytes=1 * GIB)
    table = compare.comparison(compare.read_runs([tmp_path])[0])
    labels = [label for label, _ in compare.groups(table)]
    assert labels == [
        "gpt2s · seq_len=64 · batch_size=8 on cpu",
        "tiny on cpu",
        "tiny on NVIDIA H100 80GB HBM3",  # by experiment, then device
    ]  # named by what differs from the built-in experiment as written, not by a hash
    by = {label: g for label, g in compare.groups(table)}
    assert row(by["gpt2s · seq_len=64 · batch_size=8 on cpu"], "gradcp")["mem_saved_pct"] == pytest.approx(75.0)
    assert row(by["tiny on cpu"], "gradcp")["mem_saved_pct"] == pytest.approx(50.0)
    h100 = by["tiny on NVIDIA H100 80GB HBM3"]
    assert h100["baseline"].to_list() == ["gradcp"]  # its only run is its own baseline
    assert table["group_index"].to_list() == sorted(table["group_index"].to_list())


def test_explicit_baseline_missing_from_one_group_blanks_only_that_group(tmp_path):
    write_run(tmp_path, "baseline")
    write_run(tmp_path, "gradcp")
    write_run(tmp_path, "gradcp", experiment="gpt2s", experiment_id="cccc2222dddd")
    table = compare.comparison(compare.read_runs([tmp_path])[0], baseline="baseline")
    gpt = table.filter(pl.col("experiment") == "gpt2s")
    assert gpt["baseline"].to_list() == [None] and gpt["mem_saved_pct"].to_list() == [None]
    assert row(table.filter(pl.col("experiment") == "tiny"), "gradcp")["mem_saved_pct"] == 0.0


def test_an_interrupted_run_keeps_its_figures_and_is_marked(runs):
    write_run(runs, "stopped", status="interrupted", reason="interrupted", peak_alloc_bytes=GIB, step_ms_median=50.0)
    table = compare.comparison(compare.read_runs([runs])[0])
    r = row(table, "stopped")
    assert r["status"] == "interrupted" and r["peak_alloc_bytes"] == GIB and r["step_ms_median"] == 50.0
    assert r["mem_saved_pct"] is not None
    notes = compare.group_notes(table, [])
    assert "stopped (interrupted): its figures are from an interrupted run, over 6 steps it completed" in notes
    assert "1 run\n" in compare.render_markdown(table.filter(pl.col("profile") == "stopped").with_columns(pl.lit(None, dtype=pl.String).alias("baseline")))


@pytest.mark.parametrize("status", ["oom", "nan", "crashed", "error"])
def test_runs_that_did_not_finish_keep_their_status_and_blank_figures(runs, status):
    write_run(runs, "broken", status=status, reason=status, peak_alloc_bytes=9 * GIB, step_ms_median=1.0, val_ppl=1.0)
    table = compare.comparison(compare.read_runs([runs])[0])
    r = row(table, "broken")
    assert r["status"] == status and r["batch_size"] == 8 and r["reason"] == status
    for c in compare.DISPLAY_COLUMNS:
        if c.figure:
            assert r[c.name] is None, c.name


def test_sort_within_groups(runs):
    frame = compare.read_runs([runs])[0]
    assert compare.comparison(frame, sort="step_ms_median")["profile"].to_list() == ["bf16", "baseline", "gradcp"]
    assert compare.comparison(frame, sort="-peak GiB")["profile"].to_list() == ["baseline", "bf16", "gradcp"]
    with pytest.raises(MemlabError, match="unknown sort column 'nope'; choose one of: profile, status"):
        compare.comparison(frame, sort="nope")


def test_select_experiment_by_name_or_id(tmp_path):
    write_run(tmp_path, "baseline")
    write_run(tmp_path, "baseline", experiment="gpt2s", experiment_id="cccc2222dddd")
    frame = compare.read_runs([tmp_path])[0]
    assert compare.select_experiment(frame, "gpt2s")["experiment"].to_list() == ["gpt2s"]
    assert compare.select_experiment(frame, "cccc2222")["experiment"].to_list() == ["gpt2s"]
    assert compare.select_experiment(frame, EXP_ID)["experiment"].to_list() == ["tiny"]
    with pytest.raises(MemlabError, match=r"no runs of experiment 'nope'; present: gpt2s \(cccc2222dddd\), tiny \(aaaa1111bbbb\)"):
        compare.select_experiment(frame, "nope")


def test_empty_frame_gives_an_empty_comparison(tmp_path):
    frame, skipped = compare.read_runs([tmp_path])
    assert frame.height == 0 and skipped == []
    table = compare.comparison(frame)
    assert table.height == 0
    assert set(c.name for c in compare.DISPLAY_COLUMNS) <= set(table.columns)


def test_write_parquet_round_trips(runs, tmp_path):
    table = compare.comparison(compare.read_runs([runs])[0])
    path = compare.write_parquet(table, tmp_path / "out" / "comparison.parquet")
    assert pl.read_parquet(path).equals(table)
    assert [p.name for p in path.parent.iterdir()] == ["comparison.parquet"]  # no temp file left behind


# ---------------------------------------------------------------------------------------------- display


@pytest.mark.parametrize(
    "value, kind, text",
    [
        (None, "gib", "—"),
        (None, "int", "—"),
        (float("nan"), "ms", "—"),
        (3 * GIB // 2, "gib", "1.50"),
        (0, "gib", "0.00"),  # a real zero stays zero; only null is a dash
        (0.4234, "fraction_pct", "42.3%"),
        (12.345, "signed_pct", "+12.3%"),
        (-4.0, "signed_pct", "-4.0%"),
        (-1e-14, "signed_pct", "+0.0%"),
        (1.254, "times", "1.25×"),
        (5120.4, "rate", "5,120"),
        (123.45, "ms", "123.5"),
        (64, "int", "64"),
        ("oom", "text", "oom"),
    ],
)
def test_format_value(value, kind, text):
    assert compare.format_value(value, kind) == text


def test_display_columns_are_in_the_comparison_frame(runs):
    table = compare.comparison(compare.read_runs([runs])[0])
    for c in compare.DISPLAY_COLUMNS:
        assert c.name in table.columns, c.name
    headers = [c.header for c in compare.DISPLAY_COLUMNS]
    assert len(headers) == len(set(headers))


def test_core_compare_and_plot_do_not_import_ui_libraries():
    code = (
        "import sys, memlab.core.compare, memlab.core.plot\n"
        "bad = [m for m in ('rich', 'typer', 'textual', 'matplotlib.pyplot') if m in sys.modules]\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_reading_many_folders_is_fast(tmp_path):
    import time

    root = tmp_path / "runs"
    for i in range(300):
        write_run(root, f"p{i % 7}")
    t = time.perf_counter()
    frame, skipped = compare.read_runs([root])
    compare.comparison(frame)
    elapsed = time.perf_counter() - t
    assert frame.height == 300 and not skipped
    assert elapsed < 2.0, f"{elapsed:.2f} s for 300 folders"


def test_load_reads_filters_and_compares(tmp_path):
    write_run(tmp_path, "baseline", peak_alloc_bytes=2 * GIB)
    write_run(tmp_path, "gradcp", peak_alloc_bytes=GIB)
    write_run(tmp_path, "baseline", experiment="gpt2s", experiment_id="cccc2222dddd")
    bad = write_run(tmp_path, "broken")
    _corrupt(bad)
    table, skipped = compare.load([tmp_path], experiment="tiny", sort="-mem_saved_pct")
    assert table["profile"].to_list() == ["gradcp", "baseline"]
    assert table["mem_saved_pct"].to_list() == [50.0, 0.0]
    assert [s[0] for s in skipped] == [str(bad)]


def test_distributed_runs_show_their_gpus(tmp_path):
    """Issue 9: a DDP/FSDP run is a row like any other, with its world size in the GPUs column (terminal and markdown)."""
    from memlab.core.compare import render_markdown

    root = tmp_path / "runs"
    gpu = dict(device="cuda", gpu_name="NVIDIA H200")
    write_run(root, "bf16", n_gpus=1, peak_alloc_bytes=8 * GIB, **gpu)
    write_run(root, "ddp_bf16", n_gpus=2, peak_alloc_bytes=8 * GIB + GIB // 2, **gpu)
    table = compare.comparison(compare.read_runs([root])[0])
    assert row(table, "ddp_bf16")["n_gpus"] == 2 and row(table, "bf16")["n_gpus"] == 1
    col = next(c for c in compare.DISPLAY_COLUMNS if c.name == "n_gpus")
    assert col.header == "GPUs" and compare.format_value(2, col.kind) == "2"

    lines = render_markdown(table).splitlines()
    header = next(line for line in lines if line.startswith("| profile"))
    cells = [c.strip() for c in header.strip("|").split("|")]
    i = cells.index("GPUs")
    by_profile = {
        cols[0].strip("*"): cols[i]
        for line in lines if line.startswith("| ") and line is not header
        for cols in [[c.strip() for c in line.strip("|").split("|")]]
    }
    assert by_profile["ddp_bf16"] == "2" and by_profile["bf16"] == "1"


def test_a_group_that_mixes_gpu_counts_or_versions_says_so(tmp_path):
    """Runs with different GPU counts, torch or memlab versions share a group only with a note naming the difference."""
    h100 = dict(device="cuda", gpu_name="NVIDIA H100 80GB HBM3")
    write_run(tmp_path, "baseline", n_gpus=1, torch_version="2.6.0", memlab_version="0.1.0", **h100)
    write_run(tmp_path, "ddp_bf16", n_gpus=2, torch_version="2.6.0", memlab_version="0.2.0", **h100)
    (label, g), = compare.groups(compare.comparison(compare.read_runs([tmp_path])[0]))
    notes = compare.group_notes(g, compare.visible_columns(g)[1])
    assert "runs here differ in GPUs (1, 2); memlab (0.1.0, 0.2.0): their figures may not compare" in notes
    write_run(tmp_path / "same", "baseline", n_gpus=1, torch_version="2.6.0", **h100)
    write_run(tmp_path / "same", "bf16", n_gpus=1, torch_version="2.6.0", **h100)
    (label, g), = compare.groups(compare.comparison(compare.read_runs([tmp_path / "same"])[0]))
    assert not any("differ in" in n for n in compare.group_notes(g, []))
    # one version number spans many commits: runs from two commits of memlab 0.1.0 say so too
    for profile, commit in (("baseline", "66f2cd9a1b2c"), ("bf16", "a5db0201c3d4+dirty")):
        write_run(tmp_path / "commits", profile, memlab_version="0.1.0", memlab_commit=commit, **h100)
    (label, g), = compare.groups(compare.comparison(compare.read_runs([tmp_path / "commits"])[0]))
    assert "runs here differ in memlab commit (66f2cd9a1b2c, a5db0201c3d4+dirty): their figures may not compare" in \
        compare.group_notes(g, compare.visible_columns(g)[1])


def test_wall_tokens_per_s_and_mfu_at_the_bf16_peak_show_only_where_they_differ(tmp_path):
    """A twin column (metrics.Metric.twin) is left out where it is within 3 % of its sibling on every row."""
    h100 = dict(device="cuda", gpu_name="NVIDIA H100 80GB HBM3")
    write_run(tmp_path, "baseline", tokens_per_s=1000.0, tokens_per_s_wall=980.0, mfu=0.30, mfu_bf16_peak=0.30, **h100)
    write_run(tmp_path, "bf16", tokens_per_s=2000.0, tokens_per_s_wall=1990.0, mfu=0.40, mfu_bf16_peak=0.40, **h100)

    def shown() -> list[str]:
        (_, g), = compare.groups(compare.comparison(compare.read_runs([tmp_path])[0]))
        cols, hidden = compare.visible_columns(g)
        assert not {"tokens_per_s_wall", "mfu_bf16_peak"} & {c.name for c in hidden}  # never "not measured"
        return [c.name for c in cols]

    assert "tokens_per_s_wall" not in shown() and "mfu_bf16_peak" not in shown()
    write_run(tmp_path, "tf32", tokens_per_s=1500.0, tokens_per_s_wall=1400.0, mfu=0.6, mfu_bf16_peak=0.18, **h100)
    cols = shown()
    assert cols.index("tokens_per_s_wall") == cols.index("tokens_per_s") + 1
    assert cols.index("mfu_bf16_peak") == cols.index("mfu") + 1


def test_groups_are_named_by_what_differs_from_the_experiment_as_written():
    from memlab.core.config import load_experiment, to_dict

    def first(name, exp_id, config):
        return {"experiment": name, "experiment_id": exp_id, "device": "cpu", "gpu_name": None,
                "experiment_config": json.dumps(config) if config is not None else None}

    tiny = to_dict(load_experiment("tiny"))
    changed = json.loads(json.dumps(tiny))
    changed["train"]["steps"], changed["model"]["n_layer"], changed["data"]["source"] = 300, 4, "/home/me/posts.jsonl"
    labels = compare.group_labels([
        first("tiny", "a1", tiny),
        first("tiny", "b2", changed),
        first("mine", "c3", {"train": {"steps": 1}}),  # a user's own file: memlab cannot read it as written
        first("mine", "d4", {"train": {"steps": 2}}),
        first("solo", "e5", None),
    ])
    assert labels == [
        "tiny on cpu",
        "tiny · n_layer=4 · source=posts.jsonl · steps=300 on cpu",
        "mine · c3 on cpu",
        "mine · d4 on cpu",
        "solo on cpu",  # the only group of its name needs no id
    ]
