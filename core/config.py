"""Experiments and profiles: typed dataclasses, one per TOML table, loaded strictly.

An Experiment is what stays fixed in a comparison (model shape, data, optimisation, token budget, eval set).
A Profile is the technique knobs, the only thing that varies. Section names are unique across the two, so
`--set section.key=value` needs no prefix. An unknown key, a wrong type or an out-of-range value is a
ConfigError naming the file, the key and the valid choices.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import tomllib
import typing
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

from memlab.core.errors import ConfigError
from memlab.core.models import shape

# ---------------------------------------------------------------------------------------------- experiment


@dataclass
class ModelConfig:
    """The model. family = gpt: memlab's own GPT-style decoder (pre-LayerNorm blocks, learned positions, tied
    embeddings). family = hf: any causal LM the installed transformers knows, from `source` (a preset, a config.json
    or a checkpoint folder); the shape keys below that the experiment sets override its config, the rest come from
    it (memlab.core.models.shape)."""

    family: Literal["gpt", "hf"] = "gpt"
    source: str = ""  # hf: a preset name (memlab models), a config.json, or a checkpoint folder (config + weights)
    n_layer: int = 12
    n_head: int = 12
    d_model: int = 768
    n_kv_head: int = 0  # key/value heads (grouped-query attention, hf only); 0 = n_head
    d_ff: int = 0  # 0 = 4 * d_model
    vocab_size: int = 0  # 0 = the tokenizer's vocabulary, padded up to a multiple of 64 (faster matmuls)
    seq_len: int = 1024
    dropout: float = 0.0


@dataclass
class DataConfig:
    """Where the tokens come from. `source = "stdlib"` is the built-in corpus that needs no network."""

    source: str = "stdlib"  # stdlib | a file or folder | hf:NAME[:CONFIG]
    text_field: str = "text"
    split: str = "train"
    streaming: bool = False
    tokenizer: str = "bpe:8192"  # bpe:N | path/to/tokenizer.json | hf:NAME
    max_docs: int = 0  # 0 = every document
    val_tokens: int = 131072  # the fixed held-out slice every profile of an experiment is evaluated on


@dataclass
class TrainConfig:
    batch_size: int = 16  # the effective batch (sequences) per optimizer step
    lr: float = 6e-4
    min_lr_ratio: float = 0.1  # cosine decays to lr * min_lr_ratio
    warmup_steps: int = 20
    steps: int = 0  # optimizer steps; 0 = as many as `epochs` takes
    epochs: float = 1.0  # used when steps = 0: one epoch covers every training token once
    clip: float = 1.0  # max global grad norm; 0 = no clipping
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    seed: int = 1337
    eval_every: int = 0  # steps between validations; 0 = only at the end
    measure_after: int = 3  # steps left out of the speed and memory figures (warm-up, optimizer state)


@dataclass
class Experiment:
    name: str = "unnamed"
    description: str = ""
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)

    def fingerprint(self) -> str:
        """Stable short hash: runs with equal fingerprints are comparable side by side."""
        data = dataclasses.asdict(self) | {"name": None, "description": None}
        for key, default in _NEW_MODEL_KEYS.items():  # keys added later leave older experiments' ids as they were
            if data["model"].get(key) == default:
                del data["model"][key]
        blob = json.dumps(data, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:12]


# Keys that joined [model] after runs were stored: at their defaults they are left out of the fingerprint.
_NEW_MODEL_KEYS = {"family": "gpt", "source": "", "n_kv_head": 0}


def explicit_keys(obj: Any) -> set[str]:
    """The "section.key" names a TOML document or `--set` gave `obj` (an Experiment) explicitly; the hf family fills
    the other shape keys from the model's config (memlab.core.models.shape)."""
    return obj.__dict__.setdefault("_explicit", set())


# ---------------------------------------------------------------------------------------------- profile


@dataclass
class PrecisionConfig:
    # bf16_pure: the parameters themselves (so gradients and optimizer state too) are bf16; no fp32 master copy
    dtype: Literal["fp32", "tf32", "bf16", "fp16", "bf16_pure"] = "fp32"


@dataclass
class AttentionConfig:
    kernel: Literal["eager", "sdpa", "flash", "flex"] = "sdpa"
    # kernel = sdpa: its backend; kernel = flash: the SDPA backend that stands in where flash-attn cannot run (no
    # flash-attn, or dropout under FA4), auto meaning SDPA's flash backend
    sdpa_backend: Literal["auto", "flash", "cudnn", "efficient", "math"] = "auto"
    window: int = 0  # sliding window of W tokens; 0 = full causal attention


@dataclass
class CheckpointingConfig:
    # ops: per block, keep the outputs of matmuls and attention, recompute everything else (torchtitan's per-op SAC)
    mode: Literal["none", "full", "every_n", "selective", "ops"] = "none"
    every: int = 2  # every_n: checkpoint one block in `every`
    target: Literal["attention", "mlp"] = "attention"  # selective: which sub-layer to recompute
    offload: bool = False  # save activations on the CPU (torch.autograd.graph.save_on_cpu)
    # Under compile only: torch._functorch.config.activation_memory_budget, the share (0..1) of the activations the
    # compiler's min-cut partitioner may keep; it recomputes the cheapest of the rest. 1.0 = off (PyTorch's default:
    # the partitioner's own runtime-optimal choice), 0.0 = recompute as much as it can.
    budget: float = 1.0
    # with offload: copy on a side CUDA stream and prefetch one block ahead in backward (memlab.core.offload),
    # instead of save_on_cpu's synchronous copies
    offload_overlap: bool = False


@dataclass
class OptimizerConfig:
    name: Literal["adamw", "adafactor", "adamw8bit", "adamw4bit", "bf16_sr", "muon", "paged_adamw8bit", "galore"] = "adamw"
    fused: bool = False  # adamw only: the fused kernel instead of foreach
    offload: bool = False  # keep optimizer state (and the step) on the CPU
    rank: int = 128  # galore: rank of the projected gradient of each hidden matrix
    # adamw only: one optimizer per parameter, stepped from its post-accumulate-grad hook during backward, which
    # then frees that gradient: no full gradient buffer ever exists (no clipping, accumulation or fp16 scaler)
    in_backward: bool = False


@dataclass
class AccumulationConfig:
    steps: int = 1  # the batch is split into this many micro-batches; the effective batch is unchanged


@dataclass
class CompileConfig:
    enabled: bool = False
    mode: Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"] = "default"
    # Inductor's coordinate-descent tuning of its own Triton kernels (norms, pointwise, reductions): a longer first
    # compile, sometimes faster kernels. The max-autotune modes already do it.
    tune_kernels: bool = False


@dataclass
class KernelsConfig:
    # memlab's fused kernels (memlab.core.fused): residual add + bias + LayerNorm in one Triton pass each way, the
    # MLP's GELU and its backward in cuBLASLt's matmul epilogues, every matmul on cuBLASLt's fastest algorithm for
    # its shape (timed at first use), and the LM head's loss with the logits' gradient made in forward (full logits
    # only: a chunked or library loss keeps its own path). The same function of the same parameters in fewer
    # passes over memory; on the CPU backend their PyTorch reference runs instead.
    fused: bool = False
    # torchao float8 training: the blocks' Linear layers compute in float8 (H100 / Ada). A speed technique: the
    # weights stay fp32 masters, so memory barely moves.
    float8: bool = False
    # Liger Kernel's patches of a transformers model (hf family): RMSNorm, RoPE and SwiGLU as Triton kernels
    # (memlab.core.techniques.liger_patches); the `liger` profile adds Liger's fused linear cross-entropy head
    liger: bool = False


@dataclass
class CudaGraphConfig:
    # The whole step (forward, backward, clipping, the optimizer) captured once as one CUDA graph and replayed: the
    # host launches one graph a step, not every kernel (memlab.core.techniques.cuda_graph). Memory is measured while
    # capturing; a graphed step has no phase times.
    enabled: bool = False


@dataclass
class LossConfig:
    chunked: bool = False  # cross-entropy in chunks of rows: never materializes the B x T x V logits
    chunk_size: int = 4096  # rows (tokens) per chunk
    # A library's fused linear cross-entropy (Triton, CUDA only): the LM head's matmul and the loss in one kernel,
    # so the B x T x V logits never exist either (memlab.core.linear_ce). One of two ways with chunked, not both.
    fused: Literal["none", "liger", "cce"] = "none"


@dataclass
class FinetuneConfig:
    """What trains. full: every parameter. lora / dora: low-rank adapters on the target Linear layers (peft), the
    base frozen in `base` precision (nf4 / int8: quantized by bitsandbytes, CUDA only: QLoRA). freeze: only the
    last `last_blocks` blocks, the final norm and the head train."""

    method: Literal["full", "lora", "dora", "freeze"] = "full"
    rank: int = 16
    alpha: float = 32.0
    dropout: float = 0.05  # on the adapters' input (peft's lora_dropout)
    # all-linear: every Linear inside the blocks (not the head); else comma-separated names, each the end of a
    # module's name (e.g. "q_proj,v_proj", or "attn.qkv" on memlab's gpt)
    targets: str = "all-linear"
    base: Literal["auto", "bf16", "nf4", "int8"] = "auto"  # the frozen weights' storage; auto = as precision.dtype keeps them
    last_blocks: int = 2  # freeze: how many of the last blocks train


@dataclass
class LoaderConfig:
    pin_memory: bool = False
    workers: int = 0


@dataclass
class AllocatorConfig:
    expandable_segments: bool = False  # PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (set before CUDA starts)


@dataclass
class DistributedConfig:
    mode: Literal["none", "ddp", "fsdp"] = "none"
    cpu_offload: bool = False  # fsdp: keep sharded parameters on the CPU
    # fsdp: free each block's gathered parameters after its forward (and gather them again for its backward); false
    # keeps them until backward (ZeRO-2: one all-gather a step, the whole model's compute-dtype weights held)
    reshard_after_forward: bool = True
    reduce_dtype: Literal["fp32", "param"] = "fp32"  # fsdp: gradients reduce-scattered in fp32 or in the params' dtype
    prefetch: int = 1  # fsdp: units whose all-gather is issued ahead of the one computing (FSDP2's own default: 1)
    blocks_per_unit: int = 1  # fsdp: consecutive blocks gathered and reduced as one unit (fewer units, less host work)
    local_optimizer: bool = True  # fsdp: AdamW and the gradient norm on each rank's local shards (memlab.core.shard_step)


@dataclass
class Profile:
    name: str = "unnamed"
    description: str = ""
    precision: PrecisionConfig = field(default_factory=PrecisionConfig)
    attention: AttentionConfig = field(default_factory=AttentionConfig)
    checkpointing: CheckpointingConfig = field(default_factory=CheckpointingConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    accumulation: AccumulationConfig = field(default_factory=AccumulationConfig)
    compile: CompileConfig = field(default_factory=CompileConfig)
    kernels: KernelsConfig = field(default_factory=KernelsConfig)
    cuda_graph: CudaGraphConfig = field(default_factory=CudaGraphConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    loader: LoaderConfig = field(default_factory=LoaderConfig)
    allocator: AllocatorConfig = field(default_factory=AllocatorConfig)
    distributed: DistributedConfig = field(default_factory=DistributedConfig)
    finetune: FinetuneConfig = field(default_factory=FinetuneConfig)
    # Experiment keys this profile cannot run without, e.g. {"train.clip": 0.0} for optimizer.in_backward (no global
    # norm exists to clip by). Applied to the experiment when the two are resolved together (apply_overrides), so the
    # run's experiment, its fingerprint and its summary's `overrides` all say so.
    overrides: dict[str, Any] = field(default_factory=dict)


def _sections(cls: type) -> dict[str, type]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls) if dataclasses.is_dataclass(hints[f.name])}


EXPERIMENT_SECTIONS = _sections(Experiment)
PROFILE_SECTIONS = _sections(Profile)
TOP_LEVEL_KEYS = {"name", "description", "extends"}
PROFILE_TOP_LEVEL_KEYS = TOP_LEVEL_KEYS | {"overrides"}

# ---------------------------------------------------------------------------------------------- values


MAX_INT = 10**12  # any integer knob; beyond it sizes and token counts overflow 64-bit arithmetic downstream
MAX_STEPS = 10**9


def _type_name(tp: Any) -> str:
    if get_origin(tp) is Literal:
        return " | ".join(str(a) for a in get_args(tp))
    return {int: "an integer", float: "a number", bool: "true or false", str: "a string"}.get(tp, str(tp))


def coerce(value: Any, tp: Any, where: str) -> Any:
    """Check (and lightly convert) one value against its field type; raise ConfigError naming `where`."""
    if get_origin(tp) is Literal:
        choices = get_args(tp)
        if value not in choices:
            raise ConfigError(f"{where}: {value!r} is not valid; choose one of: {', '.join(map(str, choices))}")
        return value
    ok = {
        bool: isinstance(value, bool),
        int: isinstance(value, int) and not isinstance(value, bool),
        float: isinstance(value, (int, float)) and not isinstance(value, bool),
        str: isinstance(value, str),
    }[tp]
    if not ok:
        raise ConfigError(f"{where} must be {_type_name(tp)}, got {value!r}")
    if tp is float and not math.isfinite(value):
        raise ConfigError(f"{where} must be a finite number, got {value!r}")
    if tp is int and abs(value) > MAX_INT:
        raise ConfigError(f"{where} is too large: {value} (at most {MAX_INT:,})")
    return float(value) if tp is float else value


def _apply_section(obj: Any, table: Any, section: str, origin: str, explicit: set[str]) -> None:
    if not isinstance(table, dict):
        raise ConfigError(f"{origin}: [{section}] must be a table of keys, got {table!r}")
    hints = typing.get_type_hints(type(obj))
    valid = [f.name for f in dataclasses.fields(obj)]
    for key, value in table.items():
        if key not in valid:
            raise ConfigError(f"{origin}: unknown key {section}.{key}; valid keys in [{section}]: {', '.join(valid)}")
        setattr(obj, key, coerce(value, hints[key], f"{origin}: {section}.{key}"))
        explicit.add(f"{section}.{key}")


def _apply_document(target: Any, doc: dict, sections: dict[str, type], origin: str) -> None:
    for key, value in doc.items():
        if key in ("name", "description"):
            setattr(target, key, coerce(value, str, f"{origin}: {key}"))
        elif key == "extends":
            continue
        elif key == "overrides" and isinstance(target, Profile):
            target.overrides = {**target.overrides, **_profile_overrides(value, origin)}
        elif key in sections:
            _apply_section(getattr(target, key), value, key, origin, explicit_keys(target))
        else:
            top = PROFILE_TOP_LEVEL_KEYS if isinstance(target, Profile) else TOP_LEVEL_KEYS
            valid = sorted(top) + [f"[{s}]" for s in sections]
            raise ConfigError(f"{origin}: unknown key {key!r}; valid: {', '.join(valid)}")


def _field_type(cls: type, section: str, key: str, where: str) -> Any:
    """The type of key `key` of section class `cls`, or a ConfigError naming the keys of [section]."""
    hints = typing.get_type_hints(cls)
    if key not in hints:
        valid = ", ".join(f.name for f in dataclasses.fields(cls))
        raise ConfigError(f"{where}: unknown key {section}.{key}; valid keys in [{section}]: {valid}")
    return hints[key]


def _profile_overrides(table: Any, origin: str) -> dict[str, Any]:
    """A profile's [overrides] table: {"section.key": value} over experiment keys, each checked like `--set`."""
    if not isinstance(table, dict):
        raise ConfigError(f"{origin}: [overrides] must be a table of \"section.key\" = value, got {table!r}")
    out = {}
    for name, value in table.items():
        where = f"{origin}: overrides {name!r}"
        parts = name.split(".")
        if len(parts) != 2 or not all(parts):
            raise ConfigError(f"{where}: expected an experiment key as \"section.key\", e.g. \"train.clip\" = 0")
        if parts[0] not in EXPERIMENT_SECTIONS:
            raise ConfigError(f"{where}: unknown experiment section {parts[0]!r}; valid: {', '.join(EXPERIMENT_SECTIONS)}")
        out[name] = coerce(value, _field_type(EXPERIMENT_SECTIONS[parts[0]], *parts, where), where)
    return out


# ---------------------------------------------------------------------------------------------- loading

_BUILTIN_PACKAGE = "memlab.profiles"


def _builtin_dir(kind: str) -> Any:
    root = resources.files(_BUILTIN_PACKAGE)
    return root / "experiments" if kind == "experiment" else root


def builtin_names(kind: Literal["profile", "experiment"]) -> list[str]:
    folder = _builtin_dir(kind)
    return sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".toml"))


def _read_toml(text: str, origin: str) -> dict:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{origin}: not valid TOML ({e})") from None


def _looks_like_path(ref: str) -> bool:
    return ref.endswith(".toml") or "/" in ref or "\\" in ref


def _parent_ref(parent: str, ref: str) -> str:
    """`extends` in a file names its parent relative to that file's folder (where the two usually sit together);
    the working directory still answers where the file's folder has no such parent (as before this rule)."""
    if not _looks_like_path(parent) or not _looks_like_path(ref) or Path(parent).expanduser().is_absolute():
        return parent
    beside = Path(ref).expanduser().parent / parent
    return str(beside) if beside.is_file() or not Path(parent).is_file() else parent


def _resolve(ref: str, kind: Literal["profile", "experiment"]) -> tuple[dict, str, str]:
    """A built-in name or a path to a TOML file -> (document, origin for messages, default name)."""
    if not ref.strip():
        raise ConfigError(f"the {kind} name is empty; give a built-in {kind} (memlab {kind}s) or a path to a .toml file")
    looks_like_path = _looks_like_path(ref)
    if looks_like_path or (ref not in builtin_names(kind) and Path(ref).is_dir()):
        path = Path(ref).expanduser()
        shown = ref if ref.isprintable() else repr(ref)  # an error is one line, whatever the path holds
        if path.is_dir():
            raise ConfigError(f"{shown} is a folder; a {kind} is a .toml file (or a built-in name: memlab {kind}s)")
        if not path.is_file():
            raise ConfigError(f"{kind} file not found: {shown}")
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise ConfigError(f"{shown}: cannot read {kind} file ({e.__class__.__name__})") from None
        return _read_toml(text, str(path)), str(path), path.stem
    names = builtin_names(kind)
    if ref not in names:
        raise ConfigError(f"unknown {kind} {ref!r}{_did_you_mean(ref, names)}; built-in {kind}s: {', '.join(names)} (or a path to a .toml file)")
    text = (_builtin_dir(kind) / f"{ref}.toml").read_text(encoding="utf-8")
    return _read_toml(text, f"{kind}s/{ref}.toml"), f"built-in {kind} {ref}", ref


def _did_you_mean(ref: str, names: list[str]) -> str:
    """` (did you mean bf16?)` for a name that differs from a built-in only in case, or is one typo away."""
    import difflib

    same_case = [n for n in names if n.lower() == ref.lower()]
    close = same_case or difflib.get_close_matches(ref.lower(), names, n=1, cutoff=0.8)
    return f" (did you mean {close[0]}?)" if close else ""


class _ExtendsCycle(ConfigError):
    """Raised once, naming the whole chain; the files along the chain pass it on as it is."""


def _load(ref: str, kind: Literal["profile", "experiment"], cls: type, sections: dict, seen: tuple = ()) -> tuple[Any, str]:
    """The resolved object and where it came from (for messages), `extends` applied parent first."""
    doc, origin, default_name = _resolve(ref, kind)
    if ref in seen:
        raise _ExtendsCycle(f"{origin}: `extends` forms a cycle: {' -> '.join(seen + (ref,))}")
    parent = doc.get("extends")
    if parent is not None:
        if not isinstance(parent, str):
            raise ConfigError(f"{origin}: extends must be the name of a built-in {kind} or a path, got {parent!r}")
        try:
            obj, _ = _load(_parent_ref(parent, ref), kind, cls, sections, seen + (ref,))
        except ConfigError as e:
            if isinstance(e, _ExtendsCycle) or str(e).startswith(f"{origin}:"):
                raise
            raise ConfigError(f"{origin}: extends = {parent!r}: {e}") from None
        obj.description = ""
    else:
        obj = cls()
    obj.name = default_name
    _apply_document(obj, doc, sections, origin)
    return obj, origin


def load_profile(ref: str) -> Profile:
    profile, origin = _load(ref, "profile", Profile, PROFILE_SECTIONS)
    validate_profile(profile, origin)
    return profile


def load_experiment(ref: str) -> Experiment:
    experiment, origin = _load(ref, "experiment", Experiment, EXPERIMENT_SECTIONS)
    _resolve_model(experiment, origin)
    validate_experiment(experiment, origin)
    return experiment


def _resolve_model(experiment: Experiment, origin: str) -> None:
    """hf: the shape keys the experiment left unset come from its model's config (memlab.core.models.shape)."""
    try:
        shape.resolve(experiment, explicit_keys(experiment))
    except ConfigError as e:
        raise ConfigError(f"{origin}: {e}") from None


def profile_from_dict(data: dict) -> Profile:
    """Rebuild a resolved profile (e.g. from run.json)."""
    profile = Profile()
    _apply_document(profile, data, PROFILE_SECTIONS, "profile")
    return profile


def experiment_from_dict(data: dict) -> Experiment:
    experiment = Experiment()
    _apply_document(experiment, data, EXPERIMENT_SECTIONS, "experiment")
    return experiment


# ---------------------------------------------------------------------------------------------- overrides


def parse_set(item: str) -> tuple[str, str, Any]:
    """'section.key=value' -> (section, key, value); the value is read as TOML, else kept as a string."""
    if "=" not in item:
        raise ConfigError(f"--set {item!r}: expected section.key=value, e.g. train.batch_size=32")
    lhs, raw = item.split("=", 1)
    parts = lhs.strip().split(".")
    if len(parts) != 2 or not all(parts):
        raise ConfigError(f"--set {item!r}: expected section.key=value, e.g. attention.window=512")
    raw = raw.strip()
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    return parts[0], parts[1], value


def apply_overrides(experiment: Experiment, profile: Profile, items: list[str]) -> None:
    """Resolve the two together: the profile's own [overrides] of experiment keys, then the `--set` items (which
    win), each applied to whichever of experiment or profile owns the section; then re-validate both."""
    for name, value in profile.overrides.items():
        section, key = name.split(".")
        setattr(getattr(experiment, section), key, value)  # checked when the profile was loaded
    if any(parse_set(item)[:2] in (("model", "source"), ("model", "family")) for item in items):
        # another model: the shape (and tokenizer) the experiment's file gave its own model no longer apply; a
        # checkpoint's own tokenizer then serves its data (the --set keys beside it still win)
        explicit_keys(experiment).difference_update([f"model.{k}" for k in shape.KEY_NAMES] + ["data.tokenizer"])
    for item in items:
        section, key, value = parse_set(item)
        if section in EXPERIMENT_SECTIONS:
            target = getattr(experiment, section)
        elif section in PROFILE_SECTIONS:
            target = getattr(profile, section)
        else:
            valid = ", ".join(list(EXPERIMENT_SECTIONS) + list(PROFILE_SECTIONS))
            raise ConfigError(f"--set {item!r}: unknown section {section!r}; valid sections: {valid}")
        tp = _field_type(type(target), section, key, f"--set {item!r}")
        if tp is str and not isinstance(value, str):
            value = str(value)
        setattr(target, key, coerce(value, tp, f"--set {section}.{key}"))
        if section in EXPERIMENT_SECTIONS:
            explicit_keys(experiment).add(f"{section}.{key}")
    _resolve_model(experiment, "--set")
    validate_experiment(experiment, "--set")
    validate_profile(profile, "--set")


def describe_overrides(profile: Profile) -> str | None:
    """The profile's [overrides] as one line, e.g. 'train.clip=0.0'; None when it has none."""
    return " ".join(f"{k}={v}" for k, v in profile.overrides.items()) or None


# ---------------------------------------------------------------------------------------------- validation


def _require(cond: bool, message: str) -> None:
    if not cond:
        raise ConfigError(message)


def warmup_warning(warmup_steps: int, total_steps: int) -> str | None:
    """One line when the warm-up does not end within the run (`--steps 3` on an experiment that warms up over 1000):
    the learning rate then only climbs, to total/warmup of train.lr, and never decays."""
    if not warmup_steps or warmup_steps < total_steps:
        return None
    return (f"train.warmup_steps ({warmup_steps:,}) is not less than the run's {total_steps:,} steps: the learning rate only "
            f"warms up, to {total_steps / warmup_steps:.1%} of train.lr (lower it with --set train.warmup_steps=N)")


def validate_experiment(e: Experiment, origin: str) -> None:
    m, t, d = e.model, e.train, e.data
    for key in ("n_layer", "n_head", "d_model", "seq_len"):
        _require(getattr(m, key) >= 1, f"{origin}: model.{key} must be at least 1, got {getattr(m, key)}")
    _require(m.d_model % m.n_head == 0, f"{origin}: model.d_model ({m.d_model}) must be divisible by model.n_head ({m.n_head})")
    _validate_family(m, origin)
    _require(m.d_ff >= 0, f"{origin}: model.d_ff must be >= 0 (0 = 4 x d_model), got {m.d_ff}")
    _require(m.vocab_size >= 0, f"{origin}: model.vocab_size must be >= 0 (0 = from the tokenizer), got {m.vocab_size}")
    _require(0.0 <= m.dropout < 1.0, f"{origin}: model.dropout must be in [0, 1), got {m.dropout}")
    _require(t.batch_size >= 1, f"{origin}: train.batch_size must be at least 1, got {t.batch_size}")
    _require(t.lr > 0, f"{origin}: train.lr must be positive, got {t.lr}")
    _require(0.0 <= t.min_lr_ratio <= 1.0, f"{origin}: train.min_lr_ratio must be in [0, 1], got {t.min_lr_ratio}")
    _require(t.steps >= 0, f"{origin}: train.steps must be >= 0 (0 = from epochs), got {t.steps}")
    _require(t.steps <= MAX_STEPS, f"{origin}: train.steps must be at most {MAX_STEPS:,}, got {t.steps:,}")
    _require(t.epochs > 0, f"{origin}: train.epochs must be positive, got {t.epochs}")
    for key in ("warmup_steps", "eval_every", "measure_after"):
        _require(getattr(t, key) >= 0, f"{origin}: train.{key} must be >= 0, got {getattr(t, key)}")
    _require(t.clip >= 0, f"{origin}: train.clip must be >= 0 (0 = off), got {t.clip}")
    _require(t.weight_decay >= 0, f"{origin}: train.weight_decay must be >= 0, got {t.weight_decay}")
    _require(0 <= t.beta1 < 1 and 0 <= t.beta2 < 1, f"{origin}: train.beta1 and train.beta2 must be in [0, 1)")
    _require(d.max_docs >= 0, f"{origin}: data.max_docs must be >= 0 (0 = all), got {d.max_docs}")
    _require(d.val_tokens >= 1, f"{origin}: data.val_tokens must be at least 1, got {d.val_tokens}")
    _require(bool(d.source.strip()), f"{origin}: data.source must not be empty (stdlib, a path, or hf:NAME)")
    _require(bool(d.tokenizer.strip()), f"{origin}: data.tokenizer must not be empty (bpe:N, a tokenizer.json, or hf:NAME)")


def _validate_family(m: ModelConfig, origin: str) -> None:
    _require(m.n_kv_head >= 0, f"{origin}: model.n_kv_head must be >= 0 (0 = n_head), got {m.n_kv_head}")
    if m.family == "gpt":
        _require(not m.source, f"{origin}: model.source = {m.source!r} applies to model.family = \"hf\" (memlab's gpt is built from the shape keys alone)")
        _require(m.n_kv_head in (0, m.n_head), f"{origin}: model.n_kv_head = {m.n_kv_head}: memlab's gpt has no grouped-query attention; use model.family = \"hf\" (e.g. a llama preset) or n_kv_head = 0")
        return
    kv = m.n_kv_head or m.n_head
    _require(m.n_head % kv == 0, f"{origin}: model.n_kv_head ({kv}) must divide model.n_head ({m.n_head}): each key/value head serves a whole group of query heads")
    config = shape.read_source(m.source)
    cap = shape.max_positions(config)
    _require(cap is None or m.seq_len <= cap, f"{origin}: model.seq_len = {m.seq_len} is longer than the model's positions ({cap}, its config's max_position_embeddings)")


def validate_profile(p: Profile, origin: str) -> None:
    _require(p.attention.window >= 0, f"{origin}: attention.window must be >= 0 (0 = none), got {p.attention.window}")
    _require(p.checkpointing.every >= 1, f"{origin}: checkpointing.every must be at least 1, got {p.checkpointing.every}")
    _require(0.0 <= p.checkpointing.budget <= 1.0, f"{origin}: checkpointing.budget must be in [0, 1] (1 = off), got {p.checkpointing.budget}")
    _require(p.accumulation.steps >= 1, f"{origin}: accumulation.steps must be at least 1, got {p.accumulation.steps}")
    _require(p.loss.chunk_size >= 1, f"{origin}: loss.chunk_size must be at least 1, got {p.loss.chunk_size}")
    _require(not (p.loss.chunked and p.loss.fused != "none"),
             f"{origin}: loss.chunked = true and loss.fused = {p.loss.fused} are two ways to avoid the logits; choose one (loss.chunked = false, or loss.fused = \"none\")")
    _require(p.loader.workers >= 0, f"{origin}: loader.workers must be >= 0, got {p.loader.workers}")
    _require(p.optimizer.rank >= 1, f"{origin}: optimizer.rank must be at least 1, got {p.optimizer.rank}")
    _validate_finetune(p.finetune, origin)
    if p.checkpointing.offload_overlap:
        _require(p.checkpointing.offload, f"{origin}: checkpointing.offload_overlap applies with checkpointing.offload = true (it says how the activations go to the CPU)")
    if p.optimizer.fused:
        _require(p.optimizer.name == "adamw", f"{origin}: optimizer.fused applies to adamw only, not {p.optimizer.name}")


def _validate_finetune(f: FinetuneConfig, origin: str) -> None:
    _require(f.rank >= 1, f"{origin}: finetune.rank must be at least 1, got {f.rank}")
    _require(f.alpha > 0, f"{origin}: finetune.alpha must be positive, got {f.alpha}")
    _require(0.0 <= f.dropout < 1.0, f"{origin}: finetune.dropout must be in [0, 1), got {f.dropout}")
    _require(f.last_blocks >= 0, f"{origin}: finetune.last_blocks must be >= 0, got {f.last_blocks}")
    _require(bool(f.targets.strip()), f"{origin}: finetune.targets must not be empty (all-linear, or names such as q_proj,v_proj)")
    if f.base in ("nf4", "int8"):
        _require(f.method in ("lora", "dora"), f"{origin}: finetune.base = {f.base} quantizes frozen weights; it needs method = lora or dora, not {f.method}")


def to_dict(obj: Any) -> dict:
    return dataclasses.asdict(obj)


def describe_changes(profile: Profile) -> str:
    """What a profile changes against the defaults, e.g. 'precision.dtype=bf16 checkpointing.mode=full'."""
    base = Profile()
    changes = []
    for section in PROFILE_SECTIONS:
        cur, ref = getattr(profile, section), getattr(base, section)
        for f in dataclasses.fields(cur):
            if getattr(cur, f.name) != getattr(ref, f.name):
                changes.append(f"{section}.{f.name}={getattr(cur, f.name)}")
    if profile.overrides:
        changes.append(f"overrides: {describe_overrides(profile)}")
    return " ".join(changes) if changes else "(defaults)"
