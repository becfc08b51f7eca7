"""flash-attn: FA4 (`flash_attn.cute`, package flash-attn-4) or FA2 (`flash_attn`, package flash-attn).

Both take (B, T, nh, hs) in bf16 or fp16 and window with `window_size=(W-1, 0)` next to `causal=True` (W-1 keys
to the left, none to the right: each query sees itself and the W-1 tokens before it). FA4 returns `(out, lse)`
and has no dropout; FA2 returns `out` and has. FA4 runs on Hopper and Blackwell (compute capability 9.x-11.x),
where it is preferred when both are installed; FA2 otherwise. flash-attn is optional (`pip install memlab[flash]`).

Where flash-attn cannot do what the run asks, a stand-in runs and its name says which and why, never silently:
- dropout (the seeds trained with 0.1) where only FA4 is there: FA2 if installed; else SDPA's flash backend
  (`sdpa:flash (flash_attn.cute has no dropout)`), or the backend `sdpa_backend` names; with a window SDPA's
  memory-efficient backend with an explicit mask (`sdpa:efficient+mask (...)`): FlexAttention has no dropout either;
- no flash-attn: SDPA's flash backend, or the backend `attention.sdpa_backend` names (`fastest`: cuDNN); a window
  then is an error on CUDA (use flex), the masked SDPA on the CPU;
- the CPU backend: SDPA (flash-attn needs CUDA).
"""

from __future__ import annotations

import importlib.metadata
from dataclasses import dataclass
from typing import Callable

import torch

from memlab.core.attention.kernel import AttentionKernel, Fallback, KernelSpec, Supports, register
from memlab.core.attention.flash_packed import attend_packed, fa4_window
from memlab.core.attention.sdpa import SDPAAttention
from memlab.core.config import AttentionConfig
from memlab.core.errors import ConfigError

INSTALL = "pip install 'memlab[flash]'"


@dataclass(frozen=True)
class FlashImpl:
    """One importable flash-attn: its call, what it is called in the summary, and how it spells things."""

    func: Callable
    label: str  # e.g. "flash_attn.cute 4.0.0b36"
    fa4: bool  # FA4: returns (out, lse), no dropout, Hopper or newer only

    @property
    def supports(self) -> Supports:
        return Supports(window=True, dropout=not self.fa4, dtypes=frozenset({"bf16", "fp16"}), devices=frozenset({"cuda"}),
                        cpu_backward=False, materializes_scores=False, fake_tensors=False)


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def installed() -> dict[str, str | None]:
    """Versions of the flash-attn distributions present (None when absent), without importing them."""
    return {"fa4": _version("flash-attn-4"), "fa2": _version("flash-attn")}


def _import_fa4() -> FlashImpl | str:
    try:
        from flash_attn.cute import flash_attn_func
    except Exception as e:  # noqa: BLE001 (an import that fails for any reason means "not usable here")
        return f"flash_attn.cute: {e.__class__.__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    return FlashImpl(flash_attn_func, f"flash_attn.cute {_version('flash-attn-4') or '?'}", fa4=True)


def _import_fa2() -> FlashImpl | str:
    try:
        from flash_attn import flash_attn_func
    except Exception as e:  # noqa: BLE001
        return f"flash_attn: {e.__class__.__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    return FlashImpl(flash_attn_func, f"flash_attn {_version('flash-attn') or '?'}", fa4=False)


def find_impl(device: torch.device, dropout: bool = False) -> tuple[FlashImpl | None, str]:
    """The flash-attn to use on `device` (one with dropout when `dropout`), or None and the reason there is none
    (for the fallback's name)."""
    have = installed()
    if not any(have.values()):
        return None, "flash-attn not installed"
    if device.type != "cuda":
        return None, "flash-attn needs CUDA"
    major, _ = torch.cuda.get_device_capability(device)
    hopper_or_newer = 9 <= major <= 11
    if not hopper_or_newer and not have["fa2"]:
        return None, f"flash-attn-4 needs compute capability 9.0 or newer, this GPU is {major}.x"
    # FA4 first where it runs (it is the faster on Hopper and Blackwell), FA2 otherwise.
    order = (("fa4", _import_fa4), ("fa2", _import_fa2)) if hopper_or_newer else (("fa2", _import_fa2),)
    errors, no_dropout = [], None
    for dist, load in order:
        if not have[dist]:
            continue
        impl = load()
        if not isinstance(impl, FlashImpl):
            errors.append(impl)
        elif dropout and not impl.supports.dropout:
            no_dropout = f"{impl.label.split()[0]} has no dropout"
        else:
            return impl, ""
    return None, no_dropout or "flash-attn not importable: " + "; ".join(errors)


class FlashAttention:
    def __init__(self, impl: FlashImpl, window: int):
        self.impl = impl
        self.window = window
        self.name = impl.label
        self.supports = impl.supports
        # FA2 spells "no window" (-1, -1), FA4 (None, None); both take (W-1, 0) for a causal window of W.
        self.window_size = fa4_window(window) if impl.fa4 else ((window - 1, 0) if window else (-1, -1))
        # FA4's CuTe-DSL kernels are not traceable by torch.compile: the model hands FA4 its packed projection
        # through memlab::flash_packed (`packed`), which compile keeps whole; a caller with q, k, v apart still
        # gets FA4 outside the graph (one graph break a call). FA2 registers torch custom ops.
        self._call = torch.compiler.disable(self._fa4) if impl.fa4 else self._fa2
        self.packed = self._packed if impl.fa4 else None
        self.accepts_gqa = True  # FA2 and FA4 take fewer key/value heads than query heads as they are

    def _packed(self, qkv: torch.Tensor, heads: int, dropout_p: float = 0.0) -> torch.Tensor:
        assert not dropout_p, "FA4 has no dropout: build_attention chooses a stand-in before any step"
        return attend_packed(qkv, heads, self.window)

    def _fa4(self, q, k, v):
        out, _lse = self.impl.func(q, k, v, causal=True, window_size=self.window_size)
        return out

    def _fa2(self, q, k, v, dropout_p):
        return self.impl.func(q, k, v, dropout_p=dropout_p, causal=True, window_size=self.window_size)

    def __call__(self, q, k, v, dropout_p: float = 0.0):
        # (B, nh, T, hs) -> (B, T, nh, hs): a view of the qkv projection's layout, last dim contiguous as required
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        if self.impl.fa4:
            assert not dropout_p, "FA4 has no dropout: build_attention chooses a stand-in before any step"
            out = self._call(q, k, v)
        else:
            out = self._call(q, k, v, dropout_p)
        return out.transpose(1, 2)  # (B, nh, T, hs)


def _build(cfg: AttentionConfig, device: torch.device, dtype: torch.dtype, dropout: float = 0.0) -> AttentionKernel:
    if device.type == "cuda" and dtype not in (torch.bfloat16, torch.float16):
        # flash-attn and SDPA's flash backend alike take 16-bit inputs only (fp32 and tf32 keep q, k, v in fp32).
        raise ConfigError("attention.kernel = flash needs 16-bit inputs: set precision.dtype = bf16 or fp16 (fp32 and tf32 are not supported by flash-attn)")
    impl, reason = find_impl(device, dropout=bool(dropout))
    if impl is not None:
        return FlashAttention(impl, cfg.window)
    if device.type != "cuda":
        # CPU: SDPA picks (its flash backend when it can; math with dropout, which CPU flash lacks); the name says which.
        return Fallback(SDPAAttention("math", cfg.window, masked=True) if cfg.window else SDPAAttention("auto"), reason)
    if cfg.window and dropout:
        return Fallback(SDPAAttention("efficient", cfg.window, masked=True), reason)
    if cfg.window:
        raise ConfigError(
            f"attention.window = {cfg.window} with attention.kernel = flash needs flash-attn ({reason}; {INSTALL}): "
            "SDPA's flash backend cannot window. Use attention.kernel = flex for a sliding window without it"
        )
    return Fallback(SDPAAttention(stand_in_backend(cfg)), reason)


def stand_in_backend(cfg: AttentionConfig) -> str:
    """The SDPA backend that runs where flash-attn cannot: the one `sdpa_backend` names (`fastest` names cudnn, the
    fastest on an H100), else SDPA's flash backend, the nearest to flash-attn."""
    return "flash" if cfg.sdpa_backend == "auto" else cfg.sdpa_backend


# Declared as FA2 (FA4 is the same but for dropout): no T x T scores, as with every stand-in flash uses on CUDA.
_DECLARED = FlashImpl(lambda *a, **k: None, "flash_attn", fa4=False).supports

register(KernelSpec("flash", _build, f"flash-attn: FA4 on Hopper+, else FA2; windows; falls back to SDPA's flash backend without it or for dropout under FA4 ({INSTALL})", lambda cfg: _DECLARED))
