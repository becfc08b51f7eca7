"""The profiles one can queue: built-in ones and TOML files in the current folder (or --profiles-dir).

A file meant as a profile that does not load (bad TOML, an unknown key, a missing `extends`) stays in the list,
marked, with its error shown when highlighted; it cannot be queued. Files that are not profiles at all
(pyproject.toml, an experiment) are left out."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rich.text import Text
from textual.binding import Binding
from textual.message import Message
from textual.widgets import OptionList
from textual.widgets.option_list import Option


@dataclass(frozen=True)
class ProfileInfo:
    ref: str  # what `memlab run --profile` takes: a built-in name or a path
    label: str
    description: str = ""
    changes: str = ""
    error: str = ""  # why a profile file does not load: shown, and the profile cannot be queued
    needs_cuda: str = ""  # why it cannot run on the CPU backend (its technique check's message), marked in the list


def discover_profiles(profiles_dir: str | Path | None = None) -> list[ProfileInfo]:
    """Built-in profiles, then *.toml files in `profiles_dir` (default: the current folder) meant as profiles;
    those that do not load carry their error. Files that are not profiles (pyproject.toml, an experiment) are left out."""
    from memlab.core.config import builtin_names, describe_changes, load_profile
    from memlab.core.errors import MemlabError
    from memlab.core.requirements import cuda_only

    found = []
    for name in builtin_names("profile"):
        try:
            p = load_profile(name)
        except MemlabError:
            continue
        found.append(ProfileInfo(name, name, p.description, _changes(describe_changes, p), needs_cuda=cuda_only(p) or ""))
    folder = Path(profiles_dir) if profiles_dir is not None else Path.cwd()
    builtin = {f.ref for f in found}
    for path in sorted(folder.glob("*.toml")) if folder.is_dir() else []:
        ref = str(path) if profiles_dir is not None else f"./{path.name}"
        label = path.stem if path.stem not in builtin else path.name
        try:
            p = load_profile(ref)
        except MemlabError as e:
            if _meant_as_profile(path):
                found.append(ProfileInfo(ref, f"{label} (file)", error=str(e)))
            continue
        found.append(ProfileInfo(ref, f"{label} (file)", p.description, _changes(describe_changes, p), needs_cuda=cuda_only(p) or ""))
    return found


def _meant_as_profile(path: Path) -> bool:
    """A TOML file that does not load as a profile, but was meant as one: it does not parse (and is no
    pyproject.toml), or it has a profile's keys. An experiment, a pyproject.toml, any other TOML: not."""
    import tomllib

    from memlab.core.config import PROFILE_SECTIONS

    try:
        data = tomllib.loads(path.read_text(encoding="utf-8", errors="replace"))
    except (tomllib.TOMLDecodeError, OSError):
        return path.name != "pyproject.toml"
    return "extends" in data or any(k in PROFILE_SECTIONS for k in data)


def _changes(describe, profile) -> str:
    try:
        return describe(profile)
    except Exception:  # noqa: BLE001 (a nicety: never stop the list for it)
        return ""


def _label(p: ProfileInfo) -> Text:
    if p.error:
        return Text.assemble((p.label, "dim strike"), (" ✗ broken", "red"))
    if p.needs_cuda:
        return Text.assemble(p.label, (" · CUDA", "dim"))
    return Text(p.label)


class ProfileList(OptionList):
    """Enter (or a) puts the highlighted profile at the end of the queue."""

    BINDINGS = [Binding("a", "pick", "Add to queue", show=False)]

    @dataclass
    class Picked(Message):
        profile: str

    @dataclass
    class Highlighted(Message):
        info: ProfileInfo | None

    def __init__(self, profiles: list[ProfileInfo], **kwargs) -> None:
        self.profiles = {p.ref: p for p in profiles}
        super().__init__(*[Option(_label(p), id=p.ref) for p in profiles], **kwargs)

    def action_pick(self) -> None:
        option = self.highlighted_option
        if option is not None and option.id is not None:
            self._pick(option.id)

    def _on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        if event.option.id is not None:
            self._pick(event.option.id)

    def _pick(self, ref: str) -> None:
        info = self.profiles.get(ref)
        if info is not None and info.error:
            self.app.notify(f"{info.label} does not load: {info.error}", severity="error", timeout=6)
            return
        self.post_message(self.Picked(ref))

    def _on_option_list_option_highlighted(self, event: OptionList.OptionHighlighted) -> None:
        event.stop()
        self.post_message(self.Highlighted(self.profiles.get(event.option.id or "")))
