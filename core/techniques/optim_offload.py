"""Optimizer state offloaded to the CPU: the GPU keeps the model's parameters and gradients, the host keeps fp32
master parameters and the optimizer's state (AdamW: two fp32 moments, 8 bytes a parameter) in pinned memory.

Each step copies the gradients GPU -> CPU, steps on the CPU (torch's fused or foreach AdamW on the host tensors),
and copies the updated parameters back. GPU memory saved: the optimizer state; time paid: two transfers of the
parameters' size and a CPU optimizer step (ZeRO-Offload's trade, without overlapping it with backward).

The wrapper is a torch.optim.Optimizer over the model's own parameters, so everything the engine does to an
optimizer works unchanged: set_lr writes param_groups[i]["lr"], GradScaler unscales the GPU gradients and skips
the step on overflow, clip_grad_norm_ sees the GPU gradients, zero_grad(set_to_none=True) frees them.
"""

from __future__ import annotations

from typing import Any

import torch

from memlab.core.config import OptimizerConfig, TrainConfig
from memlab.core.errors import ConfigError
from memlab.core.optim import ADAFACTOR_LR, adafactor_groups, param_groups

# Hyper-parameters the CPU optimizer takes from the outer groups before each step (set_lr changes "lr" there).
_SYNCED = ("lr", "weight_decay", "betas", "eps")


class CPUOffloadOptimizer(torch.optim.Optimizer):
    """Steps `param_groups` (on any device) with an optimizer over fp32 copies of the parameters on the CPU."""

    def __init__(self, groups: list[dict], make_inner, *, defaults: dict[str, Any], pin_memory: bool):
        super().__init__(groups, defaults)
        self.pin_memory = pin_memory
        self._pairs: list[tuple[torch.Tensor, torch.Tensor]] = []  # (model parameter, its CPU master)
        cpu_groups = []
        for group in self.param_groups:
            masters = []
            for p in group["params"]:
                m = torch.empty(p.shape, dtype=torch.float32, device="cpu", pin_memory=pin_memory)
                m.copy_(p.detach())
                m.grad = torch.empty(p.shape, dtype=torch.float32, device="cpu", pin_memory=pin_memory)
                masters.append(m)
                self._pairs.append((p, m))
            cpu_groups.append({**{k: v for k, v in group.items() if k != "params"}, "params": masters})
        self.inner: torch.optim.Optimizer = make_inner(cpu_groups)
        # Gradient buffers persist across steps (pinned memory is slow to allocate); a missing gradient is
        # signalled to the inner optimizer by setting the master's .grad to None for that step only.
        self._grad_buffers = {id(m): m.grad for _, m in self._pairs}

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for outer, inner in zip(self.param_groups, self.inner.param_groups):
            for key in _SYNCED:
                if key in outer and key in inner:
                    inner[key] = outer[key]
        # GPU -> CPU: every gradient into its pinned buffer, asynchronously, then wait once.
        for p, m in self._pairs:
            if p.grad is None:
                m.grad = None
                continue
            m.grad = self._grad_buffers[id(m)]
            m.grad.copy_(p.grad, non_blocking=True)
        if any(p.is_cuda for p, _ in self._pairs):
            torch.cuda.synchronize()
        # clipping folded into a fused Adam(W)'s grad_scale (memlab.core.step) reaches the CPU optimizer with it
        scale = getattr(self, "grad_scale", None)
        self.inner.grad_scale = scale.to("cpu") if scale is not None else None
        self.inner.step()
        # CPU -> GPU: the updated fp32 masters back into the model's parameters. The copies are ordered on the
        # current stream, so the next step's gradient copies (and its synchronize) come after them.
        for p, m in self._pairs:
            if m.grad is not None:
                p.copy_(m, non_blocking=True)
        return loss

    def state_dict(self) -> dict[str, Any]:
        return self.inner.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """The inner optimizer's state; the masters restart from the model's (restored) parameters."""
        self.inner.load_state_dict(state_dict)
        with torch.no_grad():
            for p, m in self._pairs:
                m.copy_(p)


def build_offloaded(model: torch.nn.Module, cfg: OptimizerConfig, train: TrainConfig, device: torch.device) -> torch.optim.Optimizer:
    groups = param_groups(model, train.weight_decay)
    betas = (train.beta1, train.beta2)
    if cfg.name == "adamw":
        kind = {"fused": True} if cfg.fused else {"foreach": True}

        def make_inner(cpu_groups):
            return torch.optim.AdamW(cpu_groups, lr=train.lr, betas=betas, **kind)

        defaults = {"lr": train.lr, "betas": betas, "eps": 1e-8, "weight_decay": train.weight_decay}
    elif cfg.name == "adafactor":
        if not hasattr(torch.optim, "Adafactor"):
            raise ConfigError(f"optimizer.name = adafactor needs torch >= 2.5 (this is {torch.__version__})")

        def make_inner(cpu_groups):
            return torch.optim.Adafactor(cpu_groups, lr=ADAFACTOR_LR)

        groups = adafactor_groups(groups, train)  # set_lr scales the outer groups' lr; the step copies it inward
        defaults = {"lr": ADAFACTOR_LR, "weight_decay": train.weight_decay}
    else:
        raise ConfigError(f"optimizer.offload works with adamw or adafactor, not {cfg.name} (its 8-bit state lives on the GPU)")
    return CPUOffloadOptimizer(groups, make_inner, defaults=defaults, pin_memory=device.type == "cuda")
