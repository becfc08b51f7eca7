"""Is the second step of a fake trace the first one again? (the trace's cost: memlab fit on an 8B model)

    python bench/one_step_check.py [--out FILE] [CASE ...]     (CASE: experiment:profile:micro_batch[:set,set])

For each case, the step's trace made both ways: the second step traced (trace.SECOND_STEP = "traced"), and made
from the first (trace._next_step: its blocks made and freed again, what it kept not made again). Reports whether
the two event lists are the same once keys are renamed, the allocator replay's allocated and reserved peaks each
way, and the seconds each took. Every built-in profile on the tiny experiment by default.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from memlab.core.config import apply_overrides, load_experiment, load_profile
from memlab.core.predict import analytic, trace
from memlab.core.predict.allocator import replay
from trace_compare import canonical
from memlab.core.techniques import allocator

PROFILES = sorted(p.stem for p in (Path(__file__).resolve().parent.parent / "profiles").glob("*.toml"))


def normalized(events: list) -> list:
    """trace_compare.canonical, each block's "where" dropped (a made-again block's is its original's), lazy sizes as text."""
    return [(ev[0], ev[1], str(ev[2])) if ev[0] == "alloc" else ev[:2] for ev in canonical(events)]


def one(case: str) -> dict:
    parts = case.split(":")
    experiment, profile, micro = parts[0], parts[1], int(parts[2])
    e, p = load_experiment(experiment), load_profile(profile)
    apply_overrides(e, p, [s for s in (parts[3].split(",") if len(parts) > 3 else []) if s])
    vocab, _ = analytic.vocab_for(e)
    row = {"case": case}
    got = {}
    trace.DEEPEN = False  # both ways at the model's depth (the made deep step: bench/deepen_check.py)
    trace.step_trace(e, p, vocab_size=vocab, micro_batch=micro)  # once first: what a process makes at its first trace only
    for mode in ("traced", "synthesized"):
        trace.SECOND_STEP = mode
        t0 = time.perf_counter()
        try:
            events = trace.step_trace(e, p, vocab_size=vocab, micro_batch=micro)
        except Exception as exc:  # noqa: BLE001 (a profile the trace refuses here: its row says so)
            return row | {"error": f"{type(exc).__name__}: {str(exc)[:160]}"}
        row[f"{mode}_s"] = round(time.perf_counter() - t0, 2)
        model = replay(events, expandable=allocator.expandable(p))
        row[f"{mode}_peaks"] = [model.peak_allocated, model.peak_reserved]
        got[mode] = normalized(events)
    row["same_events"] = got["traced"] == got["synthesized"]
    row["same_peaks"] = row["traced_peaks"] == row["synthesized_peaks"]
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("cases", nargs="*", default=[f"tiny:{p}:8" for p in PROFILES])
    ap.add_argument("--out")
    args = ap.parse_args()
    for case in args.cases:
        row = one(case)
        line = json.dumps(row)
        print(line, flush=True)
        if args.out:
            with open(args.out, "a") as f:
                f.write(line + "\n")
    sys.exit(0)


if __name__ == "__main__":
    main()
