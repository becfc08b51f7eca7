"""The dtypes a profile's precision.dtype gives: what matmuls and attention compute in, what the parameters are
stored in. Facts, not a technique: the attention kernels, the predictor and the precision technique's door
(memlab.core.techniques.precision) all read them."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from memlab.core.config import Profile

AUTOCAST = {"bf16": torch.bfloat16, "fp16": torch.float16}
PARAM_DTYPE = {"bf16_pure": torch.bfloat16}  # precisions whose parameters are not fp32


def compute_dtype(profile: Profile) -> torch.dtype:
    """The dtype matmuls and attention see: the autocast dtype or the parameters', else fp32 (tf32 keeps fp32)."""
    dtype = profile.precision.dtype
    return AUTOCAST.get(dtype) or PARAM_DTYPE.get(dtype, torch.float32)


def param_dtype(profile: Profile) -> torch.dtype:
    return PARAM_DTYPE.get(profile.precision.dtype, torch.float32)
