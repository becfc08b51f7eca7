"""What fits on a card, per profile: the predicted peak at the experiment's micro-batch and sequence, the largest
micro-batch at that sequence, and the longest sequence at micro-batch 1 (`memlab fit`).

"Fits" and the search are memlab.core.predict.axis's, from the experiment's own shape; the two axes share their
traces. A deep model's trace is made from five of its blocks (memlab.core.predict.deepen): an 8B model's in about a
second.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass

from memlab.core.config import Experiment, Profile
from memlab.core.errors import MemlabError
from memlab.core.models import family
from memlab.core.predict import analytic, cache
from memlab.core.predict.card import Card
from memlab.core.predict.axis import batches, longest_seq
from memlab.core.predict.prediction import weights_bytes
from memlab.core.predict.allocator import replay
from memlab.core.predict.search import LIMIT
from memlab.core.predict.trace import deep_trace
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
    row = Fit(profile.name, micro, experiment.model.seq_len, budget_bytes=card.budget_for(profile),
              trainable_params=_trainable(experiment, profile, vocab))
    weights = weights_bytes(experiment, one)
    if not _searches(weights, one, card):
        return _weights_over_budget(experiment, one, vocab, card, row, weights)
    traces: dict[tuple[int, int], list] = {}  # (sequence, micro-batch): the two axes meet at the experiment's shape
    axis = batches(experiment, one, vocab, card, traces)
    try:
        allocated, reserved = axis.peaks(micro)
    except MemlabError as e:
        return dataclasses.replace(row, error=str(e))
    except Exception as e:  # noqa: BLE001 (an op without a fake implementation: this row says so, the others go on)
        return dataclasses.replace(row, error=f"not traced ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})")
    row = dataclasses.replace(row, allocated_bytes=allocated, reserved_bytes=reserved)
    share = allocated / reserved  # of the reserve, what tensors hold at the experiment's shape
    return dataclasses.replace(row, max_batch=axis.largest(micro, LIMIT, share),
                               longest_seq=longest_seq(experiment, one, vocab, card, 1, share, traces))


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
