"""One micro-batch of a held-out profile at the edge of a 24 GiB card on an H200 (bench/results/hf-heldout-h200): the
replayed peaks under the cap, the verdict's room (the budget less REPLAY_MARGIN of what the step adds), and the
verdict with and without the margin.

    python bench/edge_check.py PROFILE ...        (llama-1b, optimizer.fused=true, micro-batch 1)
"""

from __future__ import annotations

import sys
from unittest import mock

from memlab.core.config import apply_overrides, load_experiment, load_profile
from memlab.core.predict import axis, card as cards
from memlab.core.predict.analytic import vocab_for
from memlab.core.techniques.accumulation import single

OUTSIDE = cards.context_bytes_with(int(0.601 * 2**30))  # the H200's driver reserve (bench/hf_heldout_maxbatch.py)
G = 2**30


def main() -> None:
    for prof in sys.argv[1:]:
        one(prof)


def one(prof: str) -> None:
    e, p = load_experiment("llama-1b"), load_profile(prof)
    apply_overrides(e, p, ["optimizer.fused=true"])
    with mock.patch.object(cards, "context_bytes_here", lambda: OUTSIDE):
        card = cards.Card(24 * G, None, "", capped=True, named=True)
        ax = axis.batches(e, single(p), vocab_for(e)[0], card)
        a = ax.replayed(1)
        print(prof, "budget", round(card.budget_bytes / G, 3), "allocated", round(a.peak_allocated / G, 3), "reserved", round(a.peak_reserved / G, 3),
              "built", round(a.steps_reserved / G, 3), "room", round(ax.verdict_room(1) / G, 3), "fits", ax.fits(1), "fits without margin",
              axis.batches(e, single(p), vocab_for(e)[0], card, margin=0).fits(1))


if __name__ == "__main__":
    main()
