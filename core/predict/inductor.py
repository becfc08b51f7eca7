"""torch.compile under checkpointing.budget: what the compiled step keeps for backward and where it peaks, traced.

`checkpointing.budget` is torch._functorch.config.activation_memory_budget (memlab.core.techniques.checkpointing),
read by AOTAutograd's min-cut partitioner. Below 1 it saves less and recomputes more in backward, and where that
recompute lands decides the peak: at budget 0 the partitioner saves only the graph's inputs, and the backward
rebuilds every forward value it needs before its first gradient (reordering_to_mimic_autograd_engine inserts a
recomputed node where the first backward op needs it; the loss's gradient needs the whole forward), so the
backward peaks about as high as no budget at all: on the H100, gpt2s at micro-batch 16, 6.54 GiB at budget 0 against
6.68 without one, and 4.43 at 0.25. No interpolation between the two ends gets that, so this module runs the real
thing, with no GPU and no memory:

1. torch.compile memlab's GPT, loss included (what the engine compiles), on the CPU under bf16 autocast, its batch
   dimension dynamic, and stop it once AOTAutograd's partitioner (Inductor's own partition function, under the
   budget) has made the forward and backward graphs: nothing is compiled or run;
2. lower and schedule both graphs with Inductor for CUDA, the device the estimate is for (on a machine without
   one, an H100's properties stand in), generate the wrapper code and replay its allocations, reuses and frees. The
   backward is lowered with the saved values AOTAutograd donates to it (_donated), as torch.compile lowers it: where
   the partition saves the logits (budget 0.75 on a large vocabulary), their gradient is written into their buffer,
   not beside it (without this the seed shape and bigvocab at 0.75 were predicted 47% and 40% over the H100).

The batch stays a symbol: every buffer is a line in it (bytes per sample and fixed bytes), so one trace answers
every micro-batch (the find-batch search asks for many; `peaks_of` walks the events at one). The partitioner decides
at `GraphShape.batch` (its size hint): elsewhere its choices are taken as the same, which holds as long as the weights' bf16 copies stay small beside
the activations.

On the CPU the attention is the CPU's fused kernel (output and log-sum-exp, as a GPU's). Its place in the partitioner
is cuDNN attention's, what SDPA ran on the H100 (torch 2.11) for sdpa_backend = auto: neither recomputable by default
nor "compute intensive"; with sdpa_backend = flash or efficient it is given the GPU kernel's place (compute
intensive, costed in FLOPs).

Under kernels.float8 the model is converted as memlab.core.techniques.float8 converts it, with torchao's own
Float8Linear: its casts to float8, their scales and the scaled matmuls are in both graphs, and Inductor plans their
buffers like any other (torchao must be installed where the trace runs; the key names its release).

The walk gives the step's events (`step_events`, at any budget, 1 included: the default partition), which the
allocator model replays and the analytic estimate's budget figures sum (`budget_peaks`): each buffer's allocation
and free in both graphs, the forward's saved buffers carried into the backward
(AOTAutograd's order: the forward returns [loss, saved tensors..., saved symints...], the backward takes [saved
symints..., saved tensors..., tangents...]) and freed at the backward's last `del` of them, and the gradients it
returns, which live on as .grad (memlab.core.predict.trace.compiled_trace puts the two graphs in the eager step).

A trace takes 20 to 40 s at GPT-2-small size, in a child process (torch.compile's caches and the stand-ins for the
device stay there); its events are kept in memory and in the cache folder (memlab.core.data.cache,
compile-events-*.json), per shape, budget, torch release and version of memlab.core's code (tracer_fingerprint),
and inductor_traces.json holds those of the shapes this repository's checks use.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable
from unittest import mock

import torch
from memlab.core import stopping
from memlab.core.answers import source_fingerprint
from memlab.core.data.cache import cache_root
from memlab.core.config import CheckpointingConfig, FinetuneConfig, ModelConfig
from memlab.core.model import GPT, GPTConfig
from memlab.core.models import hf_attention
from memlab.core.models.hf import HFCausalLM, transformers_config
from memlab.core.errors import MemlabError
from memlab.core.predict.cuda_autocast import cuda_policy
from memlab.core.predict.calibration import ASSUMED_GPU, DEVICES, INDUCTOR_WRAPPER_TORCH, torch_release
from memlab.core.runfolder import atomic_write_json
from memlab.core.techniques.checkpointing import apply_checkpointing
from memlab.core.techniques.finetune import add_adapters, target_layers
from memlab.core.techniques.float8 import converts

# Traces made ahead for the shapes this repository's own checks estimate (the H100 runs of bench/results/, the seeds'
# study, tests/), so that they do not trace for minutes on a fresh machine: EVENTS, what `python -m
# memlab.core.predict.inductor KEY` prints, keyed by the torch release (and torchao's, under float8) that traced it;
# another release's entries are not read. bench/retrace_budget_table.py
# retraces them. Data, not code: the tracer's fingerprint (answers.source_fingerprint) hashes the code alone.
_AHEAD = json.loads(Path(__file__).with_name("inductor_traces.json").read_text())
EVENTS = _AHEAD["EVENTS"]

# What the assumed card reports (torch.cuda.get_device_properties): Inductor reads it to split reductions and size kernels.
_CARD = DEVICES[ASSUMED_GPU]
H100_PROPERTIES = dict(name=_CARD.name, major=_CARD.capability[0], minor=_CARD.capability[1],
                       multi_processor_count=_CARD.sm_count, total_memory=_CARD.total_memory,
                       regs_per_multiprocessor=_CARD.regs_per_sm, max_threads_per_multi_processor=_CARD.max_threads_per_sm,
                       max_threads_per_block=_CARD.max_threads_per_block, warp_size=_CARD.warp_size,
                       L2_cache_size=_CARD.l2_cache_size, shared_memory_per_block_optin=_CARD.shared_memory_per_block_optin,
                       gcnArchName="")
TRACE_TIMEOUT_S = 900  # a GPT-2-small step traces in about 30 s on one core; a much larger model takes longer


@dataclass(frozen=True)
class GraphShape:
    """Everything the traced step depends on. `batch`: the micro-batch the partitioner decides at (at least 2:
    torch.compile specializes a batch of 1). `attention`: "cudnn" (sdpa auto or cudnn) or "flash" (sdpa flash or
    efficient), see the module's docstring."""

    n_layer: int
    n_head: int
    d_model: int
    d_ff: int
    vocab: int
    seq_len: int
    dropout: float
    budget: float
    batch: int
    attention: str = "cudnn"
    float8: bool = False  # the blocks' Linears are torchao's Float8Linear (kernels.float8; torchao must be installed)
    model: str = ""  # another family's model: its [model] section as JSON (the hf family: the transformers model it builds)
    finetune: str = ""  # LoRA on a bf16 base: the [finetune] section as JSON (peft's adapters in the traced model)
    blocks: str = ""  # "ops": not the whole step but one block, checkpointed per op and compiled as the engine does (_block)


@dataclass(frozen=True)
class BudgetPeaks:
    """Bytes above the weights and optimizer state at one micro-batch (CUDA: the tensors the wrapper allocates)."""

    saved: int  # what the forward keeps for backward
    forward: int  # the forward's peak, the saved values and the loss included
    backward: int  # the backward's peak: what is still saved, the recompute, its temporaries, gradients so far
    backward_grads: int  # of `backward`, the parameter gradients already made


@dataclass(frozen=True)
class Line:
    """Bytes as a function of the micro-batch b: per_sample * b + fixed."""

    per_sample: int
    fixed: int

    def at(self, b: int) -> int:
        return self.per_sample * b + self.fixed


def budget_peaks(shape: GraphShape, b: int) -> BudgetPeaks:
    """The compiled step's saved bytes and peaks at micro-batch b, walked from its events (step_events)."""
    return peaks_of(step_events(shape), b)


def peaks_of(events: StepEvents, b: int) -> BudgetPeaks:
    """Walk both graphs' events at micro-batch b: the forward's peak; what it keeps for backward (all it has not freed
    at its end but its output); the backward's peak, from those saved buffers on, and how much of it is gradients."""
    live: dict[str, int] = {}
    total = [0, 0]  # bytes alive, and of them the keys asked about

    def peak(graph: tuple, keys: set[str]) -> tuple[int, int]:
        top = tuple(total)
        for ev in graph:
            if ev[0] == "alloc":
                live[ev[1]] = ev[2].at(b)
                total[0] += live[ev[1]]
                total[1] += live[ev[1]] if ev[1] in keys else 0
                top = max(top, tuple(total), key=lambda t: t[0])
            elif ev[0] == "free" and ev[1] in live:
                gone = live.pop(ev[1])
                total[0] -= gone
                total[1] -= gone if ev[1] in keys else 0
        return top

    forward, _ = peak(events.forward, set())
    total[0] -= live.pop(events.output, 0)
    saved = total[0]
    backward, gradients = peak(events.backward, {g[0] for g in events.gradients if g is not None})
    return BudgetPeaks(saved, forward, backward, gradients)


def _known_or_traced(shape: GraphShape) -> StepEvents:
    """The step's events for `shape`: from the table made ahead or the cache folder, else traced in a child and kept
    in the cache folder."""
    key = _key(shape)
    known = EVENTS.get(key) or _read_cache().get(key)
    if known:
        return StepEvents.from_json(known)
    made = StepEvents.from_json(_child_output(shape))
    _write_cache(key, made)
    return made


def shape_of(key: str) -> GraphShape:
    """The GraphShape a key of the cache or of the traces made ahead names (_key, less the releases that traced it)."""
    return GraphShape(**{k: v for k, v in json.loads(key).items() if k not in ("torch", "torchao")})


def _key(shape: GraphShape) -> str:
    """The shape, and the torch release that traced it (its partitioner and Inductor decide the figures); under float8
    torchao's too (its casts are in the graphs). A shape without float8 keeps the key it had before the field."""
    fields = asdict(shape) | {"torch": torch.__version__.split("+")[0]}
    if shape.float8:
        import torchao

        fields["torchao"] = torchao.__version__
    else:
        del fields["float8"]
    for field in ("model", "finetune", "blocks"):
        if not fields[field]:  # the key a shape had before the field
            del fields[field]
    return json.dumps(fields, sort_keys=True)


def _child_output(shape: GraphShape) -> dict:
    """Traced in a fresh interpreter: torch.compile's caches and the stand-ins for the CUDA device stay there."""
    return children_output([shape])[0]


def children_output(shapes: list[GraphShape]) -> list[dict]:
    """Each shape's StepEvents (as JSON) traced in one fresh interpreter, in order."""
    cmd = [sys.executable, "-m", "memlab.core.predict.inductor", *(json.dumps(asdict(shape)) for shape in shapes)]
    returncode, out, err = _run_child(cmd)
    lines = out.strip().splitlines()
    if returncode != 0 or len(lines) < len(shapes):
        tail = (err.strip().splitlines() or ["no output"])[-1]
        raise TraceFailed(f"tracing the compiled step failed: {tail}")
    return [json.loads(line) for line in lines[-len(shapes):]]


def _run_child(cmd: list[str], poll_s: float = 0.5) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of `cmd`, ended early (RuntimeError) when this thread's stop is asked
    (memlab.core.stopping: a study stopping during a lane's prediction) or after TRACE_TIMEOUT_S. One compile
    thread: the child writes wrapper code and compiles no kernel, so a pool of compile workers is only start-up."""
    env = dict(os.environ, TORCHINDUCTOR_COMPILE_THREADS="1")
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) as child:
        for _ in range(int(TRACE_TIMEOUT_S / poll_s)):
            try:
                out, err = child.communicate(timeout=poll_s)
                return child.returncode, out, err
            except subprocess.TimeoutExpired:
                if stopping.asked():
                    child.kill()
                    child.communicate()
                    raise RuntimeError("tracing the compiled step stopped: the search was asked to stop") from None
        child.kill()
        child.communicate()
        raise TraceFailed(f"tracing the compiled step took over {TRACE_TIMEOUT_S} s")


class TraceFailed(MemlabError):
    """The child tracing a compiled step failed or ran out of time (a model Dynamo splits, an op Inductor cannot
    lower on the CPU): a prediction that replays it says so and keeps the eager step's figures."""


def main(argv: list[str] | None = None) -> None:
    """`python -m memlab.core.predict.inductor '{"n_layer": 12, ...}' ...`: trace each shape and print its StepEvents
    as a JSON line (what the predictor's child runs; also how the entries of inductor_traces.json are made), one after
    another in this process (the canary test's several, without a second start-up of torch.compile)."""
    for arg in argv or sys.argv[1:]:
        print(json.dumps(_step_events_traced(shape_of(arg)).to_json()), flush=True)


@dataclass(frozen=True)
class StepEvents:
    """One compiled training step's allocations and frees, each size a line in the batch, for the allocator model
    (memlab.core.predict.trace). `forward` and `backward`: ["alloc", key, Line, name] / ["free", key] /
    ["matmul"] (where the graph's first cuBLAS matmul runs: its thread's workspace is allocated there, once). The
    backward frees the forward's saved buffers under the forward's keys. `output`: the key of the buffer the forward
    returns (the loss; a block's graphs: the block's output); `gradients`: per input of the forward, in order, [key,
    shape] of its gradient as the backward returns it (alive until the optimizer's zero_grad; a size the batch
    decides is -1), None for an input without one (the tokens)."""

    forward: tuple
    backward: tuple
    output: str
    gradients: tuple

    def to_json(self) -> dict:
        def plain(events: tuple) -> list:
            return [[asdict(x) if isinstance(x, Line) else x for x in ev] for ev in events]

        return {"forward": plain(self.forward), "backward": plain(self.backward), "output": self.output,
                "gradients": list(self.gradients)}

    @classmethod
    def from_json(cls, d: dict) -> StepEvents:
        def lines(events: list) -> tuple:
            return tuple(tuple(Line(**x) if isinstance(x, dict) else x for x in ev) for ev in events)

        gradients = tuple(None if g is None else (g[0], tuple(g[1])) for g in d["gradients"])
        return cls(lines(d["forward"]), lines(d["backward"]), d["output"], gradients)


@functools.lru_cache(maxsize=16)
def step_events(shape: GraphShape) -> StepEvents:
    """The compiled step's events for `shape`: remembered (this process, EVENTS made ahead, the cache
    folder), else traced in a child process (slow; then kept in the cache folder). One trace serves every micro-batch."""
    return _known_or_traced(shape)


def _step_events_traced(shape: GraphShape) -> StepEvents:
    forward, backward = _partitioned(shape)
    links = _saved_links(forward, backward)
    gradient_shapes = [None if n is None else _dims(n.meta["val"].shape) for n in list(backward.graph.nodes)[-1].args[0]]
    return _events_of(*_lowered(forward, backward), links, gradient_shapes)


def _dims(shape: Any) -> tuple[int, ...]:
    """A gradient's shape, -1 where the batch decides the size (a block's input: the parameters' are fixed)."""
    return tuple(d if isinstance(d, int) else -1 for d in shape)


def _saved_links(forward: Any, backward: Any) -> dict[int, str]:
    """Which backward input each saved forward output is (_saved_links_by_order), from the two graphs."""
    saved = list(forward.graph.nodes)[-1].args[0][1:]
    symints = sum(not isinstance(getattr(n, "meta", {}).get("val"), torch.Tensor) for n in saved)
    inputs = [n.name for n in backward.graph.nodes if n.op == "placeholder" and not n.name.startswith("tangents_")]
    return _saved_links_by_order([getattr(n, "name", None) for n in saved], symints, inputs)


def _saved_links_by_order(saved: list, symints: int, backward_inputs: list[str]) -> dict[int, str]:
    """The forward returns [loss, saved tensors..., saved symints...] and the backward takes [saved symints...,
    saved tensors..., tangents...] (AOTAutograd's order): {index in the forward's return: the backward's input}."""
    if len(backward_inputs) != len(saved):
        raise RuntimeError("the backward's inputs are not the forward's saved values in AOTAutograd's order")
    return {i + 1: name for i, name in enumerate(backward_inputs[symints:])}


def _events_of(forward: tuple[str, dict[str, Line]], backward: tuple[str, dict[str, Line]], links: dict[int, str],
               gradient_shapes: list) -> StepEvents:
    """Both wrappers walked into one step: the forward's buffers that it returns stay alive (the loss, the saved
    values) and the rest are freed when it ends; the backward takes the saved ones under the forward's keys, frees
    each at its last name's `del`, and what it has not freed at its end but its gradients goes then."""
    fw = _Live("fw")
    returned = _walk(*forward, fw, lambda names: None)
    kept = {fw.owner[returned[0]]} | {fw.owner[returned[i]] for i in links if returned[i] in fw.owner}
    for key in [k for k in fw.bytes if k not in kept]:
        fw.free(key)
    saved_by_name = {links[i]: fw.owner[returned[i]] for i in links if returned[i] in fw.owner}

    bw = _Live("bw")

    def take_args(names: list[str]) -> None:
        for name in names:
            key = saved_by_name.get(name)
            if key is None:
                continue
            if key in bw.bytes:
                bw.alias(name, bw_first[key])
            else:
                bw.adopt(name, key, fw.made[key])
                bw_first[key] = name

    bw_first: dict[str, str] = {}
    outputs = _walk(*backward, bw, take_args)
    if any(shape is not None and name not in bw.owner for name, shape in zip(outputs, gradient_shapes)):
        raise RuntimeError("a gradient the backward returns is no buffer its wrapper code was seen to make")
    gradients = [None if shape is None else (bw.owner[name], shape) for name, shape in zip(outputs, gradient_shapes)]
    kept = {g[0] for g in gradients if g is not None}
    for key in [k for k in bw.bytes if k not in kept]:
        bw.free(key)
    return StepEvents(tuple(map(tuple, fw.events)), tuple(map(tuple, bw.events)), fw.owner[returned[0]], tuple(gradients))



# ---------------------------------------------------------------------------------------------- the cache folder


_EVENTS_CACHE = "compile-events"


def _cache_file():
    """One file per version of the code that traced it (tracer_fingerprint): a folder kept across an upgrade, or
    across an edit to the tracer, holds traces the code now running would not print, and never reads them."""
    return cache_root() / f"{_EVENTS_CACHE}-{tracer_fingerprint()}.json"


@functools.lru_cache(maxsize=4)
def tracer_fingerprint(root: Path = Path(__file__).resolve().parents[1]) -> str:
    """The source of memlab.core (`root`), hashed: the tracer, the model it builds and the techniques that change it all
    live there (memlab.core.answers.source_fingerprint, which leaves out this tracer's own output table)."""
    return source_fingerprint(root)


def _read_cache() -> dict[str, dict]:
    try:
        return json.loads(_cache_file().read_text())
    except (OSError, ValueError):
        return {}


def _write_cache(key: str, trace: StepEvents) -> None:
    """Best effort (a read-only cache folder only costs the next process the trace again); atomic by rename."""

    path = _cache_file()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(path, _read_cache() | {key: trace.to_json()})
    except OSError:
        pass


# ---------------------------------------------------------------------------------------------- trace and partition


def _lowered(forward: Any, backward: Any) -> tuple[tuple[str, dict[str, Line]], tuple[str, dict[str, Line]]]:
    """Both graphs' wrapper code, the backward lowered with the saved values AOTAutograd donates to it (_donated), as
    torch.compile lowers it. Lowering moves every value to CUDA: read what the graphs hold before."""
    donated = _donated(forward, backward)
    return _wrapper_code(forward, is_backward=False), _wrapper_code(backward, is_backward=True, donated=donated)


def _partitioned(shape: GraphShape) -> tuple[Any, Any]:
    """The forward and backward graphs torch.compile's Inductor gets from AOTAutograd's partitioner under the budget:
    the real torch.compile path (Dynamo, Inductor's pre-grad passes and decompositions, the partition function),
    stopped once the graphs are partitioned (nothing runs: the model's memory is allocated, never touched). The
    partitioner sizes every value at `shape.batch`, the batch symbol's hint. With `shape.blocks`, the first block's
    graphs (_block), the model's forward run eagerly up to it."""
    import torch._functorch.config as functorch_config
    import torch._inductor.compile_fx as compile_fx

    graphs: list[Any] = []
    min_cut = compile_fx.min_cut_rematerialization_partition

    def partition(joint: Any, joint_inputs: Any, **kwargs: Any) -> Any:
        with _attention_in_partitioner(shape.attention):
            graphs.extend(min_cut(joint, joint_inputs, **kwargs))
        raise _Partitioned

    model = _hf(shape) if shape.model else _gpt(shape)
    x, y = (torch.zeros(shape.batch, shape.seq_len, dtype=torch.long) for _ in range(2))
    if shape.blocks:
        step = _block(model, shape.blocks)
    else:
        for tokens in (x, y):
            torch._dynamo.mark_dynamic(tokens, 0)  # the batch stays a symbol: one trace for every micro-batch
        step = torch.compile(model)
    with mock.patch.object(compile_fx, "min_cut_rematerialization_partition", partition), _autocast_as_on_cuda(), \
         _padding_as_on_cuda(), functorch_config.patch(activation_memory_budget=shape.budget), \
         torch.autocast("cpu", dtype=torch.bfloat16):
        try:
            step(x, y)
        except Exception as e:  # noqa: BLE001 (Dynamo wraps the stop in its own error)
            if not graphs:
                raise RuntimeError(f"torch.compile stopped before partitioning ({e.__class__.__name__}: {e})") from e
    loss = list(graphs[0].graph.nodes)[-1].args[0][0].meta["val"]
    if loss.dim() != 0 and not shape.blocks:  # a graph break: the first graph is a piece of the step, not the whole of it
        raise RuntimeError("torch.compile split this model's step into several graphs; the reader reads one")
    return graphs[0], graphs[1]


def _block(model: Any, mode: str) -> Any:
    """The model with its blocks checkpointed in `mode` and the first compiled, as the engine compiles each block
    under per-op checkpointing (memlab.core.techniques.checkpointing): its forward runs eagerly until that block, whose
    input's batch stays a symbol (every block's graph is the first's: they are one module class, their weights inputs)."""
    apply_checkpointing(model, CheckpointingConfig(mode=mode), compile_blocks=False)
    first = model.blocks[0]
    compiled = torch.compile(first.forward)

    def forward(*args: Any, **kwargs: Any) -> Any:
        torch._dynamo.mark_dynamic(args[0] if args else kwargs["hidden_states"], 0)
        return compiled(*args, **kwargs)

    first.forward = forward
    return model


@contextlib.contextmanager
def _autocast_as_on_cuda():
    """The CPU autocast this trace runs under, as code that asks about CUDA's sees it. torchao's Float8Linear casts its
    input to `torch.get_autocast_gpu_dtype()` where `torch.is_autocast_enabled()` (CUDA's) holds, as it does on the
    GPU; without this it saw no autocast and cast the fp32 LayerNorm outputs to float8 directly (two bf16 casts a
    block fewer than the GPU's graph). It did not close the seq-8192 shape's gap, which is the torch release's
    (docs/estimator.md). The ops CUDA's autocast runs in fp32 run in fp32 here too (cuda_autocast: transformers'
    GPT-2 builds its GELU from pow and tanh, which the CPU's autocast left in bf16)."""
    asked = torch.is_autocast_enabled

    def enabled(device_type: str | None = None) -> bool:
        return asked("cpu") if device_type in (None, "cuda") else asked(device_type)

    with mock.patch.object(torch, "is_autocast_enabled", enabled), \
         mock.patch.object(torch, "get_autocast_gpu_dtype", lambda: torch.get_autocast_dtype("cpu")), cuda_policy():
        yield


@contextlib.contextmanager
def _padding_as_on_cuda():
    """Inductor's shape padding, as on a GPU: a matmul with a dimension that is not a multiple of the alignment (GPT-2's
    50,257-token head) is padded where the GPU's benchmark finds it faster, and its backward then holds one more
    logits-sized buffer (transformers' GPT-2 compiled at micro-batch 34 on an H200: 19.83 GiB with padding, 16.64
    without; bench/results/heldout-arch-h200). The CPU never pads (no CUDA tensors, no benchmark): here every matmul
    Inductor can pad is padded, the larger of the two outcomes (a max batch errs low where the GPU would not pad)."""
    from torch._inductor.fx_passes import pad_mm

    with mock.patch.object(pad_mm, "check_device", lambda a, b: True), mock.patch.object(pad_mm, "has_triton", lambda: True), \
         mock.patch.object(pad_mm, "_should_pad", lambda *args, **kwargs: True):
        yield


class _Partitioned(Exception):
    """Raised inside torch.compile once the partitioner has made the graphs: nothing is compiled or run."""


def _attention_kernel(q: Any, k: Any, v: Any, dropout_p: float = 0.0) -> Any:
    """The model's attention on fake CPU tensors: the CPU's fused kernel, which keeps what a GPU's does (output and
    an fp32 log-sum-exp), and no T x T scores (SDPA on the CPU would take the math path under dropout)."""
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, dropout_p, True)[0]


def _gpt(shape: GraphShape) -> Any:
    """memlab's GPT as the engine builds it, its weights allocated and never initialized (built on the meta device)."""
    cfg = GPTConfig(shape.n_layer, shape.n_head, shape.d_model, shape.d_ff, shape.vocab, shape.seq_len, shape.dropout)
    with torch.device("meta"):
        model = GPT(cfg, _attention_kernel)
    model = model.to_empty(device="cpu")
    model.lm_head.weight = model.wte.weight  # tied again: one V x C matrix, as the engine's model
    if shape.float8:  # as memlab.core.techniques.float8 converts it: torchao's casts and scaled matmuls in the graphs
        from torchao.float8 import convert_to_float8_training

        convert_to_float8_training(model, module_filter_fn=converts)
    return model


class _GroupedAttention:
    """_attention_kernel behind memlab's attention registry in a transformers model (memlab.core.models.hf_attention).
    It takes fewer key/value heads than query heads as they are, as memlab's SDPA kernel hands them to the GPU's
    fused kernels (enable_gqa: on the H100 its cuDNN backend took Llama's 8 key/value heads for 32 query heads), so
    the step saves k and v unrepeated. Repeated here first, Llama-3.2-1B's compiled step was predicted 6.0% over
    the H100's peak (+3.6% without; +0.0% once memlab's attention function cast q and k to bf16 as SDPA does)."""

    accepts_gqa = True
    window = 0

    def __call__(self, q: Any, k: Any, v: Any, dropout_p: float = 0.0) -> Any:
        return _attention_kernel(q, k, v, dropout_p)


def _hf(shape: GraphShape) -> Any:
    """The transformers model the hf family builds (memlab.core.models.hf) for `shape.model`, its weights allocated
    and never initialized, every attention layer served by the CPU's fused kernel (_GroupedAttention)."""
    from transformers import AutoModelForCausalLM

    hf_attention.register()
    tuned = FinetuneConfig(**json.loads(shape.finetune)) if shape.finetune else None
    dtype = torch.bfloat16 if tuned else torch.float32  # LoRA's frozen base is built in bf16 (finetune.apply_before_model)
    with torch.device("meta"):
        made = AutoModelForCausalLM.from_config(transformers_config(ModelConfig(**json.loads(shape.model))),
                                                attn_implementation=hf_attention.NAME, dtype=dtype)
    model = HFCausalLM(made)
    tied = model.head.weight is model.embedding.weight
    model = model.to_empty(device="cpu")
    if tied:  # to_empty gives each module its own tensor: one V x C matrix again, as the engine's model has
        model.head.weight = model.embedding.weight
    kernel = _GroupedAttention()
    for block in model.blocks:
        setattr(model.sublayer(block, "attention"), hf_attention.KERNEL_ATTR, kernel)
    if tuned:
        add_adapters(model, list(target_layers(model, tuned.targets)), tuned)
    return model


@contextlib.contextmanager
def _attention_in_partitioner(attention: str):
    """sdpa flash / efficient: the CPU kernel takes the GPU kernel's place among the partitioner's compute-intensive
    ops, costed by the same FLOP formula. cuDNN attention (sdpa auto on the H100) has no such place: nothing to do."""
    if attention != "flash":
        yield
        return
    import torch._functorch.partitioners as partitioners
    from torch.utils.flop_counter import sdpa_flop_count

    op = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    op_list, runtime = partitioners.get_default_op_list, partitioners.estimate_runtime

    def with_attention():
        ops = op_list()
        ops.compute_intensive_ops.add(op)
        return ops

    def attention_flops(node: Any) -> float:
        if node.target is op.default:
            q, k, v = (a.meta["val"] for a in node.args[:3])
            return sdpa_flop_count(q.shape, k.shape, v.shape)
        return runtime(node)

    with mock.patch.object(partitioners, "get_default_op_list", with_attention), \
         mock.patch.object(partitioners, "estimate_runtime", attention_flops):
        yield


def _donated(forward: Any, backward: Any) -> set[str]:
    """The saved values AOTAutograd donates to the backward (torch._functorch.config.donated_buffer, on by default):
    those sharing no storage with the forward's inputs, its loss or the backward's outputs. Inductor may write a
    gradient into a donated buffer in place: where the bf16 logits are saved, their gradient takes their buffer instead
    of a second one (what the H100 did at budget 0.75). Mirrors aot_autograd's collect_bw_donated_buffer_idxs, which
    runs after the partition this module stops at."""
    import torch._functorch.config as functorch_config

    if not getattr(functorch_config, "donated_buffer", False):
        return set()

    def storages(nodes: Any) -> set[int]:
        values = (n.meta.get("val") for n in nodes if n is not None and hasattr(n, "meta"))
        return {v.untyped_storage()._cdata for v in values if isinstance(v, torch.Tensor)}

    fw_out = list(forward.graph.nodes)[-1].args[0]
    bw_out = list(backward.graph.nodes)[-1].args[0]
    kept = storages([n for n in forward.graph.nodes if n.op == "placeholder"]) | storages(fw_out[:1]) | storages(bw_out)
    return {n.name for n in fw_out[1:] if n is not None and n.op != "placeholder" and isinstance(n.meta.get("val"), torch.Tensor)
            and n.meta["val"].untyped_storage()._cdata not in kept}


# ---------------------------------------------------------------------------------------------- Inductor, for CUDA


def _wrapper_code(gm: Any, *, is_backward: bool, donated: set[str] = frozenset()) -> tuple[str, dict[str, Line]]:
    """Inductor's wrapper code for `gm` on CUDA, and the bytes of every buffer it names. `donated`: the backward's
    inputs Inductor may reuse (set as torch.compile's own lowering gets them from AOTAutograd's metadata)."""
    from torch._inductor.compile_fx import _recursive_post_grad_passes, fake_tensor_prop, view_to_reshape
    from torch._inductor.debug import DebugContext
    from torch._inductor.graph import GraphLowering
    from torch._inductor.virtualized import V

    inputs = [n.meta["val"] for n in gm.graph.nodes if n.op == "placeholder"]
    view_to_reshape(gm)
    with torch.no_grad():
        fake_mode = fake_tensor_prop(gm, inputs, force_allow_non_fake_inputs=True)
    with V.set_fake_mode(fake_mode), DebugContext():
        # the post-grad passes re-propagate fake values, which needs a device that exists: on the CPU graph
        _recursive_post_grad_passes(gm, is_inference=False)
    inputs = _moved_to_cuda(gm, fake_mode)
    with _as_if_cuda(), V.set_fake_mode(fake_mode), DebugContext():
        graph = GraphLowering(gm, example_inputs=inputs, shape_env=fake_mode.shape_env, is_backward=is_backward,
                              is_inference=False)
        placeholders = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
        graph.bw_donated_idxs = [i for i, name in enumerate(placeholders) if name in donated] or None
        with V.set_graph_handler(graph), V.set_extern_kernel_nodes([]):
            graph.run(*inputs)
            code = graph.codegen()[0]
            sizes = {name: _layout_bytes(buf) for name, buf in graph.name_to_buffer.items()}
    return getattr(code, "value", code), sizes


def _moved_to_cuda(gm: Any, fake_mode: Any) -> list[Any]:
    """Every fake value of `gm` on the CUDA device, same shape, strides and dtype; every device argument too."""
    cuda = torch.device("cuda", 0)

    def moved(v: Any) -> Any:
        if isinstance(v, torch.Tensor) and v.device.type != "cuda":
            with fake_mode:
                return torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device=cuda)
        return v

    for node in gm.graph.nodes:
        if isinstance(node.kwargs.get("device"), torch.device):
            node.kwargs = {**node.kwargs, "device": cuda}
        value = node.meta.get("val")
        if value is not None:
            node.meta["val"] = tuple(moved(x) for x in value) if isinstance(value, (tuple, list)) else moved(value)
    gm.recompile()
    return [n.meta["val"] for n in gm.graph.nodes if n.op == "placeholder"]


@contextlib.contextmanager
def _as_if_cuda():
    """On a machine with a GPU, nothing; without one, what Inductor asks of the device answered as an H100 would,
    and Triton taken as present (no kernel is compiled: only the wrapper code is generated)."""
    if torch.cuda.is_available():
        yield
        return
    import types

    from torch._inductor.runtime.hints import DeviceProperties

    props = types.SimpleNamespace(**H100_PROPERTIES)
    device_props = DeviceProperties(type="cuda", index=0, multi_processor_count=props.multi_processor_count,
                                    cc=10 * props.major + props.minor, major=props.major,
                                    regs_per_multiprocessor=props.regs_per_multiprocessor,
                                    max_threads_per_multi_processor=props.max_threads_per_multi_processor,
                                    max_threads_per_block=props.max_threads_per_block, warp_size=props.warp_size)
    with mock.patch.object(DeviceProperties, "create", classmethod(lambda cls, device: device_props)), \
         mock.patch("torch.cuda.get_device_properties", lambda *a, **k: props), \
         mock.patch("torch.cuda.get_device_capability", lambda *a, **k: (props.major, props.minor)), \
         mock.patch("torch.cuda.current_device", lambda: 0), \
         mock.patch("torch._inductor.scheduler.has_triton", lambda: True), \
         mock.patch("torch.utils._triton.triton_hash_with_backend", lambda: "h100"):
        yield


def _layout_bytes(buf: Any) -> Line:
    try:
        layout = buf.get_layout()
        return _storage_bytes(list(layout.size), list(layout.stride), layout.dtype.itemsize)
    except Exception:  # noqa: BLE001 (a multi-output kernel's tuple has no layout of its own: its items do)
        return Line(0, 0)


def _storage_bytes(size: list[Any], stride: list[Any], itemsize: int) -> Line:
    import sympy

    if any(sympy.sympify(n) == 0 for n in size):
        return Line(0, 0)
    return _line((1 + sum((sympy.sympify(n) - 1) * sympy.sympify(st) for n, st in zip(size, stride))) * itemsize)


def _line(x: Any) -> Line:
    """An int, a SymInt or a sympy expression in the batch symbol, as a Line (which it must be: bytes are linear
    in the batch in this model)."""
    import sympy

    expr = sympy.sympify(x.node.expr if hasattr(x, "node") else x)
    if not expr.free_symbols:
        return Line(0, int(expr))
    values = [int(expr.subs({s: b for s in expr.free_symbols})) for b in (0, 1, 2)]
    if values[2] - values[1] != values[1] - values[0]:
        raise ValueError(f"{expr} bytes are not linear in the batch")
    return Line(values[1] - values[0], values[0])


# ---------------------------------------------------------------------------------------------- the replay


_ALLOC = re.compile(r"^(\w+) = empty_strided(?:_\w+)?\(\(([^)]*)\), \(([^)]*)\), torch\.(\w+)")
_REUSE = re.compile(r"^(\w+) = (?:reinterpret_tensor\()?(\w+)[^;]*; del \2  # reuse$")
_VIEW = re.compile(r"^(\w+) = reinterpret_tensor\((\w+),")
_ITEM = re.compile(r"^(\w+) = (\w+)\[\d+\]$")
_CALL = re.compile(r"^(\w+) = [\w.]+\(")


class _Live:
    """Allocations alive, by the names that hold them (a reuse renames; a view adds a name), and the events, in
    order, for the allocator model (`prefix` keeps one graph's keys apart from the other's)."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.owner: dict[str, Any] = {}
        self.bytes: dict[Any, Line] = {}
        self.names: dict[Any, set[str]] = {}
        self.made: dict[Any, Line] = {}  # every allocation's bytes, freed or not
        self.count = 0  # allocations made here (a key each)
        self.events: list[list] = []  # ["alloc", key, Line, name] / ["free", key] / ["matmul"] (the first cuBLAS call)

    def new(self, name: str, nbytes: Line) -> None:
        self.drop(name)  # a name assigned again lets go of what it held
        self.count += 1
        key = f"{self.prefix}{self.count}"
        self.adopt(name, key, nbytes)
        if nbytes != Line(0, 0):  # a kernel's tuple, a size read off an input: no memory (the allocator skips 0 bytes)
            self.events.append(["alloc", key, nbytes, name])

    def adopt(self, name: str, key: Any, nbytes: Line) -> None:
        """`name` holds allocation `key` of `nbytes`, made elsewhere (the backward's saved inputs: the forward's)."""
        self.owner[name], self.bytes[key], self.names[key], self.made[key] = key, nbytes, {name}, nbytes

    def alias(self, name: str, of: str) -> None:
        if of in self.owner:
            key = self.owner[name] = self.owner[of]
            self.names[key].add(name)

    def drop(self, name: str) -> None:
        key = self.owner.pop(name, None)
        if key is None:
            return
        self.names[key].discard(name)
        if not self.names[key]:
            self.free(key)

    def free(self, key: Any) -> None:
        gone = self.bytes.pop(key)
        for name in self.names.pop(key):
            if self.owner.get(name) == key:
                del self.owner[name]
        if gone != Line(0, 0):
            self.events.append(["free", key])


_EAGER = re.compile(r"^(buf\w+) = ")
_MATMUL = re.compile(r"^(?:\w+ = )?extern_kernels\.(?:mm|addmm|bmm|baddbmm)\(")


def _walk(code: str, sizes: dict[str, Line], live: _Live, take_args: Callable[[list[str]], None]) -> list[str | None]:
    """Follow the wrapper's call() into `live`: allocations, reuses, views, dels, extern kernels' results, the
    buffers it makes with eager ops, such as a mix-order reduction's sums (`buf28 = workspace_1[...].sum(dim=0)`:
    LayerNorm's weight and bias gradients on gpt2s; the events need every gradient), and where the first cuBLAS
    matmul runs. Returns the name each returned value is, in order."""
    for line in _call_body(code):
        if line.endswith("= args"):
            take_args([n.strip() for n in line[: -len("= args")].split(",") if n.strip()])
        elif line.startswith("return "):
            return _returned_names(line)
        elif line.startswith("del "):
            for name in line[4:].split(","):
                live.drop(name.strip())
        elif m := _REUSE.match(line):
            live.alias(m[1], m[2])
            live.drop(m[2])
        elif m := _ALLOC.match(line):
            size, stride = ([x for x in group.split(",") if x.strip()] for group in (m[2], m[3]))
            live.new(m[1], sizes.get(m[1]) or _storage_bytes(size, stride, _itemsize(m[4])))
        elif m := _VIEW.match(line):
            live.alias(m[1], m[2])
        elif (m := _ITEM.match(line)) or (m := _CALL.match(line)):
            live.new(m[1], sizes.get(m[1], Line(0, 0)))  # an extern kernel's result (or one item of its tuple)
        elif m := _EAGER.match(line):
            live.new(m[1], sizes.get(m[1], Line(0, 0)))
        if _MATMUL.match(line) and ["matmul"] not in live.events:
            live.events.append(["matmul"])
    return []


def _returned_names(line: str) -> list[str | None]:
    """`return (buf3, reinterpret_tensor(buf7, (s0, 64), (64, 1), 0), None, s0, )`: the name each item is (a view:
    the buffer it views), in order; None for None."""
    inner = line[len("return "):].strip()
    inner = inner[1:-1] if inner.startswith("(") and inner.endswith(")") else inner
    items, depth, start = [], 0, 0
    for i, ch in enumerate(inner + ","):
        depth += 1 if ch in "([" else -1 if ch in ")]" else 0
        if ch == "," and depth == 0:
            items.append(inner[start:i].strip())
            start = i + 1
    names = [re.match(r"(?:reinterpret_tensor\()?(\w+)", item) for item in items if item]
    return [None if m is None or m[1] == "None" else m[1] for m in names]


class WrapperFormatChanged(MemlabError):
    """Inductor's wrapper code is not in the format this reader knows (a new torch release changed it)."""


def _call_body(code: str) -> list[str]:
    """The statements of the wrapper's call(), stripped, comments and asserts left out; checked against the format
    the reader knows (check_wrapper_format), so that a new release's wrapper fails loudly, never reads as nothing."""
    if "def call(self, args):" not in code:
        raise _format_changed("no `def call(self, args):`")
    lines = code[code.index("def call(self, args):"):].splitlines()[1:]
    indent = len(lines[0]) - len(lines[0].lstrip())
    body = []
    for raw in lines:
        if raw.strip() and len(raw) - len(raw.lstrip()) < indent:
            break
        line = raw.strip()
        if line and not line.startswith(("#", "assert_")):
            body.append(line)
    check_wrapper_format(body)
    return body


def check_wrapper_format(body: list[str]) -> None:
    """Every allocation and reuse the wrapper's call() makes must be one the reader parses, and the body must take
    its arguments and return: anything else is a format this reader was not written for."""
    if not any(line.endswith("= args") for line in body) or not any(line.startswith("return ") for line in body):
        raise _format_changed("call() neither unpacks `args` nor returns")
    for line in body:
        if ("empty_strided" in line and not _ALLOC.match(line) and "reinterpret_tensor" not in line) or \
                (line.endswith("# reuse") and not _REUSE.match(line)):
            raise _format_changed(f"a line it cannot read: {line[:120]}")


def _format_changed(what: str) -> WrapperFormatChanged:
    release = torch_release()
    return WrapperFormatChanged(
        f"Inductor's wrapper code under torch {release} is not in the format memlab.core.predict.inductor reads "
        f"(checked under torch {', '.join(INDUCTOR_WRAPPER_TORCH)}): {what}; predict a compiled step with --method analytic")


def _itemsize(dtype: str) -> int:
    return getattr(torch, dtype).itemsize


if __name__ == "__main__":
    main()
