"""memlab's attention kernels inside a transformers model, through transformers' attention registry.

transformers calls `ALL_ATTENTION_FUNCTIONS[config._attn_implementation](module, q, k, v, mask, ...)` from every
attention layer; registering `memlab` there (and a mask function that builds no mask) makes a model built with
attn_implementation="memlab" call the kernel the profile chose (memlab.core.attention): FA4, cuDNN or flash SDPA,
flex with a window. memlab trains on packed windows of contiguous tokens with no padding, so plain causal attention
is the whole mask: no (B, 1, T, T) mask tensor is ever built.

The layer hands over q as (B, nh, T, hs) and k, v as (B, n_kv, T, hs) (grouped-query attention). A kernel that takes
fewer key/value heads itself (`accepts_gqa`) gets them as they are; any other gets them repeated to nh heads, the
copy transformers' own eager path makes. A layer's own scaling (Gemma's query_pre_attn_scalar) is folded into q.
Attention logit soft-capping (Gemma-2) is computed here, from the scores, only under attention.kernel = eager (the
family check refuses the other kernels for such a model, before any work).
"""

from __future__ import annotations

import math

import torch

from memlab.core.attention.kernel import window_mask

NAME = "memlab"
KERNEL_ATTR = "memlab_kernel"  # set by the adapter on each attention layer: the kernel that serves it


def _repeat_kv(t: torch.Tensor, groups: int) -> torch.Tensor:
    """(B, n_kv, T, hs) -> (B, n_kv * groups, T, hs), each key/value head serving its group of query heads."""
    if groups == 1:
        return t
    B, n_kv, T, hs = t.shape
    return t[:, :, None].expand(B, n_kv, groups, T, hs).reshape(B, n_kv * groups, T, hs)


def _softcapped(q, k, v, scale: float, cap: float, window: int, dropout: float) -> torch.Tensor:
    """Eager causal attention with tanh soft-capping of the scores (Gemma-2): materializes (B, nh, T, T)."""
    scores = (q @ k.transpose(-2, -1)) * scale
    scores = torch.tanh(scores / cap) * cap
    scores = scores.masked_fill(~window_mask(q.size(-2), window, q.device), float("-inf"))
    probs = torch.softmax(scores.float(), dim=-1).to(q.dtype)
    if dropout:
        probs = torch.nn.functional.dropout(probs, p=dropout)
    return probs @ v


def memlab_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling: float | None = None,
                     sliding_window: int | None = None, softcap: float | None = None, **kwargs):
    """transformers' attention-function contract: returns (output (B, T, nh, hs), no weights)."""
    kernel = getattr(module, KERNEL_ATTR)
    hs = query.size(-1)
    default_scale = 1.0 / math.sqrt(hs)
    groups = query.size(1) // key.size(1)
    if softcap:
        k, v = _repeat_kv(key, groups), _repeat_kv(value, groups)
        out = _softcapped(query, k, v, scaling or default_scale, softcap, kernel.window, dropout)
        return out.transpose(1, 2).contiguous(), None
    if scaling is not None and not math.isclose(scaling, default_scale, rel_tol=1e-6):
        query = query * (scaling / default_scale)  # the kernel scales by 1/sqrt(hs): the layer's own scale folded in
    query, key, value = _one_dtype(query, key, value)
    if not getattr(kernel, "accepts_gqa", False):
        key, value = _repeat_kv(key, groups), _repeat_kv(value, groups)
    out = kernel(query, key, value, dropout_p=dropout)  # (B, nh, T, hs)
    return out.transpose(1, 2).contiguous(), None


def _one_dtype(q, k, v):
    """q, k and v in one dtype. Under autocast a layer's rotary embedding (fp32 cos and sin against the fp32 residual
    stream) hands q and k over in fp32 beside a bf16 v; SDPA casts them itself under autocast, flash-attn asserts."""
    if q.dtype == k.dtype == v.dtype:
        return q, k, v
    device = q.device.type
    dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else v.dtype
    return q.to(dtype), k.to(dtype), v.to(dtype)


def no_mask(*args, **kwargs):
    """transformers' mask-function contract; packed windows without padding need none (causal is the kernel's)."""
    return None


_REGISTERED = False


def register() -> None:
    """Register `memlab` with transformers' attention and mask registries (once a process)."""
    global _REGISTERED
    if _REGISTERED:
        return
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(NAME, memlab_attention)
    AttentionMaskInterface.register(NAME, no_mask)
    _REGISTERED = True
