"""`memlab tui`: pick profiles into a queue, watch each run live, compare the results.

The app never trains in its own process. A thread worker drives the core supervisor (ChildRun): one child process
per run, reading its JSON-lines events. The worker only appends to an inbox (a deque); a timer drains the inbox a
few times a second and redraws once, so 10 or 100 events a second cost the same number of redraws (no flicker).
Quitting asks the running child to stop (SIGINT: it writes status `interrupted`) and waits for it, bounded.
"""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

from textual import on, work
from textual.app import App
from textual.binding import Binding
from textual.css.query import NoMatches
from textual.worker import Worker, WorkerState

from memlab.tui.model import LiveState, RunQueue, display_name, load_run
from memlab.tui.screens.confirm import ConfirmScreen
from memlab.tui.screens.help import HelpScreen
from memlab.tui.screens.main import MainScreen
from memlab.tui.screens.open_run import OpenRunScreen
from memlab.tui.widgets.event_log import EventLog
from memlab.tui.widgets.live_panel import LivePanel
from memlab.tui.widgets.profile_list import ProfileInfo, ProfileList, discover_profiles
from memlab.tui.widgets.queue_view import QueueView
from memlab.tui.widgets.results_table import ResultsTable
from memlab.tui.widgets.settings_panel import Settings, SettingsPanel

THEMES = ("textual-dark", "textual-light")
CPU_PARAMS_WARN = 20e6  # transformer weights above which an experiment is a GPU one (gpt2s: ~85M; tiny: ~0.1M)


class MemlabApp(App[None]):
    CSS_PATH = "memlab.tcss"
    TITLE = "memlab"
    BINDINGS = [
        Binding("question_mark", "help", "Help", key_display="?", tooltip="This help: every key, and what each panel shows"),
        Binding("r", "run", "Run", tooltip="Run the queue: waiting profiles start one after another, each in a child process of its own"),
        Binding("p", "pause", "Pause", tooltip="Pause the queue (the current run goes on; the next waits), or resume it"),
        Binding("c", "cancel_run", "Cancel", tooltip="Cancel the running profile (SIGINT: its folder is kept, marked interrupted); the queue goes on"),
        Binding("o", "open_run", "Open", tooltip="Open a past run folder: its summary and steps in the live panel"),
        Binding("v", "live_view", "Live view", show=False, tooltip="Back to the live run after opening a past one"),
        Binding("t", "toggle_theme", "Light/dark", show=False, tooltip="Light/dark theme"),
        Binding("q", "quit", "Quit", tooltip="Quit: with a run in progress, asks first; the running child is asked to stop (it writes `interrupted`), and waited for"),
    ]

    DRAIN_INTERVAL_S = 0.125  # at most 8 redraws a second, whatever the event rate
    QUIT_GRACE_S = 10.0  # SIGINT, then SIGTERM after this, then SIGKILL (ChildRun.cancel)
    QUIT_WAIT_S = 25.0  # the longest quitting waits for the child before killing it

    def __init__(
        self,
        runs_dir: str | Path = "runs",
        experiment: str = "auto",
        device: str = "auto",
        overrides: list[str] | tuple[str, ...] = (),
        profiles_dir: str | Path | None = None,
        profiles: list[ProfileInfo] | None = None,
        theme: str = "textual-dark",
    ) -> None:
        super().__init__()
        self.runs_dir = str(runs_dir)
        self.device = device
        self.overrides = list(overrides)
        self.profiles = profiles if profiles is not None else discover_profiles(profiles_dir)
        self.settings = Settings(experiment=experiment)
        self.queue = RunQueue()
        self.mode = "idle"  # idle (r starts) | running (waiting items run, new ones too) | paused
        self.live_state = LiveState()
        self.view_state: LiveState | None = None  # a past run shown instead of the live one
        self.main: MainScreen | None = None
        self._inbox: deque[tuple[str, int, Any]] = deque()
        self._runner = self._make_runner()  # the core queue supervisor: one child at a time, an outcome for each
        self._stopping = False
        self._queue_worker: Worker | None = None
        self._worker_lock = threading.Lock()
        self._worker_active = False
        self._device_guess: str | None = None
        self.knob_problem: str | None = None  # a knob field that does not parse: no run starts until it is fixed
        self.theme = theme

    # ------------------------------------------------------------------------------------------ setup

    async def on_mount(self) -> None:
        from memlab.core.config import builtin_names

        main = MainScreen(self.profiles, self.settings, builtin_names("experiment"))
        await self.push_screen(main)
        self.main = main
        self._update_subtitle()
        if self.device == "auto":
            self._guess_device()
        self._mark_placeholder_device()
        self._install_signal_handlers()
        self.set_interval(self.DRAIN_INTERVAL_S, self._drain)
        self._refresh_queue()
        self.log_line(f"runs folder {self.runs_dir} · experiment {self.settings.experiment} · device {self.device}")
        self.load_results()

    @property
    def live(self) -> LivePanel:
        return self.main.query_one(LivePanel)

    @property
    def results(self) -> ResultsTable:
        return self.main.query_one(ResultsTable)

    @property
    def event_log(self) -> EventLog:
        return self.main.query_one(EventLog)

    def log_line(self, message: str, kind: str = "info", t: float | None = None) -> None:
        if self.main is not None and self.main.is_mounted:
            try:
                self.event_log.add(message, kind, t)
            except NoMatches:
                pass  # the app is closing: its widgets are already gone

    def _update_subtitle(self) -> None:
        """Experiment · device · runs folder; `auto` shown as what it will be (the last run says, else NVML guesses)."""
        s = self.live_state
        device = self.device
        if device == "auto":
            device = s.device or (f"{self._device_guess} (auto)" if self._device_guess else "auto")
        experiment = self.settings.experiment
        if experiment == "auto":
            if s.experiment:
                experiment = s.experiment
            elif self._device_guess or self.device != "auto":
                experiment = "gpt2s (auto)" if device.startswith("cuda") else "tiny (auto)"
        self.sub_title = f"{experiment} · {device} · {self.runs_dir}"

    @work(thread=True, exclusive=True, exit_on_error=False, group="probe", name="device probe")
    def _guess_device(self) -> None:
        """What `--device auto` will pick, for the header only (children resolve `auto` themselves): NVML, no torch."""
        try:
            import pynvml

            pynvml.nvmlInit()
            try:
                count = pynvml.nvmlDeviceGetCount()
            finally:
                pynvml.nvmlShutdown()
        except Exception:  # noqa: BLE001 (no driver, no library: no GPU)
            count = 0
        self.call_from_thread(self._set_device_guess, "cuda" if count else "cpu")

    def _set_device_guess(self, guess: str) -> None:
        self._device_guess = guess
        self._update_subtitle()
        self._mark_placeholder_device()

    def _mark_placeholder_device(self) -> None:
        """Before any run: the live panel's rows for the device runs will use (host RSS on CPU, no GPU rows); the
        profile list greys out what cannot run there."""
        if self.main is None:
            return
        self.main.query_one(ProfileList).set_device(self._expected_device())
        if self.live_state.status or self.view_state is not None:
            return
        expected = self._expected_device()
        if expected is not None:
            self.live.set_class(expected == "cpu", "-cpu")

    # ------------------------------------------------------------------------------------------ the queue worker

    def feed(self, record: tuple[str, int, Any]) -> None:
        """Thread-safe: what the worker (or a test) hands to the UI; drained a few times a second."""
        self._inbox.append(record)

    def _spec_for(self, profile: str):
        from memlab.core.supervisor import ChildSpec

        s = self.settings  # an immutable snapshot: the knobs as they are when this run starts
        return ChildSpec(
            profile=profile, experiment=s.experiment, device=self.device, runs_dir=self.runs_dir,
            overrides=self.overrides + s.overrides(), extra_args=s.extra_args(),
        )

    def _make_runner(self):
        from memlab.core.queue import ChildQueue

        def on_start(item_id: int, spec) -> None:
            self.feed(("run_started", item_id, spec.profile))

        def on_event(item_id: int, ev: dict) -> None:
            self.feed(("event", item_id, ev))

        def on_result(outcome) -> None:
            result = outcome.result
            self.queue.update(outcome.key, status=result.status, run_dir=result.run_dir, message=result.message)
            self.feed(("run_ended", outcome.key, result))

        return ChildQueue(on_start=on_start, on_event=on_event, on_result=on_result)

    @property
    def _child(self):
        """The ChildRun in flight, or None."""
        return self._runner.current

    # Not `exclusive`: one loop at a time is guaranteed by _worker_active (a thread cannot be cancelled anyway).
    @work(thread=True, exit_on_error=False, group="queue", name="queue")
    def _run_queue(self) -> None:
        """Run waiting items one after another, each in a child process, until none waits, a pause or a quit."""
        done = False

        def claim():
            nonlocal done
            while True:
                with self._worker_lock:  # claim, or say "no worker" atomically: an item added now is never stranded
                    problem = self.knob_problem
                    item = None
                    if not self._stopping and self.mode == "running" and problem is None:
                        item = self.queue.claim_next()
                    if item is None:
                        if self.mode == "running":  # ran dry (or a knob is wrong): what is added next waits for r
                            self.mode = "idle"
                            if problem is not None and self.queue.pending():
                                self.feed(("knob_problem", 0, problem))
                        self._worker_active, done = False, True
                        return
                yield item.id, self._spec_for(item.profile)

        try:
            self._runner.run(claim())
        finally:
            if not done:  # an unexpected error: let a later `r` start a fresh loop
                with self._worker_lock:
                    self._worker_active = False
            self.feed(("queue_idle", 0, None))

    def _ensure_worker(self) -> None:
        if self._stopping or self.mode != "running" or self.knob_problem is not None:
            return
        with self._worker_lock:
            if self._worker_active or not self.queue.pending():
                return
            self._worker_active = True
        self._queue_worker = self._run_queue()

    @property
    def busy(self) -> bool:
        """A child is running, or the worker is about to start one."""
        return self._worker_active

    # ------------------------------------------------------------------------------------------ draining events

    def _drain(self) -> None:
        """Apply everything the worker queued since the last tick, then redraw each touched widget once."""
        if not self._inbox or self.main is None:
            return
        live_dirty = queue_dirty = results_dirty = False
        while self._inbox:
            kind, item_id, payload = self._inbox.popleft()
            if kind == "event":
                live_dirty = True
                try:
                    self._on_child_event(payload)
                except (TypeError, ValueError, KeyError, AttributeError):
                    pass  # a child's malformed event (a field of the wrong type): skipped, never the app's end
            elif kind == "run_started":
                self.live_state = LiveState(profile=display_name(payload), expected_device=self._expected_device() or "")
                self.view_state = None
                self.live.say(None)
                self.log_line(f"▶ {display_name(payload)}: starting a child process", "start")
                live_dirty = queue_dirty = True
            elif kind == "run_ended":
                self._on_run_ended(item_id, payload)
                live_dirty = queue_dirty = results_dirty = True
            elif kind == "queue_idle":
                queue_dirty = True
            elif kind == "knob_problem":
                self._refuse_run(payload)
        try:
            if live_dirty and self.view_state is None:
                self.live.show(self.live_state)
            if queue_dirty:
                self._refresh_queue()
                self._update_subtitle()
            if results_dirty:
                self.load_results()
        except NoMatches:
            pass  # the app is closing (a timer tick while its widgets go): the run folders hold everything

    def _on_child_event(self, ev: dict[str, Any]) -> None:
        self.live_state.apply(ev)
        kind = ev.get("event")
        s = self.live_state
        if kind == "started":
            self.view_state = None
            params = ev.get("params")
            detail = [s.experiment, s.device]
            if params:
                detail.append(f"{params / 1e6:.2f}M params")
            detail.append(f"{s.total_steps} steps")
            self.log_line(f"{s.profile}: started · {' · '.join(str(d) for d in detail)} · {s.run_dir}", "info", ev.get("t"))
            self._update_subtitle()
        elif kind == "eval":
            val_loss, ppl = ev.get("val_loss"), ev.get("val_ppl")
            if val_loss is not None and ppl is not None:
                self.log_line(f"{s.profile}: eval @ step {ev.get('step')}: val loss {val_loss:.4f} · ppl {ppl:,.2f}", "info", ev.get("t"))
        elif kind == "failed" and ev.get("reason") == "oom":
            self.log_line(f"✗ {s.profile}: OOM at step {ev.get('step')}: {(ev.get('message') or '').splitlines()[0][:200] if ev.get('message') else 'out of memory'}", "oom", ev.get("t"))

    def _on_run_ended(self, item_id: int, result) -> None:
        s = self.live_state
        s.ended(result.status, result.message)
        name = s.profile
        if result.status == "finished":
            summary = result.summary or {}
            detail = [f"{summary.get('steps', s.step)} steps"]
            if summary.get("tokens_per_s"):
                detail.append(f"{summary['tokens_per_s']:,.0f} tok/s")
            if summary.get("val_ppl") is not None:
                detail.append(f"val ppl {summary['val_ppl']:,.2f}")
            self.log_line(f"✓ {name}: finished · {' · '.join(detail)}", "finished")
        elif result.status == "oom":
            pass  # logged from the failed event, with its step
        else:
            icon = "■" if result.status == "interrupted" else "✗"
            reason = (result.message or "").strip().splitlines()
            self.log_line(f"{icon} {name}: {result.status}" + (f": {reason[0][:200]}" if reason else ""), result.status)

    def _refresh_queue(self) -> None:
        if self.main is None:
            return
        view = self.main.query_one(QueueView)
        view.show(self.queue.items())
        running = self._child is not None
        label = {"idle": "r runs it", "paused": "paused"}.get(self.mode, "running" if running or self.busy else "idle")
        view.border_title = f"Queue · {label}"

    # ------------------------------------------------------------------------------------------ results

    @work(thread=True, exclusive=True, exit_on_error=False, group="results", name="results")
    def load_results(self) -> None:
        from memlab.core import compare
        from memlab.core.errors import MemlabError

        if not Path(self.runs_dir).is_dir():
            frame = None
        else:
            try:
                frame, _ = compare.read_runs([self.runs_dir])
            except MemlabError:
                frame = None
        try:
            self.call_from_thread(self._show_results, frame)
        except RuntimeError:
            pass  # the app closed meanwhile

    def _show_results(self, frame) -> None:
        try:
            table = self.results
        except NoMatches:
            return  # the app is closing: its widgets are already gone
        table.load(frame)
        self._show_notes(table.notes, table.columns_hint if table.table is not None else "")

    # ------------------------------------------------------------------------------------------ widget messages

    def on_profile_list_refused(self, message: ProfileList.Refused) -> None:
        """A profile that cannot run here is not queued: why, in the Live panel (where the user looks) and the Log."""
        line = f"✗ {message.info.label} not queued: {message.reason}"
        self.live.say(line)
        self.log_line(line, "error")

    def on_profile_list_picked(self, message: ProfileList.Picked) -> None:
        self.live.say(None)
        item = self.queue.add(message.profile)
        self._refresh_queue()
        self.main.query_one(QueueView).show(self.queue.items(), keep=item.id)
        if self.mode == "running":
            self._ensure_worker()
        elif self.mode == "idle" and len(self.queue.items()) == 1:
            self.notify("press r to run the queue", timeout=3)

    def on_queue_view_move(self, message: QueueView.Move) -> None:
        if self.queue.move(message.item_id, message.delta):
            self.main.query_one(QueueView).show(self.queue.items(), keep=message.item_id)

    def on_queue_view_remove(self, message: QueueView.Remove) -> None:
        if self.queue.remove(message.item_id):
            self._refresh_queue()
        else:
            self.notify("that run is in progress: c cancels it", severity="warning", timeout=3)

    def on_settings_panel_changed(self, message: SettingsPanel.Changed) -> None:
        from memlab.core.config import load_experiment
        from memlab.core.errors import MemlabError

        self.knob_problem = message.problem
        s = message.settings
        if s.experiment != self.settings.experiment and s.experiment != "auto":
            try:
                experiment = load_experiment(s.experiment)
            except MemlabError as e:
                self.notify(str(e), severity="error")
                return
            self._warn_if_slow_on_cpu(s.experiment, experiment)
        self.settings = s
        self._update_subtitle()

    def _expected_device(self) -> str | None:
        """cpu or cuda as far as the app knows before a run says: --device, else the NVML guess; None unknown."""
        if self.device != "auto":
            return "cpu" if self.device == "cpu" else "cuda"
        return self._device_guess

    def _warn_if_slow_on_cpu(self, name: str, experiment) -> None:
        """An experiment sized for a GPU, picked where runs go to the CPU: say so before an hours-long run."""
        m = experiment.model
        params = 12 * m.n_layer * m.d_model**2
        if self._expected_device() == "cpu" and params > CPU_PARAMS_WARN:
            message = (f"experiment {name} is sized for a GPU (~{params / 1e6:.0f}M params, seq {m.seq_len}): "
                       "on the CPU each run takes hours; tiny is the CPU one")
            self.notify(message, severity="warning", timeout=8)
            self.log_line(f"⚠ {message}", "warning")

    def on_results_table_rendered(self, message: ResultsTable.Rendered) -> None:
        self._show_notes(message.notes, message.columns)

    def _show_notes(self, notes: list[str], columns: str) -> None:
        """The results' notes under the table; which columns are shown on the panel's border."""
        from textual.widgets import Static, TabbedContent

        try:
            self.main.query_one("#results-notes", Static).update(" · ".join(notes))
            self.main.query_one(TabbedContent).border_subtitle = f"columns: {columns}" if columns else ""
        except NoMatches:
            pass  # the app is closing

    def on_results_table_open_run(self, message: ResultsTable.OpenRun) -> None:
        self.open_run(message.path)

    @on(Worker.StateChanged)
    def _worker_failed(self, event: Worker.StateChanged) -> None:
        """The one place background failures surface: logged and shown, never a crash of the app."""
        if event.state != WorkerState.ERROR:
            return
        error = event.worker.error
        self.log_line(f"✗ background {event.worker.name} failed: {error.__class__.__name__}: {error}", "error")
        self.notify(f"{event.worker.name} failed: {error}", severity="error")
        if event.worker.group == "queue":
            self._refresh_queue()

    # ------------------------------------------------------------------------------------------ actions

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen())

    def _refuse_run(self, problem: str) -> None:
        self.log_line(f"✗ no run started: {problem}; fix the knob or clear it (empty: the experiment's own)", "error")
        self.notify(f"{problem}: no run started", severity="error", timeout=5)
        self._refresh_queue()

    def action_run(self) -> None:
        if self.knob_problem is not None:
            self._refuse_run(self.knob_problem)
            return
        self.mode = "running"
        if not self.queue.pending() and not self.busy:
            self.notify("the queue has nothing waiting: pick profiles (enter) first", timeout=3)
        self._ensure_worker()
        self._refresh_queue()

    def action_pause(self) -> None:
        if self.mode == "paused":
            self.mode = "running"
            self.log_line("queue resumed")
            self._ensure_worker()
        elif self.mode == "running":
            self.mode = "paused"
            self.log_line("queue paused: the current run goes on, the next one waits (p resumes)")
        else:
            self.notify("the queue is not running: r runs it", timeout=3)
        self._refresh_queue()

    def action_cancel_run(self) -> None:
        child = self._child
        if child is not None and child.cancelled:
            self.notify("already stopping: it is saving what it has", timeout=2)
            return
        if not self._runner.cancel_current():  # a run still starting is cancelled as soon as its child exists
            self.notify("no run in progress", timeout=2)
            return
        name = self.live_state.profile or "the current run"
        self.log_line(f"cancelling {name}: stopping after the current step… (SIGINT: it keeps what it has)")
        self.notify(f"{name}: stopping after the current step…", timeout=5)

    def action_open_run(self) -> None:
        def opened(path: str | None) -> None:
            if path:
                self.open_run(path)

        self.push_screen(OpenRunScreen(self.runs_dir), opened)

    def open_run(self, path: str) -> None:
        try:
            state = load_run(path)
        except ValueError as e:
            self.notify(str(e), severity="error")
            return
        self.view_state = state
        self.live.show(state)
        self.log_line(f"opened {path}: {state.profile} · {state.status}")

    def action_live_view(self) -> None:
        self.view_state = None
        self.live.show(self.live_state)

    def action_toggle_theme(self) -> None:
        self.theme = THEMES[1] if self.theme == THEMES[0] else THEMES[0]

    # ------------------------------------------------------------------------------------------ quitting

    async def action_quit(self) -> None:
        """q: with a run in progress, ask first (quitting stops it); else quit at once."""
        if self._stopping or isinstance(self.screen, ConfirmScreen):
            return
        if not self.busy:
            await self.quit_now()
            return
        async def answered(yes: bool | None) -> None:
            if yes:
                await self.quit_now()

        self.push_screen(ConfirmScreen("A run is in progress. Quit?", self._quit_detail), answered)

    def _quit_detail(self) -> str:
        """What quitting now stops, read again while the question is open: the step goes on with the run."""
        s = self.live_state
        if not self.busy:
            return "the run has ended meanwhile: quitting stops nothing"
        progress = f", now at step {s.step}/{s.total_steps}" if s.total_steps and s.status == "running" else ""
        waiting = self.queue.pending()
        detail = f"Quitting stops {s.profile or 'the current run'}{progress} (its folder is kept, marked interrupted)"
        if waiting:
            detail += f"; {waiting} waiting run{'s' if waiting != 1 else ''} will not start"
        return detail

    async def quit_now(self) -> None:
        """Stop cleanly: no new run starts; the running child gets SIGINT and writes `interrupted`; wait for it
        (and for a child the worker was just starting), at most QUIT_WAIT_S, then kill what is left."""
        if self._stopping:
            return
        self._stopping = True
        self._runner.stop(self.QUIT_GRACE_S)
        deadline = time.monotonic() + self.QUIT_WAIT_S
        told = False
        while True:
            child = self._child
            alive = child is not None and child.alive
            if alive and not child.cancelled:
                child.cancel(self.QUIT_GRACE_S)
            if alive and not told:
                told = True
                self.notify(f"stopping {self.live_state.profile or 'the run'}: waiting for it to save (≤ {self.QUIT_WAIT_S:.0f} s)", timeout=self.QUIT_WAIT_S)
                self.log_line("quitting: the running child is asked to stop")
            if not alive and not self.busy:
                break
            if time.monotonic() > deadline:
                if alive:
                    self._kill(child)
                break
            await asyncio.sleep(0.05)
        w = self._queue_worker
        if w is not None and w.state in (WorkerState.PENDING, WorkerState.RUNNING):
            try:
                await asyncio.wait_for(w.wait(), timeout=5.0)
            except Exception:  # noqa: BLE001 (a failed or slow worker must not keep the app from exiting)
                pass
        self._drain()
        self.exit()

    def _install_signal_handlers(self) -> None:
        """SIGTERM, or SIGHUP when the SSH session drops: quit as `q` does, so the child is not left training."""
        if self.is_headless:
            return
        try:
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGHUP):
                loop.add_signal_handler(sig, lambda: asyncio.ensure_future(self.quit_now()))
        except (NotImplementedError, RuntimeError, AttributeError, ValueError):
            pass  # not on this platform, or not the main thread: on_unmount still stops the child

    def _kill(self, child) -> None:
        """The child did not stop in time: kill it, and mark its folder as the user asked (interrupted)."""
        child.kill("interrupted", "killed when memlab tui quit (it did not stop within the grace period)")

    def on_unmount(self) -> None:
        """A last guard (an exception, a closed terminal): never leave a child training behind."""
        self._stopping = True
        self._runner.stop(self.QUIT_GRACE_S)
        child = self._child
        if child is not None and child.alive:
            try:
                child.proc.wait(timeout=self.QUIT_WAIT_S)
            except Exception:  # noqa: BLE001
                self._kill(child)
