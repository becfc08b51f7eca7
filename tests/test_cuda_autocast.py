"""The predictor's fake step runs on a CPU but predicts a GPU's step: autocast must keep in fp32 what CUDA's autocast
keeps in fp32 (memlab.core.predict.cuda_autocast), and the compiled-graph reader must pad what Inductor may pad on a
GPU (inductor._padding_as_on_cuda). Both were found on transformers' GPT-2, held out on an H200
(bench/results/heldout-arch-h200/NOTE.md)."""

from __future__ import annotations

import contextlib
from unittest import mock

import torch

from memlab.core.config import apply_overrides, load_experiment, load_profile
from memlab.core.predict import fake
from memlab.core.predict import inductor
from memlab.core.predict.analytic import vocab_for
from memlab.core.predict.cuda_autocast import cuda_policy


def _under_cpu_autocast(x: torch.Tensor) -> dict[str, torch.dtype]:
    with torch.autocast("cpu", dtype=torch.bfloat16):
        h = x @ x
        outs = {"pow": torch.pow(h, 3.0), "exp": h.exp(), "layer_norm": torch.nn.functional.layer_norm(h, (4,)),
                "softmax": torch.softmax(h, -1), "log_softmax": torch.nn.functional.log_softmax(h, dim=-1),
                "sum": h.sum(), "tanh": torch.tanh(h), "asked bf16": torch.softmax(h, -1, dtype=torch.bfloat16)}
    return {name: t.dtype for name, t in outs.items()}


def test_cuda_policy_runs_cudas_fp32_ops_in_fp32_and_leaves_when_it_ends():
    x = torch.randn(4, 4)
    assert set(_under_cpu_autocast(x).values()) == {torch.bfloat16}  # the CPU's own lists
    with cuda_policy():
        inside = _under_cpu_autocast(x)
    fp32 = {"pow", "exp", "layer_norm", "softmax", "log_softmax", "sum"}
    assert {n for n, d in inside.items() if d == torch.float32} == fp32  # tanh is in no list; a dtype asked for stands
    assert set(_under_cpu_autocast(x).values()) == {torch.bfloat16}  # the registrations went with the context


def test_the_fake_step_keeps_gpt2s_gelu_intermediates_in_fp32_as_the_gpu_did():
    """GPT-2's tanh GELU is built from pow, tanh and products: on CUDA pow runs in fp32 and so does everything after
    it, so each block keeps 6 bytes a hidden element more than the CPU's autocast would (the H200's peaks were
    14-22% over the prediction without the policy)."""
    e, p = load_experiment("llama-tiny"), load_profile("bf16")
    apply_overrides(e, p, ["model.source=gpt2", "model.n_layer=2", "model.seq_len=64", "model.d_model=96", "model.d_ff=384"])
    vocab, b = vocab_for(e)[0], 4
    as_on_cuda = fake.fake_estimate(e, p, vocab_size=vocab, micro_batch=b).components["activations"]
    with mock.patch.object(fake, "cuda_policy", contextlib.nullcontext):
        as_on_cpu = fake.fake_estimate(e, p, vocab_size=vocab, micro_batch=b).components["activations"]
    assert as_on_cuda - as_on_cpu == 6 * e.model.d_ff * b * e.model.seq_len * e.model.n_layer


def test_the_reader_pads_a_matmul_inductor_could_pad_on_a_gpu():
    """An unaligned dimension (GPT-2's 50,257-token head): the GPU's benchmark decides, the CPU cannot ask it, so the
    reader takes the padded, larger outcome; an aligned matmul has nothing to pad either way."""
    from torch._inductor.fx_passes import pad_mm

    hidden = torch.empty(64, 768, dtype=torch.bfloat16)
    head, head_of_50304 = (torch.empty(768, v, dtype=torch.bfloat16) for v in (50257, 50304))
    with inductor._padding_as_on_cuda():
        assert pad_mm.should_pad(None, hidden, head, torch.ops.aten.mm)
        assert not pad_mm.should_pad(None, hidden, head_of_50304, torch.ops.aten.mm)
    assert not pad_mm.should_pad(None, hidden, head, torch.ops.aten.mm)  # CPU tensors, outside: never padded
