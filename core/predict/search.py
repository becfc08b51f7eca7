"""One search for the largest size that fits: grow from a start by doubling (or halve below it), then bisect. The
predictor asks it over micro-batches and over sequence lengths, with any `fits` (the analytic bound's, or the
allocator replay's over the fake trace); find-batch's measured search (memlab.core.batchfind) probes real steps in
children and guides its probes by their measured peaks, so it keeps its own loop.
"""

from __future__ import annotations

from typing import Callable

LIMIT = 1 << 20  # no micro-batch or sequence length is asked beyond this


def largest_fitting(fits: Callable[[int], bool], start: int, limit: int, confirm: int = 0) -> int:
    """The largest b in 1..limit with fits(b): doubling from `start`, or halving below it, then bisection. That
    assumes fits is monotone, and the allocator's is not quite (gpt2s gradcp_every2 fits 35 and 37, not 36): with
    `confirm`, the answer's `confirm` smaller batches must fit too, else the search goes on below the one that did
    not, so the figure errs low, as a bound should."""
    return _confirmed(largest_fitting, fits, bisected(fits, min(start, limit), limit), confirm)


def bisected(fits: Callable[[int], bool], start: int, limit: int) -> int:
    if fits(start):
        lo, hi = start, start * 2
        while hi <= limit and fits(hi):
            lo, hi = hi, hi * 2
        hi = min(hi, limit + 1)  # limit + 1 stands for "does not fit": nothing above the limit is asked
    else:
        lo, hi = start // 2, start
        while lo >= 1 and not fits(lo):
            lo, hi = lo // 2, lo
        if lo < 1:
            return 0
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def largest_multiple(fits: Callable[[int], bool], granule: int, start: int, limit: int, confirm: int = 0) -> int:
    """The largest multiple of `granule` up to `limit` with fits (0: not even `granule` fits): largest_fitting over
    the multiples, for sequence lengths (kernels and tiles want multiples of 64 or so)."""
    return granule * largest_fitting(lambda n: fits(n * granule), max(1, start // granule), limit // granule, confirm)


def largest_near(fits: Callable[[int], bool], guess: int, limit: int, confirm: int = 0) -> int:
    """largest_fitting from a good guess: galloping up from it while sizes fit (steps 1, 2, 4, ...) or down from it
    while they do not, then bisecting the last step. A guess within a few of the answer costs a few asks, where
    doubling from a start and bisecting back costs a dozen (a trace of an 8B model takes seconds; a probe on the
    GPU, a minute). `confirm`: as for largest_fitting. Each size is asked once."""
    if not hasattr(fits, "asked"):
        fits = _asked_once(fits)
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
    return _confirmed(largest_near, fits, lo, confirm)


def _confirmed(search: Callable[..., int], fits: Callable[[int], bool], best: int, confirm: int) -> int:
    """`best` where its `confirm` smaller sizes fit too; else `search` again below the first that does not (0: none)."""
    for b in range(best - 1, max(best - confirm, 1) - 1, -1):
        if not fits(b):
            return search(fits, b - 1, b - 1, confirm) if b > 1 else 0
    return best


def _asked_once(fits: Callable[[int], bool]) -> Callable[[int], bool]:
    answers: dict[int, bool] = {}

    def once(b: int) -> bool:
        if b not in answers:
            answers[b] = fits(b)
        return answers[b]

    once.asked = answers  # type: ignore[attr-defined]
    return once
