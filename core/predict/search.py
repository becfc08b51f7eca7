"""One search for the largest size that fits: gallop from a guess (up while sizes fit, down while they do not), then
bisect. The predictor asks it over micro-batches and over sequence lengths, with any `fits` (the analytic bound's,
or the allocator replay's over the fake trace: memlab.core.predict.axis); find-batch's measured search
(memlab.core.batchfind) probes real steps in children and guides its probes by their measured peaks, so it keeps
its own loop.
"""

from __future__ import annotations

from typing import Callable

LIMIT = 1 << 20  # no micro-batch or sequence length is asked beyond this


def largest_near(fits: Callable[[int], bool], guess: int, limit: int, confirm: bool = False) -> int:
    """The largest size in 1..limit with fits (0: not even 1), from a guess: galloping up from it while sizes fit
    (steps 1, 2, 4, ...) or down from it while they do not, then bisecting the last step. A guess within a few of
    the answer costs a few asks, where doubling from a start and bisecting back costs a dozen (a trace of an 8B model
    takes seconds; a probe on the GPU, a minute). That assumes fits is monotone, and the allocator's is not quite
    (gpt2s gradcp_every2 fits 35 and 37, not 36): with `confirm`, the sizes 1, 2, 4, ... below the answer, down to
    an eighth below it, must fit too (_first_failed_rung), else the search goes on below the first that did not, so the
    figure errs low, as a bound should. Each size is asked once."""
    if not hasattr(fits, "asked"):
        fits = _asked_once(fits)
    best = _gallop_and_bisect(fits, guess, limit)
    failed_ladders = 0
    while confirm and best > 0:
        failed = _first_failed_rung(fits, best)
        if failed is None:
            break
        failed_ladders += 1
        below = failed - 1
        if failed_ladders > NOISY_AFTER:  # a band of failures, not an island: farther down each time
            below = min(below, best - min(best // 8, 8 << (failed_ladders - NOISY_AFTER)))
        best = _gallop_and_bisect(fits, below, below) if below >= 1 else 0
    return best


def _gallop_and_bisect(fits: Callable[[int], bool], guess: int, limit: int) -> int:
    g = max(1, min(guess, limit))
    if fits(g):
        lo, step = g, 1
        while lo + step <= limit and fits(lo + step):
            lo, step = lo + step, step * 2
        hi = min(lo + step, limit + 1)
    else:
        hi, step = g, 1
        while hi - step >= 1 and not fits(hi - step):
            hi, step = hi - step, step * 2
        lo = max(hi - step, 0)  # 0: nothing below is known to fit yet
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def affine_guess(peak: Callable[[int], int], x1: int, x2: int, room: int) -> int:
    """Where the affine line through the peaks at x1 and x2 reaches `room` (at least 1; x2 where it does not rise)."""
    p1, p2 = peak(x1), peak(x2)
    slope = (p2 - p1) / (x2 - x1)
    return max(1, int(x1 + (room - p1) / slope)) if slope > 0 else x2


# Failed ladders a search restarts just below before it takes the region for a band of failures
NOISY_AFTER = 4


def _first_failed_rung(fits: Callable[[int], bool], best: int) -> int | None:
    """The first of best - 1, best - 2, best - 4, ... down to an eighth below `best` (at least best - 1) that does
    not fit; None where all do. The replay's fits come in islands where a step's large blocks land in freed segments
    or not: heldout_fat's act_offload_overlap fits 154-156 and 160-164 but not 148-153 or 157-159, and the GPU fitted
    148 and nothing above; one size below the answer cannot tell an island from the mainland, a ladder can. An
    eighth: the scale of the predictions' accuracy (within 10%), at log2(best / 8) asks. Near a card's edge the
    failures can also fill a band: gpt2s qlora_gradcp's longest sequence on 80 GB, replayed, fits every length up to
    6528 units of 64 tokens and above it three in five need an allocator retry, up to 6961. Restarting just below
    each failure walked that band down a size or two at a time (417 asks, 6 minutes, 6528); after NOISY_AFTER
    restarts the search steps 16, 32, 64, ... below (at most an eighth): 48 asks, 6442."""
    step = 1
    while best - step >= max(1, min(best - 1, best - best // 8)):  # at least the size below
        if not fits(best - step):
            return best - step
        step *= 2
    return None


def _asked_once(fits: Callable[[int], bool]) -> Callable[[int], bool]:
    answers: dict[int, bool] = {}

    def once(b: int) -> bool:
        if b not in answers:
            answers[b] = fits(b)
        return answers[b]

    once.asked = answers  # type: ignore[attr-defined]
    return once
