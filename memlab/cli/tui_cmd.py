"""`memlab tui`: the interactive app (queue of profiles, live view, results). Textual is imported only here."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Annotated, Optional

import typer

from memlab.cli.options import DeviceOpt, ExperimentOpt, RunsDirOpt, SetOpt


def tui(
    runs_dir: RunsDirOpt = "runs",
    experiment: ExperimentOpt = "auto",
    device: DeviceOpt = "auto",
    set_: SetOpt = None,
    profiles_dir: Annotated[Optional[Path], typer.Option("--profiles-dir", help="Also list the profile TOML files in this folder (default: the current folder).")] = None,
    light: Annotated[bool, typer.Option("--light", help="Start with the light theme (t toggles).")] = False,
) -> None:
    """Open the terminal UI: queue profiles, watch each run live (one child process each), compare the results."""
    from memlab.core.config import apply_overrides, load_experiment, load_profile
    from memlab.core.environment import check_device_name, resolve_device
    from memlab.core.errors import MemlabError

    check_device_name(device)
    if device.startswith("cuda"):
        resolve_device(device)  # no CUDA here: one line now, not a rejection for every run queued later
    # Check the command line now, in one line, rather than in every child later.
    exp = load_experiment("tiny" if experiment == "auto" else experiment)
    apply_overrides(exp, load_profile("baseline"), list(set_ or []))
    if profiles_dir is not None and not profiles_dir.is_dir():
        raise MemlabError(f"--profiles-dir {profiles_dir}: no such folder")
    from memlab.core.runstore import ensure_runs_dir  # polars: once the names and values are known to be good

    ensure_runs_dir(Path(runs_dir), create=False)
    _check_runs_dir_can_be_made(Path(runs_dir))

    from memlab.tui.app import MemlabApp

    app = MemlabApp(
        runs_dir=runs_dir, experiment=experiment, device=device, overrides=list(set_ or []),
        profiles_dir=profiles_dir, theme="textual-light" if light else "textual-dark",
    )
    app.run()


def _check_runs_dir_can_be_made(runs_dir: Path) -> None:
    """The TUI makes its runs folder with the first run; refuse now one that could never be made (`/proc/nope`): a
    throwaway folder is made and removed where the runs folder would go (permissions alone miss /proc, and root)."""
    from memlab.core.errors import MemlabError

    if runs_dir.is_dir():
        return
    parent = runs_dir.absolute().parent
    while not parent.exists():
        parent = parent.parent
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".memlab-check-", dir=parent))
    except OSError as e:
        raise MemlabError(f"runs folder {runs_dir} cannot be created ({e.strerror}); pass a writable --runs-dir") from None


def register(app: typer.Typer) -> None:
    app.command("tui")(tui)
