"""FSDP2's optimizer step on each rank's local shards, as plain tensors (distributed.local_optimizer, on by default).

FSDP2's parameters and gradients are DTensors. torch's AdamW and the gradient norm on them go through DTensor's
dispatch, op by op and tensor by tensor: on gpt2s at 16 x 1024 a GPU that host work made FSDP's optimizer phase
5-17 ms against DDP's 1 ms (bench/results/fsdp-h200x2). AdamW is elementwise, so each rank can step its own
shards as plain tensors: the optimizer holds each parameter's local shard (the storage FSDP2 all-gathers from),
is handed the local shard of each gradient before the step, and the gradient norm is the square root of the
ranks' summed squares (the shards are disjoint). The arithmetic is the same as on the DTensors.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


class LocalShards:
    """Each FSDP2 parameter beside its local shard; the optimizer is built over `tensors`."""

    def __init__(self, params: list[torch.nn.Parameter]):
        with torch.no_grad():  # to_local under no_grad is the DTensor's own local tensor, not an autograd view
            self.pairs = [(p, p.to_local()) for p in params]

    @property
    def tensors(self) -> list[torch.Tensor]:
        return [local for _, local in self.pairs]

    def link_grads(self) -> None:
        """Hand each local shard its gradient's local shard (FSDP2's reduce-scatter output), before the step."""
        with torch.no_grad():
            for param, local in self.pairs:
                shard = param._local_tensor
                if shard.data_ptr() != local.data_ptr() or shard.shape != local.shape:
                    # FSDP2 re-pads a shard into new storage at its lazy init (the first forward) when it cannot keep
                    # the old one (an empty shard): the optimizer's tensor follows it, keeping its identity
                    local.set_(shard)
                local.grad = None if param.grad is None else param.grad._local_tensor

    def total_norm(self) -> torch.Tensor:
        """The global gradient norm (fp32, on every rank): this rank's shards' squared norm, summed over the ranks."""
        grads = [local.grad for _, local in self.pairs if local.grad is not None]
        device = self.pairs[0][1].device
        mine = torch.nn.utils.get_total_norm(grads).to(device) if grads else torch.zeros((), device=device)
        squared = mine.float().square()
        if dist.is_initialized():
            dist.all_reduce(squared)
        return squared.sqrt()

    def clip(self, max_norm: float) -> torch.Tensor:
        """clip_grad_norm_ over the shards: the global norm, every local gradient scaled by the same factor."""
        norm = self.total_norm()
        torch.nn.utils.clip_grads_with_norm_(self.tensors, max_norm, norm)
        return norm

    def drop_grads(self) -> None:
        """After the step: no gradient on either side, so FSDP2's next reduce-scatter starts a fresh one instead of
        accumulating into this step's."""
        for param, local in self.pairs:
            param.grad = None
            local.grad = None


def wanted(profile, dist_context) -> bool:
    """Whether this step's optimizer runs on local shards: FSDP across ranks, torch's AdamW stepped after backward
    (optimizer.in_backward steps each DTensor in its hook; library optimizers keep their own handling)."""
    d, o = profile.distributed, profile.optimizer
    return (dist_context is not None and d.mode == "fsdp" and d.local_optimizer and o.name == "adamw"
            and not o.in_backward and not o.offload)
