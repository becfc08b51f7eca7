"""Beyond one GPU: torchrun, the process group, and DDP / FSDP2 as memory techniques.

memlab adds no launcher of its own. Under `torchrun` (RANK, WORLD_SIZE and LOCAL_RANK in the environment) `memlab
run` initializes the process group itself (`init_from_env`: NCCL on CUDA with device cuda:LOCAL_RANK, plus gloo for
host tensors; gloo alone on CPU); `memlab run --nproc N` re-executes itself through `torchrun --standalone`
(`torchrun_argv`). Every rank runs the same engine; this module is what the engine asks when it needs to know it is
one of several:

- `check`: combinations PyTorch does not support are a ConfigError at build, with the fix in the message;
- `DistContext.wrap`: the distributed wrapping, applied last (memlab.core.techniques): DDP around the finished model,
  or FSDP2 `fully_shard` on every block then on the root, with a MixedPrecisionPolicy (parameters in the profile's
  compute dtype, gradients reduced in fp32) and, with distributed.cpu_offload, a CPUOffloadPolicy;
- the global batch: train.batch_size is the effective batch of one optimizer step over all ranks; each rank takes a
  disjoint slice of it (memlab.core.data.batch_iterator), so it must divide by ranks x accumulation.steps;
- the loss: every step's loss is all-reduced on the device (no host sync) and read one step late with the meters,
  so the loss rank 0 reports is the mean over all ranks, as a single process on the whole batch would see it;
- stopping: a first SIGINT/SIGTERM only raises a flag that travels with that all-reduce, so every rank stops at the
  same step and the run still ends with one summary; a second signal stops at once;
- the end: every rank measured its own memory and time; `DistContext.finish` gathers the per-rank summaries to rank
  0 (on a gloo group with a timeout, so a rank that died cannot hang the others forever), which writes them as
  ranks.parquet and a summary with the max over ranks for memory and the global tokens/s.

`distributed.mode = ddp | fsdp` outside torchrun is allowed: the engine makes a process group of one process (DDP or
FSDP on one rank is legal, and FSDP with cpu_offload on one GPU is a memory technique of its own). `mode = none`
under torchrun with more than one process is a ConfigError (each rank would train the whole batch alone).
"""

from __future__ import annotations

import atexit
import os
import socket
import sys
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from memlab.core import metrics
from memlab.core.config import Experiment, Profile
from memlab.core.errors import ConfigError, DeviceError
from memlab.core.requirements import CUDA_NEEDS

TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK")
CUDA_BACKEND = "cpu:gloo,cuda:nccl"
# The end-of-run gather waits this long for the slowest rank (all ranks normally arrive within a second: they run
# the same final evaluation in lockstep); past it, rank 0 writes what it has alone.
GATHER_TIMEOUT_S = 60.0

# How the ranks' summaries reduce to the run's, and what each rank's row keeps: declared in memlab.core.metrics.
MAX_OVER_RANKS = metrics.reduced_by("max")  # memory; time: the slowest rank sets the pace of a synchronous step
SUM_OVER_RANKS = metrics.reduced_by("sum")  # counts
AT_SLOWEST_PACE = metrics.reduced_by("pace")  # rank 0's tokens/s and MFU, scaled to the slowest rank's step time
RANK_COLUMNS = metrics.per_rank_names()  # ranks.parquet (memlab.core.schema.RANK_SCHEMA)

# FSDP2 keeps (and all-gathers) parameters in the profile's compute dtype; fp32 / tf32 leave them in fp32.
_PARAM_DTYPE = {"bf16": torch.bfloat16, "fp16": torch.float16}

# knobs of FSDP2's units alone, with their defaults (set under another mode: a config error)
_FSDP_KNOBS = {"reshard_after_forward": True, "reduce_dtype": "fp32", "prefetch": 1, "blocks_per_unit": 1, "local_optimizer": True}

_stop = {"requested": False}
_control: dict[str, Any] = {"group": None}


class StopRequested(KeyboardInterrupt):
    """Every rank saw a stop request at the same step (the engine ends the run as `interrupted`)."""


# ---------------------------------------------------------------------------------------------- launching


def launched_by_torchrun() -> bool:
    return all(k in os.environ for k in TORCHRUN_ENV)


def env_rank() -> int:
    """This process's global rank: from the process group when there is one, else torchrun's RANK, else 0."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return int(os.environ.get("RANK", "0")) if launched_by_torchrun() else 0


def world_size() -> int:
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    return int(os.environ.get("WORLD_SIZE", "1")) if launched_by_torchrun() else 1


def init_from_env(device: torch.device) -> torch.device:
    """Under torchrun: start the process group and return this rank's device (cuda:LOCAL_RANK on CUDA).

    Outside torchrun, or when a group exists already, returns `device` unchanged.
    """
    if not launched_by_torchrun() or dist.is_initialized():
        return device
    local_rank = int(os.environ["LOCAL_RANK"])
    if device.type == "cuda":
        n = torch.cuda.device_count()
        if local_rank >= n:
            raise DeviceError(f"torchrun started local rank {local_rank} but this host has {n} visible GPU(s); lower --nproc-per-node")
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        # NCCL for the GPU; gloo too, for collectives on host tensors (FSDP2 with cpu_offload: grad-norm of CPU shards)
        dist.init_process_group(CUDA_BACKEND, device_id=device)
    else:
        dist.init_process_group("gloo")
    atexit.register(shutdown)  # however the command ends (a one-line error included), the group ends with it
    return device


def shutdown() -> None:
    """End the process group this process runs in (memlab run calls it last)."""
    if dist.is_available() and dist.is_initialized():
        _control["group"] = None
        dist.destroy_process_group()


def torchrun_argv(nproc: int, memlab_args: list[str]) -> list[str]:
    """The command `memlab run --nproc N` becomes: this Python's torchrun, standalone on this host."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc), "-m", "memlab", *memlab_args]


def request_stop() -> None:
    """Called from a signal handler: every rank stops after the step whose loss carries the flag."""
    _stop["requested"] = True


def stop_requested() -> bool:
    return _stop["requested"]


# ---------------------------------------------------------------------------------------------- checks


def check(experiment: Experiment, profile: Profile, world: int, device_type: str) -> None:
    """Distributed combinations PyTorch cannot run, refused at build with the fix (called before torchrun too)."""
    d, mode = profile.distributed, profile.distributed.mode
    if world > 1 and mode == "none":
        raise ConfigError(
            f"distributed.mode = none with {world} ranks (--nproc / torchrun): each rank would train the whole batch alone; "
            f"use a distributed profile (ddp_bf16, fsdp_bf16, fsdp_gradcp_bf16) or --set distributed.mode=ddp"
        )
    # the global batch against ranks x accumulation.steps: memlab.core.techniques.accumulation
    if d.cpu_offload and mode != "fsdp":
        raise ConfigError(f"distributed.cpu_offload offloads FSDP2's sharded parameters and applies to distributed.mode = fsdp, not {mode}")
    if device_type != "cuda" and (why := CUDA_NEEDS["distributed.cpu_offload"](profile)):
        raise DeviceError(why)
    if d.prefetch < 1:
        raise ConfigError(f"distributed.prefetch = {d.prefetch}: it counts the units gathered ahead; use 1 (FSDP2's own order) or more")
    if d.blocks_per_unit < 1:
        raise ConfigError(f"distributed.blocks_per_unit = {d.blocks_per_unit}: use 1 (one FSDP unit per block) or more")
    changed = [f"distributed.{k}" for k, default in _FSDP_KNOBS.items() if getattr(d, k) != default]
    if changed and mode != "fsdp":
        raise ConfigError(f"{', '.join(changed)} applies to distributed.mode = fsdp, not {mode}")
    if mode == "fsdp":
        if profile.optimizer.offload:
            raise ConfigError(
                "optimizer.offload does not compose with distributed.mode = fsdp (it would copy sharded DTensors into a "
                "second optimizer); use distributed.cpu_offload = true instead: FSDP2's CPUOffloadPolicy keeps the sharded "
                "parameters, gradients and optimizer state on the CPU"
            )
        if profile.optimizer.name == "adafactor":
            raise ConfigError(
                "optimizer.name = adafactor does not run on FSDP2's sharded parameters (its factored update does in-place "
                "ops that DTensor cannot shard); use adamw with fsdp, or adafactor with distributed.mode = ddp"
            )


# ---------------------------------------------------------------------------------------------- the context


@dataclass
class DistContext:
    """Where this process stands among the ranks of a run; the engine keeps one per train()."""

    mode: str = "none"
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    owns_group: bool = False  # the engine made a one-process group (ddp/fsdp outside torchrun) and ends it

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.mode != "none" or self.world_size > 1

    def check(self, experiment: Experiment, profile: Profile) -> None:
        check(experiment, profile, self.world_size, self.device.type)

    # -------------------------------------------------------------------- wrapping (the last technique)

    def wrap(self, model: torch.nn.Module, profile: Profile) -> tuple[torch.nn.Module, str]:
        """DDP around the model, or FSDP2 on every block then the root; returns the model to train and a description.

        `model` may be torch.compile's wrapper: FSDP2 shards the module inside it in place (the compiled wrapper then
        calls the sharded module), DDP wraps the wrapper. The optimizer must be built after this (FSDP2 replaces the
        parameters with sharded DTensors).
        """
        mode = profile.distributed.mode
        if mode == "none":
            return model, "none"
        cuda = self.device.type == "cuda"
        if mode == "ddp":
            from torch.nn.parallel import DistributedDataParallel as DDP

            # gradient_as_bucket_view: gradients are views into the all-reduce buckets, not a second copy of them.
            wrapped = DDP(model, device_ids=[self.device.index] if cuda else None, gradient_as_bucket_view=True)
            return wrapped, f"ddp x{self.world_size}"
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

        inner = getattr(model, "_orig_mod", model)  # under torch.compile's wrapper
        mesh = init_device_mesh(self.device.type, (self.world_size,))
        d = profile.distributed
        mp = MixedPrecisionPolicy(param_dtype=_PARAM_DTYPE.get(profile.precision.dtype),
                                  reduce_dtype=torch.float32 if d.reduce_dtype == "fp32" else None)  # None: the params'
        offload = CPUOffloadPolicy(pin_memory=True) if d.cpu_offload else OffloadPolicy()
        blocks, k = list(inner.blocks), d.blocks_per_unit
        # every block in one unit kept after forward: that unit would be gathered and reduced beside the root's, so
        # the root holds the blocks itself (one group: one all-gather, one reduce-scatter, half the hooks' host work)
        units = [] if k >= len(blocks) and not d.reshard_after_forward else [blocks[i:i + k] for i in range(0, len(blocks), k)]
        for unit in units:  # one all-gather / reduce-scatter per unit: only one unit (of k blocks) is ever whole
            fully_shard(unit if k > 1 else unit[0], mesh=mesh, mp_policy=mp, offload_policy=offload,
                        reshard_after_forward=d.reshard_after_forward)
        fully_shard(inner, mesh=mesh, mp_policy=mp, offload_policy=offload)  # the root: embeddings, final norm, head
        _prefetch([unit[0] for unit in units], d.prefetch)  # a unit's hooks and prefetch lists sit on its first block
        return model, _fsdp_description(len(blocks), profile)

    def grad_scaler(self, device: torch.device) -> torch.amp.GradScaler:
        """fp16: FSDP's gradients are sharded, so an overflow seen by one rank must skip the step on every rank."""
        if self.mode == "fsdp" and self.world_size > 1:
            from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

            return ShardedGradScaler(device.type)
        return torch.amp.GradScaler(device.type)

    def set_grad_sync(self, model: torch.nn.Module, sync: bool) -> None:
        """Gradient accumulation under DDP: all-reduce once, in the last micro-batch's backward (what no_sync does).

        FSDP2 keeps reduce-scattering every micro-batch: skipping it would keep whole unsharded gradients between
        micro-batches, the memory FSDP is there to save.
        """
        if self.mode == "ddp":
            model.require_backward_grad_sync = sync

    # -------------------------------------------------------------------- the loss

    def reduce_loss(self, loss: torch.Tensor) -> torch.Tensor:
        """[sum of the ranks' losses, stop flags], all-reduced on the device; read later with `read_loss`."""
        if self.world_size == 1:
            return loss
        loss = loss.float()
        # full_like launches a fill kernel: no host-to-device copy, so no host sync
        packed = torch.stack([loss, torch.full_like(loss, 1.0 if stop_requested() else 0.0)])
        dist.all_reduce(packed)
        return packed

    def read_loss(self, value: Any) -> float | None:
        """The mean loss over ranks as a float; StopRequested (on every rank alike) when any rank asked to stop."""
        if not isinstance(value, torch.Tensor):
            return value
        if self.world_size == 1:
            return value.item()
        total, stops = value.tolist()
        if stops > 0:
            raise StopRequested(f"stop requested (signal) on {int(stops)} of {self.world_size} ranks")
        return total / self.world_size

    # -------------------------------------------------------------------- the end

    def rank_row(self, summary: dict[str, Any]) -> dict[str, Any]:
        row = {k: summary.get(k) for k in RANK_COLUMNS}
        tps = summary.get("tokens_per_s")
        # this rank's share: its slice of every global batch
        row["tokens_per_s"] = tps / self.world_size if tps is not None else None
        row["tokens"] = (summary.get("tokens") or 0) // self.world_size
        row.update(rank=self.rank, local_rank=self.local_rank, world_size=self.world_size, hostname=socket.gethostname(), device=str(self.device))
        return row

    def finish(self, summary: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]] | None]:
        """Gather every rank's summary to rank 0. Returns (the run's summary, one row per rank) on rank 0,
        (this rank's summary, None) elsewhere; (summary, None) when the run is not distributed."""
        if not self.distributed:
            return summary, None
        mine = (summary, self.rank_row(summary))
        gathered: list[Any] = [mine]
        group = _control["group"]
        if self.world_size > 1 and group is not None:
            out: list[Any] | None = [None] * self.world_size if self.is_main else None
            try:
                dist.gather_object(mine, out, dst=0, group=group)
                gathered = out if self.is_main else [mine]
            except Exception:  # noqa: BLE001 (a rank that died or hangs: rank 0 keeps what it measured itself)
                gathered = [mine]
        if not self.is_main:
            return summary, None
        return aggregate([s for s, _ in gathered if s is not None], self.world_size), [r for _, r in gathered if r is not None]

    def close(self) -> None:
        if self.owns_group:
            shutdown()


def _prefetch(blocks: list[torch.nn.Module], ahead: int) -> None:
    """ahead > 1: each unit issues the all-gathers of the next `ahead` units (forward) and of the `ahead` before it
    (backward) from its own hooks, so they overlap compute even when the host does not run ahead of the GPU; 1 leaves
    FSDP2's own order (the next unit's all-gather issued when it is reached)."""
    if ahead <= 1:
        return
    for i, block in enumerate(blocks):
        block.set_modules_to_forward_prefetch(blocks[i + 1:i + 1 + ahead])
        block.set_modules_to_backward_prefetch(blocks[max(0, i - ahead):i][::-1])


def _fsdp_description(n_blocks: int, profile: Profile) -> str:
    d = profile.distributed
    params = profile.precision.dtype if profile.precision.dtype in _PARAM_DTYPE else "fp32"
    parts = [f"params {params}", f"reduce {'fp32' if d.reduce_dtype == 'fp32' else params}"]
    if not d.reshard_after_forward:
        parts.append("kept after forward")
    if d.prefetch > 1:
        parts.append(f"prefetch {d.prefetch}")
    if d.blocks_per_unit >= n_blocks and not d.reshard_after_forward:
        parts.append("one unit with the root")
    elif d.blocks_per_unit > 1:
        parts.append(f"{d.blocks_per_unit} blocks a unit")
    if not d.local_optimizer:
        parts.append("optimizer on DTensors")
    world = dist.get_world_size() if dist.is_initialized() else 1
    return f"fsdp x{world} ({n_blocks} blocks + root; {', '.join(parts)})" + (" cpu_offload" if d.cpu_offload else "")


def aggregate(summaries: list[dict[str, Any]], world: int) -> dict[str, Any]:
    """One summary for the run from the ranks' own (rank 0's first): max over ranks for memory and time, the sum
    for counts, tokens/s of the whole run (global tokens per step / the slowest rank's median step time)."""
    out = dict(summaries[0])
    for key in MAX_OVER_RANKS:
        vals = [s.get(key) for s in summaries if s.get(key) is not None]
        out[key] = max(vals) if vals else None
    for key in SUM_OVER_RANKS:
        vals = [s.get(key) for s in summaries if s.get(key) is not None]
        out[key] = sum(vals) if vals else None
    own, slowest = summaries[0].get("step_ms_median"), out.get("step_ms_median")
    if own and slowest and out.get("tokens_per_s"):
        scale = own / slowest  # rank 0's figures assumed its own pace; the run goes at the slowest rank's
        for key in AT_SLOWEST_PACE:
            if out.get(key) is not None:
                out[key] *= scale
    failed = [s["status"] for s in summaries if s.get("status") not in (None, "finished")]
    if failed and out.get("status") == "finished":
        out["status"] = failed[0]
    return out


def setup(profile: Profile, device: torch.device) -> DistContext:
    """The engine's view of the ranks. Makes a one-process group when the profile asks for ddp/fsdp outside torchrun."""
    mode = profile.distributed.mode
    owns = False
    if not dist.is_initialized():
        if mode == "none":
            return DistContext(mode="none", device=device)
        backend = CUDA_BACKEND if device.type == "cuda" else "gloo"
        if device.type == "cuda":
            device = torch.device("cuda", device.index if device.index is not None else torch.cuda.current_device())
            torch.cuda.set_device(device)
        # an in-memory store: one process needs no rendezvous (and takes no port)
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, **({"device_id": device} if device.type == "cuda" else {}))
        owns = True
    elif device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    world = dist.get_world_size()
    if world > 1 and _control["group"] is None:
        # every rank calls train() together, so this collective is safe here; gloo, so the final gather is on the
        # CPU and honours the timeout even when NCCL is stuck
        _control["group"] = dist.new_group(backend="gloo", timeout=timedelta(seconds=GATHER_TIMEOUT_S))
    _stop["requested"] = False
    local = int(os.environ.get("LOCAL_RANK", "0")) if launched_by_torchrun() else 0
    return DistContext(mode=mode, rank=dist.get_rank(), world_size=world, local_rank=local, device=device, owns_group=owns)
