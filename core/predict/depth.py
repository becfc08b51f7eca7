"""A deep model's step peaks from two shallow traces. A decoder stack repeats one block, so each phase's peak of a
step (forward, backward, optimizer, of each micro-batch) is affine in the number of blocks: the weights, gradients,
optimizer state and saved activations of each block add the same bytes. Tracing the step at SHALLOW depths and
extrapolating each phase's peak to the model's depth costs a few blocks' tracing instead of all of them (an 8B
model's 32: seconds, not minutes). The phases are extrapolated apart because the phase that peaks can change with
depth: Llama-3.2-1B under gradcp_bf16 peaks at the loss with 2 or 4 blocks and in the optimizer's step with 16.

Only the tensors' peak: the allocator's reserve is not affine in depth (which freed blocks a request reuses depends
on the whole order; on Llama-3.2-1B a ratio or a waste taken from the shallow traces was 12% off either way), so
memlab.core.predict.fit takes its guesses from here and every verdict from a full trace.
"""

from __future__ import annotations

import dataclasses

from memlab.core.config import Experiment, Profile
from memlab.core.predict.allocator import PHASE, Allocator, ExpandableAllocator, replayed
from memlab.core.predict.trace import fake_trace
from memlab.core.techniques import allocator, repeats_per_block

SHALLOW = (2, 4)  # two depths, both even: a model whose blocks alternate (Gemma-2's sliding and global) has whole pairs
DEEP_ENOUGH = 3 * SHALLOW[1]  # below this many blocks the full trace is cheap enough


def applies(experiment: Experiment, profile: Profile) -> bool:
    """Where extrapolating is sound: a deep stack whose step repeats block by block, as its techniques declare (not
    a compiled step, a captured one, every-n checkpointing with a period the shallow depths do not hold whole, the
    last blocks trained by freeze)."""
    return experiment.model.n_layer >= DEEP_ENOUGH and repeats_per_block(profile, SHALLOW)


def extrapolated_peak(experiment: Experiment, profile: Profile, *, vocab_size: int, micro_batch: int,
                      capped: bool) -> int:
    """The step's tensors' peak at the model's depth, each phase's peak extrapolated from the SHALLOW depths."""
    shallow = [_phase_peaks(_at_depth(experiment, n), profile, vocab_size, micro_batch, capped) for n in SHALLOW]
    (d1, d2), depth = SHALLOW, experiment.model.n_layer
    if len(shallow[0]) != len(shallow[1]):
        raise ValueError("the shallow traces have different phases")
    return max(a1 + (a2 - a1) * (depth - d1) // (d2 - d1) for a1, a2 in zip(*shallow))


def _at_depth(experiment: Experiment, n_layer: int) -> Experiment:
    return dataclasses.replace(experiment, model=dataclasses.replace(experiment.model, n_layer=n_layer))


def _phase_peaks(experiment: Experiment, profile: Profile, vocab_size: int, micro_batch: int,
                 capped: bool) -> list[int]:
    """The tensors' peak between the trace's phase marks: building the model, then each phase of two steps (the
    first is the model's construction, which the steps' peaks do not count: STEPS resets them)."""
    events = fake_trace(experiment, profile, vocab_size=vocab_size, micro_batch=micro_batch, capped=capped, phases=True)
    model = ExpandableAllocator() if allocator.expandable(profile) else Allocator()
    peaks = []
    for event in events:
        if event[0] == PHASE:
            peaks.append(model.peak_allocated)
            model.peak_allocated = model.allocated
        else:
            replayed(model, event)
    return peaks + [model.peak_allocated]
