"""The engine's read-back of each step's loss and gradient norm, on the GPU: as committed (meters.host_copy queues a
copy to pinned host memory before the step's end mark) against the read it replaced (the device tensor's .item() one
step late, which the stream orders behind the next step: the host then waits for that step too, and the GPU idles
through the host's work between steps). The old read is restored by swapping host_copy for the identity.

Cases in rounds, interleaved (the two reads take turns going first), in one process, each memlab side timed as the engine times it (events: the median step;
wall: the laps over the measured steps) and the compiled loop of bench/fastest.py by the same wall clock:

    python3 bench/read_back_check.py --out $OUT/read-back --batches 16,64 --rounds 3 --steps 30
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
PROFILES = ["fastest", "fastest,loader.pin_memory=true", "compile", "bf16"]


def memlab_case(experiment: str, entry: str, steps: int, batch: int, old_read: bool) -> dict:
    from fastest import memlab_run

    from memlab.core import meters

    committed = meters.host_copy
    if old_read:
        meters.host_copy = lambda value: value
    try:
        profile, *sets = entry.split(",")
        return memlab_run(experiment, profile, steps, batch, sets=sets)
    finally:
        meters.host_copy = committed


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--experiment", default="gpt2s")
    ap.add_argument("--batches", default="16,64")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--profiles", default=";".join(PROFILES), help="';'-separated: profile[,key=value...]")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    torch._dynamo.config.cache_size_limit = 64

    from fastest import experiment_data, reference_run

    from memlab.core.environment import environment

    exp, tok, vocab = experiment_data(args.experiment)
    rows: list[dict] = []

    def record(case: str, batch: int, rnd: int, res: dict) -> None:
        rows.append({"case": case, "batch": batch, "round": rnd} | res)
        with open(out / "read_back.jsonl", "a") as f:  # row by row: a run stopped at its limit keeps what it had
            f.write(json.dumps(rows[-1]) + "\n")
        print(f"b{batch} {case:40s} round {rnd}: events {res.get('tokens_per_s') or 0:,.0f} wall {res.get('tokens_per_s_wall') or 0:,.0f}",
              flush=True)

    batches = [int(b) for b in args.batches.split(",")]
    for rnd in range(args.rounds):
        for b in batches:
            record("compiled loop", b, rnd, reference_run(tok.train, exp, vocab, b, args.steps, compiled=True))
            for entry in args.profiles.split(";"):
                for old in (False, True) if rnd % 2 == 0 else (True, False):  # each read goes first in every other round
                    if old and "pin_memory" in entry:
                        continue
                    record(f"{entry} ({'old read' if old else 'host copy'})", b, rnd, memlab_case(args.experiment, entry, args.steps, b, old))

    env = environment(torch.device("cuda"))
    lines = [f"GPU {env['gpu_name']} · driver {env.get('driver')} · torch {env['torch']} · CUDA {env['cuda']} · experiment {args.experiment}",
             f"tokens/s, median of {args.rounds} interleaved rounds; wall = the same wall clock on both sides (batch building and host gaps in)",
             "| batch | case | tokens/s (events) | tokens/s (wall) | wall / events | wall / compiled loop's wall |", "|--:|:--|--:|--:|--:|--:|"]
    for b in batches:
        def med(case: str, key: str) -> float | None:
            vals = [r[key] for r in rows if r["batch"] == b and r["case"] == case and r.get(key)]
            return statistics.median(vals) if vals else None
        ref = med("compiled loop", "tokens_per_s_wall")
        for case in dict.fromkeys(r["case"] for r in rows if r["batch"] == b):
            ev, wall = med(case, "tokens_per_s"), med(case, "tokens_per_s_wall")
            if ev and wall and ref:
                lines.append(f"| {b} | {case} | {ev:,.0f} | {wall:,.0f} | {wall / ev:.3f} | {wall / ref:.3f}x |")
    text = "\n".join(lines)
    print(text)
    (out / "read_back.md").write_text(text + "\n\ncommand: python3 bench/read_back_check.py " + " ".join(sys.argv[1:]) + "\n")


if __name__ == "__main__":
    main()
