"""Attention kernels: each one the CPU can run gives eager's output and gradients; windows match an explicit mask;
flash and flex fall back on the CPU and say so in their name; the flash-attn wrapper speaks FA2's and FA4's
dialects (checked with stand-ins, since flash-attn needs CUDA); what a kernel cannot do is an error at build."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F

from memlab.core.attention import build_attention, kernel_names
from memlab.core.attention.kernel import window_mask
from memlab.core.attention import flash as flash_mod
from memlab.core.attention.flash import FlashAttention, FlashImpl
from memlab.core.attention.flex import FlexAttention, mask_mod_for
from memlab.core.config import AttentionConfig
from memlab.core.errors import ConfigError
from memlab.core.model import GPT, GPTConfig

CPU = torch.device("cpu")
CUDA = torch.device("cuda")  # only named: building these kernels touches no GPU
CFG = GPTConfig(n_layer=2, n_head=2, d_model=32, d_ff=64, vocab_size=96, seq_len=16)


def build(name, window=0, device=CPU, dtype=torch.float32, **kw):
    return build_attention(AttentionConfig(kernel=name, window=window, **kw), device, dtype)


def qkv(B=2, nh=3, T=20, hs=8, seed=0, dtype=torch.float32, grad=False):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, nh, T, hs, generator=g).to(dtype).requires_grad_(grad) for _ in range(3)]


def reference(q, k, v, window):
    """Row by row, the definition: query i sees key j iff j <= i and i - j < window (fp32)."""
    q, k, v = (t.detach().float() for t in (q, k, v))
    T = q.size(-2)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    out = torch.empty_like(q)
    for i in range(T):
        lo = max(0, i - window + 1) if window else 0
        out[..., i : i + 1, :] = torch.softmax(scores[..., i : i + 1, lo : i + 1], dim=-1) @ v[..., lo : i + 1, :]
    return out


def test_every_kernel_is_registered():
    assert kernel_names() == ["eager", "flash", "flex", "sdpa"]


@pytest.mark.parametrize("name", ["sdpa", "flash", "flex"])
@pytest.mark.parametrize("window", [0, 1, 5])
def test_cpu_kernels_match_eager_output_and_gradients(name, window):
    q, k, v = qkv(grad=True)
    out = build(name, window)(q, k, v)
    (gq, gk, gv) = torch.autograd.grad(out.square().sum(), (q, k, v))
    q2, k2, v2 = (t.detach().clone().requires_grad_() for t in (q, k, v))
    ref = build("eager", window)(q2, k2, v2)
    rq, rk, rv = torch.autograd.grad(ref.square().sum(), (q2, k2, v2))
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    for a, b in ((gq, rq), (gk, rk), (gv, rv)):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out, reference(q, k, v, window), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", ["flash", "flex"])
def test_bf16_fallbacks_match_an_fp32_reference_within_bf16_tolerance(name):
    q, k, v = qkv(T=33, dtype=torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = build(name, 0, dtype=torch.bfloat16)(q, k, v)
    ref = reference(q, k, v, 0)
    assert out.dtype == torch.bfloat16
    assert ((out.float() - ref).norm() / ref.norm()).item() < 1e-2


def _expected_flash_reason():
    return "flash-attn not installed" if not any(flash_mod.installed().values()) else "flash-attn needs CUDA"


def test_flash_on_cpu_falls_back_to_sdpa_and_says_so():
    k = build("flash")
    k(*qkv())  # SDPA's `auto` names the backend it picked on its first call
    assert k.name == f"sdpa:flash ({_expected_flash_reason()})"
    kw = build("flash", window=4)
    assert kw.name == f"sdpa:masked ({_expected_flash_reason()})" and kw.window == 4


def test_flash_fallback_on_cpu_trains_with_dropout():
    # CPU's SDPA flash backend has no dropout: SDPA's own choice (math) runs, and the name says which
    k = build("flash")
    q, kk, v = qkv(grad=True)
    k(q, kk, v, dropout_p=0.1).sum().backward()
    assert k.name == f"sdpa:math ({_expected_flash_reason()})"
    assert q.grad is not None


def test_flex_on_cpu_falls_back_to_sdpa_and_says_so():
    k = build("flex")
    k(*qkv())
    assert k.name.endswith("(flex has no CPU backward)") and k.name.startswith("sdpa:")
    assert build("flex", window=3).name == "sdpa:masked (flex has no CPU backward)"


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@pytest.mark.parametrize("window", [0, 5])
def test_flex_block_mask_forward_matches_the_masked_reference(window):
    # The real FlexAttention (uncompiled: forward only on CPU) with memlab's mask function and block mask.
    q, k, v = qkv(T=40)
    kernel = FlexAttention(window, compiled=False)
    torch.testing.assert_close(kernel(q, k, v), reference(q, k, v, window), atol=1e-5, rtol=1e-5)
    assert kernel.name == "flex"
    assert kernel.block_mask(40, CPU) is kernel.block_mask(40, CPU)  # built once per length, then cached
    mm = mask_mod_for(window)
    i, j = torch.arange(40).view(-1, 1), torch.arange(40).view(1, -1)
    assert torch.equal(mm(0, 0, i, j), window_mask(40, window, CPU))


def test_flex_declares_no_dropout_and_sdpa_stands_in_for_it_on_cuda():
    assert FlexAttention(0, compiled=False).supports.dropout is False
    plain = build_attention(AttentionConfig(kernel="flex"), CUDA, torch.bfloat16, dropout=0.1)
    assert plain.name == "sdpa (flex has no dropout)" and plain.supports.dropout
    windowed = build_attention(AttentionConfig(kernel="flex", window=64), CUDA, torch.bfloat16, dropout=0.1)
    assert windowed.name == "sdpa:efficient+mask (flex has no dropout)" and windowed.window == 64
    assert build_attention(AttentionConfig(kernel="flex"), CUDA, torch.bfloat16).name == "flex"  # no dropout: flex itself


# --------------------------------------------------------------------------------------------- flash-attn dialects


def _stand_in(fa4: bool, calls: list):
    """A CPU stand-in for flash_attn_func: takes (B, T, nh, hs) and FA2's or FA4's window spelling."""

    def func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=None):
        calls.append({"shape": tuple(q.shape), "causal": causal, "window_size": window_size, "dropout_p": dropout_p})
        left, right = window_size
        assert right in (0, None, -1)
        if fa4:
            assert left is None or left >= 0
        else:
            assert left is not None and left >= -1
        W = 0 if left in (None, -1) else left + 1
        qh, kh, vh = (t.transpose(1, 2) for t in (q, k, v))  # back to (B, nh, T, hs)
        mask = window_mask(q.size(1), W, q.device)
        out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask).transpose(1, 2)
        return (out, torch.zeros(q.size(0), q.size(2), q.size(1))) if fa4 else out

    return func


@pytest.mark.parametrize("fa4, label", [(True, "flash_attn.cute 4.0.0b36"), (False, "flash_attn 2.7.4")])
@pytest.mark.parametrize("window", [0, 1, 6])
def test_flash_attn_wrapper_speaks_each_dialect(fa4, label, window):
    calls = []
    kernel = FlashAttention(FlashImpl(_stand_in(fa4, calls), label, fa4=fa4), window)
    q, k, v = qkv(B=2, nh=3, T=20, hs=8)
    torch.testing.assert_close(kernel(q, k, v), reference(q, k, v, window), atol=1e-5, rtol=1e-5)
    assert kernel.name == label and kernel.window == window
    (call,) = calls
    assert call["shape"] == (2, 20, 3, 8)  # (B, T, nh, hs)
    assert call["causal"] is True
    none = (None, None) if fa4 else (-1, -1)
    assert call["window_size"] == ((window - 1, 0) if window else none)


def test_fa4_has_no_dropout_but_fa2_does():
    calls = []
    fa4 = FlashAttention(FlashImpl(_stand_in(True, calls), "flash_attn.cute 4.0.0b36", fa4=True), 0)
    assert fa4.supports.dropout is False
    fa2 = FlashAttention(FlashImpl(_stand_in(False, calls), "flash_attn 2.7.4", fa4=False), 0)
    assert fa2.supports.dropout is True
    fa2(*qkv(), dropout_p=0.1)
    assert calls[-1]["dropout_p"] == 0.1


def _only_fa4(monkeypatch, fa2: bool = False):
    """A Hopper GPU with FA4 installed (and FA2 when `fa2`), stand-ins for both."""
    monkeypatch.setattr(flash_mod, "installed", lambda: {"fa4": "4.0.0b36", "fa2": "2.7.4" if fa2 else None})
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(flash_mod, "_import_fa4", lambda: FlashImpl(_stand_in(True, []), "flash_attn.cute 4.0.0b36", fa4=True))
    monkeypatch.setattr(flash_mod, "_import_fa2", lambda: FlashImpl(_stand_in(False, []), "flash_attn 2.7.4", fa4=False))


def test_dropout_under_flash_falls_back_to_a_kernel_that_has_it(monkeypatch):
    """The seeds' own configuration (dropout 0.1, flash, Hopper): FA4 has none, so FA2, else SDPA, named and why."""
    _only_fa4(monkeypatch)
    flash = AttentionConfig(kernel="flash")
    assert build_attention(flash, CUDA, torch.bfloat16).name == "flash_attn.cute 4.0.0b36"  # no dropout: FA4
    k = build_attention(flash, CUDA, torch.bfloat16, dropout=0.1)
    assert k.name == "sdpa:flash (flash_attn.cute has no dropout)" and k.supports.dropout
    k = build_attention(AttentionConfig(kernel="flash", window=64), CUDA, torch.bfloat16, dropout=0.1)
    assert k.name == "sdpa:efficient+mask (flash_attn.cute has no dropout)" and k.window == 64 and k.supports.dropout
    _only_fa4(monkeypatch, fa2=True)
    k = build_attention(AttentionConfig(kernel="flash", window=64), CUDA, torch.bfloat16, dropout=0.1)
    assert k.name == "flash_attn 2.7.4" and k.window == 64  # FA2 has dropout and windows


def test_a_builder_that_ignores_the_request_is_caught_before_any_step(monkeypatch):
    from memlab.core.attention import eager

    monkeypatch.setattr(eager, "SUPPORTS", dataclasses.replace(eager.SUPPORTS, dropout=False))
    monkeypatch.setattr(eager.EagerAttention, "supports", eager.SUPPORTS)
    with pytest.raises(ConfigError, match="cannot do dropout"):
        build_attention(AttentionConfig(kernel="eager"), CPU, torch.float32, dropout=0.1)


@pytest.mark.parametrize(
    "have, capability, expected",
    [
        ({"fa4": "4.0.0b36", "fa2": "2.7.4"}, (9, 0), "flash_attn.cute 4.0.0b36"),  # Hopper: FA4 preferred
        ({"fa4": "4.0.0b36", "fa2": "2.7.4"}, (8, 0), "flash_attn 2.7.4"),  # Ampere: FA4 cannot run
        ({"fa4": None, "fa2": "2.7.4"}, (9, 0), "flash_attn 2.7.4"),
        ({"fa4": "4.0.0b36", "fa2": None}, (8, 6), None),
        ({"fa4": None, "fa2": None}, (9, 0), None),
    ],
)
def test_flash_attn_choice_by_gpu(monkeypatch, have, capability, expected):
    monkeypatch.setattr(flash_mod, "installed", lambda: have)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(flash_mod, "_import_fa4", lambda: FlashImpl(_stand_in(True, []), "flash_attn.cute 4.0.0b36", fa4=True))
    monkeypatch.setattr(flash_mod, "_import_fa2", lambda: FlashImpl(_stand_in(False, []), "flash_attn 2.7.4", fa4=False))
    impl, reason = flash_mod.find_impl(CUDA)
    if expected is None:
        assert impl is None and reason
        kernel = build("flash", device=CUDA, dtype=torch.bfloat16)
        assert kernel.name == f"sdpa:flash ({reason})"
    else:
        assert impl.label == expected and reason == ""


def test_flash_on_cuda_refuses_fp32_and_windows_without_flash_attn(monkeypatch):
    monkeypatch.setattr(flash_mod, "installed", lambda: {"fa4": None, "fa2": None})
    with pytest.raises(ConfigError, match="precision.dtype = bf16 or fp16"):
        build("flash", device=CUDA, dtype=torch.float32)
    with pytest.raises(ConfigError, match="attention.kernel = flex"):
        build("flash", window=128, device=CUDA, dtype=torch.bfloat16)
    assert build("flash", device=CUDA, dtype=torch.bfloat16).name == "sdpa:flash (flash-attn not installed)"
    assert build("flex", window=128, device=CUDA, dtype=torch.bfloat16).name == "flex"


# --------------------------------------------------------------------------------------------- in the model


def _loss_and_grads(kernel, x, y):
    torch.manual_seed(0)
    m = GPT(CFG, kernel)
    loss = m(x, y)
    loss.backward()
    return loss.detach(), {n: p.grad for n, p in m.named_parameters()}


@pytest.mark.parametrize("name", ["flash", "flex"])
@pytest.mark.parametrize("window", [0, 4])
def test_fallback_kernels_train_like_eager(name, window):
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, CFG.vocab_size, (3, CFG.seq_len), generator=g)
    y = torch.roll(x, -1, dims=1)
    loss, grads = _loss_and_grads(build(name, window), x, y)
    ref_loss, ref_grads = _loss_and_grads(build("eager", window), x, y)
    torch.testing.assert_close(loss, ref_loss, atol=1e-6, rtol=1e-5)
    for n, gr in grads.items():
        torch.testing.assert_close(gr, ref_grads[n], atol=1e-6, rtol=1e-4, msg=n)
