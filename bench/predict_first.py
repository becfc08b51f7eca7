"""Issue 17, max batch held out: write down what find-batch will start from *before* the GPU searches run. For each
case (an experiment, a profile, optional --set overrides) under a card of --gpu-memory, the prediction
maxbatch.predicted_max_batch(..., replay=True) gives on a GPU (the smaller of the allocator replay's figure and the
analytic guard), beside its parts; the replay's column is its figure under the whole allocator budget, the
prediction takes it under the budget less maxbatch.REPLAY_MARGIN. Runs on a CPU (fake tensors; the H100's
1,247 MiB outside the allocator assumed).

    python bench/predict_first.py --out FILE --gpu-memory 24 EXPERIMENT:PROFILE[:KEY=VALUE,...] ...
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path

from memlab.core.predict import axis, card as cards, maxbatch
from memlab.core.predict import analytic as est
from memlab.core.config import apply_overrides, load_experiment, load_profile
from memlab.core.errors import MemlabError

GIB = 2**30


def parts(experiment, profile, card: int) -> tuple[int, int, int | None, int | None]:
    """(analytic with the profile's own margin, the analytic guard with the plain margin, the replay's, predicted)."""
    single = dataclasses.replace(profile, accumulation=dataclasses.replace(profile.accumulation, steps=1))
    vocab, _ = est.vocab_for(experiment)
    analytic = est.predict_max_batch(experiment, single, vocab_size=vocab, memory_bytes=card)
    guard = est.predict_max_batch(experiment, single, vocab_size=vocab, memory_bytes=card, pattern="plain")
    try:
        whole = axis.batches(experiment, single, vocab, cards.Card(card, None, "", capped=True), margin=0)  # no margin
        replayed = whole.largest(max(1, analytic // 2), 1 << 20)
    except MemlabError:  # a compiled step the replay cannot trace (a chunked or fused loss): the analytic figure stands
        replayed = None
    return analytic, guard, replayed, maxbatch.predicted_max_batch(experiment, profile, card, replay=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--gpu-memory", type=float, default=24.0, help="the card, GiB")
    ap.add_argument("cases", nargs="+", help="EXPERIMENT:PROFILE[:KEY=VALUE,...]")
    args = ap.parse_args()
    card = int(args.gpu_memory * GIB)
    rows = ["| experiment | profile | overrides | analytic (own margin) | guard (plain margin) | replay (whole budget) | predicted |",
            "|:--|:--|:--|--:|--:|--:|--:|"]
    for case in args.cases:
        name, prof_name, *rest = case.split(":")
        overrides = rest[0].split(",") if rest else []
        experiment, profile = load_experiment(name), load_profile(prof_name)
        apply_overrides(experiment, profile, overrides)
        t = time.monotonic()
        analytic, guard, replayed, predicted = parts(experiment, profile, card)
        rows.append(f"| {Path(name).name} | {prof_name} | {' '.join(overrides)} | {analytic} | {guard} | {replayed} | **{predicted}** |")
        print(rows[-1], f"({time.monotonic() - t:.0f} s)", flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text("\n".join(rows) + f"\n\ncard {args.gpu_memory:g} GiB; command: python bench/predict_first.py "
                              f"--out {args.out} --gpu-memory {args.gpu_memory:g} {' '.join(args.cases)}\n")


if __name__ == "__main__":
    main()
