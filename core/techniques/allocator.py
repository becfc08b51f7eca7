"""allocator.expandable_segments: the CUDA caching allocator maps memory in growable segments (less fragmentation)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import torch

from memlab.core.requirements import refuse_without_cuda
from memlab.core.standin import FakeStep

if TYPE_CHECKING:
    from memlab.core.config import Experiment, Profile

ENV = "PYTORCH_CUDA_ALLOC_CONF"


def check(experiment: Experiment, profile: Profile, device: torch.device, world: int) -> None:
    refuse_without_cuda("allocator", profile, device)


def expandable(profile: Profile) -> bool:
    """Whether CUDA's allocator maps growable segments for this profile (the allocator replay models either mode)."""
    return profile.allocator.expandable_segments


def fake_step(experiment: Experiment, profile: Profile, device: torch.device) -> FakeStep | None:
    """Expandable segments are CUDA's allocator's; the allocator replay models them, the fake step needs none."""
    if profile.allocator.expandable_segments and device.type != "cuda":
        return FakeStep({"allocator.expandable_segments": False})
    return None


def apply_to_process(profile: Profile) -> None:
    """The allocator reads its settings when CUDA initializes, so this runs first in the run's process, before
    check() (which asks the device what it can do) and before anything else touches CUDA."""
    if profile.allocator.expandable_segments:
        conf = os.environ.get(ENV, "")
        if "expandable_segments" not in conf:
            os.environ[ENV] = ",".join(filter(None, [conf, "expandable_segments:True"]))
