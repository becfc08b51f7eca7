"""The fused kernels' arithmetic in plain PyTorch: what kernels.fused runs on the CPU backend, and what the Triton
kernels (memlab.core.fused.triton_kernels) are checked against. Same signatures and outputs as those launchers."""

from __future__ import annotations

import math

import torch


def add_ln_fwd(x_prev, branch, bias, weight, ln_bias, eps: float, out_dtype: torch.dtype, pad: int = 0):
    """x = x_prev + branch + bias (fp32); h = LayerNorm(x) in out_dtype, its rows followed by `pad` columns that
    hold a 1 and then zeros (the ones column: memlab.core.fused.forward); mean and rstd per row."""
    x = x_prev.float() + branch.float() + bias.float()
    mean = x.mean(dim=-1)
    xc = x - mean.unsqueeze(-1)
    rstd = torch.rsqrt((xc * xc).mean(dim=-1) + eps)
    h = xc * rstd.unsqueeze(-1) * weight.float() + ln_bias.float()
    return x, with_ones_column(h.to(out_dtype), pad), mean, rstd


def with_ones_column(h: torch.Tensor, pad: int) -> torch.Tensor:
    """h with `pad` more columns: a column of ones, then zeros (none where pad is 0)."""
    if not pad:
        return h
    tail = h.new_zeros(pad)
    tail[0] = 1
    return torch.cat([h, tail.expand(*h.shape[:-1], pad)], dim=-1)


def add_ln_bwd(g_h, g_x, x, mean, rstd, weight, low_dtype: torch.dtype):
    """dx = g_x + LayerNorm'(g_h) (fp32) and in low_dtype; the LayerNorm weight, LayerNorm bias and branch-bias grads
    as the rows of one (3, C) tensor. g_h may have the ones column's pad: no gradient flows through it."""
    C = x.shape[-1]
    g = g_h[..., :C].float().reshape(-1, C)
    xhat = ((x.reshape(-1, C) - mean.reshape(-1, 1)) * rstd.reshape(-1, 1))
    wg = g * weight.float()
    c1 = (xhat * wg).mean(dim=-1, keepdim=True)
    c2 = wg.mean(dim=-1, keepdim=True)
    dx = (wg - (xhat * c1 + c2)) * rstd.reshape(-1, 1)
    if g_x is not None:
        dx = dx + g_x.float().reshape(-1, C)
    dx = dx.reshape(x.shape)
    dx_low = dx.to(low_dtype, copy=True)  # a copy even in fp32: an op's outputs may not alias each other
    return dx, dx_low, torch.stack([(g * xhat).sum(dim=0), g.sum(dim=0), dx.reshape(-1, C).sum(dim=0)])


_K0 = math.sqrt(2.0 / math.pi)


def _tanh_u(x):
    """tanh(sqrt(2/pi) (x + 0.044715 x^3)): gelu_tanh(x) = x/2 (1 + this), and its derivative's factor."""
    return torch.tanh(_K0 * (x + 0.044715 * x * x * x))


def _dgelu(g, pre):
    """d = g * gelu_tanh'(pre) in pre's dtype."""
    x = pre.float()
    t = _tanh_u(x)
    d = g.float() * (0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * _K0 * (1.0 + 3 * 0.044715 * x * x))
    return d.to(pre.dtype)


def head_cross_entropy(h, weight, targets, vocab: int):
    """(mean cross-entropy of h @ weight^T against targets, fp32; its gradient with respect to those logits, in h's
    dtype). weight may carry pad rows past `vocab`: their logits are left out of the softmax, their gradient is 0."""
    M = h.shape[0]
    logits = (h @ weight.t()).float()
    real = logits[:, :vocab]
    lse = torch.logsumexp(real, dim=1)
    loss = (lse - real.gather(1, targets[:, None]).squeeze(1)).mean()
    grad = torch.zeros_like(logits)
    grad[:, :vocab] = torch.exp(real - lse[:, None])
    grad.scatter_add_(1, targets[:, None], grad.new_full((M, 1), -1.0))
    return loss, (grad / M).to(h.dtype)


def _gelu_tanh(x):
    return 0.5 * x * (1.0 + _tanh_u(x))


def mm_bias_gelu(x, weight, bias):
    """(pre, act): pre = x @ weight^T + bias in x's dtype (the matmul accumulates in fp32), act its GELU (tanh).
    x may carry pad columns past weight's (a ones column): its leading ones are the matrix."""
    x = x[:, : weight.shape[1]]
    pre = (x.float() @ weight.float().t() + bias.float()).to(x.dtype)
    return pre, _gelu_tanh(pre.float()).to(x.dtype)


def mm_dgelu(g, weight, pre):
    """d = (g @ weight, rounded to pre's dtype) * gelu_tanh'(pre) in pre's dtype."""
    return _dgelu((g.float() @ weight.float()).to(pre.dtype), pre)



def matmul(a, b, transpose_a: bool, transpose_b: bool, bias=None, pad_out: int = 0):
    """op(a) @ op(b) (+ bias, added before the rounding to a's dtype, as nn.Linear's addmm adds it), followed by
    pad_out zero columns. An untransposed a may carry pad columns past op(b)'s rows: its leading ones are used."""
    y = b.t() if transpose_b else b
    x = a.t() if transpose_a else a[:, : y.shape[0]]
    out = x @ y if bias is None else torch.addmm(bias, x, y)
    return torch.nn.functional.pad(out, (0, pad_out)) if pad_out else out
