"""distributed.mode: DDP or FSDP2 around the finished module (the ranks' context is memlab.core.distributed)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from memlab.core import distributed
from memlab.core.standin import FakeStep, StandIn

if TYPE_CHECKING:
    from memlab.core.config import Experiment, Profile
    from memlab.core.step import TrainStep


def check(experiment: Experiment, profile: Profile, device: torch.device, world: int) -> None:
    distributed.check(experiment, profile, world, device.type)


def shards_weights(profile: Profile) -> bool:
    """Whether each rank holds only its share of the weights (FSDP); DDP's ranks each hold all of them."""
    return profile.distributed.mode == "fsdp"


# A process group's NCCL communicator, held on the GPU outside the caching allocator: NVML's per-process figure less
# the reserve was 1.285-1.287 GiB for every ddp_bf16 and fsdp_bf16 run of one process on an H200 (torch 2.11) and
# 0.725-0.74 GiB for the same shapes without a group (bench/results/trace-heldout-cpu/gpu): 0.56 GiB, the larger.
PROCESS_GROUP_BYTES = 573 * 2**20


def outside_allocator_bytes(profile: Profile) -> int:
    """What the technique holds on the GPU outside the caching allocator, beyond the CUDA context every run holds."""
    return PROCESS_GROUP_BYTES if profile.distributed.mode != "none" else 0


def fake_step(experiment: Experiment, profile: Profile, device: torch.device) -> FakeStep | None:
    """FSDP2's all-gathers and reshards (each unit's parameters gathered in bf16 for its forward, freed, gathered
    again for its backward) have no stand-in; traced as the plain step, one rank's allocated peak came out up to 7.6%
    over the GPU's and its reserve 4-7% under (bench/results/trace-heldout-cpu): refused rather than answered wrong."""
    if profile.distributed.mode != "fsdp":
        return None
    return FakeStep(refusal="the trace has no stand-in for FSDP2's all-gathers and reshards (traced as the plain step, "
                            "a rank's reserve came out 4-7% under the GPU's)")


def memory_standin(profile: Profile) -> StandIn | None:
    """DDP's gradient buckets, which its wrapper allocates: the predictor's fake step has no process group to wrap
    in, so the predictor allocates them (memlab.core.predict.standins.ddp_buckets). One rank's memory is DDP's at
    any world size; FSDP2's sharding is not stood in for (the trace refuses several ranks)."""
    return StandIn("grads", "ddp_buckets") if profile.distributed.mode == "ddp" else None


def repeats_per_block(profile: Profile, depths: tuple[int, ...]) -> bool:
    """DDP's buckets are laid out over the whole model at once, not block by block."""
    return profile.distributed.mode != "ddp"


def steps_to_steady(profile: Profile) -> int:
    """DDP builds its buckets again at the second step: the third is the first that allocates as every later one."""
    return 3 if profile.distributed.mode == "ddp" else 2


def apply(step: TrainStep) -> None:
    """Last of the model wrappers: DDP wraps the compiled module; FSDP2 shards the module inside it."""
    if step.dist is None:
        return
    step.train_model, step.applied["distributed"] = step.dist.wrap(step.train_model, step.profile)
