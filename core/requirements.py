"""What a profile needs from the machine, derived from the techniques' own checks (no hand-kept list).

A profile needs CUDA when its checks refuse it on the CPU for the `tiny` experiment (the one the CPU backend runs):
`memlab profiles`, the TUI and the README mark those.
"""

from __future__ import annotations

import copy
import functools

import torch

from memlab.core.config import Profile, apply_overrides, load_experiment
from memlab.core.errors import DeviceError, MemlabError


@functools.lru_cache(maxsize=1)
def _cpu_experiment():
    return load_experiment("tiny")


def cuda_only(profile: Profile) -> str | None:
    """Why `profile` cannot run on the CPU backend (the check's own one-line message), or None when it can."""
    from memlab.core.techniques import check_techniques

    world = 2 if profile.distributed.mode != "none" else 1  # a ddp / fsdp profile is checked as the ranks it is for
    experiment, profile = copy.deepcopy(_cpu_experiment()), copy.deepcopy(profile)
    try:
        apply_overrides(experiment, profile, [])  # the profile's own [overrides], as a run resolves them
        check_techniques(experiment, profile, torch.device("cpu"), world)
    except DeviceError as e:
        return str(e)
    except MemlabError:
        return None  # refused for another reason (a shape, a combination), not for want of CUDA
    return None
