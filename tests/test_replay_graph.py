"""The allocator replay of a step captured as a CUDA graph (cuda_graph.enabled): the graph's private pool beside
the general one (memlab.core.predict.allocator.GraphedAllocator), the traced step (two launched steps, then the
captured one), and a graphed step replayed against the H100 (bench/results/graph-step-h100/NOTE.md, its 3-seed part)."""

from __future__ import annotations

import pytest

from memlab.core.predict.allocator import CAPTURE, GraphedAllocator, OutOfMemory, replay

MIB = 2**20
GIB = 2**30


def test_the_capture_empties_the_general_cache_and_the_graph_keeps_a_pool_of_its_own():
    events = [("alloc", "weights", 40 * MIB), ("alloc", "step 1", 100 * MIB), ("free", "step 1", 0),
              (CAPTURE, None, 0),  # the cached 100 MiB segment goes back to the device
              ("alloc", "graph a", 60 * MIB), ("free", "graph a", 0), ("alloc", "graph b", 50 * MIB)]
    m = replay(events)
    assert isinstance(m, GraphedAllocator)
    assert m.main.reserved == 40 * MIB and m.graph.reserved == 60 * MIB  # b reused a's block, in the graph's pool
    assert m.reserved == 100 * MIB and m.peak_reserved == 140 * MIB  # the launched step's peak came first
    assert m.allocated == 90 * MIB


def test_a_tensor_made_before_the_capture_is_freed_into_the_general_pool_which_the_graph_cannot_use():
    events = [("alloc", "weights", 40 * MIB), ("alloc", "grad", 30 * MIB), (CAPTURE, None, 0),
              ("free", "grad", 0), ("alloc", "graph a", 30 * MIB)]
    m = replay(events)
    assert m.main.allocated == 40 * MIB and m.graph.allocated == 30 * MIB
    assert m.reserved == 40 * MIB + 30 * MIB + 30 * MIB  # the freed 30 MiB stays cached in the general pool


def test_under_a_cap_the_graph_gets_what_the_general_pool_does_not_hold():
    events = [("alloc", "weights", 60 * MIB), (CAPTURE, None, 0), ("alloc", "graph a", 50 * MIB)]
    replay(events, cap=110 * MIB)
    with pytest.raises(OutOfMemory):
        replay(events, cap=100 * MIB)


def test_the_traced_graphed_step_is_two_launched_steps_then_a_capture_with_its_own_workspaces():
    from memlab.core.predict.trace import step_trace
    from memlab.core.config import load_experiment, load_profile

    profile = load_profile("bf16")
    profile.cuda_graph.enabled = True
    events = step_trace(load_experiment("tiny"), profile, vocab_size=512, micro_batch=2)
    captures = [i for i, e in enumerate(events) if e[0] == CAPTURE]
    assert len(captures) == 1
    workspaces = [i for i, e in enumerate(events) if e[0] == "alloc" and str(e[1]).startswith("cublas workspace")]
    after = [i for i in workspaces if i > captures[0]]
    assert len(after) == len(workspaces) - len(after) >= 1  # each thread's workspace again, on the capture's stream


def test_a_graphed_bf16_step_replays_what_the_h100_reserved():
    """gpt2s bf16 with cuda_graph at micro-batch 21 under a 12 GiB card: the H100 reserved 10.67 GiB (find-batch's
    probe 4, bench/results/graph-step-h100/NOTE.md, its 3-seed part). Seen while the model was written (its
    workspaces on the capture's stream were added to close a 0.05 GiB gap): not held out."""
    from memlab.core.predict.trace import step_trace
    from memlab.core.config import load_experiment, load_profile

    profile = load_profile("bf16")
    profile.cuda_graph.enabled = True
    m = replay(step_trace(load_experiment("gpt2s"), profile, vocab_size=8192, micro_batch=21))
    assert m.peak_reserved / GIB == pytest.approx(10.67, rel=0.01)


def test_kernels_fused_replays_as_the_stock_compiled_model_and_other_profiles_as_they_are():
    from memlab.core.config import load_profile
    from memlab.core.predict.standins import compiled_standin

    fastest = load_profile("fastest")
    stand_in = compiled_standin(fastest)
    assert fastest.kernels.fused and not stand_in.kernels.fused
    assert stand_in.cuda_graph.enabled and stand_in.compile.enabled and stand_in.attention == fastest.attention
    compile_ = load_profile("compile")
    assert compiled_standin(compile_) is compile_
