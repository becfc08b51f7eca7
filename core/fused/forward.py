"""GPT.hidden through the fused kernels: the same function of the same parameters, wired across blocks.

The stock block computes x = x + proj(...) and the next LayerNorm in separate kernels, and its backward casts the
fp32 residual gradient to bf16 and sums each bias gradient in passes of their own. Here every residual add takes
the projection's bias and the *next* LayerNorm with it (block i's MLP output meets block i+1's ln_1, the last one
ln_f), so one kernel each way does the add, the norm, the cast and the bias gradients. The MLP runs as one
function (_MLPBranch) whose GELU, forward and backward, is in the epilogues of the matmuls next to it (cuBLASLt's,
as NVIDIA's Transformer Engine runs its MLP). Every other matmul is memlab::matmul (_Linear): cuBLASLt with its
algorithm chosen per shape by timing, torch's own call among the candidates. Output projections run without their
bias (it is added, once, in add_layer_norm), and the saved activation for each norm is its input x, not a second
fp32 tensor.

The loss (fused_head_loss) makes the logits in one matmul and turns them into their gradient in the same
forward, one pass per row, in their own buffer: the backward is the head's two matmuls. The head's weight is
padded with zero rows to a row length of 128 bytes, as Inductor pads the stock logits' rows (same bytes), since
cuBLAS runs several times slower on an odd row length such as GPT-2's 50257 (measured on an H100).

Without dropout, the qkv projection's bias goes in only for q: k's bias adds q.b_k to every score of a row, which
the softmax takes out again (no effect, a gradient of 0), and v's adds b_v to every output row, since a row of
attention weights sums to 1, so it joins the output projection's bias as W_proj b_v. The same function, with a bias
gradient for q's third only.

Where a norm's output feeds a linear layer (qkv, the MLP's input layer), add_layer_norm writes a column of ones
after it (then zeros, to a row length of 16 bytes): the forward's matmul reads only the norm's columns, and the
weight gradient's matmul g^T [h 1] then gives the bias gradient as its last column, from its fp32 accumulator,
where a separate sum would read all of g again (5.3 ms of a 273 ms step at gpt2s batch 200 on the H100; the
extra output column costs 0.04 ms of the 0.44 ms it saves a layer, bench/bias_column_micro.py). The
bias gradient is rounded as the weight gradient is, as under the stock model's autocast.

With model.dropout > 0 (the seeds trained with 0.1), dropout runs in PyTorch where the stock model has it: on the
embeddings, inside the attention kernel, and on each projection's output (bias included, as nn.Linear gives it),
which then meets the fused add with a zero bias. The same dropout calls in the same order as the stock forward.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from memlab.core.fused.ops import add_layer_norm, head_cross_entropy, matmul, mm_bias_gelu, mm_dgelu
from memlab.core.fused.reference import with_ones_column


def ones_pad(C: int, dtype: torch.dtype) -> int:
    """How many columns follow a norm's C outputs where a linear layer takes them: the ones column, then zeros to a
    row length of a multiple of 16 bytes (what cuBLASLt's kernels want)."""
    per_16_bytes = 16 // dtype.itemsize
    return -(C + 1) % per_16_bytes + 1


def _add_norm(x: torch.Tensor, branch: torch.Tensor, bias: torch.Tensor, norm: nn.LayerNorm, dropout: float,
              pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(x + dropout(branch + bias), its norm in the branch's dtype (what the next matmul takes under autocast) with
    `pad` columns after it: the ones column and zeros, where a linear layer takes it, else none)."""
    if dropout:  # the bias must be dropped with the branch, as the stock model's nn.Linear output is
        branch, bias = F.dropout(branch + bias.to(branch.dtype), dropout), torch.zeros_like(bias)
    x, h, _, _ = add_layer_norm(x, branch, bias, norm.weight, norm.bias, norm.eps, branch.dtype, pad)
    return x, h


def _weight_and_bias_grads(d_wb: torch.Tensor, c_in: int, pad: int, g: torch.Tensor, bias_len: int, dtypes):
    """The weight and bias gradients from d_wb = g^T x. Where x had the ones column (pad > 0), d_wb's column c_in
    is the column sums of g: the bias gradient, from the matmul's fp32 accumulator and rounded as its weight
    gradient is (as the stock model's autocast rounds both); else a sum of its own. bias_len: the leading outputs
    the bias covers."""
    w_dtype, b_dtype = dtypes
    d_w = d_wb[:, :c_in].to(w_dtype, memory_format=torch.contiguous_format)
    if b_dtype is None:
        return d_w, None
    d_b = d_wb[:bias_len, c_in] if pad else g[:, :bias_len].sum(dim=0, dtype=torch.float32)
    return d_w, d_b.to(b_dtype)


class _Linear(torch.autograd.Function):
    """F.linear(h, weight, bias) with the weight and bias cast to h's dtype (as autocast casts them), its three
    matmuls through memlab::matmul (the algorithm timed per shape) and the bias added in the forward's epilogue.
    The bias may cover only the leading outputs (the others get none). h may end in the ones column (its pad
    columns get a gradient of 0): the weight gradient's matmul then gives the bias gradient too."""

    @staticmethod
    def forward(ctx, h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        x = h.reshape(-1, h.shape[-1])  # (B*T, C_in [+ pad])
        w = weight.to(h.dtype)
        ctx.save_for_backward(x, w)
        ctx.h_shape, ctx.dtypes = h.shape, (weight.dtype, None if bias is None else bias.dtype)
        ctx.bias_len, ctx.pad = (0 if bias is None else bias.shape[0]), x.shape[1] - w.shape[1]
        if bias is not None:
            bias = F.pad(bias.to(h.dtype), (0, w.shape[0] - bias.shape[0]))
        y = matmul(x, w, False, True, bias)
        return y.view(*h.shape[:-1], w.shape[0])

    @staticmethod
    def backward(ctx, g: torch.Tensor):
        x, w = ctx.saved_tensors
        g = g.reshape(-1, g.shape[-1])  # (B*T, C_out)
        d_h = matmul(g, w, False, False, None, ctx.pad).view(ctx.h_shape)
        d_w, d_b = _weight_and_bias_grads(matmul(g, x, True, False), w.shape[1], ctx.pad, g, ctx.bias_len, ctx.dtypes)
        return d_h, d_w, d_b


class _MLPBranch(torch.autograd.Function):
    """proj(gelu_tanh(h W1^T + b1)) without proj's bias, the weights cast to h's dtype (as autocast casts them).
    Forward: one matmul makes pre and act (memlab::mm_bias_gelu, GELU in the epilogue), then the output layer.
    Backward: the output layer's weight gradient; one matmul the gradient through the output layer and the GELU
    (memlab::mm_dgelu); the input layer's input and weight gradients, and its bias gradient (from the weight
    gradient's matmul where h ends in the ones column, as _Linear's)."""

    @staticmethod
    def forward(ctx, h: torch.Tensor, w_in: torch.Tensor, b_in: torch.Tensor, w_out: torch.Tensor) -> torch.Tensor:
        x = h.reshape(-1, h.shape[-1])  # (B*T, C [+ pad])
        w1, w2 = w_in.to(h.dtype), w_out.to(h.dtype)
        pre, act = mm_bias_gelu(x, w1, b_in.to(h.dtype))  # (B*T, F) each
        ctx.save_for_backward(x, w1, pre, act, w2)
        ctx.h_shape, ctx.dtypes, ctx.pad = h.shape, (w_in.dtype, b_in.dtype, w_out.dtype), x.shape[1] - w1.shape[1]
        return matmul(act, w2, False, True).view(*h.shape[:-1], w2.shape[0])

    @staticmethod
    def backward(ctx, g: torch.Tensor):
        x, w1, pre, act, w2 = ctx.saved_tensors
        w_in_dtype, b_in_dtype, w_out_dtype = ctx.dtypes
        g = g.reshape(-1, g.shape[-1])  # (B*T, C)
        d_w_out = matmul(g, act, True, False)
        d_pre = mm_dgelu(g, w2, pre)  # (B*T, F)
        d_h = matmul(d_pre, w1, False, False, None, ctx.pad).view(ctx.h_shape)
        d_wb = matmul(d_pre, x, True, False)
        d_w_in, d_b_in = _weight_and_bias_grads(d_wb, w1.shape[1], ctx.pad, d_pre, w1.shape[0], (w_in_dtype, b_in_dtype))
        return d_h, d_w_in, d_b_in, d_w_out.to(w_out_dtype)


def _attention_biases(attn, dropout: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(the qkv projection's bias, the output projection's) as the fused block adds them: without dropout, q's bias
    alone and proj's with W_proj b_v added (module docstring); with it, as they are, since dropped attention
    weights no longer sum to 1 in a row."""
    if dropout:
        return attn.qkv.bias, attn.proj.bias
    b_q, _b_k, b_v = attn.qkv.bias.chunk(3)
    # W_proj b_v as a product and a sum, not a matmul: autocast would round a matmul's result to bf16
    return b_q, attn.proj.bias + (attn.proj.weight * b_v).sum(dim=1)


def fused_hidden(model, idx: torch.Tensor) -> torch.Tensor:
    """GPT.hidden(idx) for kernels.fused: (B, T) token ids -> final LayerNorm output (B, T, C), compute dtype."""
    p = model.cfg.dropout if model.training else 0.0
    T = idx.shape[1]
    x = model.drop(model.wte(idx) + model.wpe(torch.arange(T, device=idx.device)))  # (B, T, C) fp32 residual stream
    blocks = list(model.blocks)
    h = blocks[0].ln_1(x)  # the first norm has no residual add before it: the stock one
    if torch.is_autocast_enabled(idx.device.type):  # its output is fp32 under autocast: cast as F.linear would
        h = h.to(torch.get_autocast_dtype(idx.device.type))
    pad = ones_pad(h.shape[-1], h.dtype)
    h = with_ones_column(h, pad)
    for i, block in enumerate(blocks):
        attn, mlp = block.attn, block.mlp
        qkv_bias, proj_bias = _attention_biases(attn, p)
        qkv = _Linear.apply(h, attn.qkv.weight, qkv_bias)
        x, h = _add_norm(x, _Linear.apply(attn.attend_projected(qkv), attn.proj.weight, None), proj_bias, block.ln_2, p, pad)
        last = i + 1 == len(blocks)
        nxt = model.ln_f if last else blocks[i + 1].ln_1
        x, h = _add_norm(x, _MLPBranch.apply(h, mlp.fc.weight, mlp.fc.bias, mlp.proj.weight), mlp.proj.bias, nxt, p,
                         0 if last else pad)  # the head takes ln_f's output as it is
    return h


def fused_head_loss(h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy of h (B, T, C) through the tied head `weight` (V, C), cast to h's dtype (as
    autocast casts it) and padded with zero rows whose logits the loss leaves out."""
    V = weight.shape[0]
    pad = -V % (128 // h.element_size())
    w = weight.to(h.dtype)
    loss, _grad = head_cross_entropy(h.reshape(-1, h.shape[-1]), F.pad(w, (0, 0, 0, pad)) if pad else w, targets.reshape(-1), V)
    return loss
