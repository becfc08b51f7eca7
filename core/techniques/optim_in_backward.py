"""optimizer.in_backward: the AdamW step fused into backward (PyTorch's "fuse the optimizer step into the backward
pass" recipe). Every parameter gets an AdamW of its own, stepped by the parameter's post-accumulate-grad hook the
moment autograd has finished its gradient; the hook then frees that gradient. No buffer of every gradient ever
exists: the gradients alive at once are the ones autograd is still summing (the tied embedding's, which the LM head
starts and the embedding finishes) and the one being stepped.

What it rules out (memlab.core.techniques.optimizer refuses each, before any work): gradient accumulation (the hook
would step on every micro-batch), global-norm clipping (the norm needs every gradient at once), fp16's GradScaler
(unscaling and its inf check need every gradient), optimizer.offload, DDP and FSDP (their gradient reduction runs
after the hook would already have stepped).

The training step calls neither step() nor zero_grad(): the hooks did both. `param_groups` lists every
per-parameter optimizer's group (the same dicts), so memlab.core.optim.set_lr reaches them all unchanged.
"""

from __future__ import annotations

import torch

from memlab.core.config import OptimizerConfig, TrainConfig

LABEL = "in_backward (per-parameter step, no gradient buffer)"


class InBackwardOptimizer:
    """One AdamW per parameter, each stepped from its parameter's post-accumulate-grad hook."""

    def __init__(self, optimizers: list[torch.optim.Optimizer], handles: list) -> None:
        self.optimizers = optimizers  # MemTracker (memlab.core.predict.fake) tracks their state
        self._handles = handles

    @property
    def param_groups(self) -> list[dict]:
        return [group for opt in self.optimizers for group in opt.param_groups]

    def remove_hooks(self) -> None:
        for handle in self._handles:
            handle.remove()


def _step_and_free(optimizer: torch.optim.Optimizer):
    def hook(param: torch.Tensor) -> None:
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)  # this parameter's gradient, freed as soon as it has been used

    return hook


def build_in_backward(groups: list[dict], cfg: OptimizerConfig, train: TrainConfig) -> InBackwardOptimizer:
    """An AdamW for each parameter of `groups` (memlab.core.optim.param_groups: its weight decay kept), hooked.
    Fused asks for the fused kernel; otherwise the single-tensor loop (foreach has nothing to batch here)."""
    kind = {"fused": True} if cfg.fused else {"foreach": False}
    optimizers, handles = [], []
    for group in groups:
        for p in group["params"]:
            opt = torch.optim.AdamW([{"params": [p], "weight_decay": group["weight_decay"]}], lr=train.lr,
                                    betas=(train.beta1, train.beta2), **kind)
            optimizers.append(opt)
            handles.append(p.register_post_accumulate_grad_hook(_step_and_free(opt)))
    return InBackwardOptimizer(optimizers, handles)
