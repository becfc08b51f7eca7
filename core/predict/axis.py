"""The one search for what fits on a card, on traces: the largest micro-batch at a sequence length and the longest
sequence at a micro-batch, for `memlab estimate`, `memlab fit`, find-batch's first probe and the study.

"Fits" is the allocator replay's verdict (trace.trace_fits): the step's fake trace, replayed through CUDA's caching
allocator, stays within the card's allocator budget with REPLAY_MARGIN of what the step adds to the built model's
reserve left free, without an allocator retry; the sizes 1, 2, 4, ... below the answer, down to an eighth below it,
must fit too (search._confirmed: the replay's fits come in islands). A search starts from a guess: the step's
tensors are affine in the micro-batch and, with a fused attention kernel, in the sequence, so two traces put the
tensors' peak against the budget times the share of the reserve the tensors held at the starting shape; traces then
search from there (search.largest_near), each size traced once.
"""

from __future__ import annotations

from typing import Any, Callable

from memlab.core import stopping
from memlab.core.config import Experiment, Profile
from memlab.core.predict.allocator import replay
from memlab.core.predict.card import Card
from memlab.core.predict.fake import FAKE_STEP_LOCK
from memlab.core.predict.prediction import max_positions, with_seq_len
from memlab.core.predict.search import LIMIT, affine_guess, largest_near
from memlab.core.predict import trace  # step_trace through its module: benches and tests patch it there
from memlab.core.predict.trace import SearchStopped, trace_fits
from memlab.core.techniques import allocator

# The share of what a step adds to the built model's reserve that a fit leaves free (trace.trace_fits). At the
# batches find-batch found, the replay reserved up to 1.9% less than the H100 (act_offload on the wide held-out
# shape, 22.22 for 22.64 GiB at 136, every tensor right: bench/results/prediction-check/heldout-3/), enough to put
# its figure one to three above.
REPLAY_MARGIN = 0.03
SEQ_GRANULE = 64  # sequence lengths are searched in multiples of this (attention kernels tile by 64 or 128)

Traces = dict  # (sequence, micro-batch) -> a step's trace: what the two axes of one shape share


class Axis:
    """One axis of the search (the micro-batch, or the sequence in units of SEQ_GRANULE): each size's step traced
    once, its peaks and its verdict under the card's budget both replayed from that trace. `should_stop`: asked
    before each trace and within it (SearchStopped), for a study that stops while a search runs. `margin`: the
    verdict's (0: the whole budget, as bench/allocator_replay.py sets the replay beside find-batch)."""

    def __init__(self, shaped: Callable[[int], tuple[Experiment, int]], profile: Profile, vocab: int, card: Card,
                 traces: Traces | None = None, should_stop: Callable[[], bool] | None = None,
                 margin: float = REPLAY_MARGIN) -> None:
        self.shaped, self.profile, self.vocab, self.card = shaped, profile, vocab, card
        self.budget, self.margin = card.budget_for(profile), margin
        self.should_stop = should_stop
        self._traces = traces if traces is not None else {}
        self._replays: dict[int, Any] = {}  # this axis's replays of those traces, by size

    def trace(self, size: int) -> list:
        exp, micro = self.shaped(size)
        shape = (exp.model.seq_len, micro)
        if shape not in self._traces:
            self._traces[shape] = self._traced(exp, micro)
        return self._traces[shape]

    def _traced(self, exp: Experiment, micro: int) -> list:
        # asked once the lock is ours (another lane's trace may have held it for a while), then within the trace
        with FAKE_STEP_LOCK, stopping.asking(self.should_stop):
            if stopping.asked():
                raise SearchStopped(f"stopped before tracing micro-batch {micro}")
            try:
                return trace.step_trace(exp, self.profile, vocab_size=self.vocab, micro_batch=micro, capped=self.card.capped)
            except SearchStopped:
                raise
            except Exception as e:  # a stop that ended the tracing child, or raised on autograd's device thread
                if stopping.asked():
                    raise SearchStopped(f"stopped during the trace of micro-batch {micro}") from e
                raise

    def replayed(self, size: int) -> Any:
        if size not in self._replays:
            self._replays[size] = replay(self.trace(size), expandable=allocator.expandable(self.profile))
        return self._replays[size]

    def peaks(self, size: int) -> tuple[int, int]:
        """(allocated, reserved) at the step's peak."""
        at = self.replayed(size)
        return at.peak_allocated, at.peak_reserved

    def verdict_room(self, size: int) -> int:
        """The reserve trace_fits lets a step reach: the budget less REPLAY_MARGIN of what the step adds to the built
        model's reserve (read at `size`: the build does not change with it). Guesses aimed at the card's margin
        instead landed short: Llama-3.1-8B's lora_gradcp, whose 15 GiB base is laid out exactly, guessed 2816 tokens
        for 3008, and the search spent three more traces (11 s each) climbing."""
        built = self.replayed(size).steps_reserved
        return int((self.budget + self.margin * built) / (1 + self.margin))

    def fits(self, size: int) -> bool:
        return trace_fits(self.trace(size), self.budget, allocator.expandable(self.profile), self.margin)

    def largest(self, x0: int, limit: int, share: float | None = None) -> int:
        """The largest size up to `limit` that fits (0: not even 1), searched from a guess: the tensors' line through
        x0 and 2 x0 against the budget times `share` (None: the tensors' share of the reserve at x0), moved along the
        reserve's line through x0 and that guess (the reserve's waste grows with the size too: the logits' blocks)."""
        if share is None:
            allocated, reserved = self.peaks(x0)
            share = allocated / reserved
        room = self.verdict_room(x0)
        guess = min(affine_guess(lambda x: self.peaks(x)[0], x0, 2 * x0, int(room * share)), limit)
        if guess > x0:
            guess = min(affine_guess(lambda x: self.peaks(x)[1], x0, guess, room), limit)
        return largest_near(self.fits, guess, limit, confirm=True)


def batches(experiment: Experiment, profile: Profile, vocab: int, card: Card, traces: Traces | None = None,
            should_stop: Callable[[], bool] | None = None, margin: float = REPLAY_MARGIN) -> Axis:
    """The micro-batch axis at the experiment's sequence length."""
    return Axis(lambda b: (experiment, b), profile, vocab, card, traces, should_stop, margin)


def longest_seq(experiment: Experiment, profile: Profile, vocab: int, card: Card, micro: int,
                share: float | None = None, traces: Traces | None = None) -> int:
    """The longest sequence (a multiple of SEQ_GRANULE, up to the model's positions) that fits at micro-batch
    `micro`, searched from the experiment's length; `share` as for Axis.largest; `traces`: the batch axis's, so a
    shape both axes reach is traced once. 0: not even SEQ_GRANULE tokens fit."""
    lengths = Axis(lambda n: (with_seq_len(experiment, n * SEQ_GRANULE), micro), profile, vocab, card, traces)
    return SEQ_GRANULE * lengths.largest(max(1, experiment.model.seq_len // SEQ_GRANULE), seq_units(experiment), share)


def seq_units(experiment: Experiment, limit: int = LIMIT) -> int:
    """The most SEQ_GRANULE units a sequence search asks: `limit` tokens, and no more than the model's positions."""
    return min(limit, max_positions(experiment) or limit) // SEQ_GRANULE
