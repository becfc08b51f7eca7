"""One run = one child process. The supervisor starts `memlab run ... --events -`, reads its JSON-lines events,
and knows how it ended even when the child could not say (SIGKILL, segfault): then it marks the run `crashed`.

Each run gets a fresh process, so a fresh CUDA context and allocator: its memory figures are its own, and an OOM
or a crash ends only that run. `memlab sweep`, `memlab find-batch` and the TUI all go through `run_child`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from memlab.core.runstore import mark_status


@dataclass
class ChildSpec:
    profile: str
    experiment: str = "auto"
    device: str = "auto"
    runs_dir: str = "runs"
    overrides: list[str] = field(default_factory=list)
    extra_args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)

    def argv(self) -> list[str]:
        cmd = [sys.executable, "-m", "memlab", "run", "--profile", self.profile, "--experiment", self.experiment,
               "--device", self.device, "--runs-dir", str(self.runs_dir), "--events", "-"]
        for item in self.overrides:
            cmd += ["--set", item]
        return cmd + list(self.extra_args)


@dataclass
class ChildResult:
    status: str  # finished | oom | nan | interrupted | error | crashed | rejected (bad input: exit 2, no run)
    message: str = ""
    summary: dict[str, Any] | None = None
    run_dir: str | None = None
    returncode: int | None = None
    stderr_tail: str = ""


class ChildRun:
    """A running child. `cancel()` asks it to stop (SIGINT: it keeps what it had), then insists."""

    def __init__(self, spec: ChildSpec, on_event: Callable[[dict], None] | None = None):
        self.spec = spec
        self.on_event = on_event
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **spec.env}
        # A session of its own: a Ctrl-C in the terminal reaches the supervisor, which forwards it deliberately.
        self.proc = subprocess.Popen(
            spec.argv(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
            text=True, bufsize=1, env=env, start_new_session=True,
        )
        self._stderr: deque[str] = deque(maxlen=40)
        self._err_thread = threading.Thread(target=self._drain_stderr, daemon=True)
        self._err_thread.start()
        self.started: dict | None = None
        self.last: dict | None = None
        self.cancelled = False

    def _drain_stderr(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self._stderr.append(line.rstrip("\n"))

    def cancel(self, grace_s: float = 20.0) -> None:
        """SIGINT (the run ends as `interrupted`, its folder kept); SIGTERM after grace_s; SIGKILL after 2x."""
        self.cancelled = True
        if self.proc.poll() is not None:
            return

        def escalate() -> None:
            for sig, wait in ((signal.SIGINT, grace_s), (signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
                if self.proc.poll() is not None:
                    return
                try:
                    self.proc.send_signal(sig)
                except ProcessLookupError:
                    return
                try:
                    self.proc.wait(timeout=wait)
                    return
                except subprocess.TimeoutExpired:
                    continue

        threading.Thread(target=escalate, daemon=True).start()

    def wait(self) -> ChildResult:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            line = line.strip()
            if not line.startswith("{"):
                continue
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                continue
            if event.get("event") == "started":
                self.started = event
            if event.get("event") in ("finished", "failed"):
                self.last = event
            if self.on_event:
                self.on_event(event)
        code = self.proc.wait()
        self._err_thread.join(timeout=2)
        return self._result(code)

    def _result(self, code: int) -> ChildResult:
        tail = "\n".join(self._stderr)
        run_dir = self.started.get("run_dir") if self.started else None
        if self.last is not None:
            ev = self.last
            status = "finished" if ev["event"] == "finished" else ev.get("reason", "error")
            return ChildResult(status, ev.get("message", ""), ev.get("summary"), run_dir, code, tail)
        lines = [ln for ln in self._stderr if ln.strip()]
        if code == 2 and run_dir is None:
            message = lines[-1].removeprefix("memlab: error: ") if lines else "rejected"
            return ChildResult("rejected", message, None, None, code, tail)
        how = f"killed by signal {-code}" if code < 0 else f"exited with status {code}"
        message = f"child {how} without reporting an outcome" + (f": {lines[-1]}" if lines else "")
        if run_dir:
            mark_status(Path(run_dir), "crashed", message)
        return ChildResult("crashed", message, None, run_dir, code, tail)


def run_child(spec: ChildSpec, on_event: Callable[[dict], None] | None = None) -> ChildResult:
    return ChildRun(spec, on_event).wait()

