"""core.plot: a valid PNG of the documented size, one band per experiment, for any mix of runs."""

from __future__ import annotations

import struct
import subprocess
import sys
from pathlib import Path

import pytest
from test_compare import GIB, write_run

from memlab.core import compare
from memlab.core.plot import figure_size_px, plot_comparison

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def png_size(path: Path) -> tuple[int, int]:
    """(width, height) from the PNG's IHDR chunk, after checking the signature."""
    head = path.read_bytes()[:24]
    assert head[:8] == PNG_SIGNATURE, "not a PNG"
    assert head[12:16] == b"IHDR"
    return struct.unpack(">II", head[16:24])


def table_of(root: Path, **kw):
    return compare.comparison(compare.read_runs([root])[0], **kw)


def test_one_experiment(tmp_path):
    write_run(tmp_path / "runs", "baseline", peak_nvml_bytes=5 * GIB, max_batch=64, mfu=0.4)
    write_run(tmp_path / "runs", "gradcp", peak_alloc_bytes=GIB, step_ms_median=130.0, max_batch=123)
    out = plot_comparison(table_of(tmp_path / "runs"), tmp_path / "compare.png")
    assert out == tmp_path / "compare.png"
    assert png_size(out) == figure_size_px(1) == (1500, 750)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["compare.png", "runs"]  # no temp file left


def test_one_band_per_experiment(tmp_path):
    write_run(tmp_path, "baseline")
    write_run(tmp_path, "gradcp")
    write_run(tmp_path, "baseline", experiment="gpt2s", experiment_id="cccc2222dddd")
    table = table_of(tmp_path)
    out = plot_comparison(table, tmp_path / "two.png")
    assert png_size(out) == figure_size_px(2) == (1500, 1500)


def test_failed_incomplete_and_cpu_only_runs(tmp_path):
    host = dict(peak_alloc_fwd_bytes=None, peak_alloc_bwd_bytes=None, peak_alloc_opt_bytes=None, peak_alloc_bytes=None, peak_reserved_bytes=None)
    write_run(tmp_path, "baseline", peak_host_rss_bytes=GIB, **host)
    write_run(tmp_path, "gradcp", status="oom", **host)
    write_run(tmp_path, "bf16", status="running", summary=False)
    out = plot_comparison(table_of(tmp_path), tmp_path / "p.png")
    assert png_size(out) == figure_size_px(1)


def test_every_run_of_a_profile_and_many_profiles(tmp_path):
    for i in range(12):
        write_run(tmp_path, f"profile_with_a_long_name_{i % 6}", step_ms_median=10.0 + i)
    out = plot_comparison(table_of(tmp_path, latest_only=False), tmp_path / "all.png")
    assert png_size(out) == figure_size_px(1)


def test_nothing_to_plot_still_writes_a_png(tmp_path):
    out = plot_comparison(table_of(tmp_path), tmp_path / "empty.png")
    assert png_size(out) == figure_size_px(0)


def test_dpi_scales_the_size(tmp_path):
    write_run(tmp_path / "runs", "baseline")
    out = plot_comparison(table_of(tmp_path / "runs"), tmp_path / "small.png", dpi=50)
    assert png_size(out) == figure_size_px(1, dpi=50) == (750, 375)


def test_plotting_uses_no_pyplot_and_needs_no_display(tmp_path):
    write_run(tmp_path / "runs", "baseline")
    code = (
        "import os, sys\n"
        "os.environ.pop('DISPLAY', None); os.environ['MPLBACKEND'] = 'TkAgg'\n"
        "from memlab.core import compare, plot\n"
        f"t = compare.comparison(compare.read_runs([{str(tmp_path / 'runs')!r}])[0])\n"
        f"plot.plot_comparison(t, {str(tmp_path / 'x.png')!r})\n"
        "print('matplotlib.pyplot' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
    assert png_size(tmp_path / "x.png") == figure_size_px(1)


@pytest.mark.parametrize("n", [1, 3])
def test_figure_size_px(n):
    w, h = figure_size_px(n)
    assert w == 1500 and h == 750 * n
