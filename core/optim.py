"""Parameter groups and the learning-rate schedule (linear warm-up, then cosine to lr * min_lr_ratio). The optimizers
themselves are built at the optimizer technique's door (memlab.core.techniques.optimizer.build_optimizer)."""

from __future__ import annotations

import math

import torch

from memlab.core.config import TrainConfig

ADAFACTOR_LR = 1e-2  # torch.optim.Adafactor's default: a relative step (times the weights' RMS), not AdamW's lr


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    return decay_groups([p for p in model.parameters() if p.requires_grad], weight_decay)


def decay_groups(params: list[torch.nn.Parameter], weight_decay: float) -> list[dict]:
    # Decay matrices (linear weights, embeddings); never biases or LayerNorm gains (nanoGPT's split).
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def adafactor_groups(groups: list[dict], train: TrainConfig) -> list[dict]:
    """torch's Adafactor step is relative: lr times the weights' RMS (about 0.02 here), so AdamW's lr would make its
    steps ~50x smaller and it barely trains (val ppl 31,782 in the H100 study). Its own default peak, 1e-2,
    follows the experiment's schedule instead: each group's lr_scale maps the schedule onto it (set_lr)."""
    return [g | {"lr_scale": ADAFACTOR_LR / train.lr} for g in groups]


def lr_at(step: int, train: TrainConfig, total_steps: int) -> float:
    """Learning rate for optimizer step `step` (0-based)."""
    if train.warmup_steps and step < train.warmup_steps:
        return train.lr * (step + 1) / train.warmup_steps
    decay_steps = max(1, total_steps - train.warmup_steps)
    progress = min(1.0, (step - train.warmup_steps) / decay_steps)
    floor = train.lr * train.min_lr_ratio
    return floor + 0.5 * (train.lr - floor) * (1 + math.cos(math.pi * progress))


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """The schedule's lr on every group, times the group's lr_scale where its optimizer counts lr otherwise."""
    for group in optimizer.param_groups:
        value = lr * group.get("lr_scale", 1.0)
        if isinstance(group.get("lr"), torch.Tensor):
            group["lr"].fill_(value)
        else:
            group["lr"] = value
