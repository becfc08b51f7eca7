"""FA4 (flash_attn.cute) as one torch custom op over the packed qkv projection: memlab::flash_packed.

Two things FA4's own autograd function costs a compiled step: torch.compile cannot trace its CuTe-DSL kernels, so
each layer broke the graph in two, and its backward returns dq, dk and dv as three tensors that autograd then
concatenates into the projection's gradient, one more pass over 3 x B x T x C. As a custom op compile keeps it
whole, a CUDA graph captures it, and its backward writes dq, dk and dv straight into views of one (B, T, 3C)
gradient (measured on an H100: 0.330 against cuDNN's 0.426 ms a gpt2s layer at batch 16).

On CUDA the op calls FA4; elsewhere (the CPU backend, the tests) a PyTorch reference with the same contract runs,
and a fake implementation gives compile and the estimator the shapes. FA4 has no dropout: the kernel's builder
chooses a stand-in for a run with dropout before any step (memlab.core.attention.flash).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from memlab.core.attention.kernel import window_mask


def split_heads(qkv: torch.Tensor, heads: int) -> list[torch.Tensor]:
    """(B, T, 3C) -> q, k, v as (B, T, nh, hs) views of it: the layout flash-attn takes, nothing copied."""
    B, T, C3 = qkv.shape
    C = C3 // 3
    return [t.view(B, T, heads, C // heads) for t in qkv.split(C, dim=2)]


def fa4_window(window: int) -> tuple[int | None, int | None]:
    """FA4's (left, right) for a causal window of `window` tokens (0: none): W-1 keys to the left, none right."""
    return (window - 1, 0) if window else (None, None)


# ----------------------------------------------------------------------------- the reference (CPU, tests)


def _reference_attention(q, k, v, window: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal attention of (B, T, nh, hs) q, k, v and its log-sum-exp (B, nh, T) in fp32, from the scores."""
    qh, kh, vh = (t.transpose(1, 2) for t in (q, k, v))
    mask = window_mask(q.size(1), window, q.device)
    scores = (qh.float() @ kh.float().transpose(-1, -2)) / math.sqrt(q.size(-1))
    lse = scores.masked_fill(~mask, float("-inf")).logsumexp(-1)
    out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask)
    return out.transpose(1, 2).contiguous(), lse


def _reference_backward(qkv, out, dout, lse, heads: int, window: int) -> torch.Tensor:
    """Attention's backward written out in fp32 from the saved log-sum-exp, as flash kernels do it (autograd is
    not available inside a custom op): P = exp(S - lse), dV = P'dO, dS = P * (dO V' - rowsum(dO * O)), dQ = dS K,
    dK = dS'Q (scaled)."""
    q, k, v = (t.transpose(1, 2).float() for t in split_heads(qkv, heads))
    o, do = out.transpose(1, 2).float(), dout.transpose(1, 2).float()
    scale = 1 / math.sqrt(q.size(-1))
    mask = window_mask(q.size(2), window, q.device)
    p = torch.exp((q @ k.transpose(-1, -2) * scale).masked_fill(~mask, float("-inf")) - lse.unsqueeze(-1))
    ds = p * (do @ v.transpose(-1, -2) - (do * o).sum(-1, keepdim=True))
    grads = (ds @ k * scale, ds.transpose(-1, -2) @ q * scale, p.transpose(-1, -2) @ do)  # dq, dk, dv
    B, T, C3 = qkv.shape
    return torch.cat([g.transpose(1, 2).reshape(B, T, C3 // 3) for g in grads], dim=2).to(qkv.dtype)


# ----------------------------------------------------------------------------- FA4 (CUDA)


def _fa4():
    from flash_attn.cute import interface  # imported on first CUDA use only: flash-attn is an optional extra

    return interface


def _forward_fa4(qkv: torch.Tensor, heads: int, window: int) -> tuple[torch.Tensor, torch.Tensor]:
    q, k, v = split_heads(qkv, heads)
    B, T, nh, hs = q.shape
    out = qkv.new_empty((B, T, nh, hs))
    lse = qkv.new_empty((B, nh, T), dtype=torch.float32)
    left, right = fa4_window(window)
    _fa4()._flash_attn_fwd(q, k, v, causal=True, window_size_left=left, window_size_right=right, return_lse=True,
                           out=out, lse=lse)
    return out, lse


def _backward_fa4(qkv, out, dout, lse, heads: int, window: int) -> torch.Tensor:
    grad = torch.empty_like(qkv)
    dq, dk, dv = split_heads(grad, heads)  # FA4 writes each into its slot of the packed gradient
    left, right = fa4_window(window)
    _fa4()._flash_attn_bwd(*split_heads(qkv, heads), out, dout.contiguous(), lse, causal=True,
                           window_size_left=left, window_size_right=right, dq=dq, dk=dk, dv=dv)
    return grad


# ----------------------------------------------------------------------------- the ops


@torch.library.custom_op("memlab::flash_packed", mutates_args=())
def flash_packed(qkv: torch.Tensor, heads: int, window: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(out (B, T, nh, hs), lse (B, nh, T) fp32): causal attention of the q, k, v packed in qkv (B, T, 3C)."""
    return _reference_attention(*split_heads(qkv, heads), window)


flash_packed.register_kernel("cuda", _forward_fa4)


@flash_packed.register_fake
def _(qkv, heads, window):
    B, T, C3 = qkv.shape
    return qkv.new_empty((B, T, heads, C3 // 3 // heads)), qkv.new_empty((B, heads, T), dtype=torch.float32)


@torch.library.custom_op("memlab::flash_packed_backward", mutates_args=())
def flash_packed_backward(qkv: torch.Tensor, out: torch.Tensor, dout: torch.Tensor, lse: torch.Tensor, heads: int,
                          window: int) -> torch.Tensor:
    """The gradient of qkv (B, T, 3C), dq, dk and dv in place side by side."""
    return _reference_backward(qkv, out, dout, lse, heads, window)


flash_packed_backward.register_kernel("cuda", _backward_fa4)


@flash_packed_backward.register_fake
def _(qkv, out, dout, lse, heads, window):
    return torch.empty_like(qkv)


def _setup(ctx, inputs, output):
    qkv, heads, window = inputs
    out, lse = output
    ctx.save_for_backward(qkv, out, lse)
    ctx.heads, ctx.window = heads, window


def _backward(ctx, dout, _dlse):
    qkv, out, lse = ctx.saved_tensors
    return flash_packed_backward(qkv, out, dout, lse, ctx.heads, ctx.window), None, None


flash_packed.register_autograd(_backward, setup_context=_setup)


def attend_packed(qkv: torch.Tensor, heads: int, window: int) -> torch.Tensor:
    """Causal attention over the packed projection: (B, T, 3C) -> (B, T, C), ready for the output projection."""
    B, T, C3 = qkv.shape
    out, _lse = flash_packed(qkv, heads, window)
    return out.view(B, T, C3 // 3)
