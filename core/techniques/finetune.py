"""finetune: what trains. full (every parameter), lora / dora (low-rank adapters on the target Linear layers, through
peft), QLoRA (the same over a base quantized to 4-bit NF4 or 8-bit by bitsandbytes, CUDA only), or freeze (only the
last N blocks, the final norm and the head).

The frozen base gets no gradient and no optimizer state; with finetune.base = bf16 it is stored in bf16 (half the
bytes of fp32), with nf4 in 4 bits plus a scale per 64 weights. Adapters are kept in fp32 and run under the
profile's autocast, as peft keeps them for the Trainer. The targets are found through the family adapter (the
Linear layers inside the model's blocks), so the same profile serves memlab's GPT and any transformers model.
"""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING, Any

import torch
import torch.nn as nn

from memlab.core.errors import ConfigError, MemlabError
from memlab.core.models import family
from memlab.core.requirements import refuse_without_cuda
from memlab.core.standin import StandIn

if TYPE_CHECKING:
    from memlab.core.config import Experiment, Profile
    from memlab.core.step import TrainStep

FAMILIES = family.FAMILIES
PEFT = "pip install 'memlab[peft]'"
BNB = "pip install 'memlab[bnb]'"
ADAPTERS = ("lora", "dora")
QUANTIZED = ("nf4", "int8")


# ---------------------------------------------------------------------------------------------- checks


def check(experiment: Experiment, profile: Profile, device: torch.device, world: int) -> None:
    f = profile.finetune
    if f.method == "full":
        return
    check_plan(experiment, profile, world)
    if f.method in ADAPTERS:
        _require_package("peft", f"finetune.method = {f.method} needs peft: {PEFT}")
    if f.base in QUANTIZED:
        refuse_without_cuda("finetune.base", profile, device)
        _require_package("bitsandbytes", f"finetune.base = {f.base} needs bitsandbytes: {BNB}")


def check_plan(experiment: Experiment, profile: Profile, world: int) -> None:
    """What the configuration alone rules out: conflicting techniques, and targets, rank and last_blocks against
    the model's own layers (read from its skeleton on the meta device: nothing is allocated)."""
    f = profile.finetune
    if f.method == "full":
        return
    for knob, on in (("kernels.fused", profile.kernels.fused), ("kernels.float8", profile.kernels.float8),
                     ("cuda_graph.enabled", profile.cuda_graph.enabled)):
        if on:
            raise ConfigError(f"finetune.method = {f.method} cannot run with {knob} = true (it replaces the layers the adapters wrap); set it to false")
    if profile.optimizer.name in ("galore", "muon"):
        raise ConfigError(f"optimizer.name = {profile.optimizer.name} shapes whole weight matrices' updates; with finetune.method = {f.method} use adamw, adamw8bit or adafactor")
    if f.method == "dora" and f.base in QUANTIZED and not _peft_at_least("0.10"):
        raise ConfigError(f"finetune.method = dora over a {f.base} base needs peft >= 0.10 (this is {_version('peft')}); use method = lora, or base = bf16")
    skeleton = family.skeleton(experiment)
    if f.method == "freeze":
        n = len(skeleton.blocks)
        if not 0 < f.last_blocks <= n:
            raise ConfigError(f"finetune.last_blocks = {f.last_blocks}: the model has {n} blocks; train 1 to {n} of them (or method = full)")
        return
    layers = target_layers(skeleton, f.targets)
    narrowest = min(min(m.in_features, m.out_features) for m in layers.values())
    if f.rank > narrowest:
        raise ConfigError(f"finetune.rank = {f.rank} is above the narrowest target layer's width ({narrowest}); use 1 to {narrowest}")


def linear_layers(model: nn.Module) -> dict[str, nn.Linear]:
    """Every Linear inside the model's blocks (the head and embedding are not adapted), by full module name."""
    names = {id(b): i for i, b in enumerate(model.blocks)}
    out = {}
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear) and _in_blocks(model, name, names):
            out[name] = module
    return out


def _in_blocks(model: nn.Module, name: str, block_ids: dict[int, int]) -> bool:
    parts = name.split(".")
    for i in range(1, len(parts)):
        prefix = ".".join(parts[:i])
        if id(model.get_submodule(prefix)) in block_ids:
            return True
    return False


def target_layers(model: nn.Module, targets: str) -> dict[str, nn.Linear]:
    """The Linear layers `targets` names (all-linear: every one in the blocks); none matched is a refusal that
    lists the model's own layer names."""
    layers = linear_layers(model)
    if targets.strip() == "all-linear":
        return layers
    wanted = [t.strip() for t in targets.split(",") if t.strip()]
    chosen = {n: m for n, m in layers.items() if any(n == w or n.endswith("." + w) for w in wanted)}
    if not chosen:
        kinds = sorted({n.split(".", 1)[1] if "." in n else n for n in (_short(n) for n in layers)})
        raise ConfigError(f"finetune.targets = {targets!r} matches none of the model's Linear layers; its layers in each block: {', '.join(kinds)} (or all-linear)")
    return chosen


def _short(name: str) -> str:
    """`hf.model.layers.3.self_attn.q_proj` -> `self_attn.q_proj`: a layer's name within its block."""
    parts = name.split(".")
    digits = [i for i, p in enumerate(parts) if p.isdigit()]
    return ".".join(parts[digits[-1] + 1:]) if digits else name


def _require_package(name: str, message: str) -> None:
    if importlib.util.find_spec(name) is None:
        raise MemlabError(message)


def _version(name: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return "not installed"


def _peft_at_least(minimum: str) -> bool:
    got = _version("peft")
    if got == "not installed":
        return True  # the missing package is its own refusal
    return tuple(int(x) for x in got.split(".")[:2]) >= tuple(int(x) for x in minimum.split("."))


def repeats_per_block(profile: Profile, depths: tuple[int, ...]) -> bool:
    """freeze trains the last blocks: which blocks those are depends on the depth."""
    return profile.finetune.method != "freeze"


def memory_standin(profile: Profile) -> StandIn | None:
    """A 4-bit base needs bitsandbytes' CUDA kernels: the predictor's fake step builds the adapters over a bf16 base
    and swaps each base for a stand-in that allocates what bitsandbytes keeps (memlab.core.predict.standins)."""
    f = profile.finetune
    if f.method in ADAPTERS and f.base == "nf4":
        return StandIn("base", "nf4", {"finetune.base": "bf16"})
    return None


def memory_libraries(profile: Profile) -> tuple[str, ...]:
    f = profile.finetune
    return (("peft",) if f.method in ADAPTERS else ()) + (("bitsandbytes",) if f.base in QUANTIZED and f.method in ADAPTERS else ())


# ---------------------------------------------------------------------------------------------- apply


def apply_before_model(step: TrainStep) -> None:
    """The frozen base's storage dtype is the model's build dtype: an 8B bf16 base is never made in fp32 first."""
    f = step.profile.finetune
    if f.method in ADAPTERS and f.base in ("bf16", *QUANTIZED):
        step.param_dtype = torch.bfloat16


def apply(step: TrainStep) -> None:
    """Freeze, quantize and add adapters before the wrappers (checkpointing, compile, DDP/FSDP) and the optimizer,
    which then hold only what trains."""
    f, model = step.profile.finetune, step.model
    if f.method == "freeze":
        step.applied["finetune"] = _freeze(model, f.last_blocks)
    elif f.method in ADAPTERS:
        layers = target_layers(model, f.targets)
        names = list(layers)
        if f.base in QUANTIZED and not step.on_device:
            _quantize(model, layers, f.base, step.device)
        step.applied["finetune"] = add_adapters(model, names, f) + (f" {f.base} base (bitsandbytes {_version('bitsandbytes')})" if f.base in QUANTIZED else "")
        step.applied["adapter_bytes"] = adapter_bytes(model)
    else:
        step.applied["finetune"] = "full"
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    step.applied["trainable_params"] = trainable
    step.applied["frozen_params"] = sum(p.numel() for p in model.parameters()) - trainable


def trainable_params(model: nn.Module, profile: Profile) -> int:
    """What the optimizer will update under the profile's fine-tuning, counted on the model before any adapter (a meta skeleton will do, as
    memlab fit counts it): every parameter (full); the last blocks, the final norm and the head (freeze; a weight
    shared with the embedding once); or what peft adds to the target layers: r x (in + out) each, and DoRA's
    magnitude, one per output feature."""
    f = profile.finetune
    if f.method == "freeze":
        blocks = list(model.blocks)
        parts = [*blocks[-f.last_blocks:], model.final_norm, model.head]
        return sum(p.numel() for p in {id(p): p for part in parts for p in part.parameters()}.values())
    if f.method not in ADAPTERS:
        return sum(p.numel() for p in model.parameters())
    dora = f.method == "dora"
    return sum(f.rank * (m.in_features + m.out_features) + (m.out_features if dora else 0)
               for m in target_layers(model, f.targets).values())


def stored_weights_bytes(model: nn.Module, profile: Profile) -> int | None:
    """The weights as an adapter's frozen base stores them, counted on the model before adapters (a meta skeleton
    will do): bf16, or NF4's packed half byte a target weight with an 8-bit scale per 64 (and less) beside the rest
    in bf16. None where the base is stored as the profile's precision stores weights (full, freeze, an 8-bit base)."""
    f = profile.finetune
    if f.method not in ADAPTERS or f.base not in ("bf16", "nf4"):
        return None
    total = sum(p.numel() for p in model.parameters())
    if f.base == "bf16":
        return total * 2
    packed = sum(m.weight.numel() for m in target_layers(model, f.targets).values())
    return (total - packed) * 2 + packed * 9 // 16


def graphs_readable(profile: Profile) -> bool:
    """Whether the predictor's compiled-graph reader builds this fine-tuning as the engine does: the whole model, or
    peft's LoRA on a bf16 base (not DoRA's layers, not a 4-bit base)."""
    f = profile.finetune
    return f.method == "full" or (f.method == "lora" and f.base == "bf16")


def trains_whole_model(profile: Profile) -> bool:
    """Whether every block's input carries a gradient (the embeddings train too), so that one block's compiled graphs
    are every block's: under adapters or freezing, the first trained block's input has none, and its graph differs."""
    return profile.finetune.method == "full"


def _freeze(model: nn.Module, last: int) -> str:
    for p in model.parameters():
        p.requires_grad_(False)
    blocks = list(model.blocks)
    for part in [*blocks[-last:], model.final_norm, model.head]:
        for p in part.parameters():
            p.requires_grad_(True)
    return f"freeze: last {last} of {len(blocks)} blocks, final norm, head"


def add_adapters(model: nn.Module, names: list[str], f: Any) -> str:
    """peft's adapters on the named Linear layers, everything else frozen (also what the compiled-step reader,
    memlab.core.predict.inductor, builds)."""
    from peft import LoraConfig, inject_adapter_in_model

    for p in model.parameters():
        p.requires_grad_(False)
    config = LoraConfig(r=f.rank, lora_alpha=f.alpha, lora_dropout=f.dropout, target_modules=names,
                        use_dora=f.method == "dora")
    inject_adapter_in_model(config, model)
    for p in model.parameters():
        if p.requires_grad and p.dtype != torch.float32:
            p.data = p.data.float()  # fp32 adapters under autocast, as peft keeps them for the Trainer
    return f"{f.method} r{f.rank} alpha {f.alpha:g} on {len(names)} layers (peft {_version('peft')})"


def adapter_bytes(model: nn.Module) -> int:
    """The trained adapters' size as a safetensors file: what a run of this profile saves."""
    from safetensors.torch import save

    state = {n: p.detach().cpu() for n, p in model.named_parameters() if p.requires_grad}
    return len(save(state)) if state and not any(t.device.type == "meta" or _is_fake(t) for t in state.values()) else \
        sum(p.numel() * p.element_size() for p in state.values())


def _is_fake(t: torch.Tensor) -> bool:
    return type(t).__name__ == "FakeTensor"


def _quantize(model: nn.Module, layers: dict[str, nn.Linear], base: str, device: torch.device) -> None:
    """Swap each target Linear for bitsandbytes' 4-bit NF4 (or 8-bit) layer holding the same weights, quantized
    on the GPU; the adapters then wrap the quantized layers (peft dispatches on their class)."""
    import bitsandbytes as bnb

    for name in list(layers):  # each bf16 Linear dropped once its quantized twin is in place
        linear = layers.pop(name)
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name)
        has_bias = linear.bias is not None
        if base == "nf4":
            q = bnb.nn.Linear4bit(linear.in_features, linear.out_features, bias=has_bias, compute_dtype=torch.bfloat16,
                                  quant_type="nf4", device="meta")
            q.weight = bnb.nn.Params4bit(linear.weight.data, requires_grad=False, quant_type="nf4")
        else:
            q = bnb.nn.Linear8bitLt(linear.in_features, linear.out_features, bias=has_bias, has_fp16_weights=False,
                                    device="meta")
            # Int8Params quantizes on its way from the host to the GPU
            q.weight = bnb.nn.Int8Params(linear.weight.data.to("cpu"), requires_grad=False, has_fp16_weights=False)
        if has_bias:
            q.bias = nn.Parameter(linear.bias.data, requires_grad=False)
        setattr(parent, child, q.to(device))  # .to(cuda) quantizes
        linear = None
    if device.type == "cuda":  # the bf16 weights' segments go back: an 8B base's 15 GiB would stay reserved
        torch.cuda.empty_cache()
