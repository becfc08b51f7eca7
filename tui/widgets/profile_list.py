"""The profiles one can queue: built-in ones and TOML files in the current folder (or --profiles-dir).

A file meant as a profile that does not load (bad TOML, an unknown key, a missing `extends`) stays in the list,
marked, with its error shown when highlighted; it cannot be queued. Files that are not profiles at all
(pyproject.toml, an experiment) are left out.

A profile that cannot run here is greyed out and refused when picked, with the reason (`ProfileList.Refused`, which
the app shows in the Live panel): one whose extra is not installed (`· memlab[torchao]`), and on the CPU backend one
that needs CUDA (`· CUDA`, marked wherever it is listed)."""

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
    needs_extra: str = ""  # memlab's extra whose package is not installed here ("torchao"), marked in the list
    extra_why: str = ""  # the check's message for it, with the pip install command

    def refusal(self, device: str | None) -> str:
        """Why this profile cannot be queued where runs go to `device` (cpu, cuda; None: not known yet), else ""."""
        if self.error:
            return f"does not load: {self.error}"
        if self.needs_extra:
            return f"needs memlab[{self.needs_extra}], not installed here: {self.extra_why}"
        if self.needs_cuda and device == "cpu":
            return f"needs CUDA, and runs go to the CPU here: {self.needs_cuda}"
        return ""

    def short_refusal(self, device: str | None) -> str:
        """The same in a few words, for the line under the list."""
        if self.needs_extra:
            return f"not installed here: pip install 'memlab[{self.needs_extra}]'"
        if self.needs_cuda and device == "cpu":
            return "needs CUDA: runs go to the CPU here"
        return self.refusal(device)


def _info(ref: str, label: str, profile, describe_changes) -> ProfileInfo:
    from memlab.core.requirements import needs

    n = needs(profile)
    return ProfileInfo(ref, label, profile.description, _changes(describe_changes, profile), needs_cuda=n.cuda or "",
                       needs_extra=n.extra or "", extra_why=n.extra_why)


def discover_profiles(profiles_dir: str | Path | None = None) -> list[ProfileInfo]:
    """Built-in profiles, then *.toml files in `profiles_dir` (default: the current folder) meant as profiles;
    those that do not load carry their error. Files that are not profiles (pyproject.toml, an experiment) are left out."""
    from memlab.core.config import builtin_names, describe_changes, load_profile
    from memlab.core.errors import MemlabError

    found = []
    for name in builtin_names("profile"):
        try:
            p = load_profile(name)
        except MemlabError:
            continue
        found.append(_info(name, name, p, describe_changes))
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
        found.append(_info(ref, f"{label} (file)", p, describe_changes))
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


def _mark(p: ProfileInfo) -> str:
    if p.error:
        return " ✗ broken"
    if p.needs_extra:
        return f" · memlab[{p.needs_extra}]"
    return " · CUDA" if p.needs_cuda else ""


def label_text(p: ProfileInfo) -> str:
    """The label as plain text, mark included (for the left column's width)."""
    return p.label + _mark(p)


def _label(p: ProfileInfo, device: str | None = None) -> Text:
    if p.error:
        return Text.assemble((p.label, "dim strike"), (_mark(p), "red"))
    if p.refusal(device):  # greyed out: it cannot run here
        return Text.assemble((p.label, "dim"), (_mark(p), "dim italic"))
    return Text.assemble(p.label, (_mark(p), "dim"))


class ProfileList(OptionList):
    """Enter (or a) puts the highlighted profile at the end of the queue, unless it cannot run here."""

    BINDINGS = [Binding("a", "pick", "Add to queue", show=False)]

    @dataclass
    class Picked(Message):
        profile: str

    @dataclass
    class Refused(Message):
        info: ProfileInfo
        reason: str

    @dataclass
    class Highlighted(Message):
        info: ProfileInfo | None
        device: str | None = None

    def __init__(self, profiles: list[ProfileInfo], **kwargs) -> None:
        self.profiles = {p.ref: p for p in profiles}
        self.device: str | None = None  # where runs go (cpu, cuda), once known: greys out what needs CUDA on a CPU
        super().__init__(*[Option(_label(p), id=p.ref) for p in profiles], **kwargs)

    def set_device(self, device: str | None) -> None:
        if device == self.device:
            return
        self.device = device
        for ref, info in self.profiles.items():
            self.replace_option_prompt(ref, _label(info, device))
        option = self.highlighted_option
        if option is not None:  # the help line under the list says it too
            self.post_message(self.Highlighted(self.profiles.get(option.id or ""), device))

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
        reason = info.refusal(self.device) if info is not None else ""
        if reason:
            self.post_message(self.Refused(info, reason))
            return
        self.post_message(self.Picked(ref))

    def _on_option_list_option_highlighted(self, event: OptionList.OptionHighlighted) -> None:
        event.stop()
        self.post_message(self.Highlighted(self.profiles.get(event.option.id or ""), self.device))
