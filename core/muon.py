"""Muon (torch.optim.Muon, torch >= 2.9) for the hidden matrices, AdamW for everything else, as one optimizer.

Muon orthogonalizes each 2-D update (Newton-Schulz iterations) and is meant for the weights inside the blocks only:
the embedding, the LM head (tied to it here) and every 1-D parameter (biases, LayerNorm gains) stay with AdamW.
Its step is scaled with adjust_lr_fn = "match_rms_adamw" (lr x 0.2 sqrt(max(rows, cols))), so the AdamW learning
rate of the experiment serves both halves.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from memlab.core.config import TrainConfig
from memlab.core.errors import ConfigError
from memlab.core.optim import decay_groups


def hidden_matrices(model: nn.Module) -> list[nn.Parameter]:
    """The 2-D weights of the Linear layers other than the LM head and anything shared with an embedding."""
    excluded = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    head = getattr(model, "lm_head", None)
    if isinstance(head, nn.Module) and hasattr(head, "weight"):
        excluded.add(id(head.weight))
    out: dict[int, nn.Parameter] = {}
    for module in model.modules():
        if isinstance(module, nn.Linear) and module.weight.requires_grad and module.weight.dim() == 2 and id(module.weight) not in excluded:
            out[id(module.weight)] = module.weight
    return list(out.values())


NO_MATRIX = ("optimizer.name = muon found no 2-D hidden weight (Linear layers inside the model, not the embedding or LM "
             "head) to orthogonalize; use adamw")


def split_params(model: nn.Module, refusal: str = NO_MATRIX) -> tuple[list[nn.Parameter], list[nn.Parameter]]:
    """(the hidden matrices, every other trainable parameter) for the optimizers that treat the matrices apart
    (Muon, GaLore); `refusal` for a model without one."""
    matrices = hidden_matrices(model)
    if not matrices:
        raise ConfigError(refusal)
    chosen = {id(p) for p in matrices}
    rest = [p for p in model.parameters() if p.requires_grad and id(p) not in chosen]
    return matrices, rest


class MuonWithAdamW:
    """Two optimizers stepped together. `param_groups` is both lists concatenated (the same dicts), so the
    engine's learning-rate schedule, zero_grad and fp16's GradScaler (unscale_ / step) see one optimizer."""

    def __init__(self, muon: torch.optim.Optimizer, adamw: torch.optim.Optimizer) -> None:
        self.optimizers = (muon, adamw)
        self.defaults: dict[str, Any] = {}

    @property
    def param_groups(self) -> list[dict]:
        return [g for opt in self.optimizers for g in opt.param_groups]

    @property
    def state(self) -> dict:
        return {k: v for opt in self.optimizers for k, v in opt.state.items()}

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:
        for opt in self.optimizers:
            opt.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for opt in self.optimizers:
            opt.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict:
        return {"muon": self.optimizers[0].state_dict(), "adamw": self.optimizers[1].state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.optimizers[0].load_state_dict(state["muon"])
        self.optimizers[1].load_state_dict(state["adamw"])


def build_muon(model: nn.Module, train: TrainConfig) -> MuonWithAdamW:
    """torch.optim.Muon's presence is checked at the door (memlab.core.techniques.optimizer)."""
    matrices, rest = split_params(model)
    muon = torch.optim.Muon(matrices, lr=train.lr, weight_decay=train.weight_decay, adjust_lr_fn="match_rms_adamw")
    groups = decay_groups(rest, train.weight_decay)  # the embedding decays; biases and gains do not
    adamw = torch.optim.AdamW([g for g in groups if g["params"]], lr=train.lr, betas=(train.beta1, train.beta2), foreach=True)
    return MuonWithAdamW(muon, adamw)
