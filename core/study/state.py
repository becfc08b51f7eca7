"""The study folder's memory: `study.json`, what was asked (options), what it is a study of (identity), and one
record per item of work with its outcome. Written atomically after every item, so a study stopped at any moment
resumes from the last item that ended; a second invocation with the same --out skips what is final.

    <out>/study.json     options, identity, items (this module)
    <out>/runs/          the run folders (one child process each)
    <out>/superseded/    run folders of items the user asked to redo (--redo), kept
    <out>/commands.txt   the exact commands: the study's own and every child's
"""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from memlab.core.errors import MemlabError
from memlab.core.runfolder import atomic_write_json

STATE_FILE = "study.json"
SUPERSEDED = "superseded"  # run folders of items redone (--redo): kept, out of the report
SCHEMA = 1
# Outcomes that are results: a second invocation does not redo them (a refusal or an OOM would only repeat).
# Anything else (interrupted, crashed, error, not run for want of a max batch) is tried again.
FINAL = ("finished", "rejected", "oom", "nan", "measured", "predicted", "does not fit")


@dataclass
class Options:
    """What the user asked for; a resumed study without flags takes these."""

    profiles: list[str]
    experiment: str  # a built-in name or an absolute TOML path (auto already resolved)
    device: str  # cpu | cuda (auto already resolved)
    recipe: str | None = None
    gpu_memory: str | None = None
    batch: str = "experiment"  # experiment | baseline-max | a number
    at_max: bool = False
    steps: int | None = None
    overrides: list[str] = field(default_factory=list)  # --set, --data, --tokenizer, as --set items

    def identity(self, experiment_id: str) -> dict[str, Any]:
        """What makes two invocations the same study: anything here changes every figure."""
        return {"experiment_id": experiment_id, "device": self.device, "gpu_memory": self.gpu_memory, "batch": self.batch,
                "overrides": sorted(self.overrides), "steps": self.steps}


@dataclass
class Item:
    """One piece of work: a max-batch search (`max`), a run at the common batch (`common`) or at the profile's own
    max (`at_max`). `status` is a child's outcome (memlab.core.supervisor), or for `max`: measured, predicted
    (CPU: not measured), does not fit, rejected, error; `not run` when what it needed failed."""

    key: str
    kind: str
    profile: str
    status: str = "pending"
    message: str = ""
    batch: int | None = None  # effective batch of a run
    accumulation: int | None = None
    run_dir: str | None = None
    seconds: float | None = None
    max_batch: int | None = None  # max: measured on CUDA
    predicted_max_batch: int | None = None  # max: the estimator's
    # max: what its probes showed so far (largest fit, smallest OOM), kept in the study folder so that a search
    # resumed on another machine (find-batch's cache stays on the one it ran on) starts where it stopped
    known_fit: int | None = None
    known_oom: int | None = None
    allocator_budget_bytes: int | None = None  # max, under --gpu-memory: the allocator's cap its probes measured and set
    searched_on: str | None = None  # max: the GPU model the prediction and bounds above are for
    searched_with: list[str] = field(default_factory=list)  # max: the memlab commits its probes ran (a resumed search may span several)
    command: str = ""
    lane: str = ""  # the GPU lane it last ran on (memlab.core.lanes), e.g. "gpu 2"; "" on the CPU

    @property
    def final(self) -> bool:
        return self.status in FINAL


@dataclass
class StudyState:
    options: Options
    identity: dict[str, Any]
    items: dict[str, Item] = field(default_factory=dict)
    invocations: list[str] = field(default_factory=list)  # every study command line, with its UTC time

    def item(self, kind: str, profile: str) -> Item:
        key = f"{kind}/{profile}"
        if key not in self.items:
            self.items[key] = Item(key, kind, profile)
        return self.items[key]

    def redo(self, profiles: list[str], out: Path, max_only: bool = False) -> list[str]:
        """Forget what `profiles` measured (the code they ran has changed since): their items go back to pending and
        their run folders move to superseded/, kept but out of the report. Returns the folders moved. `max_only`
        (--redo-max): only their max batch, and the runs whose batch came from it."""
        moved = []
        for item in [i for i in self.items.values() if self._forgotten(i, profiles, max_only)]:
            if item.run_dir and (out / item.run_dir).is_dir():
                target = out / SUPERSEDED / Path(item.run_dir).name
                target.parent.mkdir(exist_ok=True)
                shutil.move(str(out / item.run_dir), str(target))
                moved.append(str(target.relative_to(out)))
            self.items[item.key] = Item(item.key, item.kind, item.profile)
        return moved

    def _forgotten(self, item: Item, profiles: list[str], max_only: bool) -> bool:
        if not max_only:
            return item.profile in profiles
        if item.kind in ("max", "at_max"):
            return item.profile in profiles
        return self.options.batch == "baseline-max" and "baseline" in profiles  # every common run is at its max

    def save(self, out: Path) -> None:
        doc = {"schema": SCHEMA, "options": asdict(self.options), "identity": self.identity,
               "items": {k: asdict(v) for k, v in self.items.items()}, "invocations": self.invocations}
        atomic_write_json(out / STATE_FILE, doc)


def load_state(out: Path) -> StudyState | None:
    """The study in `out`, None when there is none yet; a MemlabError (one line) when study.json is not one."""
    path = out / STATE_FILE
    if not path.exists():
        return None
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        options = Options(**doc["options"])
        items = {k: Item(**v) for k, v in doc["items"].items()}
        return StudyState(options, doc["identity"], items, list(doc.get("invocations", [])))
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise MemlabError(f"{path} is not a memlab study state ({e.__class__.__name__}: {e}); give another --out") from None


def check_same_study(stored: StudyState, identity: dict[str, Any], out: Path) -> None:
    """A folder holds one study: an invocation that would change its figures is refused, naming what differs."""
    diff = [k for k in sorted(set(identity) | set(stored.identity)) if identity.get(k) != stored.identity.get(k)]
    if diff:
        what = ", ".join(f"{k} {stored.identity.get(k)!r} there, {identity.get(k)!r} here" for k in diff)
        raise MemlabError(f"--out {out} holds a study of another experiment ({what}); give another --out or the same options")


def stamp(command: str) -> str:
    return f"{datetime.now(timezone.utc).isoformat(timespec='seconds')}  {command}"
