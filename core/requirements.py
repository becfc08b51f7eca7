"""What a profile needs from the machine, derived from the techniques' own checks (no hand-kept list).

A profile needs CUDA when its checks refuse it on the CPU for the `tiny` experiment (the one the CPU backend runs).
It needs an extra when a check refuses it for want of an optional package (torchao, galore-torch...) that is not
installed here. `memlab profiles`, the TUI and the README mark both.
"""

from __future__ import annotations

import copy
import functools
from dataclasses import dataclass

import torch

from memlab.core.config import Profile, apply_overrides, load_experiment
from memlab.core.errors import DeviceError, MemlabError, MissingExtra


@dataclass(frozen=True)
class Needs:
    """What stands between a profile and a run on this machine (all None: nothing)."""

    cuda: str | None = None  # why it cannot run on the CPU backend (the check's own line)
    extra: str | None = None  # memlab's extra whose package is missing here, e.g. "torchao"
    extra_why: str = ""  # the check's own line, with its pip install command

    @property
    def install(self) -> str:
        return f"pip install 'memlab[{self.extra}]'" if self.extra else ""


@functools.lru_cache(maxsize=1)
def _cpu_experiment():
    return load_experiment("tiny")


def _refusal(profile: Profile, device: torch.device) -> MemlabError | None:
    """The first technique check that refuses `profile` on `device` for the `tiny` experiment, or None."""
    from memlab.core.techniques import check_techniques

    world = 2 if profile.distributed.mode != "none" else 1  # a ddp / fsdp profile is checked as the ranks it is for
    experiment, profile = copy.deepcopy(_cpu_experiment()), copy.deepcopy(profile)
    try:
        apply_overrides(experiment, profile, [])  # the profile's own [overrides], as a run resolves them
        check_techniques(experiment, profile, device, world)
    except MemlabError as e:
        return e
    return None


def needs(profile: Profile) -> Needs:
    """CUDA (on any machine: the checks on the CPU backend) and a missing extra (on this machine: where CUDA is
    here, a CUDA-only profile is checked on it too, so that its own package is asked for)."""
    refused = _refusal(profile, torch.device("cpu"))
    if isinstance(refused, MissingExtra):
        return Needs(extra=refused.extra, extra_why=str(refused))
    if not isinstance(refused, DeviceError):
        return Needs()  # runs, or refused for another reason (a shape, a combination), not for want of CUDA
    if torch.cuda.is_available():
        on_gpu = _refusal(profile, torch.device("cuda"))
        if isinstance(on_gpu, MissingExtra):
            return Needs(cuda=str(refused), extra=on_gpu.extra, extra_why=str(on_gpu))
    return Needs(cuda=str(refused))


def cuda_only(profile: Profile) -> str | None:
    """Why `profile` cannot run on the CPU backend (the check's own one-line message), or None when it can."""
    return needs(profile).cuda
