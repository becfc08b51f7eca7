"""Issue 46's max batch held out on transformers shapes: each find-batch search under a 24 GiB card in
bench/results/hf-heldout-h200/ (measured on an H200 and committed before these predictions), beside the micro-batch
this checkout predicts on a CPU for the same experiment, profile and --set items (the one max_batch that `memlab
estimate --gpu-memory 24GiB` and `memlab fit` print: maxbatch.max_batch with the allocator replay, for a card under
find-batch's cap). A search that stopped at micro-batch 1 ("even micro-batch 1
runs out of memory") found 0.

What the H200 holds outside the allocator is the calibrated card's figure (analytic.CUDA_CONTEXT_BYTES) with the
H200's own driver reserve (0.601 GiB, bench/results/cap-check-h100/NOTE.md) for the H100's, as
card.context_bytes_here takes it on that GPU.

    python bench/hf_heldout_maxbatch.py --out bench/results/hf-heldout-h200/maxbatch.md
"""

from __future__ import annotations

import argparse
import re
import time
from pathlib import Path
from unittest import mock

from memlab.core.config import apply_overrides, load_experiment, load_profile
from memlab.core.predict import card as cards, maxbatch
from memlab.core.techniques import accumulation

RESULTS = Path(__file__).resolve().parent / "results" / "hf-heldout-h200"
H200_RESERVE = int(0.601 * 2**30)
CARD = 24 * 2**30
NAME = re.compile(r"find-batch-(?P<experiment>llama-1b|qwen-1\.5b)-(?P<profile>[a-z0-9_]+)(?:-(?P<key>[a-z_.]+)-(?P<value>[a-z0-9]+))?\.log$")


def found(log: Path) -> int | None:
    text = log.read_text()
    if m := re.search(r"^max micro-batch: (\d+)", text, re.M):
        return int(m.group(1))
    return 0 if "even micro-batch 1 runs out of memory" in text else None


def searches() -> list[tuple[str, str, list[str], int, str]]:
    out = []
    for log in sorted(RESULTS.glob("call*/find-batch/*.log")):
        m = NAME.search(log.name)
        result = found(log)
        if m and result is not None:
            sets = [f"{m['key']}={m['value']}"] if m["key"] else []
            out.append((m["experiment"], m["profile"], sets, result, str(log.relative_to(RESULTS))))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--only", default="", help="experiment:profile,... (default: every search)")
    args = ap.parse_args()
    only = {tuple(c.split(":")) for c in args.only.split(",") if c}
    outside = cards.context_bytes_with(H200_RESERVE)
    lines = ["| experiment | profile | found (H200) | predicted | error | seconds | log |", "|---|---|---|---|---|---|---|"]
    with mock.patch.object(cards, "context_bytes_here", lambda: outside):
        for experiment, profile, sets, measured, log in searches():
            if only and (experiment, profile) not in only:
                continue
            e, p = load_experiment(experiment), load_profile(profile)
            apply_overrides(e, p, sets)
            t0 = time.time()
            card = cards.Card(CARD, None, "--gpu-memory 24GiB", capped=True, named=True)
            predicted = maxbatch.max_batch(e, accumulation.single(p), card, replay=True).max_batch
            error = "exact" if predicted == measured else (f"{predicted / measured - 1:+.0%}" if measured else "above")
            lines.append(f"| {experiment} | {'+'.join([profile, *sets])} | {measured} | {predicted} | {error} | "
                         f"{time.time() - t0:.0f} | {log} |")
            print(lines[-1], flush=True)
    command = f"python bench/hf_heldout_maxbatch.py --out {args.out}" + (f" --only {args.only}" if args.only else "")
    args.out.write_text(f"command: {command}\n\n{_releases()}\n\n24 GiB card, "
                        f"{outside / 2**30:.2f} GiB outside the allocator (the H200's)\n\n" + "\n".join(lines) + "\n")


def _releases() -> str:
    import torch
    import transformers

    return f"predicted with torch {torch.__version__}, transformers {transformers.__version__}"


if __name__ == "__main__":
    main()
