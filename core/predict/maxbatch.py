"""The largest micro-batch (and the longest sequence) a profile fits on a card, predicted: the one figure to plan
for, never above what fits (the allocator replay's under the analytic guard where the step can be replayed), and
the other figures named for what they are."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable

from memlab.core.config import Experiment, Profile
from memlab.core.errors import MemlabError
from memlab.core.predict import analytic, cache
from memlab.core.predict.card import Card
from memlab.core.predict.prediction import ANALYTIC_FAMILIES, family_of, max_positions, predict, with_seq_len
from memlab.core.predict.search import LIMIT, largest_multiple
from memlab.core.predict.trace import Replayed, SearchStopped, replay_for_card, replayed_max_batch
from memlab.core.techniques.accumulation import single

# The share of what a step adds to the built model's reserve that the replayed max batch leaves free
# (trace.trace_fits). At the batches find-batch found, the replay reserved up to 1.9% less than the H100
# (act_offload on the wide held-out shape, 22.22 for 22.64 GiB at 136, every tensor right:
# bench/results/prediction-check/heldout-3/), enough to put its figure one to three above.
REPLAY_MARGIN = 0.03
SEQ_GRANULE = 64  # sequence lengths are searched in multiples of this (attention kernels tile by 64 or 128)
NO_FORMULA_START = 16  # where the replay's search starts for a family without the analytic bound
# The most tokens a micro-batch of the estimate's search holds. A trace's cost grows with the batch where a loss is
# chunked (tiny's chunked_ce on 80 GB: an analytic max batch of 220k, 6 s a trace at 16k), and no one plans a
# micro-batch of a million tokens; where this fits, the figure is a lower bound ("at least").
SEARCH_TOKENS = 1 << 20


def search_limit(experiment: Experiment) -> int:
    """The largest micro-batch the estimate's replay asks: SEARCH_TOKENS at the experiment's sequence length."""
    return max(1, SEARCH_TOKENS // experiment.model.seq_len)


@dataclass(frozen=True)
class MaxBatch:
    """`max_batch` is the one to plan for; `analytic_bound` (tensors and a fragmentation margin, an upper estimate)
    and `replayed` (the allocator replay's own search) are what it was taken from."""

    max_batch: int  # 0: not even micro-batch 1 fits
    analytic_bound: int | None  # None: no analytic formula for this model family
    replayed: Replayed | None = None
    not_replayed: str = ""  # why there is no replay ('' when there is one, or none was asked)

    @property
    def at_least(self) -> bool:
        """The replay's search stopped at its limit with room to spare: max_batch is a lower bound."""
        return self.replayed is not None and self.replayed.limit_reached and self.max_batch == self.replayed.max_batch


def analytic_bound(experiment: Experiment, profile: Profile, card: Card, *, world_size: int = 1,
                   pattern: str | None = None) -> int:
    vocab, _ = analytic.vocab_for(experiment)
    return analytic.predict_max_batch(experiment, profile, vocab_size=vocab, memory_bytes=card.total_bytes,
                                      world_size=world_size, pattern=pattern)


def max_batch(experiment: Experiment, profile: Profile, card: Card, *, replay: bool, world_size: int = 1,
              at: int = 1) -> MaxBatch:
    """`memlab estimate`'s figures: the analytic bound, and with `replay` the allocator replay over the fake trace
    (`at`: the micro-batch whose reserve it also reports; without the formula the search starts there, from the
    trace the estimate made already), the smaller under the plain-margin guard (guarded). A
    family without the formula has the replay's figure alone (always replayed). A replayed answer is kept in the
    prediction cache (a search traces the step several times: a minute for an 8B model)."""
    asked = f"max_batch replay={replay} limit={search_limit(experiment)}"  # what the search was asked, beside the step's key
    name = cache.key(experiment, profile, at, dataclasses.asdict(card), asked, world_size)
    known = cache.read(name)
    if known is not None:
        return MaxBatch(**(known | {"replayed": Replayed(**known["replayed"]) if known["replayed"] else None}))
    found = _max_batch(experiment, profile, card, replay=replay, world_size=world_size, at=at)
    if found.replayed is not None:
        cache.write(name, dataclasses.asdict(found))
    return found


def _max_batch(experiment: Experiment, profile: Profile, card: Card, *, replay: bool, world_size: int, at: int) -> MaxBatch:
    formula = family_of(experiment) in ANALYTIC_FAMILIES
    bound = analytic_bound(experiment, profile, card, world_size=world_size) if formula else None
    if not replay and formula:
        return MaxBatch(bound, bound)
    try:
        replayed = replay_for_card(experiment, profile, vocab_size=analytic.vocab_for(experiment)[0], micro_batch=at,
                                   memory_bytes=card.total_bytes, start=max(1, bound or at),
                                   margin=REPLAY_MARGIN, capped=card.capped, limit=search_limit(experiment))
    except MemlabError as e:
        return MaxBatch(bound or 0, bound, None, str(e))
    if not formula:
        return MaxBatch(replayed.max_batch, None, replayed)
    plan = guarded(experiment, profile, card, replayed.max_batch) if bound else 0
    return MaxBatch(plan, bound, replayed)


def guarded(experiment: Experiment, profile: Profile, card: Card, replayed: int) -> int:
    """The prediction from the replay's max batch (REPLAY_MARGIN left free): no more than the analytic figure with
    the plain fragmentation margin (predicted_max_batch says why)."""
    return min(analytic_bound(experiment, profile, card, pattern="plain"), replayed)


def predicted_max_batch(experiment: Any, profile: Any, memory_bytes: int, *, replay: bool = False,
                        capped: bool = True, should_stop: Callable[[], bool] | None = None) -> int | None:
    """The estimator's largest micro-batch as a probe runs it (accumulation 1); None when it cannot tell.

    Without `replay`: the analytic figure, whose fixed fragmentation margin depends on the profile's allocation
    pattern (analytic.FRAGMENTATION_MARGIN: 5% plain, 13% recompute, 22% offload). With `replay` (where find-batch
    and the study search on a GPU: seconds to a minute of CPU) and a step the allocator replay can run, the smaller
    of the replayed figure (stepped down to leave REPLAY_MARGIN of the budget free) and the analytic one with the
    plain margin only. The replay lays out the step's own blocks, so it models the fragmentation the larger margins
    stood in for (those held the deep shape's leanest 13% below the batch found); the analytic bound stays as a
    guard for what the replay misses in the tensors themselves (the deep shape's liger_ce: replayed 42, found 41,
    analytic 40). The analytic figure alone overshoots where large transient blocks fragment the reserve more than
    its margin allows (the seed shape's bf16 under a 24 GiB card: 146 against find-batch's 102; replayed, 100).
    `capped`: the probes run under --gpu-memory's cap, whose measurement allocates before the model (False for a
    search on the card's own memory). `should_stop`: asked between the replay's traces and within them;
    SearchStopped when it says so."""
    card = Card(memory_bytes, None, "", capped=capped)
    one = single(profile)
    formula = family_of(experiment) in ANALYTIC_FAMILIES
    try:
        bound = analytic_bound(experiment, one, card) or None if formula else None
        vocab, _ = analytic.vocab_for(experiment)
    except Exception:  # noqa: BLE001 (a prediction is a hint: the search runs without one)
        return None
    if not replay or (bound is None and formula):
        return bound
    replayed = _replayed_max_batch(experiment, one, vocab, card.budget_bytes, bound or 2 * NO_FORMULA_START, card.capped,
                                   should_stop)
    return guarded(experiment, one, card, replayed) if replayed and bound else replayed or bound


def _replayed_max_batch(experiment: Any, profile: Any, vocab: int, budget_bytes: int, near: int, capped: bool,
                        should_stop: Callable[[], bool] | None = None) -> int | None:
    """The allocator replay's max micro-batch, None where the step cannot be replayed (a compiled step the
    Inductor reader cannot trace, such as a chunked or fused loss under compile; kernels.fused replays as the stock
    compiled step, float8 as traced with torchao (trace.float8_peaks where torchao is not installed), offload and
    the CUDA-only libraries through memlab.core.predict.standins)."""
    try:  # from half the analytic figure `near`, with the replay's margin (bench/trace_lines_check.py asks the same)
        return replayed_max_batch(experiment, profile, vocab_size=vocab, budget_bytes=budget_bytes, start=max(1, near // 2),
                                  margin=REPLAY_MARGIN, capped=capped, should_stop=should_stop) or None
    except SearchStopped:
        raise
    except Exception:  # noqa: BLE001 (refused or untraceable: the analytic figure stands)
        return None


def max_seq_len(experiment: Experiment, profile: Profile, card: Card, micro_batch: int, *,
                fits: Callable[[Experiment], bool], limit: int = LIMIT) -> int:
    """The longest sequence (a multiple of SEQ_GRANULE, up to `limit` and the model's positions) at which
    `fits(experiment at that length)` holds at `micro_batch`: grow then bisect, as for the batch. 0: not even
    SEQ_GRANULE tokens fit."""
    positions = max_positions(experiment)
    limit = min(limit, positions) if positions else limit

    def at(T: int) -> bool:
        return fits(with_seq_len(experiment, T))

    return largest_multiple(at, SEQ_GRANULE, max(SEQ_GRANULE, experiment.model.seq_len), limit)


def longest_sequence(experiment: Experiment, profile: Profile, card: Card, micro_batch: int, method: str) -> int:
    """max_seq_len with predict's own verdict: the analytic bound within its fragmentation margin, or the trace's
    replayed reserve within the allocator budget (a trace for every length asked: seconds each)."""
    budget = analytic.usable_bytes(card.total_bytes, profile=profile)

    def fits(exp: Experiment) -> bool:
        got = predict(exp, profile, micro_batch, card, method=method)
        return got.allocated_bytes <= budget if method == "analytic" else got.fits

    return max_seq_len(experiment, profile, card, micro_batch, fits=fits)
