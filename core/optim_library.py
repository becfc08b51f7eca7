"""The optimizers that come from other libraries: each one's package, the extra that installs it, and its builder.

    adamw4bit        torchao.optim.AdamW4bit: both moments 4-bit, block-wise scaled (CUDA)
    bf16_sr          torchao.optim._AdamW(bf16_stochastic_round=True): bf16 parameters (precision.dtype = bf16_pure)
                     and bf16 moments; the update is computed in fp32 and rounded stochastically into the bf16 weight
    paged_adamw8bit  bitsandbytes.optim.PagedAdamW8bit: 8-bit moments in CUDA unified memory (paged to the host
                     under pressure), outside PyTorch's caching allocator (CUDA)
    galore           galore_torch.GaLoreAdamW: AdamW on a rank-r projection of each hidden matrix's gradient
"""

from __future__ import annotations

from importlib import import_module
from importlib.metadata import PackageNotFoundError, version

import torch
from torch import nn

from memlab.core.config import OptimizerConfig, TrainConfig
from memlab.core.errors import ConfigError, MissingExtra
from memlab.core.muon import split_params
from memlab.core.optim import decay_groups

# optimizer.name -> (import name, distribution, extra): declared in memlab.core.requirements, which has no torch
from memlab.core.requirements import OPTIMIZER_PACKAGES as PACKAGES

# GaLore's published settings for models of this size (GaLore paper, 60M-350M LLaMA): a new projection every 200
# steps, the projected update scaled by 0.25, the projection on the shorter side ("std").
GALORE_UPDATE_PROJ_GAP, GALORE_SCALE, GALORE_PROJ_TYPE = 200, 0.25, "std"


def require_package(name: str) -> None:
    """A one-line ConfigError naming the extra when the optimizer's library cannot be imported."""
    module, dist, extra = PACKAGES[name]
    try:
        import_module(module)
    except ImportError as e:
        raise MissingExtra(f"optimizer.name = {name} needs {dist} ({e.name or module} is missing): pip install 'memlab[{extra}]', or use adamw", extra) from None


def library_version(name: str) -> str:
    """'torchao 0.18.0' for the optimizer's library ('torch 2.13.0' for torch's own), for the run summary."""
    dist = PACKAGES[name][1] if name in PACKAGES else "torch"
    try:
        return f"{dist} {version(dist)}"
    except PackageNotFoundError:
        return f"{dist} (version unknown)"


def build_library_optimizer(model: nn.Module, groups: list[dict], cfg: OptimizerConfig, train: TrainConfig) -> torch.optim.Optimizer:
    betas = (train.beta1, train.beta2)
    if cfg.name == "adamw8bit":
        from torchao.optim import AdamW8bit

        return AdamW8bit(groups, lr=train.lr, betas=betas)
    if cfg.name == "adamw4bit":
        from torchao.optim import AdamW4bit

        return AdamW4bit(groups, lr=train.lr, betas=betas)
    if cfg.name == "bf16_sr":
        from torchao.optim import _AdamW

        return _AdamW(groups, lr=train.lr, betas=betas, bf16_stochastic_round=True)
    if cfg.name == "paged_adamw8bit":
        from bitsandbytes.optim import PagedAdamW8bit

        return PagedAdamW8bit(groups, lr=train.lr, betas=betas)
    if cfg.name == "galore":
        return _build_galore(model, cfg, train)
    raise ConfigError(f"unknown library optimizer {cfg.name!r}; valid: {', '.join(PACKAGES)}")


def _build_galore(model: nn.Module, cfg: OptimizerConfig, train: TrainConfig) -> torch.optim.Optimizer:
    """The hidden matrices (as Muon's: inside the blocks, not the embedding or head) get the projection; the rest
    is plain AdamW inside the same optimizer."""
    from galore_torch import GaLoreAdamW

    matrices, rest = split_params(model, "optimizer.name = galore found no 2-D hidden weight to project; use adamw")
    groups = [
        {"params": matrices, "weight_decay": train.weight_decay, "rank": cfg.rank, "update_proj_gap": GALORE_UPDATE_PROJ_GAP,
         "scale": GALORE_SCALE, "proj_type": GALORE_PROJ_TYPE},
        *decay_groups(rest, train.weight_decay),
    ]
    return GaLoreAdamW([g for g in groups if g["params"]], lr=train.lr, betas=(train.beta1, train.beta2), no_deprecation_warning=True)
