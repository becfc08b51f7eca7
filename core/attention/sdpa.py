"""PyTorch's scaled_dot_product_attention, optionally pinned to one backend (flash, cudnn, efficient, math).

With `auto`, PyTorch picks; the backend it picked is read back with torch._fused_sdp_choice on the first call so
the summary says what really ran (e.g. `sdpa:cudnn`). A sliding window needs an explicit mask, which only the
math and efficient backends take and which still costs O(T^2) in the mask: on CUDA `attention.kernel = sdpa` with a
window is refused (use flash or flex); the masked form serves as the documented stand-in where nothing better can
window: on the CPU backend (`sdpa:masked`, math: FlexAttention has no CPU backward) and, on CUDA, for a window with
dropout (`sdpa:efficient+mask`: neither FA4 nor FlexAttention has dropout).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from memlab.core.attention.kernel import ALL_DTYPES, KernelSpec, Supports, register, window_mask
from memlab.core.config import AttentionConfig
from memlab.core.errors import ConfigError, DeviceError
from memlab.core.requirements import sdpa_backend_needs_cuda

BACKENDS = {
    "flash": SDPBackend.FLASH_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "math": SDPBackend.MATH,
}
_NAMES = {v: k for k, v in BACKENDS.items()}
_BOTH = frozenset({"cuda", "cpu"})
_HALF = frozenset({"bf16", "fp16"})


def supports_of(backend: str, masked: bool) -> Supports:
    """Each backend's declaration. `auto` is declared as PyTorch's fused choice (no T x T scores); `math`, and the
    masked form on the CPU (which runs math), keep the full score matrix."""
    if masked:
        return Supports(window=True, dropout=True, dtypes=ALL_DTYPES, devices=_BOTH, cpu_backward=True,
                        materializes_scores=backend == "math", fake_tensors=True)
    table = {
        "auto": (ALL_DTYPES, _BOTH, False),
        "flash": (_HALF | {"fp32"}, _BOTH, False),  # CUDA: 16-bit only (checked by flash's builder); CPU: fp32 too
        "cudnn": (_HALF, frozenset({"cuda"}), False),
        "efficient": (ALL_DTYPES, frozenset({"cuda"}), False),
        "math": (ALL_DTYPES, _BOTH, True),
    }
    dtypes, devices, materializes = table[backend]
    return Supports(window=False, dropout=True, dtypes=dtypes, devices=devices, cpu_backward=True,
                    materializes_scores=materializes, fake_tensors=True)


def chosen_backend(q, k, v, dropout_p: float, is_causal: bool, mask=None) -> str:
    """The backend SDPA would dispatch to for these inputs (PyTorch's own selection logic)."""
    try:
        gqa = {"enable_gqa": True} if k.size(-3) != q.size(-3) else {}
        kind = q.device.type
        if torch.is_autocast_enabled(kind):  # autocast casts SDPA's inputs before the dispatch: probe with its dtype
            dtype = torch.get_autocast_dtype(kind)
            q, k, v = (t.to(dtype) for t in (q, k, v))
        idx = torch._fused_sdp_choice(q, k, v, mask, dropout_p, is_causal, **gqa)
        return _NAMES.get(SDPBackend(idx), f"backend{idx}")
    except Exception:  # noqa: BLE001 (private API: if it moves, say so rather than guess)
        return "auto"


class SDPAAttention:
    def __init__(self, backend: str, window: int = 0, masked: bool = False):
        self.backend = backend
        self.window = window
        self.masked = masked  # explicit boolean mask: the stand-in that windows where no better kernel can
        self.supports = supports_of(backend, masked)
        if masked:
            self.name = "sdpa:masked" if backend in ("math", "auto") else f"sdpa:{backend}+mask"
        else:
            self.name = f"sdpa:{backend}" if backend != "auto" else "sdpa"
        self._mask: torch.Tensor | None = None
        self._probed = False
        # grouped-query attention (fewer key/value heads, the hf family): SDPA repeats them itself (enable_gqa)
        # rather than the caller copying them; cuDNN's backend is not documented to take them, so it gets copies
        self.accepts_gqa = backend != "cudnn"

    def _window_mask(self, q: torch.Tensor) -> torch.Tensor:
        T = q.size(-2)
        if self._mask is None or self._mask.size(0) != T or self._mask.device != q.device:
            self._mask = window_mask(T, self.window, q.device)
        return self._mask

    def __call__(self, q, k, v, dropout_p: float = 0.0):
        gqa = {"enable_gqa": True} if k.size(-3) != q.size(-3) else {}  # only ever asked for: older torch lacks it
        if self.masked:
            mask = self._window_mask(q)
            if self.backend in ("math", "auto"):
                return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, **gqa)
            with sdpa_kernel([BACKENDS[self.backend]]):
                return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, **gqa)
        if self.backend == "auto":
            if not self._probed and not torch.compiler.is_compiling():
                self.name = f"sdpa:{chosen_backend(q, k, v, dropout_p, True)}"
                self._probed = True
            return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True, **gqa)
        with sdpa_kernel([BACKENDS[self.backend]]):
            return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True, **gqa)


def _build(cfg: AttentionConfig, device: torch.device, dtype: torch.dtype, dropout: float = 0.0) -> SDPAAttention:
    if cfg.window:
        if device.type == "cuda":
            raise ConfigError(
                f"attention.kernel = sdpa cannot apply a sliding window (attention.window = {cfg.window}) without a dense "
                "T x T mask; use attention.kernel = flash or flex for windowed attention, or window = 0"
            )
        if cfg.sdpa_backend not in ("auto", "math"):
            raise ConfigError(f"attention.window on CPU runs SDPA with an explicit mask; sdpa_backend {cfg.sdpa_backend!r} cannot take one (use auto)")
        return SDPAAttention("math", cfg.window, masked=True)
    if device.type != "cuda" and (why := sdpa_backend_needs_cuda(cfg)):
        raise DeviceError(why)
    if device.type == "cuda" and cfg.sdpa_backend in ("flash", "cudnn") and dtype == torch.float32:
        raise ConfigError(f"attention.sdpa_backend = {cfg.sdpa_backend} takes 16-bit inputs on CUDA: set precision.dtype = bf16 or fp16, or use sdpa_backend = auto, efficient or math")
    if device.type != "cuda" and cfg.sdpa_backend == "flash" and dropout:
        # the CPU's flash backend has no dropout: math does it (a documented stand-in, named)
        raise ConfigError(f"attention.sdpa_backend = flash has no dropout on the CPU (model.dropout = {dropout}); use auto or math, or model.dropout = 0")
    return SDPAAttention(cfg.sdpa_backend)


register(KernelSpec("sdpa", _build, "torch SDPA (flash / cudnn / efficient / math backends)", lambda cfg: supports_of(cfg.sdpa_backend, False)))
