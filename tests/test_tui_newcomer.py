"""What a new user met in the TUI (issue 20), each driven through Textual's pilot with synthetic events (no child
process): knob fields that took garbage, a results panel whose telling columns were off-screen, broken profile
files that vanished, GPU rows on a CPU run, a GPU-sized experiment on CPU without a word, cut messages, a dropdown
past the bottom edge, and the command accepting a device or a runs folder that can never work."""

from __future__ import annotations


import pytest
from tui_helpers import fixed_runs, wait_for

from memlab.core.supervisor import ChildResult
from memlab.tui.app import MemlabApp
from memlab.tui.widgets.profile_list import ProfileInfo, discover_profiles
from memlab.tui.widgets.results_table import ResultsTable, fit_columns, spread_words
from memlab.tui.widgets.settings_panel import SettingsPanel

ONE = [ProfileInfo("baseline", "baseline", "fp32")]


def make_app(tmp_path, **kw) -> MemlabApp:
    kw.setdefault("profiles", ONE)
    kw.setdefault("device", "cpu")
    return MemlabApp(runs_dir=tmp_path / "runs", experiment="tiny", **kw)


def log(app: MemlabApp) -> str:
    return "\n".join(app.event_log.lines_text)


# ---------------------------------------------------------------------------------------------- knobs


async def test_a_knob_takes_no_stray_key_and_a_bad_value_refuses_the_run(tmp_path):
    app = make_app(tmp_path)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("e", "tab")  # the steps field
        steps = app.main.query_one("#knob-steps")
        await pilot.press("z", "x")  # not digits: neither is typed in (nor zooms: the Knobs do not zoom)
        assert steps.value == "" and app.main.maximized is None and app.focused is steps
        await pilot.press("0")  # digits go in, but 0 is no step count
        await pilot.pause()
        assert app.knob_problem == "knob steps = '0' is not a positive integer"
        await pilot.press("tab", "m", "a", "k")  # batch: `ma` may become max; k is not typed in
        assert app.main.query_one("#knob-batch").value == "ma"
        app.queue.add("baseline")
        await pilot.press("r")  # from the field itself: r runs the queue, which refuses
        await pilot.pause()
        assert "✗ no run started: knob steps = '0' is not a positive integer; knob batch = 'ma' is not a positive integer or max" in log(app)
        assert app.mode == "idle" and not app.busy and [i.status for i in app.queue.items()] == ["queued"]
        # Fixed (cleared: the experiment's own; max): no problem left.
        steps.focus()
        await pilot.press("backspace")
        app.main.query_one("#knob-batch").focus()
        await pilot.press("end", "x")
        await pilot.pause()
        assert app.knob_problem is None and app.settings.steps is None and app.settings.batch == "max"


async def test_escape_or_enter_leave_a_knob_for_the_panel_one_came_from_and_q_quits_from_it(tmp_path):
    app = make_app(tmp_path)
    async with app.run_test(size=(80, 24)) as pilot:
        queue = app.main.query_one("#queue")
        queue.focus()
        await pilot.press("e", "tab", "4")
        assert app.focused.id == "knob-steps"
        await pilot.press("escape")
        assert app.focused is queue and app.settings.steps == 4
        await pilot.press("e", "tab", "tab", "m", "a", "x", "enter")  # enter in the batch field: done, not the next field
        assert app.focused is queue and app.settings.batch == "max"
        await pilot.press("e")
        assert app.focused.id == "knob-experiment"
        await pilot.press("escape")  # the experiment list, closed: escape leaves it too
        assert app.focused is queue
        await pilot.press("e", "tab", "q")  # idle: q quits at once, from the field too
        await wait_for(pilot, lambda: not app.is_running, timeout=5, what="the app to exit")


async def test_a_gpu_sized_experiment_picked_on_cpu_is_warned_about(tmp_path):
    from memlab.tui.widgets.settings_panel import Settings

    app = make_app(tmp_path)
    async with app.run_test(size=(80, 24)) as pilot:
        app.main.query_one(SettingsPanel).post_message(SettingsPanel.Changed(Settings(experiment="gpt2s")))
        await pilot.pause()
        assert "⚠ experiment gpt2s is sized for a GPU" in log(app) and "tiny is the CPU one" in log(app)
        app.main.query_one(SettingsPanel).post_message(SettingsPanel.Changed(Settings(experiment="tiny")))
        await pilot.pause()
        assert log(app).count("sized for a GPU") == 1


async def test_the_experiment_list_opens_within_the_screen(tmp_path):
    from textual.widgets._select import SelectOverlay

    path = "profiles/experiments/tiny.toml"  # a fifth choice: the list no longer fits below the field
    app = MemlabApp(runs_dir=tmp_path / "runs", experiment=path, device="cpu", profiles=ONE)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("e", "enter")
        await pilot.pause(0.2)
        overlay = app.main.query_one(SelectOverlay)
        assert overlay.display and overlay.region.height >= 5
        assert overlay.region.bottom <= app.screen.size.height


# ---------------------------------------------------------------------------------------------- the queue


async def test_cancel_says_it_stops_after_the_current_step(tmp_path):
    app = make_app(tmp_path)

    class Runner:  # the core queue's one method cancel uses
        current = None

        def cancel_current(self) -> bool:
            return True

        def stop(self, grace_s: float) -> None:
            pass

    async with app.run_test(size=(80, 24)) as pilot:
        app._runner = Runner()
        app.live_state.profile = "baseline"
        await pilot.press("c")
        assert "cancelling baseline: stopping after the current step…" in log(app)


# ---------------------------------------------------------------------------------------------- live panel


async def test_a_cpu_app_shows_no_gpu_rows_before_its_first_run_says_so(tmp_path):
    app = make_app(tmp_path)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        assert app.live.has_class("-cpu")
        app.feed(("run_started", 1, "baseline"))  # no `started` event yet: the device is not known from the run
        await wait_for(pilot, lambda: app.live.renders > 0, what="the live panel")
        assert app.live.has_class("-cpu")


async def test_a_rejection_is_shown_whole_in_the_live_panel(tmp_path):
    app = make_app(tmp_path)
    message = ("profile window: attention.window needs a CUDA GPU (flash or flex attention); this machine has none. "
               "Pick a profile without a window, or run it where CUDA is; `memlab profiles` marks which need it. END")
    async with app.run_test(size=(80, 24)) as pilot:
        app.feed(("run_started", 1, "window"))
        app.feed(("run_ended", 1, ChildResult("rejected", message, {}, None, 2)))
        await wait_for(pilot, lambda: app.live_state.status == "rejected", what="the rejection")
        await pilot.pause(0.2)
        title = app.live.query_one("#live-title")
        assert "memlab profiles` marks which need it. END" in str(title.render())
        assert title.size.height >= 3  # wrapped over lines, not cut


# ---------------------------------------------------------------------------------------------- profiles


def test_broken_profile_files_are_listed_with_their_error_and_other_toml_is_not(tmp_path):
    (tmp_path / "broken.toml").write_text('extends = "missing"\n')
    (tmp_path / "typo.toml").write_text("[precision]\ndtype = 'bf17'\n")
    (tmp_path / "not_toml.toml").write_text("this is [ not toml\n")
    (tmp_path / "mine.toml").write_text("description = 'mine'\n[precision]\ndtype = 'bf16'\n")
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    (tmp_path / "exp.toml").write_text("[model]\nn_layer = 2\n")
    files = {p.label: p for p in discover_profiles(tmp_path) if p.label.endswith("(file)")}
    assert sorted(files) == ["broken (file)", "mine (file)", "not_toml (file)", "typo (file)"]
    assert not files["mine (file)"].error
    assert "missing" in files["broken (file)"].error and "bf17" in files["typo (file)"].error and files["not_toml (file)"].error


async def test_a_broken_profile_shows_its_error_and_cannot_be_queued(tmp_path):
    broken = ProfileInfo(str(tmp_path / "broken.toml"), "broken (file)", error="broken.toml: extends 'missing': profile not found")
    app = make_app(tmp_path, profiles=[*ONE, broken])
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("down")
        await pilot.pause()
        assert "does not load: broken.toml: extends 'missing'" in str(app.main.query_one("#profile-help").render())
        await pilot.press("enter")
        await pilot.pause()
        assert app.queue.items() == []


async def test_a_long_description_is_not_cut_at_two_lines(tmp_path):
    words = "one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen seventeen END"
    app = make_app(tmp_path, profiles=[ProfileInfo("baseline", "baseline", words)])
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        help_ = app.main.query_one("#profile-help")
        assert help_.size.height >= 4 and "END" in str(help_.render())


# ---------------------------------------------------------------------------------------------- results


def test_columns_are_given_room_most_telling_first():
    from memlab.core.compare.presenting import DISPLAY_COLUMNS

    widths = {c.name: len(c.header) for c in DISPLAY_COLUMNS}
    chosen = fit_columns(list(DISPLAY_COLUMNS), widths, ("profile", "mem_saved_pct", "speedup_x", "total_s"), room=32)
    assert [c.name for c in chosen] == ["profile", "mem_saved_pct", "speedup_x"]
    # The sorted column keeps its room (its mark must not push it off), in its own place.
    kept = fit_columns(list(DISPLAY_COLUMNS), widths, ("profile", "mem_saved_pct", "speedup_x", "total_s"), room=32, keep="total_s")
    assert [c.name for c in kept][0] == "profile" and [c.name for c in kept][-1] == "total_s" and len(kept) < 4
    assert len(fit_columns(list(DISPLAY_COLUMNS), widths, None, room=10)) == len(DISPLAY_COLUMNS)


def test_a_group_name_is_laid_over_the_cells_by_whole_words():
    cells = spread_words("── tiny · steps=300 · n_layer=4", [10, 9, 12])
    assert cells == ["── tiny ·", "steps=300", "· n_layer=4"]
    assert spread_words("a b c d e f", [3, 3]) == ["a b", "c …"]


@pytest.mark.parametrize("size", [(80, 24), (120, 35)])
async def test_results_show_the_relative_columns_that_fit_and_w_cycles_sets(tmp_path, size):
    from memlab.core import compare

    fixed_runs(tmp_path / "runs")
    app = make_app(tmp_path)
    async with app.run_test(size=size) as pilot:
        await wait_for(pilot, lambda: app.results.row_count == 3, what="results")
        await pilot.pause(0.2)
        table: ResultsTable = app.results
        names = [c.name for c in table._columns]
        assert names[:3] == ["profile", "mem_saved_pct", "speedup_x"]
        assert sum(c.get_render_width(table) for c in table.columns.values()) <= table.size.width
        tabs = app.main.query_one("#tabs")
        assert tabs.border_subtitle.startswith("columns: key figures · ") and tabs.border_subtitle.endswith(" more · w cycles")
        await pilot.press("w")  # from the profile list: w acts on the results from any panel
        assert table.column_set_name == "memory" and "peak_alloc_bytes" in [c.name for c in table._columns]
        assert tabs.border_subtitle.startswith("columns: memory")
        await pilot.press("2", "w")  # from the Log tab: the results come back into view
        assert app.main.query_one("#tabs").active == "results" and table.column_set_name == "speed"
        await pilot.press("w")
        # all: every column, in pages that fit the width, the profile leading each; w pages on, then back to the start
        seen, pages = set(), 0
        while table.column_set_name.startswith("all"):
            names = [c.name for c in table._columns]
            assert names[0] == "profile" and sum(c.get_render_width(table) for c in table.columns.values()) <= table.size.width
            seen.update(names)
            pages += 1
            await pilot.press("w")
        assert table.column_set_name == "key figures"
        assert seen == {c.name for c in compare.visible_columns(table.table)[0]} and pages > 1


def test_profiles_that_need_cuda_are_marked_in_the_list():
    """The mark comes from memlab.core.requirements, whose declarations the techniques' checks refuse from."""
    from memlab.tui.widgets.profile_list import _label, discover_profiles

    infos = {p.ref: p for p in discover_profiles("/nonexistent")}
    assert "needs CUDA" in infos["tf32"].needs_cuda or "CUDA" in infos["tf32"].needs_cuda
    assert str(_label(infos["tf32"])) == "tf32 · CUDA"
    assert not infos["bf16"].needs_cuda and str(_label(infos["bf16"])) == "bf16"


def test_a_profile_whose_extra_is_missing_is_marked_with_it_in_the_list(monkeypatch):
    import memlab.core.optim_library as optim_library
    from memlab.core import requirements
    from memlab.core.config import load_profile
    from memlab.tui.widgets.profile_list import _info, _label

    def without_torchao(module):
        raise ModuleNotFoundError(f"No module named {module!r}", name=module.split(".")[0])

    found = requirements._installed
    monkeypatch.setattr(optim_library, "import_module", without_torchao)  # the check's import, and the declaration's look-up
    monkeypatch.setattr(requirements, "_installed", lambda m: m.split(".")[0] != "torchao" and found(m))
    info = _info("bf16_sr", "bf16_sr", load_profile("bf16_sr"), lambda p: "")
    assert info.needs_extra == "torchao" and not info.needs_cuda and "pip install 'memlab[torchao]'" in info.extra_why
    assert str(_label(info)) == "bf16_sr · memlab[torchao]" and info.refusal("cuda").startswith("needs memlab[torchao]")
