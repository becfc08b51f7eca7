"""The TUI's traps a new user met in round two (issue 50), each driven through Textual's pilot: keys that acted in
one panel only, a knob field that kept r, q and escape, a footer that lost `q Quit`, profiles that could be queued
where they can never run, a results panel that cut columns and its notes and hid rows under toasts, a left column
that stayed narrow on a wide terminal, and a quit question whose step stood still."""

from __future__ import annotations

import time

import pytest
from tui_helpers import fixed_runs, started_event, step_event, wait_for, write_run
from textual.widgets._toast import Toast
from textual.widgets._footer import FooterKey

from memlab.tui.app import MemlabApp
from memlab.tui.screens.confirm import ConfirmScreen
from memlab.tui.widgets.profile_list import ProfileInfo, ProfileList

CUDA_WHY = "precision.dtype = tf32 needs CUDA tensor cores; use fp32 on the CPU backend"
EXTRA_WHY = "optimizer.name = bf16_sr needs torchao (torchao is missing): pip install 'memlab[torchao]', or use adamw"
PROFILES = [
    ProfileInfo("baseline", "baseline", "fp32"),
    ProfileInfo("tf32", "tf32", "TF32 matmuls", needs_cuda=CUDA_WHY),
    ProfileInfo("bf16_sr", "bf16_sr", "bf16 with stochastic rounding", needs_extra="torchao", extra_why=EXTRA_WHY),
    ProfileInfo("act_offload_overlap", "act_offload_overlap", "offload, overlapped", needs_cuda="needs CUDA"),
]


def make_app(tmp_path, device: str = "cpu", **kw) -> MemlabApp:
    kw.setdefault("profiles", PROFILES)
    return MemlabApp(runs_dir=tmp_path / "runs", experiment="tiny", device=device, **kw)


def screen_lines(app: MemlabApp) -> list[str]:
    """The screen as the user sees it, one string a row (Textual's compositor: every layer, toasts included)."""
    return [strip.text for strip in app.screen._compositor.render_strips()]


def shown_text(app: MemlabApp, widget) -> str:
    """What of `widget` is on screen: its content rows, cropped as drawn, joined by spaces (words wrap)."""
    r = widget.content_region
    return " ".join(" ".join(line[r.x:r.right].split()) for line in screen_lines(app)[r.y:r.bottom])


# ---------------------------------------------------------------------------------------------- keys and footer


@pytest.mark.parametrize("panel", ["#profiles", "#queue", "#knob-experiment", "#knob-steps", "#knob-batch", "#results-table", "#event-log"])
async def test_the_footer_keeps_q_quit_at_80_columns_whatever_has_focus(tmp_path, panel):
    fixed_runs(tmp_path / "runs")
    app = make_app(tmp_path)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: app.results.row_count == 3, what="results")
        if panel == "#event-log":
            await pilot.press("2")
        app.main.query_one(panel).focus()
        await pilot.pause(0.3)
        # The footer is composed again after a focus change, on a later refresh: wait for the focused panel's keys.
        own = {"#queue": "Move", "#results-table": "Sort"}.get(panel, "Done" if panel.startswith("#knob") else "Columns")
        await wait_for(pilot, lambda: own in screen_lines(app)[-1], timeout=10, what=f"the footer of {panel}")
        keys = {k.description: k for k in app.main.query(FooterKey)}
        assert "Quit" in keys, f"no Quit in the footer with {panel} focused: {sorted(keys)}"
        assert keys["Quit"].region.right <= 80 and "q Quit" in screen_lines(app)[-1]


async def test_w_cycles_the_results_columns_from_any_panel_and_s_is_shown_only_where_it_works(tmp_path):
    fixed_runs(tmp_path / "runs")
    app = make_app(tmp_path)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: app.results.row_count == 3, what="results")
        for panel in ("#profiles", "#queue", "#knob-steps"):
            app.main.query_one(panel).focus()
            before = app.results.column_set_name
            await pilot.press("w")
            assert app.results.column_set_name != before, panel
            footer = {k.description for k in app.main.query(FooterKey)}
            assert "Columns" in footer and "Sort" not in footer, panel
        await pilot.press("escape", "1")  # out of the field (a digit would be typed in); the results: s sorts
        await pilot.pause(0.2)
        assert "Sort" in {k.description for k in app.main.query(FooterKey)}


# ---------------------------------------------------------------------------------------------- what cannot run here


async def test_profiles_that_cannot_run_here_are_greyed_and_refused_with_the_reason_in_the_live_panel(tmp_path):
    app = make_app(tmp_path)
    async with app.run_test(size=(80, 24)) as pilot:
        plist = app.main.query_one(ProfileList)
        await pilot.pause()
        assert plist.device == "cpu"
        await pilot.press("down")  # tf32: needs CUDA, and runs go to the CPU
        await pilot.pause()
        assert "needs CUDA: runs go to the CPU here" in str(app.main.query_one("#profile-help").render())
        await pilot.press("enter")
        await pilot.pause()
        assert app.queue.items() == []
        assert f"✗ tf32 not queued: needs CUDA, and runs go to the CPU here: {CUDA_WHY}" in app.live.notice
        assert any("tf32 not queued" in line for line in app.event_log.lines_text)
        await pilot.press("down", "enter")  # bf16_sr: its extra is not installed
        await pilot.pause()
        assert app.queue.items() == [] and "pip install 'memlab[torchao]'" in app.live.notice
        notice = app.live.query_one("#live-notice")
        assert shown_text(app, notice) == f"✗ bf16_sr not queued: needs memlab[torchao], not installed here: {EXTRA_WHY}"  # whole
        await pilot.press("home", "enter")  # one that runs: queued, and the notice goes
        await pilot.pause()
        assert [i.profile for i in app.queue.items()] == ["baseline"] and app.live.notice == ""
        # Greyed out in the list (dim), with the mark that says why.
        labels = {o.id: o.prompt for o in plist.options}
        assert str(labels["bf16_sr"]) == "bf16_sr · memlab[torchao]" and "dim" in str(labels["bf16_sr"].spans[0].style)
        assert str(labels["tf32"]) == "tf32 · CUDA" and "dim" in str(labels["tf32"].spans[0].style)
        assert not labels["baseline"].spans or "dim" not in str(labels["baseline"].spans[0].style)


async def test_on_a_gpu_a_cuda_profile_is_queued_but_a_missing_extra_still_is_not(tmp_path):
    app = make_app(tmp_path, device="cuda")
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("down", "enter", "down", "enter")
        await pilot.pause()
        assert [i.profile for i in app.queue.items()] == ["tf32"]
        assert "bf16_sr not queued" in app.live.notice


# ---------------------------------------------------------------------------------------------- results and layout


async def test_results_at_80x24_keep_a_run_s_reason_whole_and_toasts_off_the_rows(tmp_path):
    runs = tmp_path / "runs"
    fixed_runs(runs)
    write_run(runs, "gradcp", 9, peak_gib=5.0, step_ms=150.0, tps=100_000.0, ppl=41.5, status="interrupted", reason="stopped after step 318")
    app = make_app(tmp_path)
    async with app.run_test(size=(80, 24), notifications=True) as pilot:
        await wait_for(pilot, lambda: app.results.row_count == 4, what="results")
        await pilot.pause(0.3)
        notes = app.main.query_one("#results-notes")
        assert shown_text(app, notes).startswith("gradcp (interrupted): stopped after step 318 · ")
        assert notes.size.height >= notes.get_content_height(notes.size, notes.size, notes.content_size.width)  # nothing cut
        app.notify("a message the user did not ask for, long enough to take two lines of a toast", timeout=30)
        await pilot.pause(0.5)
        toasts = list(app.screen.query(Toast))
        assert toasts and all(not t.region.overlaps(app.results.region) for t in toasts)


@pytest.mark.parametrize("width", [80, 120])
async def test_the_left_column_widens_with_the_terminal_so_names_do_not_wrap(tmp_path, width):
    app = make_app(tmp_path)
    async with app.run_test(size=(width, 30)) as pilot:
        await pilot.pause(0.2)
        left = app.main.query_one("#left").size.width
        if width == 80:
            assert left == 30  # the right side keeps its room
        else:
            plist = app.main.query_one(ProfileList)
            assert left > 30 and plist.get_content_height(plist.size, plist.size, plist.content_size.width) == len(PROFILES)


# ---------------------------------------------------------------------------------------------- quitting


async def test_the_quit_question_follows_the_run_s_step(tmp_path):
    app = make_app(tmp_path)
    async with app.run_test(size=(80, 24)) as pilot:
        app.feed(("run_started", 1, "baseline"))
        app.feed(("event", 1, started_event("baseline", 400)))
        for i in range(141):
            app.feed(("event", 1, step_event(i, 400, time.time())))
        app._worker_active = True  # as while the worker runs a child
        await wait_for(pilot, lambda: app.live_state.step == 141, what="step 141")
        await pilot.press("q")
        await pilot.pause()
        assert isinstance(app.screen, ConfirmScreen)
        detail = app.screen.query_one("#confirm-detail")
        assert "at step 141/400" in str(detail.render())
        for i in range(141, 160):
            app.feed(("event", 1, step_event(i, 400, time.time())))
        await pilot.pause(ConfirmScreen.REFRESH_S * 3)
        assert "at step 160/400" in str(detail.render())
        await pilot.press("n")
        app._worker_active = False
