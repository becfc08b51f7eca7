"""What a technique declares for the predictor (memlab.core.predict): the part of it a step on fake tensors cannot
run on this machine (a CUDA-only library's kernels, copies to the host when host and device are one), the settings
that leave it out so the step builds, and the name of the stand-in that allocates what it would have allocated on
the device (memlab.core.predict.standins installs it). Declared next to each technique's check and apply, so the
predictor never reads the profile's fields itself."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class StandIn:
    kind: str  # optimizer | loss | offload: one stand-in of each kind at most
    installs: str | None  # the stand-in memlab.core.predict.standins puts in place; None: the plain step bounds it
    settings: dict[str, Any] = field(default_factory=dict)  # "section.key" -> value on the copy the fake step builds


@dataclass(frozen=True)
class FakeStep:
    """How a technique enters the predictor's step on fake tensors where it cannot run there as configured (a kernel
    without a fake implementation, a CUDA-only setting on a CPU): the settings on the copy the fake step builds and
    a note saying what changed, or the one-line reason it cannot be predicted on this device at all."""

    settings: dict[str, Any] = field(default_factory=dict)  # "section.key" -> value, as StandIn.settings
    note: str | None = None
    refusal: str | None = None


def with_settings(profile: Any, settings: dict[str, Any]) -> None:
    """Set each "section.key" of `settings` on `profile` (a copy the fake step builds)."""
    for key, value in settings.items():
        section, name = key.split(".")
        setattr(getattr(profile, section), name, value)
