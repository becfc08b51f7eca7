"""memlab::flash_packed, FA4 over the packed qkv projection: on the CPU its reference gives SDPA's output and
gradients (windows too) and compiles without a graph break; its CUDA path hands FA4 views of one packed gradient to
write dq, dk and dv into (checked with a stand-in for flash_attn.cute, which needs a GPU); a model whose kernel is
FA4 hands it the projection whole; `fastest` stands in with cuDNN where FA4 cannot run."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from torch.utils.checkpoint import CheckpointPolicy

from memlab.core.attention import build_attention
from memlab.core.attention.kernel import window_mask
from memlab.core.attention import flash as flash_mod
from memlab.core.attention import flash_packed as fp
from memlab.core.attention.flash import FlashAttention, FlashImpl
from memlab.core.config import AttentionConfig, load_profile
from memlab.core.model import GPT, GPTConfig

CUDA = torch.device("cuda")  # only named: building these kernels touches no GPU
B, T, NH, HS = 2, 20, 3, 8


def packed(seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(B, T, 3 * NH * HS, generator=g, dtype=dtype).requires_grad_(True)


def sdpa_reference(qkv, window):
    """The same attention through SDPA on split views, autograd concatenating the gradient."""
    q, k, v = (t.transpose(1, 2) for t in fp.split_heads(qkv, NH))
    y = F.scaled_dot_product_attention(q, k, v, attn_mask=window_mask(T, window, qkv.device))
    return y.transpose(1, 2).reshape(B, T, NH * HS)


@pytest.mark.parametrize("window", [0, 1, 6])
def test_the_packed_op_gives_sdpas_output_and_gradient(window):
    x, ref = packed(), packed()
    dy = torch.randn(B, T, NH * HS, dtype=torch.float64)
    y = fp.attend_packed(x, NH, window)
    y.backward(dy)
    y_ref = sdpa_reference(ref, window)
    y_ref.backward(dy)
    torch.testing.assert_close(y, y_ref)
    torch.testing.assert_close(x.grad, ref.grad, atol=1e-5, rtol=1e-5)  # the reference's backward runs in fp32


def test_the_packed_op_compiles_whole_forward_and_backward():
    """A custom op, not FA4's own autograd function: Dynamo keeps it in the graph (fullgraph fails on a break)."""

    def loss(x):
        return fp.attend_packed(x, NH, 4).square().sum()

    x, y = packed(dtype=torch.float32), packed(dtype=torch.float32)
    compiled = torch.compile(loss, fullgraph=True, backend="aot_eager")
    compiled(x).backward()
    loss(y).backward()
    torch.testing.assert_close(x.grad, y.grad)
    torch.library.opcheck(fp.flash_packed, (packed(dtype=torch.float32), NH, 0))


def _fa4_stand_in(calls: list):
    """flash_attn.cute.interface's two entry points on the CPU, with FA4's contract: the forward fills `out` and
    `lse`, the backward fills the dq, dk, dv it is given."""

    def fwd(q, k, v, causal, window_size_left, window_size_right, return_lse, out, lse):
        calls.append(("fwd", window_size_left, window_size_right, causal, return_lse))
        W = 0 if window_size_left is None else window_size_left + 1
        o, s = fp._reference_attention(q, k, v, W)
        out.copy_(o)
        lse.copy_(s)

    def bwd(q, k, v, out, dout, lse, causal, window_size_left, window_size_right, dq, dk, dv):
        calls.append(("bwd", window_size_left, window_size_right, causal, (dq, dk, dv)))
        W = 0 if window_size_left is None else window_size_left + 1
        qkv = torch.cat([t.reshape(B, T, -1) for t in (q, k, v)], dim=2)
        grad = fp._reference_backward(qkv, out, dout, lse, NH, W)
        for dst, src in zip((dq, dk, dv), fp.split_heads(grad, NH)):
            dst.copy_(src)

    return SimpleNamespace(_flash_attn_fwd=fwd, _flash_attn_bwd=bwd)


@pytest.mark.parametrize("window", [0, 6])
def test_the_cuda_path_has_fa4_write_dq_dk_dv_into_one_packed_gradient(monkeypatch, window):
    calls = []
    monkeypatch.setattr(fp, "_fa4", lambda: _fa4_stand_in(calls))
    x = packed(dtype=torch.float32).detach()
    out, lse = fp._forward_fa4(x, NH, window)
    dout = torch.randn_like(out)
    grad = fp._backward_fa4(x, out, dout, lse, NH, window)

    want_out, want_lse = fp.flash_packed(x, NH, window)  # the CPU reference
    torch.testing.assert_close(out, want_out)
    torch.testing.assert_close(lse, want_lse)
    torch.testing.assert_close(grad, fp.flash_packed_backward(x, out, dout, lse, NH, window))
    fwd, bwd = calls
    assert fwd[1:] == ((window - 1, 0) if window else (None, None)) + (True, True)
    assert bwd[1:4] == fwd[1:4]
    dq, dk, dv = bwd[4]
    # views of the returned gradient, side by side in its last dimension: nothing left to concatenate
    assert [t.data_ptr() for t in (dq, dk, dv)] == [grad.data_ptr() + i * NH * HS * grad.element_size() for i in range(3)]
    assert dq.shape == (B, T, NH, HS) and dq.stride() == grad.view(B, T, 3 * NH, HS).stride()


def test_a_model_whose_kernel_is_fa4_hands_it_the_projection_whole():
    cfg = GPTConfig(n_layer=2, n_head=2, d_model=32, d_ff=64, vocab_size=96, seq_len=16)
    unpacked_calls = []

    def flash_attn_func(*a, **k):  # FA4's own autograd function: the model must not reach it
        unpacked_calls.append(a)
        raise AssertionError("the model called FA4 on split q, k, v")

    fa4 = FlashAttention(FlashImpl(flash_attn_func, "flash_attn.cute 4.0.0b36", fa4=True), 0)
    assert fa4.packed is not None
    fa2 = FlashAttention(FlashImpl(flash_attn_func, "flash_attn 2.7.4", fa4=False), 0)
    assert fa2.packed is None  # FA2 takes q, k, v apart, as before
    torch.manual_seed(0)
    model = GPT(cfg, fa4)
    sdpa = build_attention(AttentionConfig(kernel="sdpa", sdpa_backend="math"), torch.device("cpu"), torch.float32)
    twin = GPT(cfg, sdpa)
    twin.load_state_dict(model.state_dict())
    idx = torch.randint(0, 96, (2, 16), generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(model(idx, idx), twin(idx, idx))
    torch.testing.assert_close(model(idx), twin(idx))
    assert not unpacked_calls


def _no_flash_attn(monkeypatch, fa4: bool):
    monkeypatch.setattr(flash_mod, "installed", lambda: {"fa4": "4.0.0b36" if fa4 else None, "fa2": None})
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(flash_mod, "_import_fa4", lambda: FlashImpl(lambda *a, **k: None, "flash_attn.cute 4.0.0b36", fa4=True))


def test_flash_stands_in_with_the_sdpa_backend_the_profile_names(monkeypatch):
    _no_flash_attn(monkeypatch, fa4=False)
    assert build_attention(AttentionConfig(kernel="flash"), CUDA, torch.bfloat16).name == "sdpa:flash (flash-attn not installed)"
    cudnn = AttentionConfig(kernel="flash", sdpa_backend="cudnn")
    assert build_attention(cudnn, CUDA, torch.bfloat16).name == "sdpa:cudnn (flash-attn not installed)"
    _no_flash_attn(monkeypatch, fa4=True)
    assert build_attention(cudnn, CUDA, torch.bfloat16).name == "flash_attn.cute 4.0.0b36"
    assert build_attention(cudnn, CUDA, torch.bfloat16, dropout=0.1).name == "sdpa:cudnn (flash_attn.cute has no dropout)"


def test_fastest_runs_fa4_and_cudnn_where_fa4_cannot(monkeypatch):
    """The seeds' dropout keeps `fastest` on cuDNN, what it ran before FA4 joined it."""
    attention = load_profile("fastest").attention
    _no_flash_attn(monkeypatch, fa4=True)
    assert build_attention(attention, CUDA, torch.bfloat16).name == "flash_attn.cute 4.0.0b36"
    assert build_attention(attention, CUDA, torch.bfloat16, dropout=0.1).name == "sdpa:cudnn (flash_attn.cute has no dropout)"


def test_selective_checkpointing_keeps_the_packed_attention():
    from memlab.core.techniques.checkpointing import ops_policy

    assert ops_policy(None, torch.ops.memlab.flash_packed.default) == CheckpointPolicy.MUST_SAVE
