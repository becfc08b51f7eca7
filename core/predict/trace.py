"""One training step's allocation trace, for the allocator model (memlab.core.predict.allocator): which tensor
storages are created and freed, in order, and how large.

- `fake_trace`: the step on fake tensors (FakeTensorMode: shapes, no storage; fake.fake_step, the machinery
  of `memlab estimate --method fake`) on this machine's device. SDPA is traced as a fused GPU kernel allocates (its
  output and an fp32 log-sum-exp), not as the CPU's math path (which saves T x T); compile is left off, as the fake
  estimate does.
- `compiled_trace`: a compiled step's (compile.enabled): the same two steps on fake tensors, the model's forward and
  backward replaced by the buffers Inductor's wrapper code allocates and frees for CUDA
  (memlab.core.predict.inductor.step_events, one symbolic trace for every micro-batch). On the H100 (torch 2.11)
  the seed shape (4 x 256, T 256, V 50304) at micro-batch 64 measured 3.93 GiB reserved for `compile` and 3.63 for
  `compile_budget`; replayed, 3.94 and 3.60; find-batch under a 23.26 GiB allocator budget found 400 and 432,
  replayed 398 and 430 (the seeds' study). These figures were seen while writing this: not held out.
- `blocks_trace`: a step whose blocks a GPU compiles one by one (checkpointing.compiled_blocks: per-op checkpointing):
  fake_trace's two steps with each block's forward and backward replaced by the buffers of the block's graphs
  (inductor.step_events of one block, checkpointed and compiled as the engine does); the rest eager.
- `trace_fits`: the replay's verdict on one trace under an allocator budget, in the profile's allocator mode
  (allocator.expandable_segments): no out of memory and no allocator retry (memlab.core.predict.axis searches on it).
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import weakref
from typing import Any, Callable, Iterator

import torch
from memlab.core import attention, stopping
from memlab.core.gpu_memory import MEASURE_SIDE
from memlab.core.config import Experiment, Profile
from memlab.core.errors import ConfigError
from memlab.core.model import GPT
from memlab.core.predict import analytic as est
from memlab.core.predict import cache
from memlab.core.predict import inductor
from memlab.core.predict import standins as replay_standins
from memlab.core.predict.allocator import CAPTURE, EMPTY_CACHE, PHASE, STEPS, OutOfMemory, replay
from memlab.core.predict.cuda_temporaries import Sms, sum_staging_bytes
from memlab.core.predict.deepen import BLOCK, SHALLOW, Owners, deepened
from memlab.core.predict.fake import FAKE_STEP_LOCK, fake_runnable, fake_step, reads_block_graphs, reads_compiled_graphs
from memlab.core.predict.standins import around_graphs, compiled_standin
from memlab.core.techniques import (allocator, checkpointing, cuda_graph, float8, repeats_per_block, steps_to_steady,
                                    torch_compile)
from memlab.core.techniques.cuda_graph import WARM_STEPS
from memlab.core.dtypes import compute_dtype

Event = tuple  # (action "alloc" | "free", id, bytes, where: what allocated it, for --dump; "" for a free)
# a search's stop (memlab.core.stopping), asked by a trace in progress every STOP_EVERY ops: one trace of a
# large step takes seconds to tens of seconds, and a study's stop should not wait for it (SearchStopped from inside)
STOP_EVERY = 256
# The trace's second step: "synthesized" from the first (_next_step: half a trace's ops), or "traced" again
SECOND_STEP = "synthesized"
# A deep model's trace made from a trace of deepen.SHALLOW blocks (deep_trace), or False: traced at its own depth
DEEPEN = True


def fake_trace(experiment: Experiment, profile: Profile, *, vocab_size: int, micro_batch: int,
               gpu_kernels: bool = True, capped: bool = False) -> list[Event]:
    """Every tensor storage created and freed, in order, while the model is built and trains two steps (the first
    creates the optimizer state, as the engine's warm-up does), on fake tensors on this machine: what the allocator
    of a real run sees up to then. The step is fake.fake_step's, whose SDPA saves what a fused GPU kernel
    saves and whose dropout keeps a bool mask as CUDA's does (`gpu_kernels` False: this device's own). Raises what
    fake.fake_runnable raises for a profile that cannot run on fake tensors here."""
    return _two_steps(experiment, profile, vocab_size, micro_batch, gpu_kernels=gpu_kernels, capped=capped)


def compiled_trace(experiment: Experiment, profile: Profile, *, vocab_size: int, micro_batch: int,
                   capped: bool = False) -> list[Event]:
    """fake_trace's two steps with the model's forward and backward replaced by the compiled graphs' own buffers
    (memlab.core.predict.inductor.step_events: Inductor's wrapper code for CUDA, walked): the parameters, the
    token batches, the loss's division and gradient, the optimizer's state and step and zero_grad are the eager
    step's, on fake tensors as fake_trace records them. One symbolic trace (cached) serves every micro-batch. Raises
    a MemlabError for a compiled step the inductor reader cannot trace (analytic._untraceable says why)."""

    graphs = inductor.step_events(est.compiled_graph_shape(experiment, profile, vocab_size))
    # float8's casts and scaled matmuls are in the graphs; the eager step around them (which cannot build torchao's
    # Float8Linear on fake tensors here) has the same parameters without it
    return _two_steps(experiment, around_graphs(profile), vocab_size, micro_batch, compiled=graphs, capped=capped)


def blocks_trace(experiment: Experiment, profile: Profile, *, vocab_size: int, micro_batch: int,
                 capped: bool = False) -> list[Event]:
    """fake_trace's two steps (made deep as deep_trace makes them) with each block run as its compiled graphs: the
    buffers Inductor's wrapper code allocates and frees for one block, checkpointed in the profile's mode
    (checkpointing.compiled_blocks) and compiled as the engine compiles it on a GPU. A MemlabError where the block
    cannot be traced (analytic._untraceable says why)."""
    mode = checkpointing.compiled_blocks(profile)
    graphs = inductor.step_events(est.compiled_graph_shape(experiment, profile, vocab_size, blocks=mode))
    return deep_trace(experiment, profile, vocab_size=vocab_size, micro_batch=micro_batch, capped=capped, blocks=graphs) \
        or _two_steps(experiment, profile, vocab_size, micro_batch, capped=capped, blocks=graphs)


def deep_trace(experiment: Experiment, profile: Profile, *, vocab_size: int, micro_batch: int,
               capped: bool = False, blocks: Any = None) -> list[Event] | None:
    """fake_trace at the model's depth, made from a trace of deepen.SHALLOW blocks (memlab.core.predict.deepen: the
    first blocks and the last as traced, the middle one repeated); None where the model is too shallow to gain, a
    technique's step does not repeat block by block, or the traced blocks do not repeat as the making needs."""
    depth = experiment.model.n_layer
    if not DEEPEN or SECOND_STEP != "synthesized" or depth < 2 * SHALLOW or not repeats_per_block(profile, (SHALLOW, depth)):
        return None  # (a second step traced needs the step at its depth)
    shallow = dataclasses.replace(experiment, model=dataclasses.replace(experiment.model, n_layer=SHALLOW))
    return _two_steps(shallow, profile, vocab_size, micro_batch, capped=capped, deepen_to=depth, blocks=blocks)


def _two_steps(experiment: Experiment, profile: Profile, vocab_size: int, micro_batch: int, *, gpu_kernels: bool = True,
               compiled: Any = None, capped: bool = False, deepen_to: int = 0, blocks: Any = None) -> list[Event] | None:
    """The events of building the model and training two steps on fake tensors (fake_trace); with `compiled` (a
    compiled step's StepEvents) the compiled graphs stand in for the model's forward and backward (compiled_trace);
    with `blocks` (a block's StepEvents), for each block's (blocks_trace).
    With cuda_graph.enabled, the engine's launched steps, then a CAPTURE event and the step captured after it. With
    `capped`, first what the memory cap's measurement allocates (_memory_cap_measurement). With `deepen_to`, the first
    step made at that many blocks (deep_trace; None where it cannot be)."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    graphed = cuda_graph.captures(profile)
    steps = steps_to_steady(profile)  # the steps a run takes before each allocates as the one before
    attention_backward = attention.backward_kernel(profile)  # the attention's declaration, before the stand-ins rename the kernel
    profile, standins = replay_standins.split(profile)  # CUDA-only libraries and host copies: stand-ins, below
    profile = fake_runnable(experiment, profile, device, [])  # compile off: for a compiled step the graphs stand in
    events: list[Event] = []
    tracer = _storage_tracer(torch, events)
    tracer.sources = {} if deepen_to else None
    if capped:
        _memory_cap_measurement(tracer, events)
    construction: list[int] = []
    with FAKE_STEP_LOCK, replay_standins.swappable_fake_parameters(), _model_construction(events, construction), \
            fake_step(experiment, profile, device, vocab_size, micro_batch, tracer, gpu_kernels=gpu_kernels,
                      attention_backward=attention_backward) as (step, batch):
        if replay_standins.install(step, standins, compute_dtype(profile)):
            events.append((EMPTY_CACHE, None, 0, "torch.cuda.empty_cache() after the stand-in's own"))
        steps_at = len(events)
        events.append((STEPS, None, 0, "the steps begin: a run's meters reset the peaks"))
        if compiled is not None:
            step.train_model = _compiled_model(torch, step.model, compiled, tracer, events, micro_batch)
        if blocks is not None:
            _compiled_blocks(torch, step.model, blocks, tracer, events, micro_batch)
        params = _block_marks(step.model, events) if deepen_to else {}
        marked = (lambda name: events.append((PHASE, name, 0, ""))) if deepen_to else None  # deepen's run ends
        first = len(events)
        step.run(batch(), on_phase=marked)
        if deepen_to:
            owners = Owners(params, tracer.sources, steps_at)
            return _made_deeper(events, construction, owners, deepen_to)
        again = _next_step(events, first) if SECOND_STEP == "synthesized" and not graphed and steps == 2 else None
        if again is not None:
            events += again
        else:
            for _ in range(max(steps, WARM_STEPS if graphed else 0) - 1):
                step.run(batch(), on_phase=marked)
        if graphed:  # cuda_graph.enabled: after the launched steps, one captured into the graph's own pool
            events.append((CAPTURE, None, 0))
            tracer.workspaces.clear()  # on the capture's own stream: cuBLAS keeps a workspace per handle and stream
            step.run(batch())
    return _built_on_host(events, *construction)


def _made_deeper(events: list[Event], construction: list[int], owners: Owners, depth: int) -> list[Event] | None:
    """The shallow trace's construction and first step (deepen.BLOCK marks, the phases) at `depth` blocks, and its
    second step made from that first."""
    dropped = _construction_temporaries(events, *(construction or (0, 0)))
    index = {i: n for n, i in enumerate(i for i in range(len(events)) if i not in dropped)}
    kept = [ev for i, ev in enumerate(events) if i not in dropped]
    sources = {index[i]: keys for i, keys in owners.sources.items() if i in index}
    deep = deepened(kept, Owners(owners.params, sources, index[owners.steps_at]), depth)
    if deep is None:
        return None
    deep = [ev for ev in deep if ev[0] != PHASE]
    first = next(i for i, ev in enumerate(deep) if ev[0] == STEPS) + 1
    again = _next_step(deep, first)
    return None if again is None else deep + again


def _block_marks(model: Any, events: list[Event]) -> dict[object, int]:
    """A BLOCK mark where each block's forward begins and one where its backward begins (its output's gradient
    made); the keys of each block's parameters and buffers, by block."""
    params = {}
    for i, block in enumerate(model.blocks):
        for t in (*block.parameters(), *block.buffers()):
            params[t.untyped_storage()._cdata] = i
        block.register_forward_pre_hook(lambda module, args, i=i: events.append((BLOCK, i, 0, "")))
        block.register_forward_hook(lambda module, args, out, i=i: _mark_backward(out, events, i))
    return params


def _mark_backward(out: Any, events: list[Event], i: int) -> None:
    grown = [t for t in torch.utils._pytree.tree_leaves(out) if isinstance(t, torch.Tensor) and t.requires_grad]
    if grown:
        grown[0].register_hook(lambda grad: events.append((BLOCK, i, 0, "")))


def _next_step(events: list[Event], first: int) -> list[Event] | None:
    """The events of a second step, from the first's (events[first:]): the same ops in the same order, each block
    made and freed within the step made and freed again under a key of its own; what the first step made and kept
    (the optimizer's state, a scaler's, a kernel's workspace) not made again. None where the first step freed a
    block made before it (a lifetime across steps): then only tracing the second step tells."""
    made: dict[object, int] = {}  # a key's block made in this step and not yet freed -> its event's index in `out`
    out: list[Event] = []
    for i, ev in enumerate(events[first:]):
        if ev[0] == "alloc":
            made[ev[1]] = len(out)
            out.append(("alloc", ("again", i), *ev[2:]))
        elif ev[0] == "free":
            if ev[1] not in made:
                return None
            out.append(("free", out[made.pop(ev[1])][1], *ev[2:]))
        else:
            out.append(ev)
    kept = set(made.values())
    return [ev for j, ev in enumerate(out) if j not in kept]


def _memory_cap_measurement(tracer: Any, events: list[Event]) -> None:
    """What a run under --gpu-memory's cap (MEMLAB_GPU_MEMORY_BYTES: find-batch's and the study's probes) allocates
    before its model (gpu_memory._used_outside_allocator): a matrix, its square, the main thread's cuBLAS workspace,
    which the forward's matmuls then share, and a scalar; all but the workspace freed. The workspace then sits in a
    segment of its own, not in a freed logits segment: on the mid held-out shape the H100 reserved 20.42 GiB at
    micro-batch 27 with the cap and 22.18 without it (bench/results/replay-check-h100/)."""

    where = "the memory cap's measurement (gpu_memory._used_outside_allocator)"
    matrix = MEASURE_SIDE * MEASURE_SIDE * 4  # fp32
    events += [("alloc", "cap matrix", matrix, where), ("alloc", "cap square", matrix, where)]
    tracer.workspace("forward")
    events += [("alloc", "cap sum", 4, where), ("free", "cap square", 0, ""), ("free", "cap sum", 0, ""),
               ("free", "cap matrix", 0, "")]


@contextlib.contextmanager
def _model_construction(events: list[Event], window: list[int]) -> Iterator[None]:
    """Fills `window` with the events GPT(...) appends while it is built: [first, past the last]."""
    from unittest import mock

    init = GPT.__init__

    def watched_init(self: Any, *args: Any, **kwargs: Any) -> None:
        start = len(events)
        init(self, *args, **kwargs)
        window[:] = [start, len(events)]

    with mock.patch.object(GPT, "__init__", watched_init):
        yield


def _built_on_host(events: list[Event], start: int = 0, end: int = 0) -> list[Event]:
    """The trace less what the model's construction made and freed itself. A run builds the model on the CPU and
    moves it (TrainStep.build_model); the fake step builds it on the device, where its init's temporaries (the
    untied head's V x C weight, replaced by the embedding's) left free blocks a run never has: on the seed shape
    act_offload's backward cuBLAS workspace took one, and the replay reserved 11.02 GiB where the H100 reserved
    14.09 (the workspace pinned a freed logits segment there, as it does for bf16). What outlives the construction
    (the weights, moved) stays, as does bf16_pure's cast after it (the fp32 weights reach the device first)."""
    dropped = _construction_temporaries(events, start, end)
    return [e for i, e in enumerate(events) if i not in dropped]


def _construction_temporaries(events: list[Event], start: int, end: int) -> set[int]:
    """The indices of the events of blocks made and freed within events[start:end]."""
    made: dict[object, int] = {}
    dropped: set[int] = set()
    for i in range(start, end):
        action, ident = events[i][0], events[i][1]
        if action == "alloc":
            made[ident] = i
        elif ident in made:
            dropped |= {made.pop(ident), i}
    return dropped


def _replayer(graphs: Any, tracer: Any, events: list[Event], b: int) -> Callable[[tuple, int, str], None]:
    """replay(graph, call, phase): one run of a compiled graph's events at micro-batch b, under keys of call's own."""
    def replay(graph: tuple, call: int, phase: str) -> None:
        for ev in graph:
            if ev[0] == "alloc":
                events.append(("alloc", f"{call}:{ev[1]}", ev[2].at(b), f"compiled {phase}: {ev[3]}"))
            elif ev[0] == "free":
                events.append(("free", f"{call}:{ev[1]}", 0, ""))
            else:  # the graph's first cuBLAS matmul: its thread's workspace (eager's forward and backward threads too)
                tracer.workspace(phase)

    return replay


def _compiled_model(torch: Any, model: Any, graphs: Any, tracer: Any, events: list[Event], b: int) -> Callable:
    """model(x, y) as torch.compile runs it, on fake tensors: an autograd Function whose forward appends the
    compiled forward's events at micro-batch b and returns the loss in the loss's buffer, and whose backward appends
    the backward's and returns each parameter's gradient in its buffer (AccumulateGrad keeps it as .grad, as it
    keeps a compiled backward's output). Each call's keys are its own (accumulation runs the graphs again)."""
    params = [p for p in model.parameters() if p.requires_grad]  # a frozen base's get no gradient from the graphs
    calls = iter(range(1 << 62))
    replay = _replayer(graphs, tracer, events, b)

    class CompiledGraphs(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, call: int, *weights: Any) -> Any:
            ctx.call, ctx.like = call, [(w.shape, w.dtype, w.device) for w in weights]
            replay(graphs.forward, call, "forward")
            return _adopted(tracer, lambda: torch.zeros((), device=weights[0].device), f"{call}:{graphs.output}")

        @staticmethod
        def backward(ctx: Any, grad: Any) -> tuple:
            replay(graphs.backward, ctx.call, "backward")
            return (None, *_adopted_gradients(tracer, graphs.gradients, ctx.call, ctx.like))

    return lambda x, y: CompiledGraphs.apply(next(calls), *params)


def _compiled_blocks(torch: Any, model: Any, graphs: Any, tracer: Any, events: list[Event], b: int) -> None:
    """Each block of `model` as a GPU runs it compiled, on fake tensors: an autograd Function whose forward appends
    the block graph's forward events at micro-batch b and returns the block's output in its buffer (the shape and
    dtype of its input: the residual stream), keeping the tensors it was given (the graph saves its input, which the
    recompute starts from, and a transformers layer's rotary tables), and whose backward appends the backward's and
    returns the input's gradient and each parameter's in their buffers."""
    batch_sized = [g for g in graphs.gradients if g is not None and -1 in g[1]]
    if len(batch_sized) != 1:
        raise ConfigError("the block's compiled graphs do not return one gradient for its input; predict it without "
                          "checkpointing.mode = 'ops', or measure it with find-batch on a GPU")
    weight_gradients = tuple(g for g in graphs.gradients if g is not None and -1 not in g[1])
    calls = iter(range(1 << 62))
    replay = _replayer(graphs, tracer, events, b)

    class BlockGraphs(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, call: int, given: tuple, x: Any, *weights: Any) -> Any:
            ctx.call, ctx.like, ctx.given = call, [(w.shape, w.dtype, w.device) for w in weights], (x, *given)
            replay(graphs.forward, call, "forward")
            return _adopted(tracer, lambda: torch.empty(x.shape, dtype=x.dtype, device=x.device), f"{call}:{graphs.output}")

        @staticmethod
        def backward(ctx: Any, grad: Any) -> tuple:
            replay(graphs.backward, ctx.call, "backward")
            x = ctx.given[0]
            dx = _adopted(tracer, lambda: torch.empty(x.shape, dtype=x.dtype, device=x.device), f"{ctx.call}:{batch_sized[0][0]}")
            ctx.given = ()
            return (None, None, dx, *_adopted_gradients(tracer, weight_gradients, ctx.call, ctx.like))

    for block in model.blocks:
        params = [p for p in block.parameters() if p.requires_grad]

        def forward(*args: Any, params: list = params, **kwargs: Any) -> Any:
            x, rest = (args[0], args[1:]) if args else (kwargs["hidden_states"], ())
            given = tuple(t for t in _tensors((rest, kwargs)) if t is not x)
            return BlockGraphs.apply(next(calls), given, x, *params)

        block.forward = forward


def _tensors(tree: Any) -> list:
    """The tensors in nested tuples, lists and dicts (a block's arguments)."""
    if isinstance(tree, torch.Tensor):
        return [tree]
    if isinstance(tree, dict):
        tree = list(tree.values())
    return [t for item in tree for t in _tensors(item)] if isinstance(tree, (tuple, list)) else []


def _adopted_gradients(tracer: Any, gradients: tuple, call: int, like: list) -> list:
    keys = _gradient_keys(gradients, [shape for shape, _, _ in like])
    return [_adopted(tracer, lambda s=s, d=d, dev=dev: torch.empty(s, dtype=d, device=dev), f"{call}:{key}")
            for key, (s, d, dev) in zip(keys, like)]


def _gradient_keys(gradients: tuple, shapes: list) -> list[str]:
    """The backward's gradient buffer for each parameter, in the model's order. Which parameter is which input of the
    graph is Dynamo's choice: any gradient of the parameter's shape will do (the allocator sees the same bytes)."""
    by_shape: dict[tuple, list[str]] = {}
    for g in gradients:
        if g is not None:
            by_shape.setdefault(tuple(g[1]), []).append(g[0])
    try:
        return [by_shape[tuple(shape)].pop(0) for shape in shapes]
    except (KeyError, IndexError):
        # the graphs were traced for another model than the step built: their gradients do not map onto its parameters
        raise ConfigError("the trace of the compiled step returns no gradient for a parameter of this model; predict it "
                          "without compile.enabled, or measure it with find-batch on a GPU") from None


def step_trace(experiment: Experiment, profile: Profile, *, vocab_size: int, micro_batch: int,
               capped: bool = False) -> list[Event]:
    """The trace the allocator replays: the compiled step's (compiled_trace) where the profile compiles, the compiled
    blocks' (blocks_trace) where a GPU compiles each block, else fake_trace's, made from a few blocks where the model
    is deep (deep_trace); `capped`: a run under --gpu-memory's
    cap. Within `traces_kept()` the last few are kept: an estimate replays its own micro-batch's trace for the peaks
    and again in the max-batch search."""
    kept = _KEPT["traces"]
    name = cache.key(experiment, profile, micro_batch, {"vocab": vocab_size, "capped": capped}, "step_trace", 1) if kept is not None else ""
    if name in (kept or {}):
        return kept[name]
    if reads_compiled_graphs(experiment, profile):
        trace = compiled_trace(experiment, compiled_standin(profile), vocab_size=vocab_size, micro_batch=micro_batch,
                               capped=capped)
    elif reads_block_graphs(experiment, profile):
        trace = blocks_trace(experiment, profile, vocab_size=vocab_size, micro_batch=micro_batch, capped=capped)
    else:
        trace = deep_trace(experiment, profile, vocab_size=vocab_size, micro_batch=micro_batch, capped=capped) or \
            fake_trace(experiment, profile, vocab_size=vocab_size, micro_batch=micro_batch, capped=capped)
    if kept is not None:
        kept[name] = trace
        while len(kept) > KEPT_TRACES:
            kept.pop(next(iter(kept)))  # the oldest: a dict keeps its insertion order
    return trace


@contextlib.contextmanager
def traces_kept() -> Iterator[None]:
    """step_trace keeps its last KEPT_TRACES traces within (one command's predictions of one shape); outside, every
    call traces, so nothing outlives what decided it (a monkeypatched tracer, an edited profile)."""
    outer = _KEPT["traces"]
    _KEPT["traces"] = {} if outer is None else outer
    try:
        yield
    finally:
        _KEPT["traces"] = outer


KEPT_TRACES = 4  # traces_kept's: a trace of an 8B step holds a few hundred thousand events
_KEPT: dict[str, dict[str, list[Event]] | None] = {"traces": None}


class SearchStopped(Exception):
    """The replay's search was asked to stop (a study stopping: a search takes minutes), between two traces or within
    one (every STOP_EVERY ops)."""


def trace_fits(trace: list[Event], budget_bytes: int, expandable: bool, margin: float = 0.0) -> bool:
    """The replay's verdict on one trace under an allocator budget: no out of memory, no allocator retry, and with
    `margin` that share of what the steps add to the built model's reserve still free. The built model (weights,
    a frozen or quantized base) is laid out exactly; what the replay can miss (a library's temporaries, the
    fragmentation of the step's own blocks) comes with the step, so the headroom scales with the step, not the card:
    Llama-3.1-8B's lora_gradcp reserves 15 GiB of weights before its first step, and 3% of a 24 GiB card cost it
    six 64-token steps of its longest sequence (bench/results/fit-8b-h200/NOTE.md)."""
    try:
        model = replay(trace, budget_bytes, expandable=expandable)
    except OutOfMemory:
        return False
    grown = model.peak_reserved - model.steps_reserved
    return model.retries == 0 and model.peak_reserved + margin * grown <= budget_bytes


def traced_by(profile: Profile) -> str:
    """The releases whose code decided the trace: torch's (its fake kernels, and a compiled step's partitioner and
    Inductor buffer plan), and torchao's where its Float8Linear is in the graphs."""
    releases = f"torch {torch.__version__}"
    if torch_compile.compiles(profile) and float8.swaps_linears(profile):
        import torchao

        releases += f", torchao {torchao.__version__}"
    return releases


def step_peaks(experiment: Experiment, profile: Profile, *, vocab_size: int, micro_batch: int, capped: bool) -> tuple[int, int]:
    """(allocated, reserved) at the step's peak, replayed."""
    at = replay(step_trace(experiment, profile, vocab_size=vocab_size, micro_batch=micro_batch, capped=capped),
                expandable=allocator.expandable(profile))
    return at.peak_allocated, at.peak_reserved


MATMULS = ("aten.mm.", "aten.addmm.", "aten.bmm.", "aten.baddbmm.", "aten._scaled_mm.")


def cublas_workspace_bytes(capability: tuple[int, int] | None) -> int:
    """The workspace PyTorch gives each cuBLAS handle (one per thread that runs matmuls: the forward's and the
    autograd engine's), from the caching allocator at its first matmul and kept for the process: CUBLAS_WORKSPACE_CONFIG
    (":KiB:count" pairs) if set, else ":4096:8" on Hopper and later (32 MiB; both were in the H100's traces) and
    ":4096:2:16:8" before. No GPU (capability None): an H100, as `memlab estimate` assumes."""
    import os
    import re

    config = os.environ.get("CUBLAS_WORKSPACE_CONFIG") or (":4096:8" if capability is None or capability[0] >= 9 else ":4096:2:16:8")
    return sum(int(kib) * 1024 * int(count) for kib, count in re.findall(r":(\d+):(\d+)", config))


class _TraceBook:
    """The trace's bookkeeping behind _storage_tracer's dispatch mode: the storages it has seen (freed when they
    go), the cuBLAS workspaces made so far, and the blocks a kernel makes and holds inside itself."""

    def __init__(self, torch: Any, events: list[Event]) -> None:
        capability = torch.cuda.get_device_capability() if torch.cuda.is_available() else None
        self.torch, self.events = torch, events
        self.workspace_bytes = cublas_workspace_bytes(capability)
        self.sms = Sms.of_this_device()
        self.seen: set[int] = set()
        self.workspaces: set[str] = set()
        self.paused = False
        self.sources: dict[int, tuple] | None = None  # deep_trace's: an allocation's index -> what it was made from
        self.should_stop = stopping.current()  # read here, in the caller's thread: the backward may run on autograd's own
        self.ops = 0

    def stop_if_asked(self) -> None:
        self.ops += 1
        if self.should_stop is not None and self.ops % STOP_EVERY == 0 and self.should_stop():
            raise SearchStopped(f"stopped during a trace, after {self.ops} ops")

    def made_by(self, func: Any, args: tuple, out: Any) -> None:
        """What a GPU run allocates as `func` returns: its outputs' storages, the cuBLAS workspace at a phase's
        first matmul, and a block its kernel makes and frees inside itself."""
        torch, op = self.torch, str(func)
        outputs = [t for t in torch.utils._pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
        if func is torch.ops.aten.native_dropout.default:
            outputs.reverse()  # CUDA's dropout kernel makes its mask before its output (the fake kernel: after)
        made_from = _made_from(torch, args, out, len(outputs)) if self.sources is not None else None
        for j, t in enumerate(outputs):
            before = len(self.events)
            self._note(t.untyped_storage(), op)
            if made_from and len(self.events) > before:  # a new storage (not an in-place op's, a view's)
                self.sources[before] = made_from[j] if len(made_from) == len(outputs) else made_from[0]
        if op.startswith(MATMULS):
            self.workspace("backward" if torch._C._current_graph_task_id() != -1 else "forward")
        temporary = _kernel_temporary(torch, func, args, self.sms)
        if temporary:
            nbytes, where = temporary
            self.within_the_call([(nbytes, False)], where)

    def within_the_call(self, blocks: list[tuple[int, bool]], where: str) -> list[str]:
        """Allocate (bytes, held) blocks in order, one not held freed at once (a kernel's own temporary); the held
        ones' keys."""
        keys = []
        for nbytes, kept in blocks:
            key = f"{where} {len(self.events)}"
            self.events.append(("alloc", key, nbytes, where))
            if kept:
                keys.append(key)
            else:
                self.events.append(("free", key, 0, ""))
        return keys

    def workspace(self, phase: str) -> None:
        if phase not in self.workspaces:
            self.workspaces.add(phase)
            self.events.append(("alloc", f"cublas workspace ({phase})", self.workspace_bytes,
                                f"cuBLAS workspace, {phase} thread (kept)"))

    def _note(self, storage: Any, op: str) -> None:
        key = storage._cdata
        if key in self.seen:
            return
        self.seen.add(key)
        self.events.append(("alloc", key, storage.nbytes(), op))
        weakref.finalize(storage, self._freed, key)

    def _freed(self, key: int, ident: object = None) -> None:
        self.seen.discard(key)
        self.events.append(("free", key if ident is None else ident, 0, ""))


def _storage_tracer(torch: Any, events: list[Event]) -> Any:
    """A dispatch mode that appends ("alloc", id, bytes, op) when an op's output has a storage not seen before,
    and ("free", id, 0, "") when that storage goes; and, at the first matmul of the forward and of the backward,
    the cuBLAS workspace that a GPU run allocates there and never frees (it pins a segment: on the seed shape it
    sat in a freed logits segment, and the next step's logits needed a new one). Ops run as a GPU runs them: the
    engine's gradient sums in place, and the embedding backward's own blocks held around it."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Storages(TorchDispatchMode, _TraceBook):
        def __init__(self) -> None:
            TorchDispatchMode.__init__(self)
            _TraceBook.__init__(self, torch, events)

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.stop_if_asked()
            if func is torch.ops.aten.add.Tensor and _engine_accumulates_in_place(torch, args, kwargs):
                func = torch.ops.aten.add_.Tensor
            held = None if self.paused else _embedding_backward_blocks(func, args)
            before = self.within_the_call(held[0], EMBEDDING_BACKWARD) if held else []
            out = func(*args, **(kwargs or {}))
            if not self.paused:
                self.made_by(func, args, out)
            if held:
                after = self.within_the_call(held[1], EMBEDDING_BACKWARD)
                events.extend(("free", key, 0, "") for key in reversed(before + after))
            return out

    return Storages()


def _made_from(torch: Any, args: tuple, out: Any, n: int) -> list[tuple]:
    """The keys of the tensors each of an op's `n` outputs was made from: for an op over lists (torch._foreach_*),
    the tensors at the output's own place in each list; else one entry, every tensor argument."""
    lists = [a for a in args if isinstance(a, (list, tuple)) and len(a) == n and n > 1
             and all(isinstance(t, torch.Tensor) for t in a)]
    if lists and isinstance(out, (list, tuple)):
        return [tuple(lst[j].untyped_storage()._cdata for lst in lists) for j in range(n)]
    tensors = [t for t in torch.utils._pytree.tree_leaves(args) if isinstance(t, torch.Tensor)]
    return [tuple(t.untyped_storage()._cdata for t in tensors)] if tensors else []


DISPATCH_WRAPPERS = ("torch/_dynamo/", "torch/_compile.py")  # what wraps a mode's __torch_dispatch__ (no op's code)


def _from_the_engine() -> bool:
    """Whether the op now dispatched was called by the autograd engine itself, not by Python code: past the frames
    that wrap __torch_dispatch__, the next is the backward's entry (`_engine_run_backward`), or none at all on the
    engine's own thread for a device."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_name != "__torch_dispatch__":
        frame = frame.f_back
    frame = frame.f_back if frame is not None else None
    while frame is not None and any(w in frame.f_code.co_filename.replace("\\", "/") for w in DISPATCH_WRAPPERS):
        frame = frame.f_back
    return frame is None or frame.f_code.co_name == "_engine_run_backward"


def _engine_accumulates_in_place(torch: Any, args: tuple, kwargs: dict | None) -> bool:
    """Whether this add is the autograd engine summing two gradients of one tensor, which a run does in place
    (InputBuffer's accumulate: old_var.add_(var) when the engine holds the last reference to old_var and its storage
    and old_var is dense), while under a dispatch mode it always adds out of place (a Python mode makes every tensor
    "subclass-like"). On the fat held-out shape that extra block per residual stream was what the H100 did not
    allocate: its step-1 backward diverged from the replay there. Taken as the engine's: an add with grad mode off,
    inside a backward, called from no Python code but the backward's own entry (a Python backward's adds are its
    own), of two tensors alike in shape and dtype, old_var dense and no view, its storage held by nothing else."""
    if kwargs or torch.is_grad_enabled() or torch._C._current_graph_task_id() == -1:
        return False
    if not _from_the_engine():
        return False
    old, new = args[0], args[1]
    if not isinstance(new, torch.Tensor) or old.shape != new.shape or old.dtype != new.dtype or old._base is not None:
        return False
    # the count includes the UntypedStorage object made to ask it
    return _dense(old.shape, old.stride()) and torch._C._storage_Use_Count(old.untyped_storage()._cdata) == 2


def _dense(shape: tuple, strides: tuple) -> bool:
    """is_non_overlapping_and_dense: some order of the dimensions lays the elements out contiguously."""
    expected = 1
    for size, stride in sorted((d for d in zip(shape, strides) if d[0] != 1), key=lambda d: d[1]):
        if stride != expected:
            return False
        expected *= size
    return True


EMBEDDING_BACKWARD = "embedding backward (CUDA)"  # what the trace names its blocks
SORTLESS_INDICES = 3072  # embedding_dense_backward_cuda: up to this many indices (unscaled), no sort, no buffers
ROWS_PER_THREAD = 10  # EmbeddingBackwardKernel.cu's NROWS_PER_THREAD: how finely it splits each token's rows


def _embedding_backward_blocks(func: Any, args: tuple) -> tuple[list, list] | None:
    """The blocks CUDA's embedding backward holds while it runs, as (bytes, held) before and after it makes the
    weight's gradient (Embedding.cu, EmbeddingBackwardKernel.cu), all freed before it returns: the sorted indices
    and their order, a range for the sort; then segment offsets, a count, the per-segment partial counts and
    offsets, and the partial sums, fp32 rows for up to indices / 10 + min(indices, vocabulary) partial segments
    (sized for the worst case, so not data-dependent: 54 MiB at 50,176 tokens of 1,024 wide). Every H100
    trace checked has them at these sizes; adding them changed none of the replayed peaks
    checked there. cub's own temporaries (under 1 MiB there) are left out."""
    if func is not torch.ops.aten.embedding_dense_backward.default:
        return None
    grad, indices, vocabulary, scaled = args[0], args[1], int(args[2]), bool(args[4]) if len(args) > 4 else False
    n = indices.numel()
    if n <= SORTLESS_INDICES and not scaled:
        return None
    wide = 8 if grad.dtype == torch.float64 else 4  # the partial sums accumulate in fp32 (fp64 for fp64)
    segments = _segment_bytes(vocabulary, n)
    before = [(n * 8, True), (n * 8, True), (n * 8, False)]
    after = [(n * 8, True), (8, True), (n * 8, False), (segments, True), (segments, True), (8, True),
             (_partial_bytes(vocabulary, 8, n), True), (_partial_bytes(vocabulary, grad.shape[-1] * wide, n), True)]
    return before, after


def _segment_bytes(vocabulary: int, indices: int) -> int:
    """The embedding backward's per-segment blocks: 8 bytes for each distinct token there can be."""
    return min(indices, vocabulary) * 8


def _partial_bytes(vocabulary: int, row_bytes: int, indices: int) -> int:
    """The embedding backward's partial segments (indices / 10 + one per distinct token), `row_bytes` each."""
    return (indices // ROWS_PER_THREAD + min(indices, vocabulary)) * row_bytes


def _kernel_temporary(torch: Any, func: Any, args: tuple, sms: Any) -> tuple[int, str] | None:
    """(bytes, what) of the block a CUDA kernel for `func` allocates and frees before it returns, which its fake
    kernel does not make; None for an op without one."""
    if func is torch.ops.aten._softmax_backward_data.default:
        # SoftMax.cu, softmax_backward_cuda_out: tmp = grad * output, a tensor of its own after grad_input
        grad = args[0]
        return grad.numel() * grad.element_size(), "softmax backward temporary (CUDA)"
    if func is torch.ops.aten.sum.dim_IntList and args[0].is_contiguous():
        # a sum split across thread blocks stages partial sums (Reduce.cuh; a Linear's bias gradient over every token)
        t = args[0]
        nbytes = sum_staging_bytes(tuple(t.shape), list(args[1] or ()), t.dtype == torch.float64, sms)
        return (nbytes, "reduction staging buffer (CUDA)") if nbytes else None
    return None


def _adopted(tracer: Any, make: Callable[[], Any], ident: str) -> Any:
    """The tensor `make` returns, standing for allocation `ident` that an event already made (a compiled graph's
    buffer): not noted again by `tracer` (a _storage_tracer), and freed under `ident` when its storage goes."""
    tracer.paused = True
    try:
        t = make()
    finally:
        tracer.paused = False
    storage = t.untyped_storage()
    tracer.seen.add(storage._cdata)
    weakref.finalize(storage, tracer._freed, storage._cdata, ident)
    return t
