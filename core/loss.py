"""Next-token cross-entropy, either from full logits or chunked so the B x T x V logits never exist at once.

Chunked: the final hidden states (B*T, C) are cut into chunks of rows; each chunk's logits and loss are computed
under activation checkpointing, so forward keeps only the chunk's loss and backward recomputes one chunk's
logits at a time. Peak logits memory drops from B*T*V to chunk_size*V (plus the fp32 upcast of one chunk).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint


def _logits(h: torch.Tensor, weight: torch.Tensor, softcap: float) -> torch.Tensor:
    """fp32 logits (rows, V); softcap > 0 squashes them into (-softcap, softcap) as Gemma-2's head does."""
    logits = (h @ weight.t()).float()
    return torch.tanh(logits / softcap) * softcap if softcap else logits


def _chunk_loss_sum(h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, softcap: float = 0.0) -> torch.Tensor:
    return F.cross_entropy(_logits(h, weight, softcap), targets, reduction="sum")


def loss_from_hidden(h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, chunk_size: int = 0,
                     softcap: float = 0.0) -> torch.Tensor:
    """Mean cross-entropy of hidden states h (B, T, C) through the LM head `weight` (V, C) against targets (B, T).

    chunk_size = 0: full logits (B*T, V), upcast to fp32 for a stable softmax, as a plain loop would.
    """
    h, t = h.flatten(0, 1), targets.flatten()
    if not chunk_size:
        return F.cross_entropy(_logits(h, weight, softcap), t)
    total = h.new_zeros((), dtype=torch.float32)
    for start in range(0, h.size(0), chunk_size):
        sl = slice(start, start + chunk_size)
        total = total + checkpoint(_chunk_loss_sum, h[sl], weight, t[sl], softcap, use_reentrant=False)
    return total / t.numel()
