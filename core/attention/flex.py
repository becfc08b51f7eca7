"""FlexAttention: a compiled attention kernel generated from a mask function, with a block mask that skips whole
tiles outside the causal (optionally windowed) band, so a window of W saves compute as well as memory.

`flex_attention` is compiled once per process (uncompiled, it builds the full score matrix); the block mask is
built lazily for each sequence length and cached. FlexAttention has no backward on the CPU, so on the CPU backend
this kernel falls back to SDPA and says so: with a window, the explicit-mask SDPA (`sdpa:masked (flex has no CPU
backward)`, correct but dense); without, SDPA's causal attention.
"""

from __future__ import annotations

import torch

from memlab.core.attention import AttentionKernel, KernelSpec, register
from memlab.core.attention.flash import Fallback
from memlab.core.attention.sdpa import SDPAAttention
from memlab.core.config import AttentionConfig
from memlab.core.errors import ConfigError

_COMPILED = None


def compiled_flex():
    """torch.compile(flex_attention), made once: every FlexAttention in the process shares its cache."""
    global _COMPILED
    if _COMPILED is None:
        from torch.nn.attention.flex_attention import flex_attention

        _COMPILED = torch.compile(flex_attention, dynamic=False)
    return _COMPILED


def mask_mod_for(window: int):
    """The mask function: key kv visible from query q iff kv <= q and, with a window, q - kv < window."""

    def causal(b, h, q_idx, kv_idx):
        return q_idx >= kv_idx

    def sliding(b, h, q_idx, kv_idx):
        return (q_idx >= kv_idx) & (q_idx - kv_idx < window)

    return sliding if window else causal


class FlexAttention:
    def __init__(self, window: int, compiled: bool = True):
        self.window = window
        self.name = "flex"
        self.compiled = compiled  # False only for tests (CPU forward): the uncompiled op materializes T x T
        self._mask_mod = mask_mod_for(window)
        self._block_masks: dict[tuple[int, str], object] = {}

    @torch.compiler.disable
    def _make_block_mask(self, T: int, device: torch.device):
        from torch.nn.attention.flex_attention import create_block_mask

        # B=None, H=None: one mask broadcast over batch and heads (it depends on positions only).
        return create_block_mask(self._mask_mod, B=None, H=None, Q_LEN=T, KV_LEN=T, device=device)

    def block_mask(self, T: int, device: torch.device):
        key = (T, str(device))
        bm = self._block_masks.get(key)
        if bm is None:
            bm = self._block_masks[key] = self._make_block_mask(T, device)
        return bm

    def __call__(self, q, k, v, dropout_p: float = 0.0):
        if dropout_p:
            raise ConfigError(f"attention.kernel = flex has no dropout; set model.dropout = 0 (got {dropout_p})")
        bm = self.block_mask(q.size(-2), q.device)
        if self.compiled:
            return compiled_flex()(q, k, v, block_mask=bm)  # (B, nh, T, hs)
        from torch.nn.attention.flex_attention import flex_attention

        return flex_attention(q, k, v, block_mask=bm)


def _build(cfg: AttentionConfig, device: torch.device, dtype: torch.dtype) -> AttentionKernel:
    if device.type == "cuda":
        return FlexAttention(cfg.window)
    reason = "flex has no CPU backward"
    if cfg.window:
        return Fallback(SDPAAttention("math", cfg.window, masked=True), reason)
    return Fallback(SDPAAttention("auto"), reason)


register(KernelSpec("flex", _build, "FlexAttention with a block mask, compiled; windows (CPU: SDPA, as it has no CPU backward)"))
