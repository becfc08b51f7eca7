"""Activation checkpointing: recompute a block's (or a sub-layer's, or some ops') activations in backward instead of
keeping them; or, under compile, let the compiler choose what to recompute within a memory budget.

Always `use_reentrant=False` (the implementation PyTorch recommends: it composes with autocast, compile and
hooks, and gives the same loss and gradients as no checkpointing).

mode = "ops" is per-op selective checkpointing (torchtitan's "op" SAC): in each block the outputs of the matmuls
and of the attention kernel are kept (the costly ops), and so is every random op (dropout): the recompute replays
the forward's RNG state, but the kept attention kernel does not run again, so with attention dropout a recomputed
dropout would draw at another RNG offset and its mask would not be the forward's (wrong gradients). Everything else
(LayerNorm, GELU, casts, reshapes) is recomputed in backward. `checkpointing.budget` < 1 is not a wrapper at all: it is
torch._functorch.config.activation_memory_budget, read by AOTAutograd's min-cut partitioner when the compiled graph
is built, which happens at the first forward (compile is lazy), so the compiled module runs under it (`budgeted`).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, Callable

import torch
import torch.nn as nn
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

import memlab.core.attention.flash_packed  # noqa: F401  (registers memlab::flash_packed, saved below)
from memlab.core.config import CheckpointingConfig
from memlab.core.errors import ConfigError

if TYPE_CHECKING:
    from memlab.core.config import Experiment, Profile
    from memlab.core.step import TrainStep

OPS_DESCRIPTION = "save matmul+attention"


def _saved_ops() -> set:
    """The ops whose outputs mode "ops" keeps, as they reach the dispatcher (below autograd and autocast): a Linear
    is an addmm or mm there, eager attention two bmm, SDPA one of its backend ops. Looked up by name, so an op
    this torch build lacks is simply absent."""
    aten = torch.ops.aten
    names = ("mm", "addmm", "bmm", "baddbmm", "_scaled_dot_product_flash_attention",
             "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_efficient_attention",
             "_scaled_dot_product_cudnn_attention", "_flash_attention_forward", "_efficient_attention_forward")
    return {getattr(aten, n).default for n in names if hasattr(aten, n)}


SAVED_OPS = _saved_ops() | {torch.ops.memlab.flash_packed.default}  # memlab's FA4 op (memlab.core.attention.flash_packed)
SAVED_NAMESPACES = ("flash_attn",)  # the flash-attn package's own ops (flash_attn::_flash_attn_forward)


def _random(op: Any) -> bool:
    """An op that draws from the RNG and returns its draw (CUDA's native_dropout). An in-place one (the CPU's
    dropout is bernoulli_ into a buffer it then scales) cannot be kept, its output is mutated after; on the CPU no
    kept op draws, so recomputing it replays the forward's draws in order."""
    random = torch.Tag.nondeterministic_seeded in getattr(op, "tags", ())
    return random and not op._schema.is_mutable


_DECISIONS: dict[int, CheckpointPolicy] = {}  # by id(op): an OpOverload's own __hash__ is Python, and runs per op


def ops_policy(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:  # noqa: ARG001
    """Keep what is costly to recompute (matmuls, attention) and what must not be redrawn (random ops); recompute
    the cheap, memory-bound rest."""
    decision = _DECISIONS.get(id(op))
    if decision is None:
        keep = op in SAVED_OPS or getattr(op, "namespace", None) in SAVED_NAMESPACES or _random(op)
        decision = _DECISIONS[id(op)] = CheckpointPolicy.MUST_SAVE if keep else CheckpointPolicy.PREFER_RECOMPUTE
    return decision


def _ops_contexts():
    return create_selective_checkpoint_contexts(ops_policy)


def _wrap(module: nn.Module, context_fn: Callable | None = None) -> None:
    inner = module.forward
    extra = {"context_fn": context_fn} if context_fn is not None else {}

    @functools.wraps(inner)
    def forward(*args, **kwargs):
        return checkpoint(inner, *args, use_reentrant=False, **extra, **kwargs)

    module.forward = forward


def apply_checkpointing(model: nn.Module, cfg: CheckpointingConfig, compile_blocks: bool = False) -> str:
    """Wrap blocks (or their attention / MLP) per cfg.mode; returns a one-line description for the summary.

    compile_blocks (mode ops, on CUDA, without compile.enabled): each wrapped block is compiled, so that the per-op
    policy is applied once, when the block's graph is traced. Run eagerly, per-op SAC puts every op of forward and
    of the recompute through a Python dispatch mode: on an H100 that host time exceeded the recompute it saves
    (Llama-3.2-1B at 2 x 2048: 241 ms a step against full checkpointing's 165). On the CPU backend it runs eagerly."""
    blocks = list(model.blocks)
    if cfg.mode == "none":
        return f"compiler budget {cfg.budget:g}" if cfg.budget < 1 else "none"
    if cfg.mode == "full":
        for block in blocks:
            _wrap(block)
        return f"full ({len(blocks)}/{len(blocks)} blocks)"
    if cfg.mode == "every_n":
        chosen = blocks[:: cfg.every]
        for block in chosen:
            _wrap(block)
        return f"every_n:{cfg.every} ({len(chosen)}/{len(blocks)} blocks)"
    if cfg.mode == "selective":
        for block in blocks:
            _wrap(model.sublayer(block, cfg.target))
        return f"selective:{cfg.target}"
    if cfg.mode == "ops":
        for block in blocks:
            _wrap(block, _ops_contexts)
            if compile_blocks:
                block.compile()
        each = ", each compiled" if compile_blocks else ""
        return f"ops ({OPS_DESCRIPTION}, {len(blocks)}/{len(blocks)} blocks{each})"
    raise ValueError(cfg.mode)


def budgeted(compiled: nn.Module, budget: float) -> nn.Module:
    """Run the compiled module's forward under the activation-memory budget. The partitioner reads the config when
    a graph is compiled, which is inside the first forward (and any recompile), never at torch.compile(): patching
    each call keeps it in effect for every compile and leaves the process's config as it was."""
    import torch._functorch.config as functorch_config

    inner = compiled.forward

    @functools.wraps(inner)
    def forward(*args, **kwargs):
        with functorch_config.patch(activation_memory_budget=budget):
            return inner(*args, **kwargs)

    compiled.forward = forward
    return compiled


def check(experiment: Experiment, profile: Profile, device: torch.device, world: int) -> None:
    """Every mode runs on every device (offload: act_offload). The compiler's budget needs compile, and is its own
    way of checkpointing: with a wrapper mode the two would fight over the same activations."""
    budget, mode = profile.checkpointing.budget, profile.checkpointing.mode
    if budget >= 1:
        return
    if not profile.compile.enabled:
        raise ConfigError(f"checkpointing.budget = {budget:g} is a torch.compile setting: set compile.enabled = true, "
                          "or checkpointing.budget = 1 (off)")
    if mode != "none":
        raise ConfigError(f"checkpointing.budget = {budget:g} conflicts with checkpointing.mode = {mode!r}: the compiler's "
                          "budget chooses what to recompute itself; use mode = 'none' with a budget, or budget = 1 with a mode")


def repeats_per_block(profile: Profile, depths: tuple[int, ...]) -> bool:
    """Every n-th block checkpointed repeats only over whole periods: each depth must hold whole ones."""
    every = profile.checkpointing.every if profile.checkpointing.mode == "every_n" else 1
    return all(d % max(1, every) == 0 for d in depths)


def compiled_blocks(profile: Profile) -> str:
    """The checkpointing mode whose blocks a CUDA GPU runs compiled one by one ("" where none): per-op checkpointing
    without compile.enabled (apply_checkpointing's compile_blocks; the predictor reads such a block's graphs)."""
    return "ops" if profile.checkpointing.mode == "ops" and not profile.compile.enabled else ""


def apply(step: TrainStep) -> None:
    """Before compile, so compile sees (and can fuse around) the recompute boundaries. The budget is applied by
    torch_compile, around the module it compiles."""
    p = step.profile
    compile_blocks = bool(compiled_blocks(p)) and step.device.type == "cuda" and not step.on_device
    step.applied["checkpointing"] = apply_checkpointing(step.model, p.checkpointing, compile_blocks)
