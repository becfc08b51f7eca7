"""FlexAttention: a compiled attention kernel generated from a mask function, with a block mask that skips whole
tiles outside the causal (optionally windowed) band, so a window of W saves compute as well as memory.

`flex_attention` is compiled once per process (uncompiled, it builds the full score matrix); the block mask is
built lazily for each sequence length and cached. FlexAttention has no backward on the CPU, so on the CPU backend
this kernel falls back to SDPA and says so: with a window, the explicit-mask SDPA (`sdpa:masked (flex has no CPU
backward)`, correct but dense); without, SDPA's causal attention. FlexAttention has no dropout: with
`model.dropout > 0` SDPA stands in on CUDA too (a window through the memory-efficient backend with an explicit mask),
and the name says so, e.g. `sdpa:efficient+mask (flex has no dropout)`.
"""

from __future__ import annotations

import torch

from memlab.core.attention.kernel import ALL_DTYPES, AttentionKernel, Fallback, KernelSpec, Supports, register
from memlab.core.attention.sdpa import SDPAAttention
from memlab.core.config import AttentionConfig

# Compiled kernels cannot run on fake tensors; the backward is CUDA-only (STACK.md).
SUPPORTS = Supports(window=True, dropout=False, dtypes=ALL_DTYPES, devices=frozenset({"cuda", "cpu"}), cpu_backward=False,
                    materializes_scores=False, fake_tensors=False)

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
    supports = SUPPORTS

    def __init__(self, window: int, compiled: bool = True):
        self.window = window
        self.name = "flex"
        self.compiled = compiled  # False only for tests (CPU forward): the uncompiled op materializes T x T
        self._mask_mod = mask_mod_for(window)
        self._block_masks: dict[tuple[int, str], object] = {}

    def _make_block_mask(self, T: int, device: torch.device):
        from torch.nn.attention.flex_attention import create_block_mask

        # B=None, H=None: one mask broadcast over batch and heads (it depends on positions only).
        return create_block_mask(self._mask_mod, B=None, H=None, Q_LEN=T, KV_LEN=T, device=device)

    def block_mask(self, T: int, device: torch.device):
        key = (T, str(device))
        bm = self._block_masks.get(key)
        if bm is None:
            # Outside any compiled graph. disable() imports dynamo (~2 s), so it wraps here rather than at import:
            # every run loads this module to read its declaration.
            bm = self._block_masks[key] = torch.compiler.disable(self._make_block_mask)(T, device)
        return bm

    def __call__(self, q, k, v, dropout_p: float = 0.0):
        assert not dropout_p, "flex has no dropout: build_attention chooses a stand-in before any step"
        bm = self.block_mask(q.size(-2), q.device)
        if self.compiled:
            return compiled_flex()(q, k, v, block_mask=bm)  # (B, nh, T, hs)
        from torch.nn.attention.flex_attention import flex_attention

        return flex_attention(q, k, v, block_mask=bm)


def _build(cfg: AttentionConfig, device: torch.device, dtype: torch.dtype, dropout: float = 0.0) -> AttentionKernel:
    if device.type == "cuda" and not dropout:
        return FlexAttention(cfg.window)
    reason = "flex has no dropout" if device.type == "cuda" else "flex has no CPU backward"
    if cfg.window:
        return Fallback(SDPAAttention("efficient" if device.type == "cuda" else "math", cfg.window, masked=True), reason)
    return Fallback(SDPAAttention("auto"), reason)


register(KernelSpec("flex", _build, "FlexAttention with a block mask, compiled; windows (SDPA stands in on the CPU, which has no flex backward, and for dropout)", lambda cfg: SUPPORTS))
