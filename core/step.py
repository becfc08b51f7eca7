"""One training step, built once: the model, what forward runs (compiled / DDP / FSDP wrapper), the optimizer, the
GradScaler, autocast, activation offload, accumulation and clipping. The engine, the fake-tensor estimator
(memlab.core.predict.fake) and the tests all build it with `memlab.core.techniques.build_step` and run it with
`TrainStep.run`.

Techniques fill it in through their one door (memlab.core.techniques), in the order that file explains.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager, Iterable

import torch

from memlab.core.config import Experiment, Profile
from memlab.core.models import family


class _NoMeter:
    """Stands in for memlab.core.meters.PhaseMeter where nothing is measured (fake tensors, tests)."""

    def begin(self, phase: str) -> None:
        pass

    def end(self, phase: str) -> None:
        pass

    def replayed(self, peaks: dict[str, int]) -> None:
        pass


@dataclass
class StepResult:
    loss_sum: torch.Tensor  # the batch's mean loss (summed over micro-batches), on the device: read it late
    grad_norm: torch.Tensor | None  # before clipping; None without clipping
    skipped: bool | torch.Tensor  # fp16: the GradScaler skipped the update (inf/NaN gradients); a device tensor: read it late


@dataclass
class TrainStep:
    experiment: Experiment
    profile: Profile
    device: torch.device
    vocab_size: int
    dist: Any = None  # memlab.core.distributed.DistContext; None: no distributed wrapping
    micro_batch: int = 0
    kernel: Any = None  # the attention kernel that runs (memlab.core.attention)
    model: torch.nn.Module | None = None  # the module whose parameters train: the family's model (memlab.core.models)
    train_model: torch.nn.Module | None = None  # what forward runs: the model, or its compiled / DDP wrapper
    optimizer: torch.optim.Optimizer | None = None
    shards: Any = None  # memlab.core.shard_step.LocalShards: under FSDP the optimizer holds the local shards
    scaler: torch.amp.GradScaler | None = None
    autocast: Callable[[], ContextManager] = contextlib.nullcontext
    offload: Callable[[], ContextManager] = contextlib.nullcontext
    applied: dict[str, Any] = field(default_factory=dict)  # one line per technique (and the memory cap's bytes), for the summary
    param_dtype: torch.dtype = torch.float32  # precision.dtype = bf16_pure: bf16 parameters (techniques.precision)
    on_device: bool = False  # make parameters on the device (fake tensors cannot be moved there) instead of moving them
    after_step: list[Callable[[int], None]] = field(default_factory=list)  # techniques' checks after step i (the memory cap)
    graph: Any = None  # memlab.core.techniques.cuda_graph.StepGraph: cuda_graph.enabled captures `launch` and replays it

    @property
    def accumulation(self) -> int:
        return self.profile.accumulation.steps

    @property
    def clip(self) -> float:
        return self.experiment.train.clip

    def build_model(self) -> None:
        """The experiment's model with the chosen attention kernel, on the device (techniques then wrap it)."""
        self.model = family.build(self)
        self.train_model = self.model

    def run(self, micro_batches: Iterable[tuple[torch.Tensor, torch.Tensor]], meter: Any = None,
            on_phase: Callable[[str], None] | None = None) -> StepResult:
        """One training step. `meter` (a PhaseMeter) brackets the phases; `on_phase` hears each phase's name as it
        starts (so an OOM says where it happened). With cuda_graph.enabled the step is launched, then captured and
        replayed (memlab.core.techniques.cuda_graph): the same `launch`, recorded once."""
        meter, on_phase = meter or _NoMeter(), on_phase or (lambda name: None)
        if self.graph is not None:
            return self.graph.run(self, list(micro_batches), meter, on_phase)
        return self.launch(micro_batches, meter, on_phase)

    def launch(self, micro_batches: Iterable[tuple[torch.Tensor, torch.Tensor]], meter: Any,
               on_phase: Callable[[str], None]) -> StepResult:
        """Forward and backward for each micro-batch, then the optimizer step, each kernel launched from here."""
        loss_sum = None
        for i, (x, y) in enumerate(micro_batches):
            loss = self._forward_backward(i, x, y, meter, on_phase)
            loss_sum = loss if loss_sum is None else loss_sum + loss
        on_phase("optimizer")
        meter.begin("opt")
        # optimizer.in_backward: each parameter was stepped (and its gradient freed) by its hook during backward
        grad_norm, skipped = (None, False) if self.profile.optimizer.in_backward else self._optimizer_step()
        meter.end("opt")
        return StepResult(loss_sum, grad_norm, skipped)

    def _forward_backward(self, i: int, x: torch.Tensor, y: torch.Tensor, meter: Any, on_phase: Callable[[str], None]) -> torch.Tensor:
        if self.dist is not None:
            self.dist.set_grad_sync(self.train_model, i == self.accumulation - 1)  # DDP: all-reduce once, last
        x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
        on_phase("forward")
        meter.begin("fwd")
        with self.autocast(), self.offload():
            loss = self.train_model(x, y) / self.accumulation
        meter.end("fwd")
        on_phase("backward")
        meter.begin("bwd")
        (self.scaler.scale(loss) if self.scaler else loss).backward()
        meter.end("bwd")
        return loss.detach()

    def _optimizer_step(self) -> tuple[torch.Tensor | None, bool | torch.Tensor]:
        grad_norm, skipped, scaler = None, False, self.scaler
        if self.shards is not None:
            self.shards.link_grads()
        if scaler:
            scaler.unscale_(self.optimizer)
        if self.clip and not scaler and _folds_clipping(self.optimizer):
            # torch's fused Adam(W) divides each gradient by its grad_scale as it reads it (GradScaler's door): the
            # clip factor goes in there instead of a pass of its own over every gradient; the same arithmetic
            grad_norm = self._total_norm()
            self.optimizer.grad_scale = torch.clamp((grad_norm + 1e-6) / self.clip, min=1.0)
        elif self.clip:
            grad_norm = self.shards.clip(self.clip) if self.shards is not None else \
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip)
        if scaler:
            # whether the scaler skips this step is its found-inf flags, kept on the device: comparing get_scale()
            # before and after would add two host syncs to GradScaler's own one
            found = list(scaler._found_inf_per_device(self.optimizer).values())
            if found:
                skipped = torch.stack([f.to(found[0].device) for f in found]).sum() > 0
            scaler.step(self.optimizer)
            scaler.update()
        else:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if self.shards is not None:
            self.shards.drop_grads()
        return grad_norm, skipped

    def _total_norm(self) -> torch.Tensor:
        if self.shards is not None:
            return self.shards.total_norm()
        return torch.nn.utils.get_total_norm([p.grad for p in self.model.parameters() if p.grad is not None])


def _folds_clipping(optimizer: Any) -> bool:
    """Whether `optimizer` is torch's Adam or AdamW with fused=True in every group, or wraps one as `inner` (the
    optimizer offload, which passes grad_scale on): their kernel (CUDA and CPU) divides each gradient by grad_scale
    as it reads it, so clip_grad_norm_'s factor can ride in as 1 / grad_scale."""
    inner = getattr(optimizer, "inner", optimizer)
    return isinstance(inner, torch.optim.Adam | torch.optim.AdamW) and all(g["fused"] for g in inner.param_groups)
