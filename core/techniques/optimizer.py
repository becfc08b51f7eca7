"""optimizer.name / fused / offload / in_backward: AdamW (foreach or fused), Adafactor, torchao's 8-bit and 4-bit
AdamW, bf16 AdamW with stochastic rounding, Muon (+ AdamW), bitsandbytes' paged 8-bit AdamW, GaLore; state on the
CPU; the step inside backward. This is the door: check, build_optimizer, apply; the parts it builds from live beside
it (memlab.core.optim's groups and schedule, optim_library for the libraries' optimizers, muon, optim_offload,
optim_in_backward)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from memlab.core.errors import ConfigError
from memlab.core import shard_step
from memlab.core.standin import StandIn
from memlab.core.muon import build_muon
from memlab.core.optim import ADAFACTOR_LR, adafactor_groups, decay_groups, param_groups
from memlab.core.optim_library import PACKAGES, build_library_optimizer, library_version, require_package
from memlab.core.requirements import refuse_without_cuda
from memlab.core.techniques.optim_in_backward import LABEL, build_in_backward
from memlab.core.techniques.optim_offload import build_offloaded

if TYPE_CHECKING:
    from memlab.core.config import Experiment, OptimizerConfig, Profile, TrainConfig
    from memlab.core.step import TrainStep

NAMES = ("adamw", "adafactor", "adamw8bit", "adamw4bit", "bf16_sr", "muon", "paged_adamw8bit", "galore")
NOT_ON_FSDP = ("muon", "paged_adamw8bit", "galore")  # per-matrix updates not written for FSDP2's sharded DTensors


def check(experiment: Experiment, profile: Profile, device: torch.device, world: int) -> None:
    cfg = profile.optimizer
    if cfg.name not in NAMES:
        raise ConfigError(f"unknown optimizer.name {cfg.name!r}; valid: {', '.join(NAMES)}")
    if cfg.name == "adafactor" and not hasattr(torch.optim, "Adafactor"):
        raise ConfigError(f"optimizer.name = adafactor needs torch >= 2.5 (this is {torch.__version__}); use adamw")
    _check_pairing(profile)  # what the profile itself gets wrong comes first: no package or device fixes it
    refuse_without_cuda("optimizer.name", profile, device)
    if cfg.name in PACKAGES:
        require_package(cfg.name)
    refuse_without_cuda("optimizer.offload", profile, device)
    check_in_backward(experiment, profile)


def check_in_backward(experiment: Experiment, profile: Profile) -> None:
    """What a step inside backward cannot do: each needs every gradient at once, or a later step than the hook's."""
    cfg = profile.optimizer
    if not cfg.in_backward:
        return
    refusals = (
        (cfg.name != "adamw", f"optimizer.in_backward steps adamw per parameter, not {cfg.name}; use optimizer.name = adamw"),
        (cfg.offload, "optimizer.in_backward steps on the GPU as each gradient is made; it cannot also offload the step (optimizer.offload = false)"),
        (profile.accumulation.steps > 1, f"optimizer.in_backward steps in every backward, so accumulation.steps = {profile.accumulation.steps} would step on every micro-batch; use accumulation.steps = 1"),
        (experiment.train.clip > 0, f"optimizer.in_backward steps each parameter before the global grad norm exists, so it cannot clip (train.clip = {experiment.train.clip:g}); set train.clip = 0 (the optim_in_bwd profile does)"),
        (profile.precision.dtype == "fp16", "optimizer.in_backward cannot run fp16's GradScaler (unscaling and its inf check need every gradient at once); use precision.dtype = bf16"),
        (profile.distributed.mode != "none", f"optimizer.in_backward steps before {profile.distributed.mode}'s gradient reduction; use distributed.mode = none"),
    )
    for refused, message in refusals:
        if refused:
            raise ConfigError(message)


def _check_pairing(profile: Profile) -> None:
    """What each new optimizer needs of the rest of the profile."""
    cfg = profile.optimizer
    if cfg.name == "muon" and not hasattr(torch.optim, "Muon"):
        raise ConfigError(f"optimizer.name = muon needs torch >= 2.9 (torch.optim.Muon; this is {torch.__version__}); use adamw")
    if cfg.name == "bf16_sr" and profile.precision.dtype != "bf16_pure":
        raise ConfigError(f"optimizer.name = bf16_sr rounds bf16 parameters stochastically and needs precision.dtype = bf16_pure (got {profile.precision.dtype}); use the bf16_sr profile")
    if cfg.name in NOT_ON_FSDP and profile.distributed.mode == "fsdp":
        raise ConfigError(f"optimizer.name = {cfg.name} does not run on FSDP2's sharded parameters; use distributed.mode = ddp or none")
    if cfg.offload and cfg.name not in ("adamw", "adafactor"):
        raise ConfigError(f"optimizer.offload works with adamw or adafactor, not {cfg.name} (its state lives on the GPU)")


def describe(profile: Profile) -> str:
    cfg = profile.optimizer
    text = cfg.name + (":fused" if cfg.fused else "")
    if cfg.in_backward:  # adamw only, never offloaded (check_in_backward)
        return f"{text}:{LABEL}"
    text += ":offload" if cfg.offload else ""
    if cfg.name in PACKAGES or cfg.name == "muon":
        text += f" ({library_version(cfg.name)})"  # e.g. adamw4bit (torchao 0.18.0)
    if cfg.name == "paged_adamw8bit":  # the summary's peak (the allocator's) does not include it: say so
        text += "; state in CUDA unified memory, outside the allocator's peak (NVML counts it)"
    return text


def memory_standin(profile: Profile) -> StandIn | None:
    """State kept on the host, or a library's CUDA-only optimizer: the fake step builds plain AdamW and the predictor
    installs the stand-in. GaLore: AdamW's full-size state bounds its rank-r state from above (the max batch errs low)."""
    if profile.optimizer.offload:
        return StandIn("optimizer", "offload", {"optimizer.offload": False})
    if profile.optimizer.name in PACKAGES:
        return StandIn("optimizer", None if profile.optimizer.name == "galore" else profile.optimizer.name,
                       {"optimizer.name": "adamw"})
    return None


def memory_libraries(profile: Profile) -> tuple[str, ...]:
    """The libraries whose release decides this technique's memory (the predictor's stand-in was read from one)."""
    return (PACKAGES[profile.optimizer.name][1],) if profile.optimizer.name in PACKAGES else ()


def build_optimizer(model: torch.nn.Module, cfg: OptimizerConfig, train: TrainConfig, device: torch.device,
                    params: list[torch.Tensor] | None = None) -> torch.optim.Optimizer:
    """`params`: the tensors AdamW holds when they are not the model's trainable parameters (FSDP's local shards)."""
    groups = decay_groups(params, train.weight_decay) if params is not None else param_groups(model, train.weight_decay)
    betas = (train.beta1, train.beta2)
    if cfg.offload:
        return build_offloaded(model, cfg, train, device)
    if cfg.in_backward:  # adamw only (check_in_backward checked it)
        return build_in_backward(groups, cfg, train)
    if cfg.name == "adamw":
        kind = {"fused": True} if cfg.fused else {"foreach": True}
        return torch.optim.AdamW(groups, lr=train.lr, betas=betas, **kind)
    if cfg.name == "adafactor":
        if not hasattr(torch.optim, "Adafactor"):
            raise ConfigError(f"optimizer.name = adafactor needs torch >= 2.5 (this is {torch.__version__})")
        return torch.optim.Adafactor(adafactor_groups(groups, train), lr=ADAFACTOR_LR)
    if cfg.name == "muon":
        return build_muon(model, train)  # type: ignore[return-value]  (a pair stepped as one)
    if cfg.name in PACKAGES:  # its device and package: checked at the door (check)
        return build_library_optimizer(model, groups, cfg, train)
    raise ConfigError(f"unknown optimizer.name {cfg.name!r}; valid: {', '.join(NAMES)}")


def apply(step: TrainStep) -> None:
    """After every wrapper: FSDP2 swaps in sharded parameters, which the optimizer must hold (under FSDP across
    ranks, their local shards: memlab.core.shard_step)."""
    if shard_step.wanted(step.profile, step.dist):
        step.shards = shard_step.LocalShards([p for p in step.model.parameters() if p.requires_grad])
    held = step.shards.tensors if step.shards is not None else None
    step.optimizer = build_optimizer(step.model, step.profile.optimizer, step.experiment.train, step.device, held)
    step.applied["optimizer"] = describe(step.profile)
