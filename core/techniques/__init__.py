"""Techniques, one module each, each with two functions: `check(experiment, profile, device, world)` refuses what
cannot run here with a one-line error naming the fix and the valid choices, and `apply(step)` applies the
technique to the training step under construction (memlab.core.step.TrainStep). This file is the one door, and
`build_step` the one way a step is built.

`check_techniques` runs every check, before a run folder or any event exists, so no refusal ever happens inside a
step. `apply_techniques` applies them in this order, and why:

 1. memory cap      caps the caching allocator before anything allocates on the GPU;
 2. precision       matmul flags, the autocast context and (fp16) the GradScaler; the kernel depends on the dtype;
 3. attention       the kernel for this device, dtype, dropout and window (memlab.core.attention);
    finetune        the frozen base's storage dtype (bf16 for LoRA and QLoRA) is the model's build dtype;
    -- the model is built here (memlab.core.models.family), with that kernel, on the device --
    liger patches   Liger's kernels in the transformers model's norms, MLPs and RoPE: on the bare model;
    finetune        freeze, quantize (QLoRA) and add adapters: before every wrapper and the optimizer;
 4. loss            chunked cross-entropy or a library's fused kernel is a setting of the model's head;
 5. fused kernels   switch the model's forward to memlab.core.fused: what compile traces;
    float8          swap the blocks' Linear modules for torchao's Float8Linear: before the wrappers and compile;
 6. checkpointing   wraps blocks, so compile sees (and can fuse around) the recompute boundaries;
 7. compile         over the checkpointed blocks;
 8. distributed     DDP / FSDP2 last, around (FSDP2: inside) the finished module;
 9. optimizer       after wrapping: FSDP2 swaps in sharded parameters, which the optimizer must hold;
10. act offload     a context the forward runs under;
11. cuda graph      last, on the finished step: TrainStep.run captures and replays it.

Loader and accumulation only check (the batch iterator and TrainStep.run read their settings). The allocator's
setting is an environment variable CUDA reads when it initializes: `apply_to_process` runs first in the run's
process, before the checks (which ask the device what it can do).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from memlab.core import attention
from memlab.core.models import family
from memlab.core.techniques import (
    accumulation,
    act_offload,
    allocator,
    checkpointing,
    cuda_graph,
    distributed,
    finetune,
    float8,
    fused_kernels,
    liger_patches,
    loader,
    loss,
    memory_cap,
    optimizer,
    precision,
    torch_compile,
)
from memlab.core.standin import FakeStep, StandIn
from memlab.core.step import TrainStep

if TYPE_CHECKING:
    from memlab.core.config import Experiment, Profile

BEFORE_MODEL = (memory_cap, precision, attention)
ON_MODEL = (liger_patches, finetune, loss, fused_kernels, float8, checkpointing, torch_compile, distributed, optimizer, act_offload, cuda_graph)
CHECK_ONLY = (allocator, loader, accumulation)
TECHNIQUES = CHECK_ONLY + BEFORE_MODEL + ON_MODEL


def check_techniques(experiment: Experiment, profile: Profile, device: torch.device, world: int = 1) -> None:
    """Every technique's refusal, before any work. Cheap: builds no model and allocates nothing on the GPU (an hf
    model's checks read its config, and a checkpoint's headers)."""
    family.check(experiment, profile, device, world)
    for technique in TECHNIQUES:
        technique.check(experiment, profile, device, world)


def check_plan(experiment: Experiment, profile: Profile, world: int = 1) -> None:
    """The checks that depend on the configuration alone, not on what this machine has: for `memlab estimate`,
    which plans for a GPU that may not be here (a run still meets every check on its own device)."""
    accumulation.check(experiment, profile, torch.device("cuda"), world)
    checkpointing.check(experiment, profile, torch.device("cuda"), world)
    distributed.check(experiment, profile, torch.device("cuda"), world)
    fused_kernels.check_plan(experiment, profile, world)
    optimizer.check_in_backward(experiment, profile)
    float8.check_plan(experiment, profile)
    liger_patches.check_plan(experiment, profile)
    loss.check_plan(experiment, profile, world)
    act_offload.check_plan(experiment, profile)
    cuda_graph.check_plan(experiment, profile)
    finetune.check_plan(experiment, profile, world)


def memory_libraries(profile: Profile) -> tuple[str, ...]:
    """The libraries whose releases decide the profile's memory, as each technique declares them: a prediction
    says whether it was calibrated for the releases installed (memlab.core.predict.calibration)."""
    return tuple(dict.fromkeys(lib for t in TECHNIQUES if hasattr(t, "memory_libraries") for lib in t.memory_libraries(profile)))


def memory_standins(profile: Profile) -> tuple[StandIn, ...]:
    """The stand-ins the techniques declare for the predictor's fake step (memlab.core.standin)."""
    found = (t.memory_standin(profile) for t in TECHNIQUES if hasattr(t, "memory_standin"))
    return tuple(s for s in found if s is not None)


def repeats_per_block(profile: Profile, depths: tuple[int, ...]) -> bool:
    """Whether the step's memory is one block's bytes repeated at each of these depths, as every technique declares:
    where the predictor may make a deep model's trace from a shallow one's (memlab.core.predict.deepen)."""
    return all(t.repeats_per_block(profile, depths) for t in TECHNIQUES if hasattr(t, "repeats_per_block"))


def outside_allocator_bytes(profile: Profile) -> int:
    """What the techniques hold on the GPU outside the caching allocator beyond the CUDA context, as they declare
    (a process group's communicator): the predictor's budget for the allocator is that much smaller."""
    return sum(t.outside_allocator_bytes(profile) for t in TECHNIQUES if hasattr(t, "outside_allocator_bytes"))


def steps_to_steady(profile: Profile) -> int:
    """The steps after which each step allocates as the one before, as the techniques declare: two (the first makes
    the optimizer's state), or more (DDP rebuilds its buckets at the second): the steps the predictor's trace runs."""
    return max([2, *(t.steps_to_steady(profile) for t in TECHNIQUES if hasattr(t, "steps_to_steady"))])


def graphs_standin(profile: Profile) -> dict[str, object]:
    """The settings under which the predictor traces a compiled step's graphs, as the techniques declare them (a
    technique whose kernels the graph reader cannot build names the stock one that allocates the same)."""
    return _declared("graphs_standin", profile)


def around_graphs_standin(profile: Profile) -> dict[str, object]:
    """The settings of the eager step the compiled graphs are replayed in: graphs_standin's, and what each technique
    declares it cannot build on fake tensors around the graphs."""
    return graphs_standin(profile) | _declared("around_graphs_standin", profile)


def _declared(hook: str, profile: Profile) -> dict[str, object]:
    settings: dict[str, object] = {}
    for t in TECHNIQUES:
        settings |= (getattr(t, hook)(profile) or {}) if hasattr(t, hook) else {}
    return settings


def fake_steps(experiment: Experiment, profile: Profile, device: torch.device) -> tuple[FakeStep, ...]:
    """How each technique enters the predictor's step on fake tensors on `device`, as it declares (memlab.core.standin)."""
    found = (t.fake_step(experiment, profile, device) for t in TECHNIQUES if hasattr(t, "fake_step"))
    return tuple(f for f in found if f is not None)


def apply_techniques(step: TrainStep) -> None:
    """Build `step` in the order above (its model, wrapped model, optimizer, scaler, autocast, offload)."""
    for technique in BEFORE_MODEL:
        technique.apply(step)
    finetune.apply_before_model(step)
    step.build_model()
    for technique in ON_MODEL:
        technique.apply(step)


def build_step(experiment: Experiment, profile: Profile, device: torch.device, vocab_size: int, dist: Any = None,
               on_device: bool = False) -> TrainStep:
    """The step for `profile` on `experiment`, every technique applied. Call check_techniques first (the engine's
    prepare does): apply assumes the checks passed."""
    world = dist.world_size if dist is not None else 1
    micro = accumulation.micro_batch(experiment, profile, world)
    step = TrainStep(experiment, profile, device, vocab_size, dist=dist, micro_batch=micro, on_device=on_device)
    apply_techniques(step)
    return step


def apply_to_process(profile: Profile) -> None:
    """What must be set before CUDA initializes (the allocator's configuration)."""
    allocator.apply_to_process(profile)
