"""PyTorch's scaled_dot_product_attention, optionally pinned to one backend (flash, cudnn, efficient, math).

With `auto`, PyTorch picks; the backend it picked is read back with torch._fused_sdp_choice on the first call so
the summary says what really ran (e.g. `sdpa:cudnn`). A sliding window needs an explicit mask, which only the
math and efficient backends take and which still costs O(T^2): on CUDA that is refused (use flash or flex); on
the CPU backend, where FlexAttention has no backward, it is the documented way to window: `sdpa:masked`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from memlab.core.attention import KernelSpec, register, window_mask
from memlab.core.config import AttentionConfig
from memlab.core.errors import ConfigError, DeviceError

BACKENDS = {
    "flash": SDPBackend.FLASH_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "math": SDPBackend.MATH,
}
_NAMES = {v: k for k, v in BACKENDS.items()}


def chosen_backend(q, k, v, dropout_p: float, is_causal: bool, mask=None) -> str:
    """The backend SDPA would dispatch to for these inputs (PyTorch's own selection logic)."""
    try:
        idx = torch._fused_sdp_choice(q, k, v, mask, dropout_p, is_causal)
        return _NAMES.get(SDPBackend(idx), f"backend{idx}")
    except Exception:  # noqa: BLE001 (private API: if it moves, say so rather than guess)
        return "auto"


class SDPAAttention:
    def __init__(self, backend: str, window: int = 0, masked: bool = False):
        self.backend = backend
        self.window = window
        self.masked = masked  # explicit boolean mask (CPU windowing)
        self.name = "sdpa:masked" if masked else (f"sdpa:{backend}" if backend != "auto" else "sdpa")
        self._mask: torch.Tensor | None = None
        self._probed = False

    def __call__(self, q, k, v, dropout_p: float = 0.0):
        if self.masked:
            T = q.size(-2)
            if self._mask is None or self._mask.size(0) != T or self._mask.device != q.device:
                self._mask = window_mask(T, self.window, q.device)
            return F.scaled_dot_product_attention(q, k, v, attn_mask=self._mask, dropout_p=dropout_p)
        if self.backend == "auto":
            if not self._probed and not torch.compiler.is_compiling():
                self.name = f"sdpa:{chosen_backend(q, k, v, dropout_p, True)}"
                self._probed = True
            return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True)
        with sdpa_kernel([BACKENDS[self.backend]]):
            return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True)


def _build(cfg: AttentionConfig, device: torch.device, dtype: torch.dtype) -> SDPAAttention:
    if cfg.window:
        if device.type == "cuda":
            raise ConfigError(
                f"attention.kernel = sdpa cannot apply a sliding window (attention.window = {cfg.window}) without a dense "
                "T x T mask; use attention.kernel = flash or flex for windowed attention, or window = 0"
            )
        if cfg.sdpa_backend not in ("auto", "math"):
            raise ConfigError(f"attention.window on CPU runs SDPA with an explicit mask; sdpa_backend {cfg.sdpa_backend!r} cannot take one (use auto)")
        return SDPAAttention("math", cfg.window, masked=True)
    if device.type != "cuda" and cfg.sdpa_backend in ("cudnn", "efficient"):
        raise DeviceError(f"attention.sdpa_backend = {cfg.sdpa_backend} needs CUDA; on CPU use auto, flash or math")
    return SDPAAttention(cfg.sdpa_backend)


register(KernelSpec("sdpa", _build, "torch SDPA (flash / cudnn / efficient / math backends)"))
