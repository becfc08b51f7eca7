"""Read find-batch's own printed results back out of committed logs (bench/results/prediction-check/): which search
(profile, experiment, allocator mode), the max micro-batch it found, and the prediction it printed on the GPU."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

HEADER = re.compile(r"^find-batch: (\S+) on (\S+) ·")
FOUND = re.compile(r"^max micro-batch: (\d+)")
PREDICTED = re.compile(r"^estimator predicted: (\d+)")
EXPANDABLE = re.compile(r"^\$ .*--set allocator\.expandable_segments=true")


@dataclass
class Search:
    profile: str
    experiment: str  # the experiment's name as find-batch printed it (a file's stem)
    expandable: bool
    found: int
    predicted: int | None  # what find-batch printed as the estimator's prediction, that day's code
    source: str


def searches_in(path: Path) -> list[Search]:
    """Every finished search in a log or a transcript of several (a search cut off or lost has no max line and is
    left out). A log's name says expandable segments (`-expandable`); a transcript's `$ ` command line does."""
    out, current, expandable = [], None, "-expandable" in path.name
    for line in path.read_text().splitlines():
        if EXPANDABLE.match(line):
            expandable = True
        elif line.startswith("$ "):
            expandable = "-expandable" in path.name
        if m := HEADER.match(line):
            current = m.groups()
        elif (m := FOUND.match(line)) and current:
            out.append(Search(current[0], current[1], expandable, int(m.group(1)), None, path.name))
        elif (m := PREDICTED.match(line)) and out and out[-1].predicted is None:
            out[-1].predicted = int(m.group(1))
    return out


def searches_under(folder: Path) -> list[Search]:
    return [s for p in sorted(folder.glob("find-batch-*.log")) if "-beside-" not in p.name for s in searches_in(p)]
