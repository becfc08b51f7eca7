"""compile.enabled: torch.compile over the (fused, checkpointed) model.

The CUDA-graph modes (reduce-overhead, max-autotune) are refused: a CUDA graph's memory pool is allocated when the
graph is recorded and lives outside the per-phase peak resets (DESIGN.md "What is measured"), so the phase peaks
would miss it and memory would not compare with other profiles. cuda_graph.enabled (memlab.core.techniques.cuda_graph)
captures the whole step instead, measuring its memory while capturing."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from memlab.core.errors import ConfigError
from memlab.core.standin import FakeStep
from memlab.core.techniques.checkpointing import budgeted

CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")

if TYPE_CHECKING:
    from memlab.core.config import Experiment, Profile
    from memlab.core.step import TrainStep


def check(experiment: Experiment, profile: Profile, device: torch.device, world: int) -> None:
    """The profile's own validation names the valid modes; the CUDA-graph ones are refused here, on every device."""
    c = profile.compile
    if c.enabled and c.mode in CUDA_GRAPH_MODES:
        raise ConfigError(
            f"compile.mode = {c.mode!r} records CUDA graphs, whose memory pool is outside memlab's per-phase peak "
            "resets (memory would be measured wrong); use compile.mode = 'default' or 'max-autotune-no-cudagraphs', and "
            "cuda_graph.enabled = true for a graph whose memory is measured"
        )


def compiled(model: torch.nn.Module, profile: Profile) -> torch.nn.Module:
    if profile.kernels.fused:
        from memlab.core.fused.ops import declare_to_inductor

        declare_to_inductor()
    mode = None if profile.compile.mode == "default" else profile.compile.mode
    if profile.compile.tune_kernels:
        # torch.compile takes a mode or options, not both: spell the mode out as its options and add the tuning
        from torch._inductor import list_mode_options

        options = (dict(list_mode_options(mode)) if mode else {}) | {"coordinate_descent_tuning": True}
        return torch.compile(model, options=options)
    return torch.compile(model, mode=mode)


def compiles(profile: Profile) -> bool:
    """Whether the step runs Inductor's graphs (the predictor then replays those graphs' own buffers)."""
    return profile.compile.enabled


def fake_step(experiment: Experiment, profile: Profile, device: torch.device) -> FakeStep | None:
    """The fake step runs eager (for a compiled step the predictor replays Inductor's own graphs where it can read
    them); checkpointing.budget is the partitioner's setting, refused without compile, so it goes back to 1."""
    if not profile.compile.enabled:
        return None
    return FakeStep({"compile.enabled": False, "checkpointing.budget": 1.0})


def repeats_per_block(profile: Profile, depths: tuple[int, ...]) -> bool:
    """A compiled step's graphs are traced whole: Inductor's buffers are not one block's bytes repeated."""
    return not profile.compile.enabled


def apply(step: TrainStep) -> None:
    """After checkpointing (compile sees the recompute boundaries), before distributed wrapping. A
    checkpointing.budget below 1 is the partitioner's setting: the compiled module runs under it."""
    c = step.profile.compile
    if c.enabled:
        step.train_model = compiled(step.train_model, step.profile)
        budget = step.profile.checkpointing.budget
        if budget < 1:
            step.train_model = budgeted(step.train_model, budget)
    step.applied["compile"] = (c.mode + (" +tune_kernels" if c.tune_kernels else "")) if c.enabled else "off"
