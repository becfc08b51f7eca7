"""The fused kernels as torch custom ops (memlab::...), so torch.compile keeps them whole and autograd knows them.

Each op runs the Triton kernel on CUDA and the PyTorch reference elsewhere (memlab.core.fused.reference); a fake
implementation gives compile the output shapes. `add_layer_norm` has its backward registered here; the MLP's ops
(cuBLASLt matmuls with the GELU in their epilogues, memlab.core.fused.cublaslt) are called from its autograd.Function
(memlab.core.fused.forward).
"""

from __future__ import annotations

import torch

from memlab.core.fused import reference


def _triton():
    from memlab.core.fused import triton_kernels  # imported on first CUDA use only: the CPU backend has no Triton

    return triton_kernels


# ----------------------------------------------------------------------------- residual add + bias + LayerNorm


@torch.library.custom_op("memlab::add_layer_norm", mutates_args=())
def add_layer_norm(
    x_prev: torch.Tensor, branch: torch.Tensor, bias: torch.Tensor, weight: torch.Tensor, ln_bias: torch.Tensor,
    eps: float, out_dtype: torch.dtype, pad: int = 0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(x, h, mean, rstd): x = x_prev + branch + bias in fp32, h = LayerNorm(x; weight, ln_bias) in out_dtype, its
    rows followed by `pad` columns: a column of ones, then zeros (the ones column: memlab.core.fused.forward)."""
    return reference.add_ln_fwd(x_prev, branch, bias, weight, ln_bias, eps, out_dtype, pad)


@add_layer_norm.register_kernel("cuda")
def _(x_prev, branch, bias, weight, ln_bias, eps, out_dtype, pad=0):
    return _triton().add_ln_fwd(x_prev, branch, bias, weight, ln_bias, eps, out_dtype, pad)


@add_layer_norm.register_fake
def _(x_prev, branch, bias, weight, ln_bias, eps, out_dtype, pad=0):
    stats = x_prev.new_empty(x_prev.shape[:-1], dtype=torch.float32)
    h = x_prev.new_empty((*x_prev.shape[:-1], x_prev.shape[-1] + pad), dtype=out_dtype)
    return x_prev.new_empty(x_prev.shape, dtype=torch.float32), h, stats, stats.clone()


@torch.library.custom_op("memlab::add_layer_norm_backward", mutates_args=())
def add_layer_norm_backward(
    g_h: torch.Tensor, g_x: torch.Tensor | None, x: torch.Tensor, mean: torch.Tensor, rstd: torch.Tensor,
    weight: torch.Tensor, low_dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dx, dx in low_dtype, the rows d LayerNorm weight, d LayerNorm bias, d branch bias as one (3, C) tensor).
    g_h may carry add_layer_norm's pad columns: constants, they pass no gradient on."""
    return reference.add_ln_bwd(g_h, g_x, x, mean, rstd, weight, low_dtype)


@add_layer_norm_backward.register_kernel("cuda")
def _(g_h, g_x, x, mean, rstd, weight, low_dtype):
    return _triton().add_ln_bwd(g_h, g_x, x, mean, rstd, weight, low_dtype)


@add_layer_norm_backward.register_fake
def _(g_h, g_x, x, mean, rstd, weight, low_dtype):
    sums = x.new_empty((3, x.shape[-1]), dtype=torch.float32)
    return x.new_empty(x.shape, dtype=torch.float32), x.new_empty(x.shape, dtype=low_dtype), sums


def _setup_add_layer_norm(ctx, inputs, output):
    _, branch, _, weight, _, _, _, _ = inputs
    x, _, mean, rstd = output
    ctx.save_for_backward(x, mean, rstd, weight)
    ctx.low_dtype = branch.dtype


def _backward_add_layer_norm(ctx, g_x, g_h, _g_mean, _g_rstd):
    x, mean, rstd, weight = ctx.saved_tensors
    dx, dx_low, sums = add_layer_norm_backward(g_h, g_x, x, mean, rstd, weight, ctx.low_dtype)
    d_weight, d_ln_bias, d_bias = sums.unbind(0)  # one (3, C) tensor from one sum over the kernel's partial sums
    return dx, dx_low, d_bias, d_weight, d_ln_bias, None, None, None


add_layer_norm.register_autograd(_backward_add_layer_norm, setup_context=_setup_add_layer_norm)

# ----------------------------------------------------------------------------- matmuls, the MLP's with the GELU in their epilogues


def _cublaslt():
    from memlab.core.fused import cublaslt  # imported on first CUDA use only

    return cublaslt


@torch.library.custom_op("memlab::matmul", mutates_args=())
def matmul(a: torch.Tensor, b: torch.Tensor, transpose_a: bool, transpose_b: bool, bias: torch.Tensor | None = None,
           pad_out: int = 0) -> torch.Tensor:
    """op(a) @ op(b) (+ bias) in a's dtype, op transposing where asked, then pad_out zero columns: a and b as
    stored, so that no transposed view reaches the op (Inductor would copy it to a contiguous tensor first). An
    untransposed a may carry pad columns past op(b)'s rows (a ones column): its leading columns are used."""
    return reference.matmul(a, b, transpose_a, transpose_b, bias, pad_out)


@matmul.register_kernel("cuda")
def _(a, b, transpose_a, transpose_b, bias=None, pad_out=0):
    return _cublaslt().matmul(a, b, transpose_a, transpose_b, bias, pad_out)


@matmul.register_fake
def _(a, b, transpose_a, transpose_b, bias=None, pad_out=0):
    return a.new_empty((a.shape[1] if transpose_a else a.shape[0], (b.shape[0] if transpose_b else b.shape[1]) + pad_out))


@torch.library.custom_op("memlab::mm_bias_gelu", mutates_args=())
def mm_bias_gelu(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(pre, act): pre = x (M, K) @ weight (N, K)^T + bias, act = gelu_tanh(pre), both in x's dtype. x may carry
    pad columns past K (a ones column): its leading K are used."""
    return reference.mm_bias_gelu(x, weight, bias)


@mm_bias_gelu.register_kernel("cuda")
def _(x, weight, bias):
    return _cublaslt().mm_bias_gelu(x, weight, bias)


@mm_bias_gelu.register_fake
def _(x, weight, bias):
    pre = x.new_empty((x.shape[0], weight.shape[0]))
    return pre, torch.empty_like(pre)


@torch.library.custom_op("memlab::mm_dgelu", mutates_args=())
def mm_dgelu(g: torch.Tensor, weight: torch.Tensor, pre: torch.Tensor) -> torch.Tensor:
    """d = (g (M, K) @ weight (K, N)) * gelu_tanh'(pre), in pre's dtype."""
    return reference.mm_dgelu(g, weight, pre)


@mm_dgelu.register_kernel("cuda")
def _(g, weight, pre):
    return _cublaslt().mm_dgelu(g, weight, pre)


@mm_dgelu.register_fake
def _(g, weight, pre):
    return torch.empty_like(pre)


# ----------------------------------------------------------------------------- LM head + cross-entropy


@torch.library.custom_op("memlab::head_cross_entropy", mutates_args=())
def head_cross_entropy(h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean loss fp32, d loss / d logits as (rows, weight rows) in h's dtype): h (rows, C), weight (V padded, C)."""
    return reference.head_cross_entropy(h, weight, targets, vocab)


@head_cross_entropy.register_kernel("cuda")
def _(h, weight, targets, vocab):
    return _triton().head_cross_entropy(h, weight, targets, vocab)


@head_cross_entropy.register_fake
def _(h, weight, targets, vocab):
    return h.new_empty((), dtype=torch.float32), h.new_empty((h.shape[0], weight.shape[0]))


def _setup_head_cross_entropy(ctx, inputs, output):
    h, weight, _, _ = inputs
    ctx.save_for_backward(h, weight, output[1])


def _backward_head_cross_entropy(ctx, g_loss, _g_grad):
    # the logits' gradient was made in forward for a loss gradient of 1: the two matmuls take the real one
    h, weight, grad = ctx.saved_tensors
    d_h = (matmul(grad, weight, False, False).float() * g_loss).to(h.dtype)
    d_weight = (matmul(grad, h, True, False).float() * g_loss).to(weight.dtype)
    return d_h, d_weight, None, None


head_cross_entropy.register_autograd(_backward_head_cross_entropy, setup_context=_setup_head_cross_entropy)

# ----------------------------------------------------------------------------- declared to Inductor up front


def declare_to_inductor() -> None:
    """Register memlab's ops with Inductor as kernels it calls as they are, with the layout rule it would pick on
    meeting each one. Met undeclared, torch 2.11's Inductor logs the op with its inputs' IR spelled out (formatted
    even when the log is off), and through the fused model's chain of ops that string grows exponentially with
    depth: gpt2s's compile never finished (later torch formats it lazily)."""
    try:
        from torch._inductor import lowering
        from torch._library.utils import get_layout_constraint_tag
    except ImportError:  # no Inductor here: nothing compiles, nothing to declare
        return
    for op in (add_layer_norm, add_layer_norm_backward, matmul, mm_bias_gelu, mm_dgelu, head_cross_entropy):
        overload = op._opoverload
        if overload not in lowering.lowerings:
            rule = lowering.tag_to_layout_constraint(get_layout_constraint_tag(overload, with_default=True))
            lowering.make_fallback(overload, layout_constraint=rule)
