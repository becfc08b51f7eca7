"""What a profile needs from the machine: CUDA, or an optional package. Declared here once, without torch.

Both sides read these declarations: each technique's check refuses from them on the CPU backend (so a refusal and a
listing cannot disagree), and `memlab profiles` and the TUI list a profile's needs from them in a fraction of a
second, with no technique module (nor torch, Dynamo, torchao) imported. A package is looked for, not imported
(`importlib.util.find_spec`): an installed package that fails to import is still refused by its check.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from memlab.core.config import AttentionConfig, Profile

# optimizer.name -> (import name, distribution, extra): the optimizers that come from other libraries
OPTIMIZER_PACKAGES = {
    "adamw8bit": ("torchao.optim", "torchao", "torchao"),
    "adamw4bit": ("torchao.optim", "torchao", "torchao"),
    "bf16_sr": ("torchao.optim", "torchao", "torchao"),
    "paged_adamw8bit": ("bitsandbytes.optim", "bitsandbytes", "bnb"),
    "galore": ("galore_torch", "galore-torch", "galore"),  # imports transformers and bitsandbytes when imported
}
OPTIMIZER_CUDA_ONLY = {
    "adamw8bit": "its 8-bit kernels are GPU-only",
    "adamw4bit": "its 4-bit state is quantized by GPU kernels",
    "paged_adamw8bit": "its state lives in CUDA unified memory",
}
# memlab's extras (pyproject's optional-dependencies): the top-level modules each one installs
EXTRA_MODULES = {
    "torchao": ("torchao",),
    "bnb": ("bitsandbytes",),
    "galore": ("galore_torch", "transformers", "bitsandbytes"),
    "liger": ("liger_kernel",),
    "cce": ("cut_cross_entropy",),
    "peft": ("peft",),
}
LOSS_DISTRIBUTIONS = {"liger": "liger-kernel", "cce": "cut-cross-entropy"}  # loss.fused -> its pip name (= its extra)


# ---------------------------------------------------------------------------------------------- CUDA


def _allocator(p: Profile) -> str | None:
    if p.allocator.expandable_segments:
        return "allocator.expandable_segments configures the CUDA caching allocator and needs CUDA; set it to false on the CPU backend"
    return None


def _loader(p: Profile) -> str | None:
    if p.loader.pin_memory:
        return "loader.pin_memory speeds host-to-GPU copies and needs CUDA; set it to false on the CPU backend"
    return None


def _precision(p: Profile) -> str | None:
    if p.precision.dtype == "tf32":
        return "precision.dtype = tf32 needs CUDA (TF32 is a tensor-core mode); valid on the CPU backend: fp32, bf16, fp16, bf16_pure"
    return None


def sdpa_backend_needs_cuda(a: AttentionConfig) -> str | None:
    if a.sdpa_backend in ("cudnn", "efficient"):
        return f"attention.sdpa_backend = {a.sdpa_backend} needs CUDA; on CPU use auto, flash or math"
    return None


def _sdpa_backend(p: Profile) -> str | None:
    a = p.attention  # with a window, the CPU runs SDPA's math backend with a mask (another check's refusal)
    return sdpa_backend_needs_cuda(a) if a.kernel == "sdpa" and not a.window else None


def _finetune_base(p: Profile) -> str | None:
    f = p.finetune
    if f.method != "full" and f.base in ("nf4", "int8"):
        return f"finetune.base = {f.base} (QLoRA) quantizes the base with bitsandbytes' kernels, which need CUDA; on the CPU backend use base = bf16 or auto (profile lora)"
    return None


def _loss(p: Profile) -> str | None:
    if p.loss.fused != "none":
        return f"loss.fused = {p.loss.fused} runs Triton kernels and needs CUDA; on the CPU backend use loss.chunked = true (profile chunked_ce)"
    return None


def _float8(p: Profile) -> str | None:
    if p.kernels.float8:
        return "kernels.float8 needs CUDA float8 tensor cores (an H100 or Ada GPU, compute capability 8.9+); set kernels.float8 = false on the CPU backend"
    return None


def _fsdp_offload(p: Profile) -> str | None:
    if p.distributed.cpu_offload and p.distributed.mode == "fsdp":  # under another mode it is a config error
        return "distributed.cpu_offload moves FSDP2's sharded parameters from the GPU to the CPU and needs CUDA"
    return None


def _liger(p: Profile) -> str | None:
    if p.kernels.liger:
        return "kernels.liger runs Liger Kernel's Triton kernels and needs CUDA; set it to false on the CPU backend"
    return None


def _optimizer(p: Profile) -> str | None:
    name = p.optimizer.name
    if name in OPTIMIZER_CUDA_ONLY:
        return f"optimizer.name = {name} needs CUDA ({OPTIMIZER_CUDA_ONLY[name]}); use adamw on the CPU backend"
    return None


def _optimizer_offload(p: Profile) -> str | None:
    if p.optimizer.offload:
        return "optimizer.offload moves optimizer state from the GPU to the CPU and needs CUDA; set it to false on the CPU backend"
    return None


def _act_offload(p: Profile) -> str | None:
    ck = p.checkpointing
    if ck.offload and ck.offload_overlap:
        return "checkpointing.offload_overlap copies activations to the CPU on a side CUDA stream and needs CUDA; set checkpointing.offload = false on the CPU backend"
    if ck.offload:
        return "checkpointing.offload moves activations from the GPU to the CPU and needs CUDA; set it to false on the CPU backend"
    return None


def _cuda_graph(p: Profile) -> str | None:
    if p.cuda_graph.enabled:
        return "cuda_graph.enabled captures the step as a CUDA graph and needs CUDA; set it to false on the CPU backend"
    return None


# knob -> why it needs CUDA (None: it does not, as configured), in the order memlab.core.techniques checks them
CUDA_NEEDS: dict[str, Callable[[Profile], str | None]] = {
    "allocator": _allocator,
    "loader": _loader,
    "precision": _precision,
    "attention.sdpa_backend": _sdpa_backend,
    "kernels.liger": _liger,
    "finetune.base": _finetune_base,
    "loss": _loss,
    "kernels.float8": _float8,
    "distributed.cpu_offload": _fsdp_offload,
    "optimizer.name": _optimizer,
    "optimizer.offload": _optimizer_offload,
    "checkpointing.offload": _act_offload,
    "cuda_graph": _cuda_graph,
}


def refuse_without_cuda(knob: str, profile: Profile, device) -> None:
    """A technique check's CPU refusal: the knob's declared need, as a DeviceError where `device` is not CUDA."""
    from memlab.core.errors import DeviceError

    why = CUDA_NEEDS[knob](profile)
    if why and device.type != "cuda":
        raise DeviceError(why)


# ---------------------------------------------------------------------------------------------- extras


def _installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None  # a top-level name: found, not imported


def _missing_module(extra: str) -> str | None:
    return next((m for m in EXTRA_MODULES[extra] if not _installed(m)), None)


def _finetune_package(p: Profile) -> tuple[str, str] | None:
    f = p.finetune
    if f.method in ("lora", "dora") and _missing_module("peft"):
        return "peft", f"finetune.method = {f.method} needs peft: pip install 'memlab[peft]'"
    if f.method != "full" and f.base in ("nf4", "int8") and _missing_module("bnb"):
        return "bnb", f"finetune.base = {f.base} needs bitsandbytes: pip install 'memlab[bnb]'"
    return None


def _loss_package(p: Profile) -> tuple[str, str] | None:
    fused = p.loss.fused
    if fused in LOSS_DISTRIBUTIONS and _missing_module(fused):
        return fused, f"loss.fused = {fused} needs {LOSS_DISTRIBUTIONS[fused]}: pip install 'memlab[{fused}]' (or loss.chunked = true, which needs nothing)"
    return None


def _float8_package(p: Profile) -> tuple[str, str] | None:
    if p.kernels.float8 and _missing_module("torchao"):
        return "torchao", "kernels.float8 needs torchao: pip install 'memlab[torchao]', or kernels.float8 = false"
    return None


LIGER_MISSING = "kernels.liger needs Liger Kernel: pip install 'memlab[liger]', or kernels.liger = false"


def _liger_package(p: Profile) -> tuple[str, str] | None:
    if p.kernels.liger and _missing_module("liger"):
        return "liger", LIGER_MISSING
    return None


def _optimizer_package(p: Profile) -> tuple[str, str] | None:
    name = p.optimizer.name
    if name not in OPTIMIZER_PACKAGES:
        return None
    _, dist, extra = OPTIMIZER_PACKAGES[name]
    missing = _missing_module(extra)
    if missing:
        return extra, f"optimizer.name = {name} needs {dist} ({missing} is missing): pip install 'memlab[{extra}]', or use adamw"
    return None


# knob -> (extra, the check's own line with its pip install command) when its package is not installed here; in
# the order memlab.core.techniques checks them
EXTRA_NEEDS: dict[str, Callable[[Profile], tuple[str, str] | None]] = {
    "finetune": _finetune_package,
    "loss.fused": _loss_package,
    "kernels.float8": _float8_package,
    "kernels.liger": _liger_package,
    "optimizer.name": _optimizer_package,
}


# ---------------------------------------------------------------------------------------------- a profile's needs


@dataclass(frozen=True)
class Needs:
    """What stands between a profile and a run on this machine (all None: nothing)."""

    cuda: str | None = None  # why it cannot run on the CPU backend (the check's own line)
    extra: str | None = None  # memlab's extra whose package is missing here, e.g. "torchao"
    extra_why: str = ""  # the check's own line, with its pip install command

    @property
    def install(self) -> str:
        return f"pip install 'memlab[{self.extra}]'" if self.extra else ""


def needs(profile: Profile) -> Needs:
    """CUDA (on any machine) and a missing extra (on this one) for `profile`. A
    profile refused for another reason (a shape, a combination) is refused when it runs, by its checks."""
    cuda = next((why for why in (need(profile) for need in CUDA_NEEDS.values()) if why), None)
    missing = next((m for m in (need(profile) for need in EXTRA_NEEDS.values()) if m), None)
    return Needs(cuda=cuda, extra=missing[0], extra_why=missing[1]) if missing else Needs(cuda=cuda)


def cuda_only(profile: Profile) -> str | None:
    """Why `profile` cannot run on the CPU backend (the check's own one-line message), or None when it can."""
    return needs(profile).cuda
