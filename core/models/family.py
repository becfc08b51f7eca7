"""The family door: build the experiment's model and refuse what its family cannot run, for gpt and hf alike.

Techniques never ask which class a model is; they use the adapter every family's model offers:
  blocks        the list of decoder blocks (checkpointing, FSDP units, offload hooks)
  final_norm    the norm after the last block          head / embedding   the LM head and the token embedding
  sublayer(block, "attention" | "mlp")                 num_params(), flops_params()
  loss_chunk_size, loss_kernel                         how forward(idx, targets) makes the loss
  family, architecture                                 what the summary records
"""

from __future__ import annotations

import dataclasses
import json
from typing import TYPE_CHECKING

import torch

from memlab.core.errors import ConfigError
from memlab.core.model import GPT, GPTConfig
from memlab.core.models import hf

if TYPE_CHECKING:
    from memlab.core.config import Experiment, Profile
    from memlab.core.step import TrainStep

FAMILIES = ("gpt", "hf")


def check(experiment: Experiment, profile: Profile, device: torch.device, world: int) -> None:
    """The family's own refusals (a technique's family support is its own check: memlab.core.techniques)."""
    if experiment.model.family == "hf":
        hf.check(experiment, profile)


def require_family(experiment: Experiment, families: tuple[str, ...], what: str, fix: str) -> None:
    """A technique that only some families support refuses the others in one line, with the fix."""
    family = experiment.model.family
    if family not in families:
        raise ConfigError(f"{what} supports model.family = {' or '.join(families)}, not {family}: {fix}")


def gpt_config(experiment: Experiment, vocab_size: int) -> GPTConfig:
    m = experiment.model
    return GPTConfig(n_layer=m.n_layer, n_head=m.n_head, d_model=m.d_model, d_ff=m.d_ff or 4 * m.d_model,
                     vocab_size=vocab_size, seq_len=m.seq_len, dropout=m.dropout)


def skeleton(experiment: Experiment) -> torch.nn.Module:
    """The experiment's model on the meta device (shapes and module names, no memory): for checks that ask which
    layers the model has (memlab.core.techniques.finetune)."""
    if experiment.model.family == "hf":
        return hf.skeleton(experiment)
    with torch.device("meta"):
        return GPT(gpt_config(experiment, experiment.model.vocab_size or 64), kernel=None)


def shared_skeleton(experiment: Experiment) -> torch.nn.Module:
    """skeleton(), one per model configuration for everything a process asks of it (the predictor's weights, fit's
    trainable counts, whether a compiled step can be traced): seconds each for an 8B model (transformers' modeling
    code). Read only."""
    key = json.dumps(dataclasses.asdict(experiment.model), sort_keys=True)
    if key not in _SKELETONS:
        _SKELETONS.clear()  # one model at a time: a command predicts one experiment's profiles
        _SKELETONS[key] = skeleton(experiment)
    return _SKELETONS[key]


_SKELETONS: dict[str, torch.nn.Module] = {}


def build(step: TrainStep) -> torch.nn.Module:
    """The experiment's model with the step's attention kernel, on the step's device."""
    e = step.experiment
    if e.model.family == "hf":
        return hf.build(e, step.profile, step.kernel, step.device, step.param_dtype, step.on_device)
    cfg = gpt_config(e, step.vocab_size)
    if step.on_device:
        with step.device:
            model = GPT(cfg, step.kernel)
    else:  # made on the CPU then moved: the same initial weights on every device, from the seed
        model = GPT(cfg, step.kernel).to(step.device)
    if step.param_dtype != torch.float32:  # bf16_pure (a no-op .to() would still swap fake tensors: skipped)
        model = model.to(step.param_dtype)
    return model
