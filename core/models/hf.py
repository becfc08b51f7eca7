"""The hf family: any causal LM the installed transformers knows, behind the adapter the techniques use.

`HFCausalLM` wraps the transformers model and names its parts the way memlab's GPT does (blocks, final norm, head,
embedding, a block's attention and MLP), found by what the model is, not by its class name: the decoder-layer list
is the base model's ModuleList of num_hidden_layers layers, the final norm its norm child, the head
get_output_embeddings(). Its forward takes (idx, targets) and returns the mean loss from the final hidden state and
the head, so chunked cross-entropy and the fused linear cross-entropies serve it exactly as they serve the GPT: the
B x T x V logits exist only where the profile asks for full logits. Attention goes through memlab's kernels
(memlab.core.models.hf_attention).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from memlab.core.attention import kernel_for
from memlab.core.config import Experiment, Profile
from memlab.core.errors import ConfigError, MemlabError
from memlab.core.loss import loss_from_hidden
from memlab.core.models import hf_attention, shape

NORM_NAMES = ("norm", "ln_f", "final_layernorm", "final_norm", "norm_f")
SUBLAYER_NAMES = {"attention": ("self_attn", "attn", "attention", "self_attention"), "mlp": ("mlp", "feed_forward", "ffn")}
INSTALL = "pip install 'memlab[hf]'"


def require_transformers() -> Any:
    try:
        import transformers
    except ImportError:
        raise MemlabError(f"model.family = hf needs transformers, which is not installed: {INSTALL}") from None
    return transformers


def transformers_config(model_cfg: Any) -> Any:
    """The transformers config object for an hf ModelConfig; refuses what is not a causal LM transformers knows."""
    transformers = require_transformers()
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    config = shape.hf_config(model_cfg)
    model_type = config.pop("model_type")
    if model_type not in transformers.CONFIG_MAPPING:
        raise ConfigError(f"model.source {model_cfg.source}: transformers {transformers.__version__} does not know model_type {model_type!r}")
    if model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        raise ConfigError(f"model.source {model_cfg.source}: {model_type} is not a causal language model (transformers has no "
                          f"AutoModelForCausalLM for it); memlab trains next-token prediction")
    vocab = model_cfg.vocab_size
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):  # ids past a shrunken vocabulary mean nothing
        if isinstance(config.get(key), int) and config[key] >= vocab:
            config[key] = None
    return transformers.CONFIG_MAPPING[model_type](**config)


class HFCausalLM(nn.Module):
    """A transformers causal LM as memlab's model: forward(idx, targets) -> mean next-token loss."""

    family = "hf"

    def __init__(self, hf_model: nn.Module):
        super().__init__()
        self.hf = hf_model
        self.architecture = type(hf_model).__name__
        self.loss_chunk_size = 0  # rows per cross-entropy chunk; 0 = full logits (set from the profile's [loss])
        self.loss_kernel = None  # loss.fused: a library's head + loss in one (memlab.core.linear_ce), else None
        self.fused = False  # kernels.fused is the GPT's own; the hf family never sets it
        self.logit_softcap = float(getattr(hf_model.config, "final_logit_softcapping", None) or 0.0)  # Gemma-2

    # ------------------------------------------------------------------ the parts techniques ask for
    @property
    def base(self) -> nn.Module:
        return self.hf.base_model

    @property
    def blocks(self) -> nn.ModuleList:
        n = self.hf.config.num_hidden_layers
        for child in self.base.children():
            if isinstance(child, nn.ModuleList) and len(child) == n:
                return child
        raise ConfigError(f"{self.architecture}: no list of {n} decoder layers in its base model; memlab cannot find its blocks")

    @property
    def final_norm(self) -> nn.Module:
        return _child(self.base, NORM_NAMES, f"{self.architecture}'s final norm")

    @property
    def head(self) -> nn.Module:
        return self.hf.get_output_embeddings()

    @property
    def lm_head(self) -> nn.Module:  # the name memlab's GPT and the optimizers' exclusions use
        return self.head

    @property
    def embedding(self) -> nn.Module:
        return self.hf.get_input_embeddings()

    @staticmethod
    def sublayer(block: nn.Module, which: str) -> nn.Module:
        return _child(block, SUBLAYER_NAMES[which], f"a decoder layer's {which}")

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())  # shared (tied) parameters once

    def flops_params(self) -> int:
        """Parameters that multiply each token: all but an untied input embedding (a lookup, not a matmul)."""
        tied = self.embedding.weight is self.head.weight
        return self.num_params() - (0 if tied else self.embedding.weight.numel())

    # ------------------------------------------------------------------ forward
    def hidden(self, idx: torch.Tensor) -> torch.Tensor:
        """Token ids (B, T) -> final hidden states (B, T, C), after the final norm, before the head."""
        return self.base(input_ids=idx, use_cache=False).last_hidden_state

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        h = self.hidden(idx)
        if targets is None:
            logits = self.head(h)
            return torch.tanh(logits / self.logit_softcap) * self.logit_softcap if self.logit_softcap else logits
        if self.loss_kernel is not None:
            return self.loss_kernel(h, self.head.weight, targets)
        return loss_from_hidden(h, self.head.weight, targets, self.loss_chunk_size, self.logit_softcap)


def _child(module: nn.Module, names: tuple[str, ...], what: str) -> nn.Module:
    for name in names:
        child = getattr(module, name, None)
        if isinstance(child, nn.Module):
            return child
    raise ConfigError(f"cannot find {what} (looked for {', '.join(names)}) in {type(module).__name__}")


# ---------------------------------------------------------------------------------------------- building


def build(experiment: Experiment, profile: Profile, kernel: Any, device: torch.device, dtype: torch.dtype,
          on_device: bool) -> HFCausalLM:
    """The model on `device` (made there: an 8B model is not built on the host first), every attention layer served
    by memlab's kernel for its window, a checkpoint's weights loaded."""
    from transformers import AutoModelForCausalLM

    hf_attention.register()
    config = transformers_config(experiment.model)
    with torch.device(device):
        hf_model = AutoModelForCausalLM.from_config(config, attn_implementation=hf_attention.NAME, dtype=dtype)
    model = HFCausalLM(hf_model)
    assign_kernels(model, experiment, profile, kernel, device)
    if shape.source_kind(experiment.model.source) == "checkpoint" and not on_device:
        load_weights(model.hf, Path(experiment.model.source).expanduser())
    return model


def skeleton(experiment: Experiment) -> HFCausalLM:
    """The model on the meta device: its modules and shapes, nothing allocated (a 1B model in a fraction of a second)."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        return HFCausalLM(AutoModelForCausalLM.from_config(transformers_config(experiment.model)))


def layer_windows(model: HFCausalLM) -> list[int]:
    """Each decoder layer's own sliding window (0 = full attention): Gemma-2 alternates, Mistral v0.1 has one."""
    return [getattr(model.sublayer(b, "attention"), "sliding_window", None) or 0 for b in model.blocks]


def assign_kernels(model: HFCausalLM, experiment: Experiment, profile: Profile, kernel: Any, device: torch.device) -> None:
    """The profile's kernel on every layer; a layer with a window of its own narrower than the profile's gets that
    kernel built for its window (the same kernel family; refused before any work where it cannot window)."""
    built = {0: kernel}
    for block, window in zip(model.blocks, layer_windows(model)):
        if window and window < experiment.model.seq_len and (not profile.attention.window or window < profile.attention.window):
            if window not in built:
                windowed = dataclasses.replace(profile, attention=dataclasses.replace(profile.attention, window=window))
                built[window] = kernel_for(experiment, windowed, device)
            chosen = built[window]
        else:
            chosen = kernel
        setattr(model.sublayer(block, "attention"), hf_attention.KERNEL_ATTR, chosen)


def load_weights(hf_model: nn.Module, folder: Path) -> None:
    """A checkpoint folder's safetensors weights into the model (cast to its dtype), every key accounted for."""
    from safetensors.torch import load_file

    state: dict[str, torch.Tensor] = {}
    for file in sorted(folder.glob("*.safetensors")):
        state.update(load_file(str(file), device="cpu"))
    missing, unexpected = hf_model.load_state_dict(state, strict=False)
    missing = [k for k in missing if not _tied_key(hf_model, k)]
    if missing or unexpected:
        raise ConfigError(f"{folder}: weights do not match the config (missing {missing[:3]}, unexpected {unexpected[:3]})")


def _tied_key(hf_model: nn.Module, key: str) -> bool:
    """A key a checkpoint leaves out because its parameter is another's (a head tied to the embedding)."""
    target = hf_model.get_parameter(key)
    return any(p is target and name != key for name, p in hf_model.named_parameters(remove_duplicate=False))


# ---------------------------------------------------------------------------------------------- checks


def check(experiment: Experiment, profile: Profile) -> None:
    """Everything about the model that can be refused before any work: transformers present, a causal LM it knows,
    techniques this architecture cannot run, a checkpoint's weights against the config and the host's memory."""
    config = transformers_config(experiment.model)
    if getattr(config, "attn_logit_softcapping", None) and profile.attention.kernel != "eager":
        raise ConfigError(f"{config.model_type} soft-caps its attention logits (attn_logit_softcapping = "
                          f"{config.attn_logit_softcapping}), which only attention.kernel = eager computes here; set it, "
                          f"not {profile.attention.kernel}")
    if getattr(config, "final_logit_softcapping", None) and profile.loss.fused != "none":
        raise ConfigError(f"{config.model_type} soft-caps its logits (final_logit_softcapping), which loss.fused = "
                          f"{profile.loss.fused} does not compute; use loss.chunked = true or full logits")
    if shape.source_kind(experiment.model.source) == "checkpoint":
        check_checkpoint(experiment, config)


def check_checkpoint(experiment: Experiment, config: Any) -> None:
    """A checkpoint folder: weights present, every tensor's name and shape the config's model has, and small
    enough for the host's memory (read from the safetensors headers: nothing is loaded)."""
    import psutil
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    folder = Path(experiment.model.source).expanduser()
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ConfigError(f"{folder}: a checkpoint folder needs its weights as *.safetensors; found none (or use its config.json alone for random weights)")
    size = sum(f.stat().st_size for f in files)
    available = psutil.virtual_memory().available
    if size > available:
        raise MemlabError(f"{folder}: the weights need {size / 2**30:.1f} GiB; this host has {available / 2**30:.1f} GiB of memory available")
    with torch.device("meta"):
        expected = {k: tuple(v.shape) for k, v in AutoModelForCausalLM.from_config(config).state_dict().items()}
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            for key in f.keys():
                got = tuple(f.get_slice(key).get_shape())
                if key not in expected:
                    raise ConfigError(f"{file}: weight {key!r} is not in the config's model ({config.model_type}); the weights do not match the config")
                if got != expected[key]:
                    raise ConfigError(f"{file}: weight {key!r} has shape {list(got)}, the config's model {list(expected[key])}; the weights do not match the config")
