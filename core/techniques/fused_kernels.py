"""kernels.fused: route the model's forward through memlab's fused kernels (memlab.core.fused)."""

from __future__ import annotations

import torch

from memlab.core.config import KernelsConfig
from memlab.core.errors import DeviceError


def apply_fused_kernels(model: torch.nn.Module, cfg: KernelsConfig) -> str:
    """Switch the model to the fused forward; returns what runs, for run.json and the summary."""
    if not cfg.fused:
        return "off"
    if next(model.parameters()).device.type == "cuda":
        try:
            import triton
        except ImportError as e:
            raise DeviceError("kernels.fused needs Triton on CUDA (CUDA builds of torch ship it): pip install triton") from e
        label = f"fused (triton {triton.__version__})"
    else:
        label = "fused (CPU reference)"  # no Triton on the CPU backend: the same ops in plain PyTorch
    model.fused = True
    return label
