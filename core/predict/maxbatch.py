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
from memlab.core.predict.axis import REPLAY_MARGIN, SEQ_GRANULE, batches, longest_seq, seq_units
from memlab.core.predict.card import Card
from memlab.core.predict.fake import reads_block_graphs
from memlab.core.predict.prediction import ANALYTIC_FAMILIES, family_of, predict, with_seq_len
from memlab.core.predict.search import LIMIT, largest_near
from memlab.core.predict.trace import SearchStopped, traced_by
from memlab.core.techniques import allocator, checkpointing, torch_compile
from memlab.core.techniques.accumulation import single

NO_FORMULA_START = 16  # where the replay's search starts for a family without the analytic bound
# The most tokens a micro-batch of the estimate's search holds. A trace's cost grows with the batch where a loss is
# chunked (tiny's chunked_ce on 80 GB: an analytic max batch of 220k, 6 s a trace at 16k), and no one plans a
# micro-batch of a million tokens; where this fits, the figure is a lower bound ("at least").
SEARCH_TOKENS = 1 << 20


def search_limit(experiment: Experiment) -> int:
    """The largest micro-batch the estimate's replay asks: SEARCH_TOKENS at the experiment's sequence length."""
    return max(1, SEARCH_TOKENS // experiment.model.seq_len)


@dataclass(frozen=True)
class Replayed:
    """The allocator model over one step's fake trace: what the allocator would reserve at the estimate's micro-batch,
    and the largest micro-batch whose trace stays within the card's allocator budget."""

    micro_batch: int
    allocated_bytes: int  # tensors at their peak, in the allocator's rounded block sizes
    reserved_bytes: int  # segments at their peak (mapped pages, with expandable segments)
    budget_bytes: int  # the card less what a run holds outside the allocator (Card.budget_for)
    max_batch: int  # the largest that fits: no out of memory (with expandable segments, no allocator retry either)
    expandable_segments: bool  # the allocator mode replayed: the profile's allocator.expandable_segments
    compiled: bool = False  # the trace is compiled_trace's (Inductor's buffers), not the eager step's
    margin: float = 0.0  # the share of what the step adds to the reserve max_batch leaves free (axis.REPLAY_MARGIN)
    traced_by: str = ""  # the releases that traced the step here (traced_by): another torch's Inductor may plan other buffers
    limit: int = LIMIT  # the largest micro-batch the search asked: max_batch == limit means "at least"
    blocks: bool = False  # each block replayed as its compiled graphs (per-op checkpointing, as a GPU runs it)

    @property
    def limit_reached(self) -> bool:
        return self.max_batch >= self.limit

    @property
    def fragmentation(self) -> float:
        return 1 - self.allocated_bytes / self.reserved_bytes if self.reserved_bytes else 0.0


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
        replayed = replay_for_card(experiment, profile, card, at=at, limit=search_limit(experiment))
    except MemlabError as e:
        return MaxBatch(bound or 0, bound, None, str(e))
    if not formula:
        return MaxBatch(replayed.max_batch, None, replayed)
    plan = guarded(experiment, profile, card, replayed.max_batch) if bound else 0
    return MaxBatch(plan, bound, replayed)


def replay_for_card(experiment: Experiment, profile: Profile, card: Card, *, at: int, limit: int) -> Replayed:
    """`memlab estimate`'s allocator figures: the peaks at micro-batch `at` and the largest micro-batch that fits
    (axis: searched from `at`, up to `limit`). A step fake tensors cannot run is refused (a MemlabError) rather
    than answered wrong."""
    vocab, _ = analytic.vocab_for(experiment)
    axis = batches(experiment, profile, vocab, card)
    try:
        allocated, reserved = axis.peaks(at)
        best = axis.largest(at, limit, allocated / reserved)
    except MemlabError:
        raise
    except Exception as e:  # noqa: BLE001 (an op without a fake implementation: the estimate stands without the replay)
        first = str(e).splitlines()[0] if str(e) else ""
        raise MemlabError(f"the step could not be traced on fake tensors ({e.__class__.__name__}: {first})") from None
    return Replayed(at, allocated, reserved, card.budget_for(profile), best, allocator.expandable(profile),
                    torch_compile.compiles(profile), REPLAY_MARGIN, traced_by(profile), limit,
                    reads_block_graphs(experiment, profile))


def guarded(experiment: Experiment, profile: Profile, card: Card, replayed: int) -> int:
    """The prediction from the replay's max batch (REPLAY_MARGIN left free): no more than the analytic figure with
    the plain fragmentation margin (predicted_max_batch says why), where the formula guards (guards)."""
    if not guards(experiment, profile):
        return replayed
    return min(analytic_bound(experiment, profile, card, pattern="plain"), replayed)


def guards(experiment: Experiment, profile: Profile) -> bool:
    """Whether the analytic formula describes the step a GPU runs, and so bounds the replay's max batch: memlab's GPT,
    but not its blocks compiled one by one (checkpointing.compiled_blocks), where the formula counts the eager per-op
    policy's tensors, which their graphs do not keep: on the H200 that guard held sac_ops 3-18% under find-batch on
    seven GPT shapes, the replay alone 1.6-4.0% (bench/results/prediction-check/sac-compiled)."""
    return family_of(experiment) in ANALYTIC_FAMILIES and not checkpointing.compiled_blocks(profile)


def predicted_max_batch(experiment: Any, profile: Any, memory_bytes: int, *, replay: bool = False,
                        capped: bool = True, should_stop: Callable[[], bool] | None = None) -> int | None:
    """The estimator's largest micro-batch as a probe runs it (accumulation 1); None when it cannot tell.

    Without `replay`: the analytic figure, whose fixed fragmentation margin depends on the profile's allocation
    pattern (analytic.FRAGMENTATION_MARGIN: 5% plain, 13% recompute, 22% offload). With `replay` (where find-batch
    and the study search on a GPU: seconds to a minute of CPU) and a step the allocator replay can run, the smaller
    of the replayed figure (axis's search: REPLAY_MARGIN of what the step adds left free) and the analytic one with the
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
    replayed = _replayed_max_batch(experiment, one, vocab, card, bound or 2 * NO_FORMULA_START, should_stop)
    return guarded(experiment, one, card, replayed) if replayed and bound else replayed or bound


def _replayed_max_batch(experiment: Any, profile: Any, vocab: int, card: Card, near: int,
                        should_stop: Callable[[], bool] | None = None) -> int | None:
    """The allocator replay's max micro-batch, searched from half of `near` (the analytic figure), None where the
    step cannot be replayed (a compiled step the Inductor reader cannot trace, such as a chunked or fused loss
    under compile; kernels.fused replays as the stock compiled step, float8 as traced with torchao
    (refused where torchao is not installed), offload and the CUDA-only libraries through
    memlab.core.predict.standins)."""
    try:
        return batches(experiment, profile, vocab, card, should_stop=should_stop).largest(max(1, near // 2), LIMIT) or None
    except SearchStopped:
        raise
    except Exception:  # noqa: BLE001 (refused or untraceable: the analytic figure stands)
        return None


def max_seq_len(experiment: Experiment, profile: Profile, card: Card, micro_batch: int, *,
                fits: Callable[[Experiment], bool], limit: int = LIMIT) -> int:
    """The longest sequence (a multiple of SEQ_GRANULE, up to `limit` and the model's positions) at which
    `fits(experiment at that length)` holds at `micro_batch`, searched from the experiment's length. 0: not even
    SEQ_GRANULE tokens fit."""
    def at(n: int) -> bool:
        return fits(with_seq_len(experiment, n * SEQ_GRANULE))

    return SEQ_GRANULE * largest_near(at, max(1, experiment.model.seq_len // SEQ_GRANULE), seq_units(experiment, limit))


def longest_sequence(experiment: Experiment, profile: Profile, card: Card, micro_batch: int, method: str = "trace") -> int:
    """The longest sequence that fits at `micro_batch`: by the trace's replayed verdict (axis.longest_seq, as `memlab
    fit` and find-batch --seq-len max search it), or the analytic bound within its fragmentation margin."""
    one = single(profile)
    if method != "analytic":
        return longest_seq(experiment, one, analytic.vocab_for(experiment)[0], card, micro_batch)
    budget = analytic.usable_bytes(card.total_bytes, profile=profile)

    def fits(exp: Experiment) -> bool:
        return predict(exp, one, micro_batch, card, method=method).allocated_bytes <= budget

    return max_seq_len(experiment, one, card, micro_batch, fits=fits)
