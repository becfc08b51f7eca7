"""core.plot: a valid PNG of the documented size, one band per experiment, for any mix of runs; one colour per
profile everywhere, no empty panels, value labels that never overlap."""

from __future__ import annotations

import subprocess
import sys

import pytest

from run_helpers import GIB, png_size, table_of, write_run

from memlab.core.plot import PALETTE, band_panels, figure_size_px, label_rotation, plot_comparison, profile_colors

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


@pytest.mark.parametrize(("n", "size"), [(1, (1500, 750)), (2, (1500, 1500)), (3, (3000, 1500)), (5, (3000, 2250))])
def test_many_groups_make_a_grid_not_a_tower(n, size):
    assert figure_size_px(n) == size


def test_five_groups_in_one_readable_grid(tmp_path):
    for k in range(5):
        for p in ("baseline", "gradcp"):
            write_run(tmp_path, p, experiment=f"exp{k}", experiment_id=f"{k:012d}")
    out = plot_comparison(table_of(tmp_path), tmp_path / "five.png")
    assert png_size(out) == figure_size_px(5) == (3000, 2250)


def test_a_profile_keeps_one_colour_in_every_group_and_26_colours_differ(tmp_path):
    names = [f"p{i:02d}" for i in range(26)]
    for i, p in enumerate(names):
        write_run(tmp_path, p)
        if i % 2:
            write_run(tmp_path, p, experiment="other", experiment_id="cccc2222dddd")
    table = table_of(tmp_path)
    colors = profile_colors(table)
    assert set(colors) == set(names)
    assert len(set(colors.values())) == 26 <= len(PALETTE)
    out = plot_comparison(table, tmp_path / "many.png")
    assert png_size(out) == figure_size_px(2)


def test_panels_with_no_figures_are_left_out():
    host = dict(peak_host_rss_bytes=GIB, step_ms_median=10.0, tokens_per_s=100.0, val_ppl=9.0, max_batch=None, mem_saved_pct=None)
    assert [getattr(p, "column", p) for p in band_panels([host])] == ["peak_host_rss_bytes", "step_ms_median", "tokens_per_s", "val_ppl"]
    device = dict(host, peak_alloc_fwd_bytes=GIB, max_batch=12, mem_saved_pct=3.0)
    assert [getattr(p, "column", p) for p in band_panels([device])] == ["phases", "step_ms_median", "tokens_per_s", "val_ppl", "max_batch", "mem_saved_pct"]


def test_value_labels_go_upright_then_away_rather_than_overlap():
    assert label_rotation(["1.00"] * 3, width_in=4.0) == 0
    assert label_rotation(["123,456"] * 20, width_in=4.0) == 90
    assert label_rotation(["123,456"] * 60, width_in=4.0) is None
