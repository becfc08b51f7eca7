"""Snapshots of the main screens (pytest-textual-snapshot; baselines in tests/__snapshots__/test_tui_snapshots/).

Only deterministic content: a fixed profile list, fixed run folders written here (fixed run ids, figures, steps),
an explicit device (no NVML probe), the event log's clock never on screen, notifications cleared.
Update after a deliberate change with: python -m pytest tests/test_tui_snapshots.py --snapshot-update
"""

from __future__ import annotations

import pytest
from tui_helpers import fixed_runs, wait_for

from memlab.tui.app import MemlabApp
from memlab.tui.widgets.profile_list import ProfileInfo

PROFILES = [
    ProfileInfo("baseline", "baseline", "fp32, eager attention that materializes T x T", "precision.dtype=fp32 attention.kernel=eager"),
    ProfileInfo("bf16", "bf16", "bf16 autocast, SDPA attention", "precision.dtype=bf16"),
    ProfileInfo("gradcp", "gradcp", "Gradient checkpointing on every block", "checkpointing.mode=full"),
    ProfileInfo("gradcp_bf16", "gradcp_bf16", "Gradient checkpointing on every block, bf16 autocast", "checkpointing.mode=full precision.dtype=bf16"),
    ProfileInfo("chunked_ce", "chunked_ce", "Chunked cross-entropy: never materializes B x T x V logits", "loss.chunked=True"),
    ProfileInfo("./mine.toml", "mine (file)", "A profile file of the current folder", "attention.window=256"),
]


@pytest.fixture
def app_in(tmp_path, monkeypatch):
    """An app whose runs folder is `runs` in a fresh current folder (so no temp path shows on screen)."""
    monkeypatch.chdir(tmp_path)

    def make(with_runs: bool = False, theme: str = "textual-dark") -> MemlabApp:
        if with_runs:
            fixed_runs(tmp_path / "runs")
        return MemlabApp(runs_dir="runs", experiment="tiny", device="cpu", profiles=PROFILES, theme=theme)

    return make


async def settle(pilot, rows: int = 0) -> None:
    app = pilot.app
    await wait_for(pilot, lambda: app.main is not None and app.results.row_count == rows, timeout=20, what=f"{rows} result rows")
    # DataTable sizes its columns to new rows on its next idle, not in add_row: on a loaded CI machine one snapshot
    # caught the header-only widths. Textual has no public flag for "widths settled"; this private one is it.
    await wait_for(pilot, lambda: not app.results._require_update_dimensions, timeout=20, what="the results table's column widths")
    await pilot.pause(0.2)
    app.clear_notifications()
    await pilot.pause()


def test_queue_screen(app_in, snap_compare):
    async def run_before(pilot):
        await settle(pilot)
        await pilot.press("enter", "down", "down", "enter", "down", "enter", "end", "enter")  # baseline gradcp gradcp_bf16 mine
        await pilot.press("tab", "up", "shift+up")  # in the queue: gradcp_bf16 moves above gradcp
        await settle(pilot)

    assert snap_compare(app_in(), terminal_size=(80, 24), run_before=run_before)


def test_help_screen(app_in, snap_compare):
    async def run_before(pilot):
        await settle(pilot)
        await pilot.press("question_mark")
        await pilot.pause()

    assert snap_compare(app_in(), terminal_size=(80, 24), run_before=run_before)


def test_results_view_zoomed(app_in, snap_compare):
    async def run_before(pilot):
        await settle(pilot, rows=3)
        await pilot.press("1", "right", "s", "s", "z")  # sort by mem saved, descending (the column after profile); zoom
        await pilot.pause()

    assert snap_compare(app_in(with_runs=True), terminal_size=(100, 24), run_before=run_before)


def test_past_run_in_the_live_panel_light_theme(app_in, snap_compare):
    async def run_before(pilot):
        await settle(pilot, rows=3)
        await pilot.press("o")
        await pilot.pause()
        await pilot.press("down", "enter")  # newest first: gradcp_bf16, then bf16
        await settle(pilot, rows=3)

    assert snap_compare(app_in(with_runs=True, theme="textual-light"), terminal_size=(110, 36), run_before=run_before)
