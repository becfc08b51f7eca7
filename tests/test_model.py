"""The model and its pieces: attention kernels agree, checkpointing and chunked loss change nothing but memory,
accumulation equals a bigger batch, FLOPs and MFU follow their definitions."""

from __future__ import annotations

import pytest
import torch

from model_helpers import CFG, CPU, assert_same_loss_and_grads, batch, grads, kernel, make_model

from memlab.core.attention import build_attention
from memlab.core.attention.kernel import window_mask
from memlab.core.config import AttentionConfig, CheckpointingConfig
from memlab.core.flops import flops_per_token, mfu, peak_flops, window_fraction
from memlab.core.loss import loss_from_hidden
from memlab.core.techniques.checkpointing import apply_checkpointing

def test_shapes_and_tied_embeddings():
    m = make_model()
    x, _ = batch()
    assert m(x).shape == (3, CFG.seq_len, CFG.vocab_size)
    assert m.lm_head.weight is m.wte.weight
    # counted once: embeddings V*C + positions T*C + per block (4C^2+4C qkv/proj + 2*C*F + F + C mlp + 4C ln) + final ln 2C
    C, F, V, T, L = CFG.d_model, CFG.d_ff, CFG.vocab_size, CFG.seq_len, CFG.n_layer
    per_block = (3 * C * C + 3 * C) + (C * C + C) + (C * F + F) + (F * C + C) + 4 * C
    assert m.num_params() == V * C + T * C + L * per_block + 2 * C


def test_causality_future_tokens_do_not_change_the_past():
    m = make_model().eval()
    x, _ = batch()
    y = x.clone()
    y[:, -1] = (y[:, -1] + 1) % CFG.vocab_size
    torch.testing.assert_close(m(x)[:, :-1], m(y)[:, :-1])


@pytest.mark.parametrize("window", [0, 1, 5])
def test_sdpa_matches_eager(window):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 20, 8, generator=g) for _ in range(3))
    torch.testing.assert_close(kernel("sdpa", window)(q, k, v), kernel("eager", window)(q, k, v), atol=1e-5, rtol=1e-5)


def test_window_matches_an_explicit_masked_reference():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 12, 4, generator=g) for _ in range(3))
    W = 3
    scores = (q @ k.transpose(-2, -1)) / 2.0
    ref = torch.empty_like(q)
    for i in range(12):  # row by row, the definition: key j visible iff i - W < j <= i
        lo = max(0, i - W + 1)
        ref[..., i : i + 1, :] = torch.softmax(scores[..., i : i + 1, lo : i + 1], dim=-1) @ v[..., lo : i + 1, :]
    torch.testing.assert_close(kernel("sdpa", W)(q, k, v), ref, atol=1e-5, rtol=1e-5)
    assert kernel("sdpa", W).name == "sdpa:masked"
    assert window_mask(4, 2, CPU).tolist() == [[1, 0, 0, 0], [1, 1, 0, 0], [0, 1, 1, 0], [0, 0, 1, 1]]


def test_cpu_sdpa_backends_needing_cuda_are_refused():
    from memlab.core.errors import DeviceError

    with pytest.raises(DeviceError, match="needs CUDA"):
        build_attention(AttentionConfig(kernel="sdpa", sdpa_backend="cudnn"), CPU, torch.float32)


@pytest.mark.parametrize("mode, extra", [("full", {}), ("every_n", {"every": 2}), ("selective", {"target": "attention"}), ("selective", {"target": "mlp"})])
def test_checkpointing_gives_the_same_loss_and_gradients(mode, extra):
    ref, ck = make_model(), make_model()
    desc = apply_checkpointing(ck, CheckpointingConfig(mode=mode, **extra))
    assert desc.startswith(mode)
    assert_same_loss_and_grads(ref, ck)


def test_chunked_cross_entropy_equals_full():
    g = torch.Generator().manual_seed(0)
    h = torch.randn(2, 10, 8, generator=g, requires_grad=True)
    w = torch.randn(50, 8, generator=g, requires_grad=True)
    t = torch.randint(0, 50, (2, 10), generator=g)
    full = loss_from_hidden(h, w, t, 0)
    gh, gw = torch.autograd.grad(full, (h, w))
    chunked = loss_from_hidden(h, w, t, 7)  # 20 rows in chunks of 7, 7, 6
    ch, cw = torch.autograd.grad(chunked, (h, w))
    torch.testing.assert_close(full, chunked)
    torch.testing.assert_close(gh, ch)
    torch.testing.assert_close(gw, cw)


def test_accumulating_k_micro_batches_equals_one_batch_k_times_larger():
    big, acc = make_model(), make_model()
    x, y = batch(B=4)
    big(x, y).backward()
    for xs, ys in zip(x.chunk(2), y.chunk(2)):
        (acc(xs, ys) / 2).backward()
    for (n, a), b in zip(grads(big).items(), grads(acc).values()):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5, msg=n)


def test_flops_per_token_follows_6n_plus_attention():
    assert flops_per_token(1000, 2, 8, 16) == 6 * 1000 + 12 * 2 * 8 * 16
    assert window_fraction(16, 0) == 1.0
    # T=4, W=2: queries see 1, 2, 2, 2 keys = 7 of the causal triangle's 10 pairs
    assert window_fraction(4, 2) == pytest.approx(0.7)
    assert flops_per_token(0, 1, 1, 4, window=2) == pytest.approx(12 * 4 * 0.7)


def test_mfu_uses_the_peak_for_the_compute_dtype_and_null_when_unknown():
    name = "NVIDIA H100 80GB HBM3"
    assert peak_flops(name, "bf16") == pytest.approx(989.4e12)
    assert peak_flops(name, "tf32") == pytest.approx(494.7e12)
    assert peak_flops(name, "fp32") == pytest.approx(67e12)
    assert peak_flops("NVIDIA H100 PCIe", "bf16") == pytest.approx(756e12)
    assert peak_flops("Some Future GPU", "bf16") is None
    assert mfu(1e5, 1e9, "Some Future GPU", "bf16") is None
    assert mfu(1e5, 1e9, name, "bf16") == pytest.approx(1e14 / 989.4e12)
    assert mfu(1e5, 1e9, name, "bf16", n_gpus=2) == pytest.approx(1e14 / (2 * 989.4e12))
