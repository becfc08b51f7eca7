"""What fits on a card, per profile: the predicted peak at the experiment's micro-batch and sequence, the largest
micro-batch at that sequence, and the longest sequence at micro-batch 1 (`memlab fit`).

"Fits" is the allocator replay's verdict (memlab.core.predict.trace.trace_fits): the step's fake trace, replayed
through CUDA's caching allocator, stays within the card's allocator budget (the card less the CUDA context,
libraries and driver reserve) with REPLAY_MARGIN of what the step adds to the built model's reserve left free,
without an allocator retry; the answer's next smaller size must fit
too. A search starts from a guess: the step's tensors are affine in the micro-batch and, with a fused attention
kernel, in the sequence, so two traces put the tensors' peak against the budget times the share of the reserve the
tensors held at the experiment's own shape; traces then search from there (largest_near). A deep model's trace is
made from five of its blocks (memlab.core.predict.deepen): an 8B model's in about a second.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass
from typing import Any, Callable

from memlab.core.config import Experiment, Profile
from memlab.core.errors import MemlabError
from memlab.core.models import family
from memlab.core.predict import analytic, cache
from memlab.core.predict.card import Card
from memlab.core.predict.maxbatch import REPLAY_MARGIN, SEQ_GRANULE
from memlab.core.predict.prediction import max_positions, weights_bytes, with_seq_len
from memlab.core.predict.allocator import replay
from memlab.core.predict.search import LIMIT, largest_near
from memlab.core.predict.trace import deep_trace, float8_untraced, step_peaks, step_trace, trace_fits
from memlab.core.techniques import accumulation, allocator, distributed, finetune

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
    trainable_params: int = 0  # what the optimizer updates (finetune.trainable_params, on the model's skeleton)
    note: str = ""  # why a row was not searched (its figures stay 0: nothing fits)
    error: str = ""

    @property
    def fits(self) -> bool:
        return not self.error and 0 < self.reserved_bytes <= self.budget_bytes


def fit(experiment: Experiment, profile: Profile, card: Card) -> Fit:
    """The predicted row for `profile` (one process; accumulation 1: each figure is one micro-batch's step), from the
    prediction cache where this shape was fitted before on these releases (memlab.core.predict.cache)."""
    known = kept(experiment, profile, card)
    if known is not None:
        return known
    row = _fitted(experiment, profile, card, _micro(experiment, profile))
    if not row.error:
        cache.write(_key(experiment, profile, card), dataclasses.asdict(row))
    return row


def kept(experiment: Experiment, profile: Profile, card: Card) -> Fit | None:
    """The row from the prediction cache, or None where this shape was not fitted on these releases."""
    known = cache.read(_key(experiment, profile, card))
    return Fit(**known) if known is not None else None


def _micro(experiment: Experiment, profile: Profile) -> int:
    return max(1, accumulation.micro_batch(experiment, profile, 1))


def _key(experiment: Experiment, profile: Profile, card: Card) -> str:
    card_key = dataclasses.asdict(card) | {"budget": card.budget_bytes}
    return cache.key(experiment, profile, _micro(experiment, profile), card_key, "fit", 1)


def _fitted(experiment: Experiment, profile: Profile, card: Card, micro: int) -> Fit:
    one = accumulation.single(profile)
    vocab, _ = analytic.vocab_for(experiment)
    row = Fit(profile.name, micro, experiment.model.seq_len, budget_bytes=card.budget_bytes,
              trainable_params=_trainable(experiment, profile, vocab))
    weights = weights_bytes(experiment, one)
    if not _searches(weights, one, card):
        return _weights_over_budget(experiment, one, vocab, card, row, weights)
    traces: dict[tuple[int, int], list] = {}  # (sequence, micro-batch): the two axes meet at the experiment's shape
    batches = _Axis(lambda b: (experiment, b), one, vocab, card, traces)
    try:
        allocated, reserved = batches.peaks(micro)
    except MemlabError as e:
        return dataclasses.replace(row, error=str(e))
    except Exception as e:  # noqa: BLE001 (an op without a fake implementation: this row says so, the others go on)
        return dataclasses.replace(row, error=f"not traced ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})")
    row = dataclasses.replace(row, allocated_bytes=allocated, reserved_bytes=reserved)
    share = allocated / reserved  # of the reserve, what tensors hold at the experiment's shape
    return dataclasses.replace(row, max_batch=batches.largest(micro, share, LIMIT),
                               longest_seq=_longest(experiment, one, vocab, card, 1, share, traces))


def searched(experiment: Experiment, profile: Profile, card: Card) -> bool:
    """Whether the row searches its sizes: not where the weights alone exceed the card (one trace, seconds)."""
    one = accumulation.single(profile)
    return _searches(weights_bytes(experiment, one), one, card)


def _searches(weights: int | None, one: Profile, card: Card) -> bool:
    return weights is None or weights <= card.budget_bytes or distributed.shards_weights(one)


def _weights_over_budget(experiment: Experiment, one: Profile, vocab: int, card: Card, row: Fit, weights: int) -> Fit:
    """Not even the weights fit (full training of an 8B model on a 24 GiB card): nothing is searched. The peak
    columns come from the step's trace where it is made from a few blocks (deep_trace: seconds), not traced whole."""
    note = f"the weights alone need {weights / 2**30:.1f} GiB"
    try:
        made = deep_trace(experiment, one, vocab_size=vocab, micro_batch=row.micro_batch, capped=card.capped)
    except Exception:  # noqa: BLE001 (a step fake tensors cannot run here: the row keeps its note, the others go on)
        made = None
    if made is None:
        return dataclasses.replace(row, note=note)
    at = replay(made, expandable=allocator.expandable(one))
    return dataclasses.replace(row, allocated_bytes=at.peak_allocated, reserved_bytes=at.peak_reserved, note=note)


def _trainable(experiment: Experiment, profile: Profile, vocab: int) -> int:
    shaped = copy.deepcopy(experiment)
    shaped.model.vocab_size = vocab  # the gpt family's skeleton takes its head from here
    return finetune.trainable_params(family.shared_skeleton(shaped), profile)


def longest_sequence(experiment: Experiment, profile: Profile, card: Card, micro: int) -> int:
    """The longest sequence (a multiple of SEQ_GRANULE) that fits at micro-batch `micro`, searched as fit searches
    it: find-batch --seq-len max starts its probes here."""
    return _longest(experiment, accumulation.single(profile), analytic.vocab_for(experiment)[0], card, micro, None)


def _longest(experiment: Experiment, one: Profile, vocab: int, card: Card, micro: int, share: float | None,
             traces: dict[tuple[int, int], list] | None = None) -> int:
    """The sequence axis's search from the experiment's length; `share` (None: read at that length) guides the guess.
    `traces`: the batch axis's, by (sequence, micro-batch), so a shape both axes reach is traced once."""
    lengths = _Axis(lambda n: (with_seq_len(experiment, n * SEQ_GRANULE), micro), one, vocab, card, traces)
    n0 = max(1, experiment.model.seq_len // SEQ_GRANULE)
    if share is None:
        allocated, reserved = lengths.peaks(n0)
        share = allocated / reserved
    limit = min(LIMIT, max_positions(experiment) or LIMIT) // SEQ_GRANULE
    return SEQ_GRANULE * lengths.largest(n0, share, limit)


class _Axis:
    """One axis of the search (the micro-batch, or the sequence in units of SEQ_GRANULE): each size's step traced
    once, its peaks and its verdict under the budget both replayed from that trace."""

    def __init__(self, shaped: Callable[[int], tuple[Experiment, int]], profile: Profile, vocab: int,
                 card: Card, traces: dict[tuple[int, int], list] | None = None) -> None:
        self.shaped, self.profile, self.vocab, self.card = shaped, profile, vocab, card
        self.budget = card.budget_bytes
        self.room = int(card.budget_bytes * (1 - REPLAY_MARGIN))  # float8's untraced verdict (peaks against it)
        self._traces = traces if traces is not None else {}  # by (sequence, micro-batch)
        self._replays: dict[int, Any] = {}  # this axis's replays of those traces, by size

    def trace(self, size: int) -> list:
        exp, micro = self.shaped(size)
        shape = (exp.model.seq_len, micro)
        if shape not in self._traces:
            self._traces[shape] = step_trace(exp, self.profile, vocab_size=self.vocab, micro_batch=micro,
                                             capped=self.card.capped)
        return self._traces[shape]

    def replayed(self, size: int) -> Any:
        if size not in self._replays:
            self._replays[size] = replay(self.trace(size), expandable=allocator.expandable(self.profile))
        return self._replays[size]

    def peaks(self, size: int) -> tuple[int, int]:
        if float8_untraced(self.profile):
            exp, micro = self.shaped(size)
            return step_peaks(exp, self.profile, vocab_size=self.vocab, micro_batch=micro, capped=self.card.capped)
        at = self.replayed(size)
        return at.peak_allocated, at.peak_reserved

    def verdict_room(self, size: int) -> int:
        """The reserve trace_fits lets a step reach: the budget less REPLAY_MARGIN of what the step adds to the built
        model's reserve (read at `size`: the build does not change with it). Guesses aimed at the card's margin
        instead landed short: Llama-3.1-8B's lora_gradcp, whose 15 GiB base is laid out exactly, guessed 2816 tokens
        for 3008, and the search spent three more traces (11 s each) climbing."""
        if float8_untraced(self.profile):
            return self.room
        built = self.replayed(size).steps_reserved
        return int((self.budget + REPLAY_MARGIN * built) / (1 + REPLAY_MARGIN))

    def fits(self, size: int) -> bool:
        if float8_untraced(self.profile):
            return self.peaks(size)[1] <= self.room
        return trace_fits(self.trace(size), self.budget, allocator.expandable(self.profile), REPLAY_MARGIN)

    def largest(self, x0: int, share: float, limit: int) -> int:
        """The largest size that fits, searched from a guess: the tensors' line through x0 and 2 x0 against the
        budget times `share`, moved along the reserve's line through x0 and that guess (the reserve's waste grows
        with the size too: the logits' blocks)."""
        room = self.verdict_room(x0)
        guess = min(_affine_guess(lambda x: self.peaks(x)[0], x0, 2 * x0, int(room * share)), limit)
        if guess > x0:
            guess = min(_affine_guess(lambda x: self.peaks(x)[1], x0, guess, room), limit)
        return largest_near(self.fits, guess, limit, confirm=1)


def _affine_guess(peak: Callable[[int], int], x1: int, x2: int, room: int) -> int:
    """Where the affine line through the peaks at x1 and x2 reaches `room` (at least 1; x2 where it does not rise)."""
    p1, p2 = peak(x1), peak(x2)
    slope = (p2 - p1) / (x2 - x1)
    return max(1, int(x1 + (room - p1) / slope)) if slope > 0 else x2
