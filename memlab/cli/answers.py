"""A planning command's kept answer (memlab.core.answers): printed again as it was, before torch is imported, or
computed, printed as it goes and kept."""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import sys
from pathlib import Path
from typing import Any, Callable

from memlab.core import answers

# The engine's source and the commands' (the tables and lines they print)
SOURCES = (answers.ENGINE, Path(__file__).resolve().parent)


def answered(command: str, inputs: dict[str, Any], compute: Callable[[], None]) -> None:
    """Print the kept answer to `inputs`, or run `compute` (which prints it) and keep what it printed.

    Only without a GPU (there the card is the same assumed one every time), and not under MEMLAB_ANSWERS=off.
    `compute` makes every check, so an answer is kept only for inputs that passed them, under the same source."""
    if not answers.kept_here():
        compute()
        return
    name = answers.key(command, inputs | {"shown": _shown()}, SOURCES)
    kept = answers.read(name)
    if kept is not None:
        sys.stdout.write(kept["stdout"])
        sys.stdout.flush()
        return
    copy = _Tee(sys.stdout)
    with contextlib.redirect_stdout(copy):
        compute()
    import torch  # compute imported it

    if not torch.cuda.is_available():
        answers.write(name, copy.text())


def _shown() -> dict[str, Any]:
    """How the output is shown: a terminal's width and colours, or a pipe (memlab.cli.console.make_console)."""
    tty = sys.stdout.isatty()
    return {"tty": tty, "columns": shutil.get_terminal_size().columns if tty else None,
            "env": {k: os.environ.get(k) for k in ("COLUMNS", "NO_COLOR", "FORCE_COLOR", "TERM")}}


class _Tee(io.TextIOBase):
    """Writes through to `stream` and keeps a copy; asks `stream` whether it is a terminal, as rich and click do."""

    def __init__(self, stream: Any):
        self.stream, self.parts = stream, []

    def write(self, text: str | bytes) -> int:
        if isinstance(text, bytes):  # click echoes bytes where it finds no binary buffer beneath a text stream
            text = text.decode(self.encoding, "replace")
        self.parts.append(text)
        return self.stream.write(text)

    def flush(self) -> None:
        self.stream.flush()

    def isatty(self) -> bool:
        return self.stream.isatty()

    def fileno(self) -> int:
        return self.stream.fileno()

    @property
    def encoding(self) -> str:
        return getattr(self.stream, "encoding", "utf-8")

    def text(self) -> str:
        return "".join(self.parts)
