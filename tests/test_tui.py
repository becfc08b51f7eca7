"""`memlab tui` driven through Textual's pilot: real child processes on the CPU backend (tiny experiment, 4 steps),
synthetic events for what a CPU cannot do (an OOM, a GPU) and for the 20-events-a-second responsiveness check."""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from tui_helpers import GIB, fixed_runs, started_event, step_event, wait_for
from typer.testing import CliRunner

from memlab.core import schema
from memlab.core.supervisor import ChildResult
from memlab.tui.app import MemlabApp
from memlab.tui.screens.confirm import ConfirmScreen
from memlab.tui.screens.help import HelpScreen
from memlab.tui.widgets.metric_row import MetricRow
from memlab.tui.widgets.profile_list import ProfileInfo, ProfileList
from memlab.tui.widgets.queue_view import QueueView

FAST = ["train.steps=4", "train.measure_after=1"]


def make_app(tmp_path, overrides=FAST, **kw) -> MemlabApp:
    return MemlabApp(runs_dir=tmp_path / "runs", experiment="tiny", device="cpu", overrides=overrides, **kw)


async def pick(pilot, app: MemlabApp, profile: str) -> None:
    """Add a profile to the queue the way a user does: focus the list, walk down to it, press enter."""
    plist = app.main.query_one(ProfileList)
    plist.focus()
    await pilot.press("home")
    index = [o.id for o in plist.options].index(profile)
    await pilot.press(*["down"] * index, "enter")


def statuses(app: MemlabApp) -> list[tuple[str, str]]:
    return [(i.profile, i.status) for i in app.queue.items()]


def run_json(run_dir: str | Path) -> dict:
    return json.loads((Path(run_dir) / schema.RUN_JSON).read_text())


# ---------------------------------------------------------------------------------------------- real children


@pytest.mark.slow
async def test_two_profiles_run_in_child_processes_and_fill_charts_and_results(tmp_path):
    app = make_app(tmp_path)
    async with app.run_test(size=(80, 24)) as pilot:
        await pick(pilot, app, "baseline")
        await pick(pilot, app, "gradcp")
        assert statuses(app) == [("baseline", "queued"), ("gradcp", "queued")]
        await pilot.press("r")
        await wait_for(pilot, lambda: all(i.done for i in app.queue.items()) and app.results.row_count == 2, what="two runs and two result rows")

        assert statuses(app) == [("baseline", "finished"), ("gradcp", "finished")]
        assert sorted(app.results.row_profiles) == ["baseline", "gradcp"]
        # The sparklines got the last run's 4 steps; on CPU the memory row is host RSS, and the panel says so.
        live = app.live
        assert len(live.query_one("#metric-loss", MetricRow).data) == 4
        assert len(live.query_one("#metric-step", MetricRow).data) == 4
        assert all(v > 0 for v in live.query_one("#metric-host", MetricRow).data)
        assert live.has_class("-cpu") and "CPU backend: no device memory" in str(live.query_one("#live-peaks").render())
        assert app.live_state.profile == "gradcp" and app.live_state.step == 4 and app.live_state.status == "finished"
        log = "\n".join(app.event_log.lines_text)
        assert "✓ baseline: finished" in log and "✓ gradcp: finished" in log and "eval @ step 4" in log
        # Each run trained in a child process of its own, not in the app's.
        pids = {run_json(i.run_dir)["pid"] for i in app.queue.items()}
        assert len(pids) == 2 and os.getpid() not in pids
        # The queue ran dry: a profile added now waits for r, it does not start at once.
        await pick(pilot, app, "bf16")
        await pilot.pause(1.0)
        assert app.mode == "idle" and not app.busy and statuses(app)[-1] == ("bf16", "queued")


@pytest.mark.slow
async def test_a_crash_a_cancel_and_a_rejected_profile_each_end_only_their_run_and_quitting_stops_the_last(tmp_path):
    """One queue, five items: a crash, a cancel and a rejection each end only their own run; the fourth is running
    when the user quits (asked first; no keeps it going, yes stops the child, which leaves its run interrupted);
    the fifth never starts."""
    app = make_app(tmp_path, overrides=[])
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("e", "tab", *"100000", "enter")  # knobs: experiment, then steps = 100000 (long runs, stopped by hand below)
        assert app.settings.steps == 100000
        await pick(pilot, app, "baseline")
        await pick(pilot, app, "gradcp")
        app.queue.add(str(tmp_path / "deleted_since.toml"))  # a profile file removed after it was listed
        await pick(pilot, app, "bf16")
        await pick(pilot, app, "baseline")
        await pilot.press("r")

        await wait_for(pilot, lambda: app.live_state.profile == "baseline" and app.live_state.step >= 1, what="baseline's first step")
        os.kill(app._child.proc.pid, signal.SIGKILL)  # a crash the child cannot report
        await wait_for(pilot, lambda: app.live_state.profile == "gradcp" and app.live_state.step >= 1, what="gradcp's first step")
        await pilot.press("c")  # cancel the running profile: SIGINT, it keeps its folder as `interrupted`
        await wait_for(pilot, lambda: app.live_state.profile == "bf16" and app.live_state.step >= 1, what="bf16's first step")
        await wait_for(pilot, lambda: "rejected" in "".join(app.event_log.lines_text), what="the log line")

        items = app.queue.items()
        assert [i.status for i in items[:3]] == ["crashed", "interrupted", "rejected"]
        assert run_json(items[0].run_dir)["status"] == "crashed"
        assert run_json(items[1].run_dir)["status"] == "interrupted"
        log = "\n".join(app.event_log.lines_text)
        assert "✗ baseline: crashed: child killed by signal 9" in log
        assert "■ gradcp: interrupted" in log
        assert "✗ deleted_since.toml: rejected: profile file not found" in log
        # The results list both folders with how they ended (an earlier refresh may show gradcp still running).
        await wait_for(pilot, lambda: app.results.table is not None and app.results.table["status"].to_list()[:2] == ["crashed", "interrupted"], what="results of the two run folders")

        child = app._child
        await pilot.press("q", "n")  # asked, and answered no: the run goes on
        await pilot.pause()
        assert not isinstance(app.screen, ConfirmScreen) and child.alive and not app._stopping
        t0 = time.monotonic()
        await pilot.press("q")  # a run is in progress: it asks first
        await pilot.pause()
        assert isinstance(app.screen, ConfirmScreen) and app.is_running and child.alive
        await pilot.press("y")
        await wait_for(pilot, lambda: not app.is_running, timeout=40, what="the app to exit")
    assert child.proc.poll() is not None, "the child outlived the app"
    assert time.monotonic() - t0 < app.QUIT_WAIT_S + 10
    items = app.queue.items()
    assert run_json(items[3].run_dir)["status"] == "interrupted"
    assert items[4].status == "queued"  # nothing new started while quitting
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == sorted(Path(i.run_dir).name for i in (items[0], items[1], items[3]))


# ---------------------------------------------------------------------------------------------- synthetic events


@pytest.mark.slow
async def test_stays_responsive_at_20_events_a_second_and_redraws_throttled(tmp_path):
    """Issue 8: a worker thread feeds 20 events a second (steps and NVML samples). While it does, the stream takes
    well under half of the UI thread's CPU, key presses are answered promptly, and the live panel redraws at most
    DRAIN rate, not once per event."""
    app = make_app(tmp_path)
    rate, total = 20, 10_000
    async with app.run_test(size=(80, 24)) as pilot:
        stop = threading.Event()

        def feeder() -> None:
            app.feed(("run_started", 1, "synthetic"))
            app.feed(("event", 1, started_event("synthetic", total)))
            i = 0
            while not stop.is_set():
                t = time.time()
                if i % 2:
                    app.feed(("event", 1, {"event": "gpu_sample", "t": t, "used_bytes": int((2 + i / 1000) * GIB)}))
                else:
                    app.feed(("event", 1, step_event(i // 2, total, t)))
                i += 1
                time.sleep(1 / rate)

        thread = threading.Thread(target=feeder, daemon=True)
        renders0 = app.live.renders
        t_start = time.monotonic()
        thread.start()
        await pilot.pause(0.3)  # the first events in: the panel switches to a GPU run

        # The stream's cost on the UI thread, in CPU seconds of that thread: a busy neighbour (CI runs two test
        # workers on two cores) stretches wall time but not this. Measured on a 2-core machine, 2026-11-25:
        # 0.21-0.23; 0.41-0.47 when every step relaid the whole screen out and Textual's Sparkline drew the rows
        # (bench/tui_load.py has the same at more rates and screen sizes).
        cpu0, wall0 = time.thread_time(), time.monotonic()
        await pilot.pause(1.5)
        ui_share = (time.thread_time() - cpu0) / (time.monotonic() - wall0)

        # Key presses under the stream. The median, not the slowest: one press that waited for the scheduler says
        # nothing about the app (the slowest reached 2.65 s on a loaded CI machine), a UI blocked on its events is
        # slow on every press. Measured: median 0.22-0.24 s alone, 0.27-0.55 s with both cores kept busy.
        latencies = []
        keys = ["down", "down", "up", "tab", "shift+tab", "question_mark", "escape", "t", "t"]
        for _ in range(2):
            for key in keys:
                t0 = time.monotonic()
                await pilot.press(key)
                latencies.append(time.monotonic() - t0)
            await pilot.pause(0.1)
        stop.set()
        thread.join()
        elapsed = time.monotonic() - t_start
        await pilot.pause(0.3)

        assert ui_share < 0.5, f"the event stream took {ui_share:.0%} of the UI thread"
        median = statistics.median(latencies)
        assert median < 1.0, f"key presses took {median:.2f} s (median; slowest {max(latencies):.2f} s) under the stream"
        renders = app.live.renders - renders0
        assert renders <= elapsed / app.DRAIN_INTERVAL_S + 3, f"{renders} redraws in {elapsed:.1f} s: not throttled"
        steps = app.live_state.step
        assert steps >= elapsed * rate / 2 * 0.6, f"only {steps} step events applied in {elapsed:.1f} s"
        live = app.live
        assert not live.has_class("-cpu")  # a GPU run: device, allocated and reserved rows
        assert len(live.query_one("#metric-alloc", MetricRow).data) == steps
        assert len(live.query_one("#metric-device", MetricRow).data) >= steps - 1
        assert "ETA" in str(live.query_one("#live-stats").render())


async def test_a_drain_tick_while_the_widgets_go_is_harmless(tmp_path):
    """Closing the app (q, or the terminal gone) can leave a drain tick after the panels are removed: no error."""
    from memlab.tui.widgets.live_panel import LivePanel

    app = make_app(tmp_path)
    async with app.run_test(size=(80, 24)) as pilot:
        app.feed(("run_started", 1, "synthetic"))
        app.feed(("event", 1, started_event("synthetic", 10)))
        await pilot.pause(0.3)
        await app.main.query_one(LivePanel).remove()
        app.feed(("event", 1, step_event(0, 10, time.time())))
        app.feed(("queue_idle", 0, None))
        app._drain()  # raised NoMatches before
        assert not app._inbox


async def test_an_oom_child_is_shown_as_such_and_the_log_says_why(tmp_path):
    app = make_app(tmp_path)
    async with app.run_test(size=(80, 24)) as pilot:
        app.feed(("run_started", 1, "leanest"))
        app.feed(("event", 1, started_event("leanest", 100)))
        app.feed(("event", 1, step_event(0, 100, time.time())))
        message = "CUDA out of memory. Tried to allocate 2.00 GiB"
        app.feed(("event", 1, {"event": "failed", "t": time.time(), "reason": "oom", "message": message, "step": 1, "summary": {}}))
        app.feed(("run_ended", 1, ChildResult("oom", message, {}, "/nowhere/leanest", 1)))
        await wait_for(pilot, lambda: app.live_state.status == "oom", what="the oom")
        await pilot.pause(0.3)
        assert any(line.startswith("✗ leanest: OOM at step 1: CUDA out of memory") for line in app.event_log.lines_text)
        title = str(app.live.query_one("#live-title").render())
        assert "oom" in title and "CUDA out of memory" in title


# ---------------------------------------------------------------------------------------------- keyboard, views


@pytest.mark.slow
async def test_queue_is_reordered_and_trimmed_with_the_keyboard(tmp_path):
    app = make_app(tmp_path)
    async with app.run_test(size=(80, 24)) as pilot:
        for name in ("baseline", "bf16", "gradcp"):
            await pick(pilot, app, name)
        app.main.query_one(QueueView).focus()
        await pilot.press("end", "shift+up", "shift+up")  # gradcp to the top
        assert [p for p, _ in statuses(app)] == ["gradcp", "baseline", "bf16"]
        await pilot.press("down", "delete")  # baseline out
        assert [p for p, _ in statuses(app)] == ["gradcp", "bf16"]
        await pilot.press("J")
        assert [p for p, _ in statuses(app)] == ["gradcp", "bf16"]  # bf16 is already last
        await pilot.press("K")
        assert [p for p, _ in statuses(app)] == ["bf16", "gradcp"]


async def test_results_sort_by_the_cursor_column_and_open_a_past_run(tmp_path):
    fixed_runs(tmp_path / "runs")
    app = make_app(tmp_path)
    async with app.run_test(size=(140, 36)) as pilot:  # wide enough that the key set shows step ms beside the left column
        await wait_for(pilot, lambda: app.results.row_count == 3, what="results from the run folders")
        table = app.results
        assert table.row_profiles == ["baseline", "bf16", "gradcp_bf16"]
        await pilot.press("1")
        assert app.focused is table
        step_col = [c.name for c in table._columns].index("step_ms_median")
        await pilot.press(*["right"] * step_col, "s")
        assert table.row_profiles == ["bf16", "gradcp_bf16", "baseline"]
        await pilot.press("s")
        assert table.row_profiles == ["baseline", "gradcp_bf16", "bf16"]
        # Enter opens the row's run folder in the live panel's charts.
        await pilot.press("home", "down", "enter")
        state = app.view_state
        assert state is not None and state.profile == "gradcp_bf16" and state.source == "folder"
        assert len(app.live.query_one("#metric-alloc", MetricRow).data) == 40
        assert len(app.live.query_one("#metric-device", MetricRow).data) == 120
        # o: the run picker, newest first; enter opens it.
        await pilot.press("o")
        await pilot.pause()
        await pilot.press("enter")
        await pilot.pause()
        assert app.view_state.profile == "gradcp_bf16" and app.view_state.run_id.startswith("20260102-090003")
        await pilot.press("v")
        assert app.view_state is None


async def test_help_lists_the_key_bindings_and_theme_toggles(tmp_path):
    app = make_app(tmp_path, profiles=[ProfileInfo("baseline", "baseline", "fp32")])
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        text = "\n".join(f"{key} {desc}" for _, rows in app.screen.sections for key, desc in rows)
        for words in ("c Cancel the running profile", "p Pause the queue", "o Open a past run", "⇧↑↓ Move the highlighted item up or down", "del Remove", "w Results: cycle the column sets", "esc Leave the Knobs", "s Sort by the column", "t Light/dark", "q Quit", "? This help"):
            assert words in text
        await pilot.press("escape")
        assert not isinstance(app.screen, HelpScreen)
        assert app.theme == "textual-dark"
        await pilot.press("t")
        assert app.theme == "textual-light"
        await pilot.press("ctrl+q")  # quits from anywhere, idle: at once
        await wait_for(pilot, lambda: not app.is_running, timeout=5, what="the app to exit")


# ---------------------------------------------------------------------------------------------- the command


def test_tui_command_checks_its_options_before_opening_and_imports_textual_lazily(tmp_path):
    from memlab.cli import _register_commands, app

    _register_commands()
    result = CliRunner().invoke(app, ["tui", "--set", "nosuch.key=1"])
    assert result.exit_code != 0 and "unknown section 'nosuch'" in str(result.exception or result.output)
    code = "import sys, memlab.cli.tui_cmd, memlab.core.compare, memlab.core.supervisor; sys.exit('textual' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


@pytest.mark.parametrize("device", ["gpu", "tpu"])
def test_tui_command_rejects_a_bad_device(device):
    from memlab.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["tui", "--device", device])
    assert exc.value.code == 2


def test_tui_command_refuses_cuda_where_there_is_none(capsys):
    import torch

    from memlab.cli import main

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(SystemExit) as exc:
        main(["tui", "--device", "cuda"])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no CUDA GPU" in err[0]


def test_tui_command_refuses_a_runs_folder_that_cannot_be_made(capsys):
    from memlab.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["tui", "--runs-dir", "/proc/nope"])
    assert exc.value.code == 2
    assert "runs folder /proc/nope cannot be created" in capsys.readouterr().err


async def test_children_that_crash_babble_or_cannot_start_each_end_only_their_run(tmp_path, monkeypatch):
    """Through the core queue supervisor: fake children (tests/fake_children.py) that misbehave in every way; each
    item gets its outcome, the app stays up, and the queue goes on to the last one."""
    from fake_children import fake_spec

    from memlab.core.supervisor import ChildSpec

    monkeypatch.setattr(ChildSpec, "argv", lambda self: list(fake_spec(self.profile, self.runs_dir).command))
    app = make_app(tmp_path)
    async with app.run_test(size=(80, 24)) as pilot:
        for kind in ("garbage", "sigkilled", "unstartable", "refuses_after_started", "finished"):
            app.queue.add(kind)
        await pilot.press("r")
        await wait_for(pilot, lambda: all(i.done for i in app.queue.items()), what="the queue to finish")
        assert [i.status for i in app.queue.items()] == ["error", "crashed", "crashed", "rejected", "finished"]
        await wait_for(pilot, lambda: "✓ finished: finished" in "\n".join(app.event_log.lines_text), what="the last log line")
        log = "\n".join(app.event_log.lines_text)
        assert "✗ unstartable: crashed: could not start the child process: FileNotFoundError" in log
        assert "✗ sigkilled: crashed: child killed by signal 9 (SIGKILL, e.g. the OOM killer)" in log
