"""`memlab table` and `memlab plot`: on real tiny runs from the engine, and on run folders with damage.

The real runs (three profiles of the tiny experiment, 6 steps each) are trained once per session, in process,
through `memlab run`; the table's numbers are checked against each run's own summary.parquet and steps.parquet.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from run_helpers import GIB, png_size, write_run

from memlab.core import compare, schema
from memlab.core.plot import figure_size_px

PROFILES = ("baseline", "gradcp", "sdpa")


def memlab(*args: str) -> int:
    """Run the real command line in process; the exit status (0 when it returns)."""
    from memlab.cli import main

    try:
        main([str(a) for a in args])
    except SystemExit as e:
        return int(e.code or 0)
    return 0


# The tests that read the real runs share one xdist worker (pyproject: --dist loadgroup), which trains them once.
SHARES_REAL_RUNS = pytest.mark.xdist_group("cli-table-real-runs")


@pytest.fixture(scope="session")
def real_runs(tmp_path_factory) -> Path:
    """runs/ with three finished runs of the tiny experiment: baseline, gradcp, and an SDPA profile from a file."""
    root = tmp_path_factory.mktemp("real")
    sdpa = root / "sdpa.toml"
    sdpa.write_text('description = "baseline with SDPA attention"\nextends = "baseline"\n[attention]\nkernel = "sdpa"\n')
    runs = root / "runs"
    for profile in ("baseline", "gradcp", str(sdpa)):
        rc = memlab("run", "--profile", profile, "--experiment", "tiny", "--device", "cpu", "--runs-dir", runs, "--set", "train.steps=6")
        assert rc == 0, f"memlab run --profile {profile} exited {rc}"
    return runs


@pytest.fixture
def real(real_runs, tmp_path) -> Path:
    """A private copy of the real runs, so that a test may add or damage folders."""
    dst = tmp_path / "runs"
    shutil.copytree(real_runs, dst, ignore=shutil.ignore_patterns("comparison.parquet"))
    return dst


def summaries(runs: Path) -> dict[str, dict]:
    out = {}
    for d in sorted(p for p in runs.iterdir() if p.is_dir()):
        s = pl.read_parquet(d / schema.SUMMARY).row(0, named=True)
        out[s["profile"]] = s | {"_dir": d}
    return out


def markdown_rows(text: str) -> dict[str, dict[str, str]]:
    """{profile: {header: cell}} from the markdown tables (bold baseline names unwrapped)."""
    rows, headers = {}, None
    for line in text.splitlines():
        if not line.startswith("|"):
            headers = None if not line.strip() else headers
            continue
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        if headers is None:
            headers = cells
        elif not set(line) <= set("|:-"):
            record = dict(zip(headers, cells))
            rows[record["profile"].strip("*")] = record
    return rows


# ---------------------------------------------------------------------------------------------- real runs


@SHARES_REAL_RUNS
def test_real_runs_table_matches_their_parquet_files(real, capsys):
    assert memlab("table", real, "--format", "markdown") == 0
    out = capsys.readouterr().out
    rows = markdown_rows(out)
    s = summaries(real)
    assert set(rows) == set(PROFILES) == set(s)
    assert out.count("### ") == 1 and "### tiny · steps=6 on cpu" in out
    for profile, r in rows.items():
        want = s[profile]
        assert r["status"] == "finished"
        assert r["batch"] == str(want["batch_size"]) == "8"
        assert r["step ms"] == compare.format_value(want["step_ms_median"], "ms")
        assert r["tokens/s"] == compare.format_value(want["tokens_per_s"], "rate")
        assert r["val ppl"] == compare.format_value(want["val_ppl"], "ppl")
        assert r["total s"] == compare.format_value(want["total_s"], "seconds")
        assert r["host GiB"] == f"{want['peak_host_rss_bytes'] / GIB:.2f}"
        # The summary's own figures agree with its steps.parquet (median over the measured steps).
        steps = pl.read_parquet(want["_dir"] / schema.STEPS)
        measured = steps.filter(pl.col("measured"))
        assert want["steps"] == steps.height == 6
        assert want["step_ms_median"] == pytest.approx(measured["step_ms"].median())
        assert want["val_ppl"] == pytest.approx(math.exp(want["val_loss"]))
    # CPU: no device figures, so those columns are left out and said to be.
    header = next(line for line in out.splitlines() if line.startswith("| profile"))
    assert "NVML GiB" not in header and "MFU" not in header and "fwd GiB" not in header
    assert "- not measured on these runs: fwd GiB, bwd GiB, opt GiB, peak GiB, reserved GiB, NVML GiB, max batch, MFU" in out


@SHARES_REAL_RUNS
def test_real_runs_comparison_parquet_and_relative_columns(real, capsys):
    assert memlab("table", real) == 0
    table = pl.read_parquet(real / "comparison.parquet")
    s = summaries(real)
    base = s["baseline"]
    assert table.height == 3 and set(table["baseline"]) == {"baseline"}
    for r in table.iter_rows(named=True):
        want = s[r["profile"]]
        for c in compare.DISPLAY_COLUMNS:
            if c.name in want:
                assert r[c.name] == want[c.name], (r["profile"], c.name)
        assert r["mem_saved_pct"] == pytest.approx(100 * (1 - want["peak_host_rss_bytes"] / base["peak_host_rss_bytes"]))
        assert r["speedup_x"] == pytest.approx(base["step_ms_median"] / want["step_ms_median"])
        assert r["ppl_change_pct"] == pytest.approx(100 * (want["val_ppl"] / base["val_ppl"] - 1))
    out = capsys.readouterr().out
    for profile in PROFILES:
        assert profile in out
    assert "baseline (base)" in out


@SHARES_REAL_RUNS
def test_real_runs_csv_and_json_carry_raw_units(real, capsys):
    assert memlab("table", real, "--format", "csv") == 0
    csv = pl.read_csv(capsys.readouterr().out.encode())
    assert memlab("table", real, "--format", "json") == 0
    js = json.loads(capsys.readouterr().out)
    s = summaries(real)
    assert len(js) == csv.height == 3
    for r in js:
        assert r["peak_host_rss_bytes"] == s[r["profile"]]["peak_host_rss_bytes"]
        assert r["step_ms_median"] == pytest.approx(s[r["profile"]]["step_ms_median"])
    assert csv.filter(pl.col("profile") == "gradcp")["tokens_per_s"][0] == pytest.approx(s["gradcp"]["tokens_per_s"])


@SHARES_REAL_RUNS
def test_parquet_to_stdout(real, tmp_path):
    out = tmp_path / "results.parquet"
    with out.open("wb") as f:
        proc = subprocess.run([sys.executable, "-m", "memlab", "table", str(real), "--format", "parquet", "--out", str(tmp_path / "c.parquet")], stdout=f, stderr=subprocess.PIPE, text=False)
    assert proc.returncode == 0, proc.stderr.decode()
    got = pl.read_parquet(out)
    assert sorted(got["profile"]) == sorted(PROFILES)
    assert pl.read_parquet(tmp_path / "c.parquet").height == 3


@SHARES_REAL_RUNS
def test_real_runs_plot(real, tmp_path, capsys):
    out = tmp_path / "compare.png"
    assert memlab("plot", real, "-o", out) == 0
    assert png_size(out) == figure_size_px(1)
    assert str(out) in capsys.readouterr().out
    assert memlab("plot", real) == 0  # default: in the first folder
    assert png_size(real / "compare.png") == figure_size_px(1)


@SHARES_REAL_RUNS
def test_killed_run_and_damaged_runs_beside_real_ones(real, capsys):
    s = summaries(real)
    killed = real / "20990101-000000-killed-0000"
    shutil.copytree(s["gradcp"]["_dir"], killed)
    (killed / schema.SUMMARY).unlink()
    info = json.loads((killed / schema.RUN_JSON).read_text())
    (killed / schema.RUN_JSON).write_text(json.dumps(info | {"status": "running", "pid": 2**22 + 7, "profile": {"name": "killed"}, "run_id": killed.name}))
    corrupt = real / "20990101-000001-corrupt-0001"
    shutil.copytree(s["sdpa"]["_dir"], corrupt)
    (corrupt / schema.SUMMARY).write_bytes(b"PAR1 garbage")

    assert memlab("table", real, "--format", "markdown") == 0
    cap = capsys.readouterr()
    rows = markdown_rows(cap.out)
    assert rows["killed"]["status"] == "incomplete" and rows["killed"]["step ms"] == "—"
    assert rows["baseline"]["step ms"] == compare.format_value(s["baseline"]["step_ms_median"], "ms")
    assert f"skipped {corrupt}: summary.parquet is corrupt or partial" in cap.err
    assert "killed (incomplete): no summary.parquet" in cap.out

    assert memlab("table", real, "--strict") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"memlab: error: {corrupt}: summary.parquet is corrupt")


# ---------------------------------------------------------------------------------------------- options, errors


@pytest.fixture
def two_experiments(tmp_path) -> Path:
    root = tmp_path / "runs"
    write_run(root, "baseline", peak_alloc_bytes=4 * GIB, step_ms_median=100.0)
    write_run(root, "gradcp", peak_alloc_bytes=GIB, step_ms_median=125.0)
    write_run(root, "bf16", status="oom", reason="oom", message=None)
    write_run(root, "baseline", experiment="gpt2s", experiment_id="cccc2222dddd", peak_alloc_bytes=40 * GIB, mfu=0.41)
    write_run(root, "gradcp", experiment="gpt2s", experiment_id="cccc2222dddd", peak_alloc_bytes=10 * GIB, mfu=0.35)
    return root


def test_groups_are_separate_tables_and_say_so(two_experiments, capsys):
    assert memlab("table", two_experiments) == 0
    out = capsys.readouterr().out
    assert "2 experiments: runs of different experiments or hardware are never compared" in out
    assert out.index("gpt2s · seq_len=64 · batch_size=8 on cpu") < out.index("tiny on cpu")
    assert "41.0%" in out  # MFU shown as percent
    assert "+75.0%" in out  # gradcp saves 75 % against 4 GiB (tiny) and 75 % against 40 GiB (gpt2s)
    assert "bf16 (oom): oom" in out


def test_status_other_than_finished_shows_blank_figures(two_experiments, capsys):
    assert memlab("table", two_experiments, "--format", "markdown", "--experiment", "tiny") == 0
    rows = markdown_rows(capsys.readouterr().out)
    assert rows["bf16"]["status"] == "oom"
    assert {rows["bf16"][h] for h in ("peak GiB", "step ms", "val ppl", "mem saved", "speed-up")} == {"—"}
    assert rows["gradcp"]["peak GiB"] == "1.00" and rows["gradcp"]["mem saved"] == "+75.0%"
    assert rows["gradcp"]["speed-up"] == "0.80×"


def test_baseline_option_and_unknown_baseline(two_experiments, capsys):
    assert memlab("table", two_experiments, "--baseline", "gradcp", "-f", "markdown") == 0
    out = capsys.readouterr().out
    assert out.count("Baseline: `gradcp`") == 2
    assert "| **gradcp** |" in out
    assert memlab("table", two_experiments, "--baseline", "nope") == 2
    err = capsys.readouterr().err
    assert err == "memlab: error: unknown baseline 'nope'; profiles present: baseline, bf16, gradcp\n"


def test_experiment_filter_and_sort(two_experiments, capsys):
    assert memlab("table", two_experiments, "-e", "gpt2s", "-f", "csv", "--sort", "-mfu") == 0
    csv = pl.read_csv(capsys.readouterr().out.encode())
    assert csv["profile"].to_list() == ["baseline", "gradcp"]
    assert memlab("table", two_experiments, "-e", "gpt2s", "-f", "csv", "--sort", "mfu") == 0
    assert pl.read_csv(capsys.readouterr().out.encode())["profile"].to_list() == ["gradcp", "baseline"]
    assert memlab("table", two_experiments, "-e", "nope") == 2
    assert "no runs of experiment 'nope'; present: " in capsys.readouterr().err
    assert memlab("table", two_experiments, "--sort", "nope") == 2
    assert "unknown sort column 'nope'" in capsys.readouterr().err


def test_all_shows_every_run(tmp_path, capsys):
    write_run(tmp_path, "baseline", started_at="2026-01-01T00:00:00+00:00")
    write_run(tmp_path, "baseline", started_at="2026-01-02T00:00:00+00:00")
    assert memlab("table", tmp_path, "-f", "json") == 0
    assert len(json.loads(capsys.readouterr().out)) == 1
    assert memlab("table", tmp_path, "-f", "json", "--all") == 0
    assert len(json.loads(capsys.readouterr().out)) == 2


def test_out_chooses_where_the_comparison_frame_goes(two_experiments, tmp_path, capsys):
    target = tmp_path / "elsewhere" / "cmp.parquet"
    assert memlab("table", two_experiments, "--out", target) == 0
    assert pl.read_parquet(target).height == 5
    assert not (two_experiments / "comparison.parquet").exists()


def test_comparison_parquet_in_the_first_folder_given(two_experiments, tmp_path, capsys):
    other = tmp_path / "more"
    write_run(other, "fp16")
    assert memlab("table", two_experiments, other) == 0
    assert set(pl.read_parquet(two_experiments / "comparison.parquet")["profile"]) == {"baseline", "gradcp", "bf16", "fp16"}


@pytest.mark.parametrize(
    "args, message",
    [
        (["table", "{tmp}/nope"], "memlab: error: {tmp}/nope: no such folder\n"),
        (["table", "{tmp}/empty"], "memlab: error: no runs under {tmp}/empty (start one with: memlab run --profile baseline)\n"),
        (["plot", "{tmp}/runs", "-o", "{tmp}/x.jpg"], "memlab: error: {tmp}/x.jpg: plot writes PNG; give a file name ending in .png\n"),
    ],
)
def test_user_errors_are_one_line(tmp_path, capsys, args, message):
    (tmp_path / "empty").mkdir()
    write_run(tmp_path / "runs", "baseline")
    assert memlab(*[a.format(tmp=tmp_path) for a in args]) == 2
    assert capsys.readouterr().err == message.format(tmp=tmp_path)


def test_only_bad_folders_exit_zero_and_say_so(tmp_path, capsys):
    d = write_run(tmp_path, "baseline")
    (d / schema.SUMMARY).write_bytes(b"junk")
    assert memlab("table", tmp_path) == 0
    err = capsys.readouterr().err
    assert f"skipped {d}: summary.parquet is corrupt or partial" in err and "no readable runs" in err


def test_plot_two_experiments(two_experiments, tmp_path, capsys):
    out = tmp_path / "cmp.png"
    assert memlab("plot", two_experiments, "-o", out) == 0
    assert png_size(out) == figure_size_px(2)
    assert "(2 experiments, 5 runs)" in capsys.readouterr().out


def test_help_lists_the_options(capsys):
    assert memlab("table", "--help") == 0
    out = capsys.readouterr().out
    for option in ("--all", "--baseline", "--format", "--sort", "--strict", "--experiment", "--out"):
        assert option in out


def test_a_comparison_parquet_that_cannot_be_written_is_a_warning_and_the_table_still_prints(tmp_path, capsys, monkeypatch):
    """Issue 50: on a full disk `memlab table` died with a traceback writing comparison.parquet."""
    import errno

    import memlab.core.runfolder as runfolder

    write_run(tmp_path, "baseline")
    write_run(tmp_path, "gradcp")

    def no_space(path, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(runfolder, "atomic_write_bytes", no_space)
    assert memlab("table", tmp_path, "-f", "markdown") == 0
    out, err = capsys.readouterr()
    assert set(markdown_rows(out)) == {"baseline", "gradcp"}
    assert err.strip() == f"warning could not write {tmp_path / 'comparison.parquet'}: No space left on device"
    assert not (tmp_path / "comparison.parquet").exists() and not list(tmp_path.glob(".*.tmp"))


def test_the_table_shows_the_finished_run_behind_a_later_interrupted_one_and_says_so(tmp_path, capsys):
    write_run(tmp_path, "baseline", started_at="2026-01-01T00:00:00+00:00")
    retry = write_run(tmp_path, "baseline", started_at="2026-01-02T00:00:00+00:00", status="interrupted", reason="interrupted")
    assert memlab("table", tmp_path, "-f", "markdown") == 0
    out = capsys.readouterr().out
    assert markdown_rows(out)["baseline"]["status"] == "finished"
    assert f"baseline: its latest finished run is shown; a later run was interrupted ({retry.name}) (--all shows every run)" in out
    assert "no finished runs in this experiment" not in out
