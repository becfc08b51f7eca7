"""What fits on a card, per profile: the predicted peak at the experiment's micro-batch and sequence, the largest
micro-batch at that sequence, and the longest sequence at micro-batch 1 (`memlab fit`).

"Fits" is the allocator replay's verdict (memlab.core.predict.trace.fits_replayed): the step's fake trace, replayed
through CUDA's caching allocator, stays within the card's allocator budget (the card less the CUDA context,
libraries and driver reserve) less REPLAY_MARGIN, without an allocator retry; the answer's next smaller size must fit
too. A search starts from a guess: the step's tensors are affine in the micro-batch and, with a fused attention
kernel, in the sequence, so two traces of a shallow copy of the model (memlab.core.predict.depth) put the tensors'
peak against the budget times the share of the reserve the tensors held at the experiment's own shape; full traces
then search from there (largest_near).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable

from memlab.core.config import Experiment, Profile
from memlab.core.errors import MemlabError
from memlab.core.predict import analytic
from memlab.core.predict.card import Card
from memlab.core.predict.depth import applies, extrapolated_peaks
from memlab.core.predict.maxbatch import REPLAY_MARGIN, SEQ_GRANULE, single
from memlab.core.predict.prediction import max_positions, with_seq_len
from memlab.core.predict.search import LIMIT, largest_near
from memlab.core.predict.trace import fits_replayed, step_peaks

# The profiles `memlab fit` tries without --profiles: full training as a user would (bf16; checkpointing; with 8-bit
# AdamW too), and the fine-tuning ones.
DEFAULT_PROFILES = ("bf16", "gradcp_bf16", "gradcp_adamw8bit", "lora", "lora_gradcp", "qlora", "qlora_gradcp", "freeze")


@dataclass(frozen=True)
class Fit:
    """One profile on one card. Sizes are 0 where not even the smallest fits; `error` says why a row has no figures."""

    profile: str
    micro_batch: int  # the experiment's, at which the peaks are predicted
    seq_len: int
    allocated_bytes: int = 0  # the tensors' peak (what a run reports as its peak)
    reserved_bytes: int = 0  # the allocator's reserve at that peak
    budget_bytes: int = 0
    max_batch: int = 0  # at seq_len
    longest_seq: int = 0  # at micro-batch 1, a multiple of SEQ_GRANULE
    error: str = ""

    @property
    def fits(self) -> bool:
        return not self.error and 0 < self.reserved_bytes <= self.budget_bytes


def fit(experiment: Experiment, profile: Profile, card: Card, *, axes: bool = True) -> Fit:
    """The predicted row for `profile` (one process; accumulation 1: each figure is one micro-batch's step)."""
    one = single(profile)
    micro = max(1, experiment.train.batch_size // profile.accumulation.steps)
    row = Fit(profile.name, micro, experiment.model.seq_len, budget_bytes=card.budget_bytes)
    vocab, _ = analytic.vocab_for(experiment)
    try:
        allocated, reserved = step_peaks(experiment, one, vocab_size=vocab, micro_batch=micro, capped=card.capped)
    except MemlabError as e:
        return dataclasses.replace(row, error=str(e))
    except Exception as e:  # noqa: BLE001 (an op without a fake implementation: this row says so, the others go on)
        return dataclasses.replace(row, error=f"not traced ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})")
    row = dataclasses.replace(row, allocated_bytes=allocated, reserved_bytes=reserved)
    if not axes:
        return row
    share = allocated / reserved  # of the reserve, what tensors hold at the experiment's shape
    return dataclasses.replace(row, max_batch=_max_batch(experiment, one, card, vocab, micro, share),
                               longest_seq=_longest_seq(experiment, one, card, vocab, share))


def _budget(card: Card) -> int:
    return int(card.budget_bytes * (1 - REPLAY_MARGIN))


def _max_batch(experiment: Experiment, profile: Profile, card: Card, vocab: int, micro: int, share: float) -> int:
    def fits(b: int) -> bool:
        return fits_replayed(experiment, profile, vocab_size=vocab, micro_batch=b, budget_bytes=_budget(card),
                             capped=card.capped)

    peak = _tensors_peak(lambda b: experiment, profile, vocab, card)
    guess = _affine_guess(lambda b: peak(b, b), micro, 2 * micro, int(_budget(card) * share))
    reserve = _reserve(lambda b: experiment, profile, vocab, card, micro=None)
    return largest_near(fits, _secant(reserve, micro, guess, _budget(card)), LIMIT, confirm=1)


def _longest_seq(experiment: Experiment, profile: Profile, card: Card, vocab: int, share: float) -> int:
    positions = max_positions(experiment) or LIMIT
    limit = min(LIMIT, positions) // SEQ_GRANULE

    def fits(n: int) -> bool:
        return fits_replayed(with_seq_len(experiment, n * SEQ_GRANULE), profile, vocab_size=vocab, micro_batch=1,
                             budget_bytes=_budget(card), capped=card.capped)

    shaped = lambda n: with_seq_len(experiment, n * SEQ_GRANULE)  # noqa: E731
    peak = _tensors_peak(shaped, profile, vocab, card)
    n0 = max(1, experiment.model.seq_len // SEQ_GRANULE)
    guess = min(_affine_guess(lambda n: peak(n, 1), n0, 2 * n0, int(_budget(card) * share)), limit)
    guess = _secant(_reserve(shaped, profile, vocab, card, micro=1), n0, guess, _budget(card))
    return SEQ_GRANULE * largest_near(fits, min(guess, limit), limit, confirm=1)


def _tensors_peak(shaped: Callable[[int], Experiment], profile: Profile, vocab: int,
                  card: Card) -> Callable[[int, int], int]:
    """The step's tensors' peak at (size, micro-batch): from shallow traces where the model is deep (depth.py)."""
    def peak(size: int, micro: int) -> int:
        exp = shaped(size)
        if applies(exp, profile):
            return extrapolated_peaks(exp, profile, vocab_size=vocab, micro_batch=micro, capped=card.capped).allocated
        return step_peaks(exp, profile, vocab_size=vocab, micro_batch=micro, capped=card.capped)[0]

    return peak


def _reserve(shaped: Callable[[int], Experiment], profile: Profile, vocab: int, card: Card,
             micro: int | None) -> Callable[[int], int]:
    """The replayed reserve at a size (micro None: the size is the micro-batch), without a cap."""
    def reserve(size: int) -> int:
        return step_peaks(shaped(size), profile, vocab_size=vocab, micro_batch=micro or size, capped=card.capped)[1]

    return reserve


def _secant(reserve: Callable[[int], int], x0: int, guess: int, budget: int) -> int:
    """The guess moved to where the reserve's line through x0 and the guess reaches the budget: the reserve's waste
    grows with the size too (the logits' blocks), which the tensors' line leaves out."""
    if guess <= x0:
        return guess
    r0, r1 = reserve(x0), reserve(guess)
    slope = (r1 - r0) / (guess - x0)
    return max(1, int(guess + (budget - r1) / slope)) if slope > 0 else guess


def _affine_guess(peak: Callable[[int], int], x1: int, x2: int, room: int) -> int:
    """Where the affine line through the peaks at x1 and x2 reaches `room` (at least 1)."""
    p1, p2 = peak(x1), peak(x2)
    slope = (p2 - p1) / (x2 - x1)
    return max(1, int(x1 + (room - p1) / slope)) if slope > 0 else x2
