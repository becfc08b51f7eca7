"""The analytic formula's compiler-budget figures, walked from the step's events (inductor.peaks_of, 7741fd5) beside
the envelope of lines they replaced (BudgetTrace, read from the commit given and its TRACED table), at micro-batches 1,
8 and 64 for every shape both tables hold. Prints only the figures that differ.

    python bench/budget_walk_check.py 78e7242      (the commit before the change)
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from memlab.core.predict import inductor as new

FIELDS = ("saved", "forward", "backward", "backward_grads")


def old_module(commit: str):
    """inductor.py and its table as they were at `commit`, imported from a folder of their own."""
    folder = Path(tempfile.mkdtemp())
    for name in ("inductor.py", "inductor_traces.json"):
        text = subprocess.run(["git", "show", f"{commit}:core/predict/{name}"], capture_output=True, text=True, check=True).stdout
        (folder / name).write_text(text)
    spec = importlib.util.spec_from_file_location("old_inductor", folder / "inductor.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["old_inductor"] = module
    spec.loader.exec_module(module)
    return module


def main() -> None:
    old = old_module(sys.argv[1])
    both = [k for k in old.TRACED if k in new.EVENTS]
    print(f"{len(both)} shapes in both tables")
    for key in both:
        envelope, events = old.BudgetTrace.from_json(old.TRACED[key]), new.StepEvents.from_json(new.EVENTS[key])
        for b in (1, 8, 64):
            was, now = envelope.at(b), new.peaks_of(events, b)
            moved = [f"{f} {getattr(was, f)} -> {getattr(now, f)} ({(getattr(now, f) - getattr(was, f)) / max(getattr(was, f), 1):+.4%})"
                     for f in FIELDS if getattr(was, f) != getattr(now, f)]
            if moved:
                shape = json.loads(key)
                print(f"budget {shape['budget']} d_model {shape['d_model']} micro-batch {b}: " + "; ".join(moved))


if __name__ == "__main__":
    main()
