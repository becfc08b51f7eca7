"""Attention kernels, registered by name, one file each, each declaring what it supports.

Every kernel takes q, k, v as (B, nh, T, hs) and returns causal attention of the same shape, optionally over a
sliding window of W tokens (each query sees itself and the W-1 tokens before it). A kernel may also offer
`packed(qkv, heads, dropout_p)`, taking the (B, T, 3C) projection whole and returning (B, T, C): the model then
calls that instead (FA4, whose backward writes the projection's gradient in one piece: flash_packed.py).

Each kernel class carries a `Supports` declaration (window, dropout, dtypes, devices, CPU backward, whether it
materializes the T x T scores, whether fake tensors can run it); the technique check, the estimator and the
fake-tensor method read those declarations instead of guessing again.

A profile names a kernel family (eager, sdpa, flash, flex). `build_attention` turns that into the kernel that will
run on this device with this dtype and dropout: the family's own kernel where it supports the request, else a
documented stand-in whose name says what runs and why (`Fallback`), else a one-line ConfigError. It is called by
`check` (before any run folder or event exists) and again by the engine with the same inputs, so a kernel never
refuses mid-step. `kernel.name` is what actually ran (e.g. `sdpa:cudnn`), recorded in run.json and the summary.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import torch

from memlab.core.attention import eager, flash, flex, sdpa  # noqa: F401  (each registers itself in REGISTRY)
from memlab.core.attention.kernel import REGISTRY, AttentionKernel, Fallback, Supports
from memlab.core.config import AttentionConfig
from memlab.core.dtypes import compute_dtype
from memlab.core.errors import ConfigError, MemlabError
from memlab.core.standin import FakeStep

if TYPE_CHECKING:
    from memlab.core.config import Experiment, Profile
    from memlab.core.step import TrainStep


def kernel_names() -> list[str]:
    return sorted(REGISTRY)


def declared(cfg: AttentionConfig) -> Supports:
    """The declaration of the kernel `cfg` names, without building it (no GPU needed): for the estimator, which
    plans for a GPU that may not be here."""
    return REGISTRY[cfg.kernel].declares(cfg)


def dtype_name(dtype: torch.dtype) -> str:
    return {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(dtype, "fp32")


def build_attention(cfg: AttentionConfig, device: torch.device, dtype: torch.dtype, dropout: float = 0.0) -> AttentionKernel:
    """The kernel that will run for `cfg` on `device` with inputs of `dtype` and attention dropout `dropout`."""
    spec = REGISTRY.get(cfg.kernel)
    if spec is None:
        raise ConfigError(f"unknown attention.kernel {cfg.kernel!r}; valid: {', '.join(sorted(REGISTRY))}")
    kernel = spec.build(cfg, device, dtype, dropout)
    _require_supported(kernel, cfg, device, dtype, dropout)
    return kernel


def _require_supported(kernel: AttentionKernel, cfg: AttentionConfig, device: torch.device, dtype: torch.dtype, dropout: float) -> None:
    """A builder's choice must honour the request; a mismatch is a bug in the builder, caught before any step."""
    s, want = kernel.supports, dtype_name(dtype)
    problems = [
        cfg.window and not s.window and "a window",
        dropout and not s.dropout and "dropout",
        want not in s.dtypes and f"{want} inputs",
        device.type not in s.devices and f"the {device.type} device",
        device.type == "cpu" and not s.cpu_backward and "training on the CPU",
    ]
    missing = [p for p in problems if p]
    if missing:
        raise ConfigError(f"attention kernel {kernel.name} cannot do {', '.join(missing)} (attention.kernel = {cfg.kernel}); valid kernels: {', '.join(kernel_names())}")


def effective_window(window: int, seq_len: int) -> int:
    """A window of seq_len tokens or more keeps every causal pair: it is full attention, and runs as such."""
    return window if 0 < window < seq_len else 0


def kernel_for(experiment: Experiment, profile: Profile, device: torch.device) -> AttentionKernel:
    """The kernel a run of `profile` on `experiment` uses on `device` (the window clipped to the context)."""
    cfg = dataclasses.replace(profile.attention, window=effective_window(profile.attention.window, experiment.model.seq_len))
    kernel = build_attention(cfg, device, compute_dtype(profile), experiment.model.dropout)
    if profile.attention.window and not cfg.window:
        reason = f"window {profile.attention.window} >= seq_len {experiment.model.seq_len}: full causal attention"
        kernel = Fallback(kernel.inner, f"{kernel.reason}; {reason}") if isinstance(kernel, Fallback) else Fallback(kernel, reason)
    return kernel


# ---------------------------------------------------------------------------------------------- the technique door


def check(experiment: Experiment, profile: Profile, device: torch.device, world: int) -> None:
    """Refuse, before any work, a kernel that cannot run here; building it is cheap and touches no GPU memory."""
    kernel_for(experiment, profile, device)


def apply(step: TrainStep) -> None:
    """The kernel the model is built with (the same choice check() made)."""
    step.kernel = kernel_for(step.experiment, step.profile, step.device)


def fake_step(experiment: Experiment, profile: Profile, device: torch.device) -> FakeStep | None:
    """A kernel that cannot run on fake tensors (or cannot even be built here: flash without a GPU) is traced as SDPA,
    which saves the same tensors; a fused kernel's memory does not depend on the window (O(T) a head either way).
    Without CUDA, SDPA's cuDNN and efficient backends are traced as what a fused kernel saves."""
    try:
        runs = kernel_for(experiment, profile, device).supports.fake_tensors
    except MemlabError:
        runs = False
    a = profile.attention
    if not runs:
        return FakeStep({"attention.kernel": "sdpa", "attention.sdpa_backend": "auto", "attention.window": 0},
                        note=f"attention.kernel = {a.kernel} measured as SDPA (the same saved tensors; it cannot run on fake tensors)")
    if device.type != "cuda" and a.kernel == "sdpa" and a.sdpa_backend in ("cudnn", "efficient"):
        return FakeStep({"attention.sdpa_backend": "auto"},
                        note=f"sdpa_backend = {a.sdpa_backend} measured as a fused kernel saves (its output and log-sum-exp)")
    return None


def backward_kernel(profile: Profile) -> str:
    """The backend whose backward workspace memlab.core.predict.cuda_temporaries.sdpa_backward_workspace_bytes
    gives, for `profile` on an H100: SDPA's auto runs cuDNN there in bf16 and fp16 (the H100's traces, torch
    2.11) and the efficient kernel in fp32 (not modelled); the flash family runs FlashAttention-2's backward (the
    flash-attn library's or SDPA's), or FA4's on Hopper, whose dq accumulator is the same block
    (flash_attn/cute/interface.py, _flash_attn_bwd; its two fp32 rows of B x H x round(T, 128) beside it, 1/32 of
    the accumulator at head_dim 64, are left out), or the SDPA backend that stands in where flash-attn cannot run
    (`fastest`: cuDNN, one fp32 row more than this rule)."""
    a = profile.attention
    if a.kernel == "flash":
        return "flash"
    if a.kernel != "sdpa" or a.sdpa_backend == "math":
        return ""
    if a.sdpa_backend == "auto":
        return "cudnn" if profile.precision.dtype in ("bf16", "fp16") else ""
    return a.sdpa_backend


def keeps_scores(profile: Profile) -> bool:
    """Whether SDPA is pinned to its math path, which saves the T x T probabilities on a GPU too; every other
    backend is a fused kernel that saves its output and a log-sum-exp (what the predictor's fake SDPA allocates)."""
    return profile.attention.sdpa_backend == "math"


def fake_tensors_note(profile: Profile) -> str:
    """What a fake-tensor step of this attention leaves out ("" for nothing): the H100's allocator history of
    eager fp32 attention held one more fp32 T x T gradient in backward than the fake (meta) kernels allocate
    (bench/results/estimate-h100; the analytic figure counts it)."""
    if profile.attention.kernel == "eager" and profile.precision.dtype in ("fp32", "tf32"):
        return ("fp32 eager attention: the H100 held a third fp32 T x T gradient in backward that fake tensors do "
                "not allocate; expect a real peak above this one")
    return ""
