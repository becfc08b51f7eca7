"""kernels.liger (the `liger` profile): Liger Kernel's patches of a transformers model, behind the technique door."""

from __future__ import annotations

import pytest
import torch

from memlab.core.config import load_experiment, load_profile
from memlab.core.engine import train
from memlab.core.errors import ConfigError, DeviceError
from memlab.core.events import ListSink
from memlab.core.predict.prediction import predict
from memlab.core.techniques import build_step
from memlab.core.techniques import check_plan, liger_patches

pytest.importorskip("transformers")

CPU = torch.device("cpu")


def test_liger_is_refused_on_memlabs_gpt_with_the_family_named():
    with pytest.raises(ConfigError, match=r"kernels.liger supports model.family = hf, not gpt: set kernels.liger = false"):
        check_plan(load_experiment("tiny"), load_profile("liger"))


def test_liger_on_the_cpu_is_refused_before_any_step():
    e, sink = load_experiment("llama-tiny"), ListSink()
    with pytest.raises(DeviceError, match="kernels.liger runs Liger Kernel's Triton kernels and needs CUDA"):
        train(e, load_profile("liger"), sink, device=CPU)
    assert not sink.of("step")


def test_the_predictor_traces_liger_as_the_unpatched_model():
    """Liger's kernels save less than the eager ops they replace: the fake step runs without them (an upper bound),
    so the liger profile predicts what liger_ce (the same head, no model patches) predicts."""
    e = load_experiment("llama-tiny")
    with_patches, without = predict(e, load_profile("liger"), 2), predict(e, load_profile("liger_ce"), 2)
    assert with_patches.allocated_bytes == without.allocated_bytes > 0
    assert with_patches.components == without.components


def test_apply_puts_ligers_kernels_in_the_models_norms_and_mlps(monkeypatch):
    """The wiring, on the CPU (Liger's Triton kernels themselves need CUDA: they run in bench/ on a GPU)."""
    liger = pytest.importorskip("liger_kernel.transformers")
    from transformers.models.llama import modeling_llama

    for name, value in list(vars(modeling_llama).items()):  # Liger patches the module for the process: put it back
        monkeypatch.setattr(modeling_llama, name, value)
    e, p = load_experiment("llama-tiny"), load_profile("bf16")
    step = build_step(e, p, CPU, 512)
    p.kernels.liger = True
    liger_patches.apply(step)
    block = step.model.blocks[0]
    assert block.input_layernorm.forward.__func__ is liger.LigerRMSNorm.forward
    assert block.mlp.forward.__func__ is liger.LigerSwiGLUMLP.forward
    assert modeling_llama.apply_rotary_pos_emb is liger.liger_rotary_pos_emb
    assert step.applied["kernels"].startswith("liger ") and "rms_norm" in step.applied["kernels"]


def test_an_architecture_liger_has_no_patches_for_is_refused_naming_the_ones_it_has():
    pytest.importorskip("liger_kernel")
    with pytest.raises(ConfigError, match=r"no patches for model_type 'gpt2'; it has: .*llama.*qwen2"):
        liger_patches.patch_function("gpt2")
