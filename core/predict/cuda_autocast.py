"""CUDA's autocast policy on the CPU, for the predictor's fake step of a GPU's training step.

The two devices' autocast lists differ: under `torch.autocast("cuda")` the ops of ATen's AT_FORALL_FP32 run in fp32
(reduced-precision inputs cast up first: pow, exp, layer_norm, ...) and those of AT_FORALL_FP32_SET_OPT_DTYPE give an
fp32 result (softmax, log_softmax, sum, cumsum, ...), while the CPU's autocast leaves all of them in bf16. What
autograd saves follows: transformers' GPT-2 computes its tanh GELU from separate ops, which on an H200 kept 6 bytes a
hidden element more in every block than the CPU's fake step saw (heldout-arch-h200: its peaks 14-22% over the
prediction wherever the blocks kept their activations). `cuda_policy()` registers CUDA's rule for those ops at
the AutocastCPU dispatch key, where CUDA applies it (so a composite op's inner calls get it too), for as long as the
context lasts. The lists are ATen's (aten/src/ATen/autocast_mode.h, torch 2.11 to 2.13).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, Callable

import torch

REDUCED = (torch.bfloat16, torch.float16)
# AT_FORALL_FP32 less what the CPU's own autocast already runs in fp32 (its losses, cdist, ...)
IN_FP32 = ("acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p", "reciprocal", "rsqrt",
           "sinh", "tan", "pow.Tensor_Scalar", "pow.Tensor_Tensor", "pow.Scalar", "softplus", "layer_norm",
           "native_layer_norm", "rms_norm", "group_norm", "logsumexp")
# AT_FORALL_FP32_SET_OPT_DTYPE less prod (the CPU casts it up already): with no dtype asked, CUDA asks for an fp32
# result (no fp32 copy of the input is made)
FP32_RESULT = ("softmax.int", "log_softmax.int", "sum", "sum.dim_IntList", "cumsum", "cumprod",
               "linalg_vector_norm")
_DTYPE_POSITION = {"softmax.int": 2, "log_softmax.int": 2}  # the rest take dtype by keyword only
_AUTOCAST_CPU = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastCPU)


def _op(name: str) -> Any:
    packet, _, overload = name.partition(".")
    return getattr(getattr(torch.ops.aten, packet), overload or "default")


def _reduced(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.dtype in REDUCED


def _in_fp32(op: Any) -> Callable[..., Any]:
    def kernel(*args: Any, **kwargs: Any) -> Any:
        with torch._C._ExcludeDispatchKeyGuard(_AUTOCAST_CPU):
            return op(*(a.float() if _reduced(a) else a for a in args), **kwargs)
    return kernel


def _fp32_result(op: Any, name: str) -> Callable[..., Any]:
    position = _DTYPE_POSITION.get(name)

    def kernel(*args: Any, **kwargs: Any) -> Any:
        with torch._C._ExcludeDispatchKeyGuard(_AUTOCAST_CPU):
            if _reduced(args[0]):
                if position is not None and len(args) > position:  # softmax's dtype comes positionally
                    if args[position] is None:
                        args = (*args[:position], torch.float32, *args[position + 1:])
                elif kwargs.get("dtype") is None:
                    kwargs["dtype"] = torch.float32
            return op(*args, **kwargs)
    return kernel


@contextlib.contextmanager
def cuda_policy() -> Iterator[None]:
    """CUDA's autocast rules for these ops while it lasts, in this process (the fake step holds its lock)."""
    library = torch.library.Library("aten", "IMPL")
    try:
        for name in IN_FP32:
            library.impl(name, _in_fp32(_op(name)), "AutocastCPU")
        for name in FP32_RESULT:
            library.impl(name, _fp32_result(_op(name), name), "AutocastCPU")
        yield
    finally:
        library._destroy()
