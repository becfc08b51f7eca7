"""The experiment's model shape for the hf family, read without torch or transformers.

An hf experiment names a `source`: a preset (memlab.core.models.presets), a config.json, or a checkpoint folder
(config.json + *.safetensors, optionally tokenizer.json). `resolve` fills the experiment's generic shape keys
(n_layer, d_model, n_head, n_kv_head, d_ff, vocab_size) from that config wherever the experiment did not set them,
so every figure downstream (the estimate, FLOPs, the summary) reads the real shape; `hf_config` writes the
experiment's keys back into the config dict that transformers builds. A checkpoint's own tokenizer is used unless the
experiment names another.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from memlab.core.errors import ConfigError
from memlab.core.models.presets import PRESETS

# memlab's generic key -> the names architectures give it in config.json (the first one present is used)
KEY_NAMES: dict[str, tuple[str, ...]] = {
    "n_layer": ("num_hidden_layers", "n_layer", "num_layers"),
    "d_model": ("hidden_size", "n_embd", "d_model"),
    "n_head": ("num_attention_heads", "n_head", "num_heads"),
    "n_kv_head": ("num_key_value_heads", "num_kv_heads"),
    "d_ff": ("intermediate_size", "n_inner", "ffn_dim"),
    "vocab_size": ("vocab_size",),
}
POSITION_NAMES = ("max_position_embeddings", "n_positions", "n_ctx", "max_seq_len")


def source_kind(source: str) -> str:
    """preset | config | checkpoint: what `model.source` names."""
    if source in PRESETS:
        return "preset"
    path = Path(source).expanduser()
    if path.is_dir():
        return "checkpoint"
    if path.suffix == ".json" or path.is_file():
        return "config"
    raise ConfigError(f"model.source {source!r} is neither a preset nor a config.json or checkpoint folder; presets: "
                      f"{', '.join(PRESETS)} (memlab models)")


def read_source(source: str) -> dict[str, Any]:
    """The config dict `source` names (a copy: callers may change it)."""
    if not source:
        raise ConfigError(f"model.family = hf needs model.source: a preset ({', '.join(PRESETS)}), a config.json or a checkpoint folder")
    kind = source_kind(source)
    if kind == "preset":
        return json.loads(json.dumps(PRESETS[source]["config"]))
    path = Path(source).expanduser()
    path = path / "config.json" if kind == "checkpoint" else path
    if not path.is_file():
        raise ConfigError(f"model.source {source}: no config.json there (a checkpoint folder holds config.json and *.safetensors)")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConfigError(f"model.source {path}: not a readable config.json ({e.__class__.__name__})") from None
    if not isinstance(config, dict) or "model_type" not in config:
        raise ConfigError(f"model.source {path}: a transformers config.json has a model_type; this one has none")
    return config


def _get(config: dict, key: str) -> Any:
    for name in KEY_NAMES[key]:
        if name in config:
            return config[name]
    return None


def shape_of(config: dict) -> dict[str, int]:
    """memlab's generic shape keys of a config dict (n_kv_head = n_head without grouped-query attention)."""
    shape = {key: _get(config, key) for key in KEY_NAMES}
    missing = [k for k in ("n_layer", "d_model", "n_head", "vocab_size") if not isinstance(shape[k], int)]
    if missing:
        names = "; ".join(f"{k}: {'/'.join(KEY_NAMES[k])}" for k in missing)
        raise ConfigError(f"model config ({config.get('model_type')}) lacks {', '.join(missing)} under any name memlab knows ({names})")
    shape["n_kv_head"] = shape["n_kv_head"] or shape["n_head"]
    shape["d_ff"] = shape["d_ff"] or 4 * shape["d_model"]  # GPT-2's n_inner = null means 4 x d_model
    return shape


def architecture(model: Any) -> str:
    """What a ModelConfig builds, for views: "gpt" (memlab's own), else the hf config's architecture class."""
    if model.family != "hf":
        return "gpt"
    config = read_source(model.source)
    return (config.get("architectures") or [config["model_type"]])[0]


def max_positions(config: dict) -> int | None:
    for name in POSITION_NAMES:
        if isinstance(config.get(name), int):
            return config[name]
    return None


def resolve(experiment: Any, explicit: set[str]) -> None:
    """Fill an hf experiment's shape keys the experiment did not set from its source's config; a checkpoint
    folder's tokenizer.json becomes the data's tokenizer unless data.tokenizer was set."""
    m = experiment.model
    if m.family != "hf":
        return
    config = read_source(m.source)
    for key, value in shape_of(config).items():
        if f"model.{key}" not in explicit:
            setattr(m, key, value)
    if _get(config, "n_kv_head") is None and "model.n_kv_head" not in explicit:
        m.n_kv_head = m.n_head  # no grouped-query attention: a key/value head per head, however many --set asks for
    tokenizer = Path(m.source).expanduser() / "tokenizer.json"
    if source_kind(m.source) == "checkpoint" and tokenizer.is_file() and "data.tokenizer" not in explicit:
        experiment.data.tokenizer = str(tokenizer)


def hf_config(model: Any) -> dict[str, Any]:
    """The config dict transformers builds for `model` (a ModelConfig of family hf): the source's, with the
    experiment's shape keys written over it, head_dim following d_model / n_head when either was changed."""
    config = read_source(model.source)
    base = shape_of(config)
    for key in KEY_NAMES:
        value = getattr(model, key)
        if value == base[key]:
            continue
        names = [n for n in KEY_NAMES[key] if n in config] or ([KEY_NAMES[key][0]] if key != "n_kv_head" else [])
        if not names and value == model.n_head:  # no grouped-query attention: its key/value heads are its heads
            continue
        if not names:
            raise ConfigError(f"model.n_kv_head = {value}: {config['model_type']} has no grouped-query attention (its key/value heads are its n_head, {base['n_head']})")
        config[names[0]] = value
    if "head_dim" in config and (model.d_model != base["d_model"] or model.n_head != base["n_head"]):
        config["head_dim"] = model.d_model // model.n_head
    _set_dropout(config, model.dropout)
    return config


_DROPOUT_NAMES = ("attention_dropout", "attn_pdrop", "resid_pdrop", "embd_pdrop", "hidden_dropout", "dropout")


def _set_dropout(config: dict, p: float) -> None:
    """model.dropout on every dropout the architecture has (architectures without any key take attention's)."""
    present = [n for n in _DROPOUT_NAMES if n in config]
    for name in present or ["attention_dropout"]:
        config[name] = p
