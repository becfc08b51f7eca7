"""One run = one child process. The supervisor starts `memlab run ... --events -`, reads its JSON-lines events,
and knows how it ended even when the child could not say (SIGKILL, segfault): then it marks the run `crashed`.

Each run gets a fresh process, so a fresh CUDA context and allocator: its memory figures are its own, and an OOM
or a crash ends only that run. `memlab sweep`, `memlab find-batch` and the TUI all go through `ChildRun` (the
queue ones through `memlab.core.queue`).

Whatever the child does, `ChildRun.wait` returns a ChildResult and never raises: a child that cannot start,
prints garbage, refuses its input (exit 2) after `started`, deletes its own folder, or is killed by a signal.

Outcomes (ChildResult.status):
  finished     the run completed
  oom          out of memory (the child said so)
  nan          the loss diverged (the child said so)
  interrupted  stopped by Ctrl-C / SIGINT / SIGTERM, or cancelled by the supervisor; the folder is kept
  rejected     bad input: the child exited with status 2 before any outcome (its folder, if any, is gone)
  crashed      the child ended without reporting an outcome (a signal, e.g. SIGKILL from the OOM killer; a
               segfault; an exit status; or it could not even start)
  error        the child reported another failure
`message` holds the child's last error line (or the signal / exit status when it had none).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from memlab.core.events import EVENT_KINDS, FAIL_REASONS
from memlab.core.runstore import mark_status

STATUSES = ("finished", "oom", "nan", "interrupted", "rejected", "crashed", "error")
BAD_INPUT_EXIT = 2  # memlab's exit status for a refusal (a MemlabError: a one-line reason on stderr)
# Set in a supervisor's children: such a child stops itself when its supervisor dies (stop_when_orphaned). A run
# the user started with --events - under nohup is left alone when its shell goes.
SUPERVISED_ENV = "MEMLAB_SUPERVISED"


@dataclass
class ChildSpec:
    profile: str
    experiment: str = "auto"
    device: str = "auto"
    runs_dir: str = "runs"
    overrides: list[str] = field(default_factory=list)
    extra_args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    command: list[str] | None = None  # replaces the whole argv (tests run small fake children through it)
    label: str = ""  # the run's name in results (memlab run --label); "" = the profile's own

    @property
    def name(self) -> str:
        return self.label or self.profile

    def argv(self) -> list[str]:
        if self.command is not None:
            return list(self.command)
        cmd = [sys.executable, "-m", "memlab", "run", "--profile", self.profile, "--experiment", self.experiment,
               "--device", self.device, "--runs-dir", str(self.runs_dir), "--events", "-"]
        for item in self.overrides:
            cmd += ["--set", item]
        cmd += ["--label", self.label] if self.label else []
        return cmd + list(self.extra_args)


@dataclass
class ChildResult:
    status: str  # one of STATUSES
    message: str = ""
    summary: dict[str, Any] | None = None
    run_dir: str | None = None
    returncode: int | None = None
    stderr_tail: str = ""
    callback_error: str = ""  # an on_event callback raised: it was not called again for this child

    @property
    def killed_by_sigkill(self) -> bool:
        """Ended by SIGKILL without an outcome: most often the kernel's OOM killer (host memory)."""
        return self.status == "crashed" and self.returncode == -signal.SIGKILL


def parse_event(line: str) -> dict | None:
    """One stdout line as an event, or None when it is not a sound one (see `sound`). A child's garbage is
    skipped, never raised; a finished / failed event is always kept, its fields made sound (see `outcome_event`)."""
    line = line.strip()
    if not line.startswith("{"):
        return None
    try:
        event = json.loads(line)
    except (ValueError, RecursionError):
        return None
    if not isinstance(event, dict) or event.get("event") not in EVENT_KINDS:
        return None
    if event["event"] in ("finished", "failed"):
        return outcome_event(event)
    return event if sound(event) else None


def _number(value: Any) -> bool:
    return value is None or (isinstance(value, (int, float)) and not isinstance(value, bool))


def sound(event: dict) -> bool:
    """The fields every reader relies on have their types: a started event names its run folder, a step or eval
    its step; step, eval and gpu_sample carry only numbers (and the `measured` flag); started's counts are numbers."""
    kind = event["event"]
    if kind == "started":
        return isinstance(event.get("run_dir"), str) and all(_number(event.get(k)) for k in ("total_steps", "params", "t"))
    if kind in ("step", "eval") and (not isinstance(event.get("step"), int) or isinstance(event.get("step"), bool)):
        return False
    return all(_number(v) or k in ("event", "measured") for k, v in event.items())


def outcome_event(event: dict) -> dict:
    """A finished / failed event as readers may trust it: reason one of FAIL_REASONS (else `error`), message a
    string, summary a dict (else absent)."""
    event = dict(event)
    if not isinstance(event.get("summary"), dict):
        event.pop("summary", None)
    if event["event"] == "failed":
        event["reason"] = event.get("reason") if event.get("reason") in FAIL_REASONS else "error"
        event["message"] = _text(event.get("message"))
    return event


def signal_text(code: int, oom_hint: bool = True) -> str:
    """'killed by signal 9 (SIGKILL, e.g. the OOM killer)' for a negative return code, else 'exited with status N'.
    No OOM hint where the supervisor itself escalated to SIGKILL."""
    if code >= 0:
        return f"exited with status {code}"
    try:
        name = signal.Signals(-code).name
    except ValueError:
        return f"killed by signal {-code}"
    hint = ", e.g. the OOM killer" if -code == signal.SIGKILL and oom_hint else ""
    return f"killed by signal {-code} ({name}{hint})"


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ("" if value is None else str(value))


class ChildRun:
    """A running child. `cancel()` asks it to stop (SIGINT: it keeps what it had), then insists.
    `proc` is None when the child could not be started (`start_error` says why)."""

    def __init__(self, spec: ChildSpec, on_event: Callable[[dict], None] | None = None):
        self.spec = spec
        self.on_event = on_event
        self.started: dict | None = None
        self.last: dict | None = None
        self.cancelled = False
        self.callback_error = ""
        self.start_error = ""
        self._stderr: deque[str] = deque(maxlen=40)
        self.proc: subprocess.Popen | None = None
        try:
            self.proc = self._spawn()
        except Exception as e:  # noqa: BLE001 (a bad executable, a bad env: this child crashed, the caller goes on)
            self.start_error = f"{e.__class__.__name__}: {e}"
            return
        self._err_thread = threading.Thread(target=self._drain_stderr, daemon=True)
        self._err_thread.start()

    def _spawn(self) -> subprocess.Popen:
        env = {**os.environ, "PYTHONUNBUFFERED": "1", SUPERVISED_ENV: "1", **self.spec.env}
        # A session of its own: a Ctrl-C in the terminal reaches the supervisor, which forwards it deliberately.
        # errors="replace": bytes that are not UTF-8 become U+FFFD instead of an exception in the reader.
        return subprocess.Popen(
            self.spec.argv(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
            text=True, errors="replace", bufsize=1, env=env, start_new_session=True,
        )

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def run_dir(self) -> str | None:
        """The folder the child announced in `started`, if it lies in the runs folder it was given (a confused
        child cannot make the supervisor write anywhere else)."""
        run_dir = self.started.get("run_dir") if self.started else None
        if not isinstance(run_dir, str) or not run_dir:
            return None
        try:
            inside = Path(run_dir).resolve().parent == Path(self.spec.runs_dir).resolve()
        except (OSError, ValueError, RuntimeError):
            inside = False
        return run_dir if inside else None

    def _drain_stderr(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        try:
            for line in self.proc.stderr:
                self._stderr.append(line.rstrip("\n"))
        except (OSError, ValueError):
            pass  # the pipe went away: the lines so far are what there is

    def cancel(self, grace_s: float = 20.0) -> None:
        """SIGINT (the run ends as `interrupted`, its folder kept); SIGTERM after grace_s; SIGKILL after 2x."""
        self.cancelled = True
        if not self.alive:
            return
        threading.Thread(target=self._escalate, args=(grace_s,), daemon=True).start()

    def _escalate(self, grace_s: float) -> None:
        for sig, wait in ((signal.SIGINT, grace_s), (signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
            if not self.alive:
                return
            try:
                self.proc.send_signal(sig)
                self.proc.wait(timeout=wait)
                return
            except ProcessLookupError:
                return
            except subprocess.TimeoutExpired:
                continue

    def kill(self, status: str, message: str) -> None:
        """SIGKILL now (it did not stop in time) and mark its folder with `status`, as the user asked."""
        self.cancelled = True
        if self.proc is not None:
            try:
                self.proc.kill()
                self.proc.wait(timeout=5)
            except Exception:  # noqa: BLE001 (already gone, or unkillable: nothing more to do)
                pass
        if self.run_dir:
            mark_status(Path(self.run_dir), status, message)

    def wait(self) -> ChildResult:
        """Read events until the child closes stdout, then say how it ended. Never raises."""
        if self.proc is None:
            return ChildResult("crashed", f"could not start the child process: {self.start_error}")
        try:
            for line in self.proc.stdout:
                self._take(line)
        except (OSError, ValueError):
            pass  # stdout closed under us: the exit status still says how it ended
        code = self.proc.wait()
        self._err_thread.join(timeout=2)
        return self._result(code)

    def _take(self, line: str) -> None:
        event = parse_event(line)
        if event is None:
            return
        kind = event["event"]
        if kind == "started":
            self.started = event
        elif kind in ("finished", "failed"):
            self.last = event
        if self.on_event is not None and not self.callback_error:
            try:
                self.on_event(event)
            except Exception as e:  # noqa: BLE001 (the observer's bug must not stop reading the child)
                self.callback_error = f"on_event raised {e.__class__.__name__}: {e}"

    def _error_lines(self) -> list[str]:
        return [ln for ln in self._stderr if ln.strip()]

    def _last_error(self) -> str:
        lines = self._error_lines()
        return lines[-1].removeprefix("memlab: error: ") if lines else ""

    def _result(self, code: int) -> ChildResult:
        if self.last is not None:
            status, message, summary = self._reported()
        elif code == BAD_INPUT_EXIT:
            status, message, summary = "rejected", self._last_error() or "rejected (exit status 2) without a reason", None
        else:
            status, message, summary = ("interrupted" if self.cancelled else "crashed"), self._silent_message(code), None
        run_dir = self.run_dir
        if run_dir and not Path(run_dir).is_dir():
            run_dir = None  # it vanished: a child that refused deletes its own folder
        if run_dir and status != "finished":
            mark_status(Path(run_dir), status, message)  # only a folder still "running" changes; never raises
        return ChildResult(status, message, summary, run_dir, code, "\n".join(self._stderr), self.callback_error)

    def _reported(self) -> tuple[str, str, dict | None]:
        """The child's own word (its finished / failed event), its fields checked."""
        ev = self.last  # made sound by outcome_event
        if ev["event"] == "finished":
            return "finished", "", ev.get("summary")
        return ev["reason"], ev["message"] or self._last_error(), ev.get("summary")

    def _silent_message(self, code: int) -> str:
        asked = " after it was asked to stop" if self.cancelled else ""
        last = self._last_error()
        return f"child {signal_text(code, oom_hint=not self.cancelled)}{asked} without reporting an outcome" + (f": {last}" if last else "")


def run_child(spec: ChildSpec, on_event: Callable[[dict], None] | None = None) -> ChildResult:
    return ChildRun(spec, on_event).wait()


def interrupt_self() -> None:
    """As a Ctrl-C: the run ends as `interrupted` with its folder kept (a supervised child whose supervisor is gone)."""
    os.kill(os.getpid(), signal.SIGINT)


def honour_sigint() -> None:
    """In a supervised child (`memlab run --events -`): SIGINT raises KeyboardInterrupt, as cancel() and
    interrupt_self expect, even where the child inherited SIGINT ignored (a supervisor started as a shell's `cmd &`
    without job control, some CI runners): Python keeps an inherited SIG_IGN, and the cancelled run then waited out
    its 20 s grace for SIGTERM (tests/test_supervisor.py failed so once in CI). Main thread only, as signal.signal."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.default_int_handler)


def stop_when_orphaned(poll_s: float = 1.0, getppid: Callable[[], int] = os.getppid,
                       interrupt: Callable[[], None] | None = None) -> threading.Thread:
    """In a supervised child (`memlab run --events -`): when its supervisor dies (SIGKILL, a timeout that killed
    it), the child is re-parented and no one reads its events or can stop it; children run in a session of their
    own, so the terminal's signals miss them too. It then interrupts itself (SIGINT: it ends as `interrupted`, its
    folder kept) rather than holding the GPU until it finishes."""
    parent = getppid()
    stop = interrupt or interrupt_self

    def watch() -> None:
        while getppid() == parent:
            time.sleep(poll_s)
        stop()

    thread = threading.Thread(target=watch, daemon=True, name="orphan-watch")
    thread.start()
    return thread

