"""The allocator's own trace of Llama-3.1-8B's fine-tuning steps (bench/replay_8b.sh, committed under
bench/results/fit-8b-h200/) beside the predictor's fake trace of the same probe, both replayed through memlab's
allocator model. The GPU's trace has no mark where the run empties CUDA's cache after quantizing the base
(finetune._quantize); one is put before the first step's first allocation, where the run makes it.

    python bench/replay_8b_compare.py [--out FILE]      # CPU, a minute a case
"""

from __future__ import annotations

import argparse
import gzip
import json
from pathlib import Path

from allocator_replay import fake_trace

from memlab.core.predict.allocator import EMPTY_CACHE, STEPS, replay

RESULTS = Path(__file__).resolve().parent / "results" / "fit-8b-h200"
GIB = 2**30


def gpu_trace(path: Path) -> list[tuple]:
    with gzip.open(path, "rt") as lines:
        events = [(e["action"], e["id"], e["bytes"], e["where"]) for e in map(json.loads, lines)]
    first = next(k for k, e in enumerate(events) if e[0] == "alloc" and "_forward_backward" in e[3])
    return events[:first] + [(EMPTY_CACHE, None, 0, ""), (STEPS, None, 0, "")] + events[first:]


def probe_sets(seq: int) -> list[str]:
    """As bench/replay_8b.sh runs the probe (find-batch's: no evaluation but one window at the end)."""
    return [f"model.seq_len={seq}", "train.batch_size=1", "train.measure_after=1", "train.eval_every=0",
            f"data.val_tokens={seq + 1}"]


def row(path: Path) -> str:
    profile, seq = path.name.split(".")[0][len("llama-8b_"):].rsplit("_", 1)  # llama-8b_PROFILE_SEQ.real.jsonl.gz
    gpu = replay(gpu_trace(path))
    fake = replay(fake_trace("llama-8b", profile, 1, probe_sets(int(seq))))
    err = fake.peak_reserved / gpu.peak_reserved - 1
    return (f"| {profile} | {seq} | {gpu.peak_allocated / GIB:.2f} | {fake.peak_allocated / GIB:.2f} | "
            f"{gpu.peak_reserved / GIB:.2f} | {fake.peak_reserved / GIB:.2f} | {err:+.1%} |")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    lines = ["| profile | tokens | GPU allocated GiB | replay allocated GiB | GPU reserved GiB (model over its trace) | "
             "replay reserved GiB | reserved error |", "|---|---|---|---|---|---|---|"]
    for path in sorted(RESULTS.glob("*.real.jsonl.gz")):
        lines.append(row(path))
        print(lines[-1], flush=True)
    if args.out:
        Path(args.out).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
