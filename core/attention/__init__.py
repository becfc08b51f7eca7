"""Attention kernels, registered by name, one file each.

Every kernel takes q, k, v as (B, nh, T, hs) and returns causal attention of the same shape, optionally over a
sliding window of W tokens (each query sees itself and the W-1 tokens before it). A kernel states what it
supports; `build_attention` checks the profile against that when the model is built, never mid-step, so a kernel
that cannot window is an error, never a silent dense fallback. `kernel.name` is what actually ran
(e.g. `sdpa:cudnn`), recorded in run.json and the summary.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol

import torch

from memlab.core.config import AttentionConfig
from memlab.core.errors import ConfigError


class AttentionKernel(Protocol):
    name: str
    window: int

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float = 0.0) -> torch.Tensor: ...


@dataclass(frozen=True)
class KernelSpec:
    name: str
    build: Callable[[AttentionConfig, torch.device, torch.dtype], AttentionKernel]
    describe: str


_REGISTRY: dict[str, KernelSpec] = {}


def register(spec: KernelSpec) -> None:
    _REGISTRY[spec.name] = spec


def kernel_names() -> list[str]:
    _load_builtin()
    return sorted(_REGISTRY)


def build_attention(cfg: AttentionConfig, device: torch.device, dtype: torch.dtype) -> AttentionKernel:
    _load_builtin()
    spec = _REGISTRY.get(cfg.kernel)
    if spec is None:
        raise ConfigError(f"unknown attention.kernel {cfg.kernel!r}; valid: {', '.join(sorted(_REGISTRY))}")
    return spec.build(cfg, device, dtype)


def window_mask(T: int, window: int, device: torch.device) -> torch.Tensor:
    """Boolean (T, T) mask, True where query i may attend key j: j <= i and, with a window, i - j < window."""
    i = torch.arange(T, device=device).unsqueeze(1)
    j = torch.arange(T, device=device).unsqueeze(0)
    mask = j <= i
    if window:
        mask = mask & (i - j < window)
    return mask


_BUILTIN_LOADED = False


def _load_builtin() -> None:
    # A flag, not "is the registry empty": importing one kernel module first (flash imports sdpa) registers some.
    global _BUILTIN_LOADED
    if _BUILTIN_LOADED:
        return
    from memlab.core.attention import eager, flash, flex, sdpa  # noqa: F401  (each registers itself)

    _BUILTIN_LOADED = True
