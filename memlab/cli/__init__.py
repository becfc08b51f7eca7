"""The `memlab` command: one Typer app; each command group lives in its own module here.

Errors: a MemlabError (or a bad command line) is printed as one line and exits 2; `--debug` (anywhere on the
command line, or MEMLAB_DEBUG=1) shows the traceback instead.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Annotated

STARTED_AT = time.time()  # memlab's own clock at start-up: time to first step counts from it (memlab.cli.run)

import typer  # noqa: E402

try:  # typer >= 0.20 vendors click as typer._click; older typer (e.g. on GPU images) uses click itself
    from typer._click import exceptions as _click_exc
except ImportError:  # pragma: no cover
    from click import exceptions as _click_exc

app = typer.Typer(
    name="memlab",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
    help="A bench for memory-efficient transformer training: same model, same data, technique profiles side by side.",
)


def _print_version(value: bool) -> None:
    if value:
        from memlab import __version__

        typer.echo(f"memlab {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[bool, typer.Option("--version", help="Print memlab's version and exit.", is_eager=True, callback=_print_version)] = False,
) -> None:
    pass


def _flags_show_no_type() -> None:
    """Typer >= 0.2x prints `<bool>` beside every flag (`--no-meters <bool>`, even `--help <bool>`), as if it took a
    value; a flag takes none, so its type column stays empty. Older typer has no such column: nothing to do."""
    from typer import core

    option = getattr(core, "TyperOption", None)
    original = getattr(option, "display_type_rich", None)
    if original is None or getattr(original, "_memlab", False):
        return

    def display_type_rich(self, ctx):
        return None if getattr(self, "is_flag", False) else original(self, ctx)

    display_type_rich._memlab = True
    option.display_type_rich = display_type_rich


def _help_folds_long_words() -> None:
    """Typer's help column cuts a word longer than the column with "…" (a path, a URL, `section.key=value`), which
    loses what the help says at 80 columns: fold such a word onto the next line instead. Older typer: nothing to do."""
    from typer import rich_utils

    original = getattr(rich_utils, "_get_parameter_help", None)
    if original is None or getattr(original, "_memlab", False):
        return

    def get_parameter_help(*args, **kwargs):
        columns = original(*args, **kwargs)
        for part in getattr(columns, "renderables", []):
            if hasattr(part, "overflow"):
                part.overflow = "fold"
        return columns

    get_parameter_help._memlab = True
    rich_utils._get_parameter_help = get_parameter_help


def _register_commands() -> None:
    # Once per process: each call appends every command to the app again, and Typer rebuilds all the copies on every
    # main(), so in-process callers (the tests) paid more on each call.
    if app.registered_commands:
        return
    # Imported here so that `memlab --help` stays fast and each module owns its commands.
    from memlab.cli import batch, data, fit, info, run, study, sweep, table, tui_cmd

    for module in (run, sweep, study, table, batch, fit, data, info, tui_cmd):
        module.register(app)


def fail(message: str) -> None:
    """Print a one-line error and exit with status 2."""
    typer.echo(f"memlab: error: {message}", err=True)
    raise SystemExit(2)


def main(argv: list[str] | None = None) -> None:
    from memlab.core.errors import MemlabError
    from memlab.core.library_logs import drop_known_notices

    drop_known_notices()  # a library's import notices would make a one-line error three

    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv or os.environ.get("MEMLAB_DEBUG") == "1"
    argv = [a for a in argv if a != "--debug"]
    _register_commands()
    _flags_show_no_type()
    _help_folds_long_words()
    try:
        code = app(args=argv, prog_name="memlab", standalone_mode=False)
        if isinstance(code, int) and code:  # without standalone mode, click returns typer.Exit's code
            raise SystemExit(code)
    except MemlabError as e:
        if debug:
            raise
        fail(str(e))
    except _click_exc.NoArgsIsHelpError:
        raise SystemExit(0) from None  # the help text is already printed
    except _click_exc.UsageError as e:
        if debug:
            raise
        path = e.ctx.command_path if e.ctx and e.ctx.command else "memlab"  # `memlab data prepare`, not `memlab prepare`
        hint = f" (see: {path} --help)" if path.startswith("memlab ") else " (see: memlab --help)"
        fail(e.format_message().replace("\n", " ") + hint)
    except typer.Abort:
        typer.echo("memlab: aborted", err=True)
        raise SystemExit(130) from None
    except typer.Exit as e:
        raise SystemExit(e.exit_code) from None
    except KeyboardInterrupt:
        raise SystemExit(130) from None
