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
