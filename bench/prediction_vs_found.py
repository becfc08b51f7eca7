"""Issue 17, max batch: the prediction find-batch and the study start from on a GPU (maxbatch.predicted_max_batch
with the allocator replay: the smaller of the analytic and replayed figures) against the max batch find-batch found
on the H100, for every built-in single-GPU profile of the committed seeds' study (a 24 GiB card, the seeds' shape;
bench/results/study-so-posts-h100/comparison.parquet), beside that study's own prediction (analytic, of its day).
Runs on a CPU (fake tensors); prints a Markdown table and counts.

    python bench/prediction_vs_found.py [--out FILE]

The seeds' shape is not held out from the replay: its traces were compared with these runs while the replay and
its stand-ins were written (bench/allocator_replay.py says which). The study's max batches were all measured again
on 2026-11-26 and 27 (`memlab study --redo-max all`, then resumed) after the fix that made it judge a probe as
find-batch does (not counting a probe that needed allocator retries). A profile the study has not measured is listed
and not counted.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import polars as pl

from memlab.core.predict import maxbatch
from memlab.core.config import apply_overrides, load_experiment, load_profile

STUDY = Path(__file__).parent / "results" / "study-so-posts-h100"
SEED_DATA = ['data.tokenizer="bpe:8192"', 'data.source="stdlib"']  # the study's data, as bench/allocator_replay.py


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    study = pl.read_parquet(STUDY / "comparison.parquet").filter(pl.col("study_kind") == "common")
    card = int(study["gpu_memory_cap_bytes"].drop_nulls()[0])
    rows, over, within, counted = [], 0, 0, 0
    for r in study.sort("profile").iter_rows(named=True):
        found = r["max_batch"] if r["max_batch_measured"] else None
        if found is None:
            rows.append(f"| {r['profile']} | not measured yet | | | | |")
            print(rows[-1], flush=True)
            continue
        exp, prof = load_experiment("seed-so-posts"), load_profile(r["profile"])
        apply_overrides(exp, prof, list(SEED_DATA))
        t = time.monotonic()
        predicted = maxbatch.predicted_max_batch(exp, prof, card, replay=True)
        off = (predicted - found) / found if predicted else None
        counted += off is not None
        over += bool(off is not None and off > 0)
        within += bool(off is not None and abs(off) <= 0.10)
        study_pred = r["predicted_max_batch"]
        rows.append(f"| {r['profile']} | {found} | {predicted} | {off:+.1%} | {study_pred} | {time.monotonic() - t:.0f} s |"
                    if off is not None else f"| {r['profile']} | {found} | — | — | {study_pred} | |")
        print(rows[-1], flush=True)
    head = ["| profile | found on the H100 | predicted now (this checkout, CPU) | off | the study's prediction (the H100's) | time |",
            "|:--|--:|--:|--:|--:|--:|"]
    tail = f"\n{counted} of {len(rows)} profiles measured: {over} predicted above the batch found, {within} within 10% of it; card {card / 2**30:.2f} GiB"
    text = "\n".join(head + rows) + tail
    print(tail)
    if args.out:
        Path(args.out).write_text(text + "\n\ncommand: python bench/prediction_vs_found.py --out " + args.out + "\n")


if __name__ == "__main__":
    main()
