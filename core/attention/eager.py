"""Eager attention: materializes the (B, nh, T, T) score matrix, as the seeds' baseline did."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from memlab.core.attention.kernel import ALL_DTYPES, KernelSpec, Supports, register, window_mask
from memlab.core.config import AttentionConfig

# Windows by masking the full score matrix: honoured, but no memory or compute saved.
SUPPORTS = Supports(window=True, dropout=True, dtypes=ALL_DTYPES, devices=frozenset({"cuda", "cpu"}), cpu_backward=True,
                    materializes_scores=True, fake_tensors=True)


class EagerAttention:
    supports = SUPPORTS

    def __init__(self, window: int):
        self.window = window
        self.name = "eager"
        self._mask: torch.Tensor | None = None

    def __call__(self, q, k, v, dropout_p: float = 0.0):
        T = q.size(-2)
        if self._mask is None or self._mask.size(0) != T or self._mask.device != q.device:
            self._mask = window_mask(T, self.window, q.device)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))  # (B, nh, T, T)
        att = att.masked_fill(~self._mask, float("-inf"))
        att = F.softmax(att, dim=-1)
        if dropout_p:
            att = F.dropout(att, p=dropout_p)
        return att @ v  # (B, nh, T, hs)


def _build(cfg: AttentionConfig, device: torch.device, dtype: torch.dtype, dropout: float = 0.0) -> EagerAttention:
    return EagerAttention(cfg.window)


register(KernelSpec("eager", _build, "plain PyTorch, materializes T x T (windows by masking: no memory saved)", lambda cfg: SUPPORTS))
