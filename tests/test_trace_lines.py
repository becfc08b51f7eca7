"""memlab.core.predict.trace_lines: a step's fake trace read off lines in the micro-batch, for the replay's max-batch search."""

from __future__ import annotations

import pytest

from memlab.core.predict.trace_lines import Sized, StepTraces, canonical

MIB = 2**20


def test_canonical_numbers_allocations_in_order_and_sorts_each_run_of_frees():
    events = [("alloc", 0xA0, 8, "x"), ("alloc", 0xF0, 4, "y"), ("alloc", 0xB0, 2, "z"),
              ("free", 0xB0, 0, ""), ("free", 0xA0, 0, ""), ("free", 0x99, 0, ""),  # 0x99: made before the trace
              ("alloc", 0xA0, 16, "x"), ("free", 0xF0, 0, ""), ("free", 0xA0, 0, "")]
    assert canonical(events) == [("alloc", 0, 8, "x"), ("alloc", 1, 4, "y"), ("alloc", 2, 2, "z"),
                                 ("free", None, 0, ""), ("free", 0, 0, ""), ("free", 2, 0, ""),
                                 ("alloc", 3, 16, "x"), ("free", 1, 0, ""), ("free", 3, 0, "")]


def test_a_sized_block_is_its_rules_value_and_survives_a_copy_and_a_pickle():
    import copy
    import json
    import pickle

    size = Sized(_rounded, (96,), (1000,))
    assert size == 1056 * 4 and json.dumps([size]) == "[4224]"
    for again in (copy.deepcopy(size), pickle.loads(pickle.dumps(size))):
        assert again == size and again.shape == (1000,) and again.rule is _rounded


def _rounded(unit: int, rows: int) -> int:
    return -(-rows // unit) * unit * 4  # a kernel's block, rounded up to its launch shape: not affine in rows


def _step(b: int, staging_from: int = 0) -> list[tuple]:
    """A made-up step: weights, activations of 3 MiB + 1 KiB a sample, a staging block by rule, freed in an order
    that changes from trace to trace (as storages dying together do); above `staging_from`, one block more."""
    acts = [("alloc", 1000 + b + i, 3 * MIB * b + 1024 * b + i, "act") for i in range(3)]
    extra = [("alloc", 7, 4096, "staging"), ("free", 7, 0, "")] if staging_from and b > staging_from else []
    frees = [("free", 1000 + b + i, 0, "") for i in ((0, 1, 2) if b % 2 else (2, 0, 1))]
    return [("alloc", 1, 64 * MIB, "weights"), *acts, ("alloc", 9, Sized(_rounded, (96,), (b * 100,)), "rule"),
            ("free", 9, 0, ""), *extra, *frees]


def test_lines_through_three_traces_give_every_other_without_tracing_it():
    asked = []
    traces = StepTraces(lambda b: asked.append(b) or _step(b))
    for b in (4, 8, 16):
        traces.at(b)
    assert traces.fitted and asked == [4, 8, 16]
    for b in (1, 5, 37, 100_001):
        assert traces.at(b) == canonical(_step(b))  # the rule's rounding included, at sizes it was not fitted on
    assert asked == [4, 8, 16]


def test_a_step_whose_events_change_with_the_batch_is_traced_until_three_agree():
    traces = StepTraces(lambda b: _step(b, staging_from=10))
    for b in (4, 8, 16):
        traces.at(b)
    assert not traces.fitted  # 16 has the staging block, 4 and 8 do not
    for b in (32, 64):
        traces.at(b)
    assert traces.fitted and traces.at(1000) == canonical(_step(1000, staging_from=10))


def test_lines_that_fail_where_the_search_ended_are_dropped_and_fitted_again_above():
    traces = StepTraces(lambda b: _step(b, staging_from=100))
    for b in (4, 8, 16):
        traces.at(b)
    assert traces.fitted and traces.at(500) != canonical(_step(500, staging_from=100))  # the lines miss the block
    assert not traces.lines_hold([500, 501])
    assert not traces.fitted
    traces.at(502)  # the three largest traced (500, 501, 502) all have it: lines again, right this time
    assert traces.fitted and traces.lines_hold([900, 901])


@pytest.mark.parametrize("profile, gib", [("baseline", 0.5), ("compile", 2.0)])
@pytest.mark.slow
def test_the_replayed_max_batch_is_the_same_off_lines_as_traced_at_every_batch(profile, gib, monkeypatch):
    """The search's answer does not depend on where its traces came from: the tiny experiment, eager (its staging
    buffers and the embedding backward's blocks by rule, Sized) and compiled, under a budget, with find-batch's margin."""
    from memlab.core.predict import trace as allocation_trace, trace_lines
    from memlab.core.config import load_experiment, load_profile

    experiment, args = load_experiment("tiny"), dict(vocab_size=512, budget_bytes=int(gib * 2**30), start=32, margin=0.03)
    traced: list[int] = []
    real_trace = allocation_trace.step_trace
    monkeypatch.setattr(allocation_trace, "step_trace", lambda *a, micro_batch, **k: traced.append(micro_batch) or
                        real_trace(*a, micro_batch=micro_batch, **k))
    off_lines = allocation_trace.replayed_max_batch(experiment, load_profile(profile), **args)
    asked_off_lines = len(traced)
    monkeypatch.setattr(trace_lines.StepTraces, "fit", lambda self, batches: False)
    traced.clear()
    assert allocation_trace.replayed_max_batch(experiment, load_profile(profile), **args) == off_lines > 0
    assert asked_off_lines < len(traced) / 2, (asked_off_lines, len(traced))
