"""Fused linear cross-entropy from two libraries, adapted to memlab's head (loss.fused = liger | cce).

Both compute mean next-token cross-entropy of hidden states h (B*T, C) through the LM head W (V, C), the tied
embedding, without ever holding the B x T x V logits. Both are Triton kernels: CUDA only.

liger  Liger Kernel's `liger_fused_linear_cross_entropy`: forward walks the rows in chunks of about B*T*C / V
       (one chunk's logits at a time), computes the loss and, right there, the gradients of h and of W; backward
       only hands them on. Its forward runs under the caller's autocast (torch.amp.custom_fwd), so its matmuls take
       the bf16 copy of the fp32 weight; its weight gradient accumulates in fp32 (accum_dtype).
cce    Apple's Cut Cross-Entropy `linear_cross_entropy` (impl "cce"): forward computes each row's log-sum-exp
       blockwise in SRAM and the target logit by an indexed dot; backward recomputes the logits block by block. Run
       exact (filter_eps=None): the library's default ("high") skips gradient blocks whose softmax is below bf16
       resolution, which in training from scratch is every logit at first (1/V < 2^-12 once V > 4096), so only the
       targets' logits move: on the H100 (bigvocab, V 128,256, 20 steps) val ppl was 793 against 530 for bf16 and
       liger_ce. It is an autograd.Function outside autocast whose backward takes 16-bit inputs only, so h and W
       are cast explicitly.
"""

from __future__ import annotations

import importlib
import importlib.metadata
from dataclasses import dataclass
from typing import Callable

import torch

from memlab.core.errors import ConfigError, MissingExtra

IGNORE_INDEX = -100  # memlab's targets have no ignored positions; named so both libraries get the same value

HeadLoss = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class Library:
    distribution: str  # the pip name, for the version and the install line
    module: str  # what `import` finds
    function: str  # the kernel's functional form, module:attribute
    extra: str  # memlab's optional extra
    what: str  # how the summary names it


LIBRARIES = {
    "liger": Library("liger-kernel", "liger_kernel", "liger_kernel.transformers.functional:liger_fused_linear_cross_entropy",
                     "liger", "fused linear CE"),
    "cce": Library("cut-cross-entropy", "cut_cross_entropy", "cut_cross_entropy:linear_cross_entropy",
                   "cce", "(cce kernel, exact: filter_eps=None)"),
}


def require(name: str) -> None:
    """Refuse, in one line naming the extra, when the library is not installed."""
    lib = LIBRARIES[name]
    try:
        importlib.import_module(lib.module)
    except ImportError:
        raise MissingExtra(f"loss.fused = {name} needs {lib.distribution}: pip install 'memlab[{lib.extra}]' (or loss.chunked = true, which needs nothing)", lib.extra) from None


def kernel_function(name: str) -> Callable[..., torch.Tensor]:
    module, attribute = LIBRARIES[name].function.split(":")
    return getattr(importlib.import_module(module), attribute)


def label(name: str) -> str:
    """What ran, for the summary: library, version, kernel, e.g. 'liger 0.8.5 fused linear CE'."""
    lib = LIBRARIES[name]
    try:
        version = importlib.metadata.version(lib.distribution)
    except importlib.metadata.PackageNotFoundError:
        version = "(version unknown)"
    return f"{name} {version} {lib.what}"


def head_loss(name: str, compute_dtype: torch.dtype, kernel: Callable[..., torch.Tensor] | None = None) -> HeadLoss:
    """The model's loss from (h (B, T, C), W (V, C), targets (B, T)) through library `name`'s kernel (tests pass a
    stand-in `kernel` with the library's signature)."""
    kernel = kernel or kernel_function(name)
    if name == "liger":
        return _liger(kernel, compute_dtype)
    if name == "cce":
        return _cce(kernel, compute_dtype)
    raise ConfigError(f"unknown loss.fused {name!r}; valid: none, {', '.join(LIBRARIES)}")


def _liger(kernel: Callable[..., torch.Tensor], dtype: torch.dtype) -> HeadLoss:
    def loss(h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        # h in the compute dtype: its gradient buffer (held from forward to backward) is then 2 bytes an element
        # under autocast; the fp32 weight as is, cast by autocast inside (see the module's note). accum_dtype:
        # the weight gradient summed over the chunks in fp32 even where the weight is bf16 (FSDP2's gathered one)
        return kernel(h.flatten(0, 1).to(dtype), weight, targets.flatten(), ignore_index=IGNORE_INDEX, reduction="mean",
                      accum_dtype=torch.float32)

    return loss


def _cce(kernel: Callable[..., torch.Tensor], dtype: torch.dtype) -> HeadLoss:
    def loss(h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        e, c = h.flatten(0, 1).to(dtype), weight.to(dtype)  # (B*T, C), (V, C): the 16-bit inputs CCE's backward asserts
        return kernel(e, c, targets.flatten(), ignore_index=IGNORE_INDEX, reduction="mean", impl="cce",
                      filter_eps=None)

    return loss
