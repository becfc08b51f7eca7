"""Issue 17, max batch: the prediction find-batch and the study start from on a GPU (batchfind.predicted_max_batch
with the allocator replay: the smaller of the analytic and replayed figures) against the max batch find-batch found
on the H100, for every built-in single-GPU profile of the committed seeds' study (a 24 GiB card, the seeds' shape;
bench/results/study-so-posts-h100/comparison.parquet), beside that study's own prediction (analytic, of its day).
Runs on a CPU (fake tensors); prints a Markdown table and counts.

    python bench/prediction_vs_found.py [--out FILE]

The seeds' shape is not held out from the replay: its traces were compared with these runs while the replay and
its stand-ins were written (bench/allocator_replay.py says which). The study's max batches were all measured again
on 2026-11-26 (`memlab study --redo-max all`) after the fix that made it judge a probe as find-batch does (not
counting a probe that needed allocator retries); the study's figure is used where it has one. Where it has none yet,
the later find-batch searches on that shape (prediction-check/seed-recheck.txt, seed-recheck/ and float8-traced/:
today's find-batch) are used, labelled; a profile with neither is listed and not counted.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import polars as pl
from findbatch_logs import searches_in

from memlab.core import batchfind as bf
from memlab.core.config import apply_overrides, load_experiment, load_profile

STUDY = Path(__file__).parent / "results" / "study-so-posts-h100"
CHECKS = Path(__file__).parent / "results" / "prediction-check"
RECHECKS = [CHECKS / "seed-recheck.txt", *sorted((CHECKS / "seed-recheck").glob("*.log")),  # the seed shape searched again
            CHECKS / "float8-traced" / "find-batch-seed_shape-float8.log"]
SEED_DATA = ['data.tokenizer="bpe:8192"', 'data.source="stdlib"']  # the study's data, as bench/allocator_replay.py


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    study = pl.read_parquet(STUDY / "comparison.parquet").filter(pl.col("study_kind") == "common")
    card = int(study["gpu_memory_cap_bytes"].drop_nulls()[0])
    rechecked = {s.profile: s.found for path in RECHECKS for s in searches_in(path) if not s.expandable}
    rows, over, within, counted = [], 0, 0, 0
    for r in study.sort("profile").iter_rows(named=True):
        found, where = (r["max_batch"], "") if r["max_batch_measured"] else (rechecked.get(r["profile"]), " (find-batch; the study: not yet)")
        if found is None:
            rows.append(f"| {r['profile']} | not measured again yet | | | | |")
            print(rows[-1], flush=True)
            continue
        exp, prof = load_experiment("seed-so-posts"), load_profile(r["profile"])
        apply_overrides(exp, prof, list(SEED_DATA))
        t = time.monotonic()
        predicted = bf.predicted_max_batch(exp, prof, card, replay=True)
        off = (predicted - found) / found if predicted else None
        counted += off is not None
        over += bool(off is not None and off > 0)
        within += bool(off is not None and abs(off) <= 0.10)
        study_pred = r["predicted_max_batch"] if r["max_batch_measured"] else ""
        rows.append(f"| {r['profile']} | {found}{where} | {predicted} | {off:+.1%} | {study_pred} | {time.monotonic() - t:.0f} s |"
                    if off is not None else f"| {r['profile']} | {found}{where} | — | — | {study_pred} | |")
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
