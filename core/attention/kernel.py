"""What an attention kernel is, and the registry the kernels enter by name (memlab.core.attention builds from it):
each kernel's `Supports` declaration, the `KernelSpec` it registers, the causal window mask and `Fallback`, the
stand-in whose name says what ran and why. The kernels (eager, sdpa, flash, flex) import this, not the package."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol

import torch

from memlab.core.config import AttentionConfig

ALL_DTYPES = frozenset({"fp32", "bf16", "fp16"})


@dataclass(frozen=True)
class Supports:
    """What one kernel can do; read by check(), the estimator and the fake-tensor method."""

    window: bool  # honours a sliding window (cheaper with one), not by a dense fallback
    dropout: bool  # applies attention dropout itself
    dtypes: frozenset[str]  # input dtypes it takes: fp32 | bf16 | fp16
    devices: frozenset[str]  # cuda | cpu
    cpu_backward: bool  # trains on the CPU backend (FlexAttention's backward is CUDA-only)
    materializes_scores: bool  # keeps a (B, nh, T, T) score matrix: memory grows with T^2
    fake_tensors: bool  # runs under FakeTensorMode (memlab estimate --method fake)


class AttentionKernel(Protocol):
    name: str
    window: int
    supports: Supports

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float = 0.0) -> torch.Tensor: ...


@dataclass(frozen=True)
class KernelSpec:
    name: str
    build: Callable[[AttentionConfig, torch.device, torch.dtype, float], AttentionKernel]
    describe: str
    declares: Callable[[AttentionConfig], Supports]  # what the family's own kernel supports on CUDA, unbuilt


REGISTRY: dict[str, KernelSpec] = {}


def register(spec: KernelSpec) -> None:
    REGISTRY[spec.name] = spec


def window_mask(T: int, window: int, device: torch.device) -> torch.Tensor:
    """Boolean (T, T) mask, True where query i may attend key j: j <= i and, with a window, i - j < window."""
    i = torch.arange(T, device=device).unsqueeze(1)
    j = torch.arange(T, device=device).unsqueeze(0)
    mask = j <= i
    if window:
        mask = mask & (i - j < window)
    return mask


class Fallback:
    """A kernel that stands in for the one asked for; its name says what ran and why, e.g.
    `sdpa:flash (flash-attn not installed)`. The inner name is read live: SDPA's `auto` names its backend on the
    first call."""

    def __init__(self, inner: AttentionKernel, reason: str):
        self.inner = inner
        self.reason = reason
        self.window = inner.window
        self.supports = inner.supports

    @property
    def name(self) -> str:
        return f"{self.inner.name} ({self.reason})"

    def __call__(self, q, k, v, dropout_p: float = 0.0):
        return self.inner(q, k, v, dropout_p=dropout_p)
