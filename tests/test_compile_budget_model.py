"""memlab.core.predict.inductor: the step torch.compile builds under checkpointing.budget, traced on fake tensors.

Its figures against the H100 are checked in tests/test_frontier_vs_h100.py (every point of the budget sweep); here:
the replay of Inductor's wrapper code, the table of traces made ahead, and what the estimator does with a step it cannot trace.
"""

from __future__ import annotations

import json
import shutil
import textwrap

import pytest
import torch

from model_helpers import small

from memlab.core.predict import inductor as M
from memlab.core.predict import analytic as E
from memlab.core.predict.inductor import EVENTS
from memlab.core.config import load_experiment, load_profile
from memlab.core.models import family
from memlab.core.predict.trace import step_peaks


WRAPPER = textwrap.dedent("""
    def call(self, args):
        primals_1, addmm_2, view_3, tangents_1 = args
        args.clear()
        s0 = primals_1
        buf0 = empty_strided_cuda((s0, 8), (8, 1), torch.float32)
        buf1 = torch.ops.aten.foo.default(buf0)
        buf2 = buf1[0]
        del buf1
        buf3 = buf0; del buf0  # reuse
        buf4 = reinterpret_tensor(buf3, (8*s0, ), (1, ), 0)
        del addmm_2
        buf5 = empty_strided_cuda((4096, ), (1, ), torch.bfloat16)
        return (buf2, buf5, None, )
""")


def test_the_walk_follows_allocations_an_extern_kernels_items_reuses_and_views():
    """buf0, 32 bytes a sample, lives on as buf3 (a reuse) and buf4 (a view); the extern kernel's tuple holds no
    memory of its own, its first item 300 bytes (Inductor's layout for it); buf5 8 KiB; the returned names in order."""
    live = M._Live("fw")
    returned = M._walk(WRAPPER, {"buf2": M.Line(0, 300)}, live, lambda names: None)
    assert live.events == [["alloc", "fw1", M.Line(32, 0), "buf0"], ["alloc", "fw3", M.Line(0, 300), "buf2"],
                           ["alloc", "fw4", M.Line(0, 8192), "buf5"]]
    assert returned == ["buf2", "buf5", None] and live.owner["buf4"] == live.owner["buf3"] == "fw1"
    assert set(live.bytes) == {"fw1", "fw3", "fw4"}  # the tuple went at its del


def test_the_budget_peaks_are_the_events_walked_at_each_batch():
    """The forward's peak, what it keeps (all it has not freed but its output), the backward's peak from those saved
    buffers on and the gradients then: a small batch peaks at the fixed buffers, a large one at the per-sample ones."""
    forward = (("alloc", "fw1", M.Line(100, 0), "saved"), ("alloc", "fw2", M.Line(32, 0), "temporary"),
               ("alloc", "fw3", M.Line(0, 8192), "workspace"), ("free", "fw2"), ("free", "fw3"), ("alloc", "fw4", M.Line(0, 4), "loss"))
    backward = (("alloc", "bw1", M.Line(0, 300), "bias gradient"), ("alloc", "bw2", M.Line(50, 0), "temporary"),
                ("free", "fw1"), ("free", "bw2"), ("alloc", "bw3", M.Line(0, 8192), "weight gradient"))
    events = M.StepEvents(forward, backward, "fw4", (None, ("bw1", (75,)), ("bw3", (2048,))))
    assert M.peaks_of(events, 10) == M.BudgetPeaks(saved=1000, forward=1320 + 8192, backward=8492, backward_grads=8492)
    assert M.peaks_of(events, 100) == M.BudgetPeaks(saved=10000, forward=13200 + 8192, backward=15300, backward_grads=300)


def test_a_step_it_cannot_trace_keeps_the_interpolation_and_says_why():
    e = small(L=2, C=64, H=2, T=64, V=512, batch=4)
    p = load_profile("compile_budget")
    on_cpu = E.estimate(e, p, vocab_size=512, device="cpu")
    assert not any("(traced)" in name for name in on_cpu.phases)
    assert any("cannot be traced here (the cpu backend)" in n for n in on_cpu.notes)
    p.loss.chunked = True
    chunked = E.estimate(e, p, vocab_size=512)
    assert any("cannot be traced here (a chunked or fused loss)" in n for n in chunked.notes)


def test_a_traceable_step_has_a_traced_forward_and_backward():
    e = small(L=2, C=64, H=2, T=64, V=512, batch=4)  # the table of traces made ahead's first entry: nothing is traced here
    est = E.estimate(e, load_profile("compile_budget"), vocab_size=512)
    assert {"forward (traced)", "backward (traced)", "optimizer step"} == set(est.phases)
    assert any("traced (torch.compile's partitioner" in n for n in est.notes)


def test_every_seed_entry_names_a_shape_and_the_torch_that_traced_it():
    for key, trace in EVENTS.items():
        fields = json.loads(key)
        shape = M.shape_of(key)
        assert M._key(shape).replace(torch.__version__.split("+")[0], fields["torch"]) == key
        peaks = M.peaks_of(M.StepEvents.from_json(trace), shape.batch)
        assert 0 <= peaks.saved <= peaks.forward and peaks.backward_grads <= peaks.backward


def test_the_cache_folder_is_read_only_by_the_code_that_wrote_it(tmp_path, monkeypatch):
    """A trace kept by another version of memlab.core (an upgrade, an edit to the tracer) is not read: the folder's
    file is named by the source's fingerprint, which the tables made ahead do not change."""
    core = tmp_path / "core"
    shutil.copytree(M.Path(M.__file__).parents[1], core, ignore=shutil.ignore_patterns("__pycache__"))
    before = M.tracer_fingerprint(core)
    (core / "predict" / "inductor_traces.json").write_text((core / "predict" / "inductor_traces.json").read_text() + "\n")
    assert M.tracer_fingerprint.__wrapped__(core) == before
    (core / "predict" / "inductor.py").write_text((core / "predict" / "inductor.py").read_text() + "\n# edited\n")
    assert M.tracer_fingerprint.__wrapped__(core) != before

    monkeypatch.setenv("MEMLAB_CACHE", str(tmp_path / "cache"))
    key, trace = next(iter(EVENTS.items()))
    M._write_cache(key, M.StepEvents.from_json(trace))
    assert M._read_cache() == {key: trace} and M._cache_file().name == f"compile-events-{M.tracer_fingerprint()}.json"
    monkeypatch.setattr(M, "tracer_fingerprint", lambda: "another-code")
    assert M._read_cache() == {}


@pytest.mark.slow
def test_the_inductor_reader_reads_this_torchs_wrapper_code(monkeypatch):
    """The canary, and the whole path (torch.compile stopped at the partition, Inductor's wrapper code for CUDA, the
    walk) in one child process: the smallest step's events traced ahead, traced again, and a one-layer transformers
    Llama's compiled step, full and LoRA. This torch's real wrapper code is read line by line, so a
    release that changes its format fails loudly (WrapperFormatChanged names the line); under the release the tables
    were traced with, both equal them to the byte. The Llama's graphs return one gradient per parameter, its tied
    head's included, and replayed in its step they keep less than its eager step."""
    llama, compiled = load_experiment("llama-tiny"), load_profile("compile")
    llama.model.n_layer = 1  # one decoder layer: the reader's work is per layer, the test's time is not
    vocab, _ = E.vocab_for(llama)
    llama_shape = E.compiled_graph_shape(llama, compiled, vocab)
    lora_shape = E.compiled_graph_shape(llama, load_profile("lora_fast"), vocab)
    events_key = next(iter(EVENTS))
    events, hf_events, lora_events = M.children_output([M.shape_of(events_key), llama_shape, lora_shape])
    events, hf_events = M.StepEvents.from_json(events), M.StepEvents.from_json(hf_events)
    assert any(ev[0] == "alloc" for ev in events.forward) and any(ev[0] == "alloc" for ev in events.backward)

    parameters = list(family.skeleton(llama).parameters())  # a tied head is one parameter
    assert sum(g is not None for g in hf_events.gradients) == len(parameters)
    # LoRA's graphs: a gradient for each adapter matrix (A and B on each of the layer's 7 Linears), none for the base
    lora_gradients = [g for g in M.StepEvents.from_json(lora_events).gradients if g is not None]
    assert len(lora_gradients) == 2 * 7 and {tuple(g[1]) for g in lora_gradients} >= {(16, llama.model.d_model)}
    monkeypatch.setattr(M, "step_events", lambda shape: hf_events if shape == llama_shape else pytest.fail(str(shape)))
    peak = {name: step_peaks(llama, load_profile(name), vocab_size=vocab, micro_batch=8, capped=False)[0] for name in ("compile", "bf16")}
    assert peak["compile"] < peak["bf16"]

    if json.loads(events_key)["torch"] != torch.__version__.split("+")[0]:
        pytest.skip(f"the table was traced under torch {json.loads(events_key)['torch']}, this is {torch.__version__}")
    assert events == M.StepEvents.from_json(EVENTS[events_key])


def test_a_budget_of_zero_peaks_about_as_high_as_none_and_the_middle_lowest():
    """What the H100 measured on gpt2s (6.54 GiB at budget 0, 4.43 at 0.25, 6.68 at 1), on a small model whose traces
    are traced ahead: the backward of budget 0 rebuilds the whole forward before its first gradient. (Replaces the belief
    that the peak grows with the budget from full checkpointing's, which tests/test_ckpt_frontier.py still holds.)"""
    e = small(L=4, C=128, H=4, T=256, V=512, batch=8)
    peaks = []
    for b in (0.0, 0.25, 0.5, 0.75, 1.0):
        p = load_profile("compile_budget")
        p.checkpointing.budget = b
        peaks.append(E.estimate(e, p, vocab_size=512).total_bytes)
    assert peaks[0] > 0.98 * peaks[-1]
    assert min(peaks[1:4]) < 0.9 * peaks[-1] and max(peaks[1:4]) < 0.95 * peaks[-1]


FORWARD = textwrap.dedent("""
    def call(self, args):
        primals_1, primals_2, primals_3 = args
        args.clear()
        s0 = primals_1
        buf0 = empty_strided_cuda((s0, 8), (8, 1), torch.bfloat16)
        extern_kernels.mm(primals_2, primals_3, out=buf0)
        buf1 = empty_strided_cuda((s0, 8), (8, 1), torch.float32)
        buf2 = empty_strided_cuda((), (), torch.float32)
        del buf1
        buf3 = empty_strided_cuda((64, ), (1, ), torch.float32)
        return (buf2, primals_2, buf0, reinterpret_tensor(buf0, (8, s0), (1, 8), 0), buf3, s0, )
""")
BACKWARD = textwrap.dedent("""
    def call(self, args):
        s0, primals_2, mm, permute, unused, tangents_1 = args
        args.clear()
        buf0 = mm; del mm  # reuse
        extern_kernels.mm(buf0, primals_2, out=buf0)
        buf1 = empty_strided_cuda((8, 8), (8, 1), torch.float32)
        del buf0
        buf2 = empty_strided_cuda((4, ), (1, ), torch.float32)
        del permute
        buf3 = empty_strided_cuda((8, ), (1, ), torch.float32)
        del buf3
        buf4 = buf2[0:2].view(2).sum(dim=0).view([1])
        return (None, None, buf1, reinterpret_tensor(buf2, (2, 2), (2, 1), 0), buf4, )
""")


def test_the_step_events_carry_the_saved_buffers_into_the_backward_and_keep_the_gradients():
    """The forward returns [loss, saved..., symint]: buf0 is saved twice (mm, and a view as permute), one allocation
    freed at the backward's last name for it (the reuse renames it: as a donated buffer, the gradient takes it);
    buf1 goes when the forward ends, buf3 (saved, never named by the backward) when the backward ends; the
    gradients stay, paired with the forward's parameter inputs (one made by an eager op in the wrapper, as a
    mix-order reduction's sums are), and the first matmul of each graph is marked."""
    links = M._saved_links_by_order(["primals_2", "buf0", "permute", "buf3", "s0"], symints=1,
                                    backward_inputs=["s0", "primals_2", "mm", "permute", "unused"])
    events = M._events_of((FORWARD, {}), (BACKWARD, {"buf4": M.Line(0, 4)}), links, [None, None, (8, 8), (2, 2), (1,)])
    assert events.forward == (("alloc", "fw1", M.Line(16, 0), "buf0"), ("matmul",), ("alloc", "fw2", M.Line(32, 0), "buf1"),
                              ("alloc", "fw3", M.Line(0, 4), "buf2"), ("free", "fw2"), ("alloc", "fw4", M.Line(0, 256), "buf3"))
    assert events.backward == (("matmul",), ("alloc", "bw1", M.Line(0, 256), "buf1"), ("alloc", "bw2", M.Line(0, 16), "buf2"),
                               ("free", "fw1"), ("alloc", "bw3", M.Line(0, 32), "buf3"), ("free", "bw3"),
                               ("alloc", "bw4", M.Line(0, 4), "buf4"), ("free", "fw4"))
    assert events.output == "fw3" and events.gradients == (None, None, ("bw1", (8, 8)), ("bw2", (2, 2)), ("bw4", (1,)))
    assert M.StepEvents.from_json(json.loads(json.dumps(events.to_json()))) == events


def test_the_backward_takes_the_saved_values_in_aot_autograds_order():
    # forward: [loss, a, b, s0]; backward: [s0, a, b, tangents]
    assert M._saved_links_by_order(["a", "b", "s0"], symints=1, backward_inputs=["s0", "a", "b"]) == {1: "a", 2: "b"}
    with pytest.raises(RuntimeError, match="AOTAutograd's order"):
        M._saved_links_by_order(["a", "s0"], symints=1, backward_inputs=["s0", "a", "b"])


def test_a_returned_view_is_the_buffer_it_views():
    assert M._returned_names("return (buf3, reinterpret_tensor(buf7, (s0, 64), (64, 1), 0), None, s0, )") == ["buf3", "buf7", None, "s0"]


def test_the_traces_cpu_autocast_is_what_code_asking_about_cuda_sees():
    """torchao's Float8Linear casts its input only where torch.is_autocast_enabled() (CUDA's) holds, to
    torch.get_autocast_gpu_dtype(): inside the trace it must see the CPU autocast the trace runs under, as on a GPU."""
    with M._autocast_as_on_cuda(), torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.is_autocast_enabled() and torch.get_autocast_gpu_dtype() == torch.bfloat16
    assert not torch.is_autocast_enabled()
