"""kernels.float8 (memlab.core.techniques.float8): refused before any work where it cannot run (CPU, GPUs below
compute capability 8.9, no torchao, with kernels.fused, shapes float8 cannot multiply); the module swap and what it
leaves alone (torchao, when installed); the estimate (compiled, the norm and GELU outputs are recomputed, not saved)."""

from __future__ import annotations

import sys

import pytest
import torch

from memlab.core.config import Experiment, Profile, load_experiment, load_profile
from memlab.core.errors import ConfigError, DeviceError
from memlab.core.predict.analytic import estimate
from memlab.core.requirements import cuda_only
from memlab.core.techniques import check_plan, check_techniques, float8

CPU, CUDA = torch.device("cpu"), torch.device("cuda")


def _float8_profile() -> Profile:
    p = Profile()
    p.precision.dtype = "bf16"
    p.kernels.float8 = True
    return p


def _fake_gpu(monkeypatch, capability, name="NVIDIA H100 80GB HBM3"):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)


def test_the_cpu_backend_refuses_float8_naming_the_gpu_it_needs():
    with pytest.raises(DeviceError, match=r"an H100 or Ada GPU, compute capability 8\.9\+") as info:
        check_techniques(load_experiment("tiny"), _float8_profile(), CPU)
    assert "\n" not in str(info.value)
    assert cuda_only(load_profile("float8"))  # `memlab profiles` marks it: derived from the check


def test_a_gpu_without_float8_tensor_cores_is_refused_naming_it(monkeypatch):
    _fake_gpu(monkeypatch, (8, 0), "NVIDIA A100-SXM4-80GB")
    with pytest.raises(DeviceError, match="this NVIDIA A100-SXM4-80GB is 8.0: set kernels.float8 = false"):
        float8.check(load_experiment("tiny"), _float8_profile(), CUDA, 1)


def test_without_torchao_the_message_names_the_extra(monkeypatch):
    _fake_gpu(monkeypatch, (9, 0))
    monkeypatch.setitem(sys.modules, "torchao", None)  # import fails as if not installed
    monkeypatch.setitem(sys.modules, "torchao.float8", None)
    with pytest.raises(ConfigError, match=r"pip install 'memlab\[torchao\]'"):
        float8.check(load_experiment("tiny"), _float8_profile(), CUDA, 1)


def test_an_ada_or_hopper_gpu_with_torchao_passes_the_check(monkeypatch):
    pytest.importorskip("torchao.float8", reason="torchao not installed (the memlab[torchao] extra)")
    _fake_gpu(monkeypatch, (8, 9), "NVIDIA L40S")
    float8.check(load_experiment("tiny"), _float8_profile(), CUDA, 1)


@pytest.mark.parametrize("change, words", [
    (lambda e, p: setattr(p.kernels, "fused", True), "choose one of kernels.fused, kernels.float8"),
    (lambda e, p: setattr(e.model, "d_ff", 200), "model.d_ff (200) to be multiples of 16"),
])
def test_what_float8_cannot_run_is_refused_from_the_configuration_alone(change, words):
    e, p = load_experiment("tiny"), _float8_profile()
    change(e, p)
    with pytest.raises(ConfigError, match=words.replace("(", r"\(").replace(")", r"\)")):
        check_plan(e, p)


def test_the_cli_refuses_float8_on_the_cpu_in_one_line_with_exit_2(tmp_path, capsys):
    from memlab.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["run", "--profile", "float8", "--experiment", "tiny", "--device", "cpu", "--runs-dir", str(tmp_path)])
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert exit_.value.code == 2 and len(lines) == 1 and "kernels.float8 needs CUDA" in lines[0], lines
    assert not any(tmp_path.iterdir())


def test_the_filter_keeps_the_lm_head_and_odd_shapes_in_high_precision():
    assert float8.converts(torch.nn.Linear(64, 192), "blocks.0.attn.qkv")
    assert not float8.converts(torch.nn.Linear(64, 192), "lm_head")
    assert not float8.converts(torch.nn.Linear(64, 24), "blocks.0.mlp.fc")
    assert not float8.converts(torch.nn.Linear(20, 64), "blocks.0.mlp.proj")


def test_apply_swaps_the_block_linears_and_says_so():
    torchao = pytest.importorskip("torchao.float8", reason="torchao not installed (the memlab[torchao] extra)")
    del torchao
    from torchao.float8.float8_linear import Float8Linear

    from memlab.core.step import TrainStep

    e = load_experiment("tiny")
    step = TrainStep(e, _float8_profile(), CPU, vocab_size=128, kernel=_sdpa())
    step.build_model()
    weight = step.model.blocks[0].attn.qkv.weight
    step.applied["kernels"] = "off"
    float8.apply(step)
    swapped = [n for n, m in step.model.named_modules() if isinstance(m, Float8Linear)]
    assert len(swapped) == 4 * e.model.n_layer  # qkv, attn proj, fc, mlp proj in every block
    assert type(step.model.lm_head) is torch.nn.Linear and step.model.lm_head.weight is step.model.wte.weight
    assert step.model.blocks[0].attn.qkv.weight is weight and weight.dtype == torch.float32  # fp32 masters kept
    assert step.applied["kernels"].startswith("float8 (torchao ") and step.applied["kernels"].endswith(f", tensorwise, {len(swapped)} Linear)")


def _sdpa():
    from memlab.core.attention import build_attention
    from memlab.core.config import AttentionConfig

    return build_attention(AttentionConfig(kernel="sdpa"), CPU, torch.bfloat16)


def test_the_compiled_estimate_drops_the_norm_and_gelu_outputs_and_the_weight_copies():
    """As listed on the H100 (bench/results/frontier-h100/a2/saved_tensors.txt): per block, compiled float8 keeps
    neither LayerNorm output (2 x e BTC), only the fc output of fc and GELU (e BTF less), and no bf16 weight copies."""
    e: Experiment = load_experiment("gpt2s")
    m = e.model
    for b in (16, 32):  # micro-batches whose peak is the loss, with every block's activations alive
        base = estimate(e, load_profile("compile"), vocab_size=8192, micro_batch=b)
        f8 = estimate(e, load_profile("float8"), vocab_size=8192, micro_batch=b)
        BT, C, F = b * m.seq_len, m.d_model, 4 * m.d_model
        per_block = 2 * (2 * BT * C) + 2 * BT * F + 2 * (4 * C * C + 2 * C * F)
        assert base.components["activations"] - f8.components["activations"] == m.n_layer * per_block
        assert any("recomputed in backward" in n for n in f8.notes)
