"""GPT.hidden through the fused kernels: the same function of the same parameters, wired across blocks.

The stock block computes x = x + proj(...) and the next LayerNorm in separate kernels, and its backward casts the
fp32 residual gradient to bf16 and sums each bias gradient in passes of their own. Here every residual add takes
the projection's bias and the *next* LayerNorm with it (block i's MLP output meets block i+1's ln_1, the last one
ln_f), so one kernel each way does the add, the norm, the cast and the bias gradients; the MLP's input layer
computes its bias gradient inside the GELU backward. Projections run without their bias (it is added, once, in
add_layer_norm), and the saved activation for each norm is its input x, not a second fp32 tensor.

The loss (fused_head_loss) makes the logits in one matmul and turns them into their gradient in the same
forward, one pass per row, in their own buffer: the backward is the head's two matmuls. The head's weight is
padded with zero rows to a row length of 128 bytes, as Inductor pads the stock logits' rows (same bytes), since
cuBLAS runs several times slower on an odd row length such as GPT-2's 50257 (bench/results/fused-head-h100/).

With model.dropout > 0 (the seeds trained with 0.1), dropout runs in PyTorch where the stock model has it: on the
embeddings, inside the attention kernel, and on each projection's output (bias included, as nn.Linear gives it),
which then meets the fused add with a zero bias. The same dropout calls in the same order as the stock forward.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from memlab.core.fused.ops import add_layer_norm, gelu_tanh_backward_bias, head_cross_entropy


def _add_norm(x: torch.Tensor, branch: torch.Tensor, bias: torch.Tensor, norm: nn.LayerNorm, dropout: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(x + dropout(branch + bias), its norm in the branch's dtype: what the next matmul takes under autocast)."""
    if dropout:  # the bias must be dropped with the branch, as the stock model's nn.Linear output is
        branch, bias = F.dropout(branch + bias.to(branch.dtype), dropout), torch.zeros_like(bias)
    x, h, _, _ = add_layer_norm(x, branch, bias, norm.weight, norm.bias, norm.eps, branch.dtype)
    return x, h


class _LinearGelu(torch.autograd.Function):
    """gelu_tanh(x W^T + b) with the weight cast to x's dtype (as autocast does); backward: one kernel for
    gelu' and the bias gradient, then the two matmuls."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        w = weight.to(x.dtype)
        pre = torch.addmm(bias.to(x.dtype), x.reshape(-1, x.shape[-1]), w.t())  # (B*T, F)
        ctx.save_for_backward(x, w, pre)
        ctx.weight_dtype = weight.dtype
        return F.gelu(pre, approximate="tanh").view(*x.shape[:-1], -1)

    @staticmethod
    def backward(ctx, g: torch.Tensor):
        x, w, pre = ctx.saved_tensors
        d, d_bias = gelu_tanh_backward_bias(g.reshape(pre.shape), pre)  # (B*T, F), (F,)
        x2 = x.reshape(-1, x.shape[-1])
        return (d @ w).view(x.shape), (d.t() @ x2).to(ctx.weight_dtype), d_bias


def fused_hidden(model, idx: torch.Tensor) -> torch.Tensor:
    """GPT.hidden(idx) for kernels.fused: (B, T) token ids -> final LayerNorm output (B, T, C), compute dtype."""
    p = model.cfg.dropout if model.training else 0.0
    T = idx.shape[1]
    x = model.drop(model.wte(idx) + model.wpe(torch.arange(T, device=idx.device)))  # (B, T, C) fp32 residual stream
    blocks = list(model.blocks)
    h = blocks[0].ln_1(x)  # the first norm has no residual add before it: the stock one
    for i, block in enumerate(blocks):
        attn, mlp = block.attn, block.mlp
        x, h = _add_norm(x, F.linear(attn.attend(h), attn.proj.weight), attn.proj.bias, block.ln_2, p)
        act = _LinearGelu.apply(h, mlp.fc.weight, mlp.fc.bias)
        nxt = blocks[i + 1].ln_1 if i + 1 < len(blocks) else model.ln_f
        x, h = _add_norm(x, F.linear(act, mlp.proj.weight), mlp.proj.bias, nxt, p)
    return h


def fused_head_loss(h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy of h (B, T, C) through the tied head `weight` (V, C), cast to h's dtype (as
    autocast casts it) and padded with zero rows whose logits the loss leaves out."""
    V = weight.shape[0]
    pad = -V % (128 // h.element_size())
    w = weight.to(h.dtype)
    loss, _grad = head_cross_entropy(h.reshape(-1, h.shape[-1]), F.pad(w, (0, 0, 0, pad)) if pad else w, targets.reshape(-1), V)
    return loss
