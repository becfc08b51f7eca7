"""The estimator's long-context attention terms (issue 17), each against the real training step measured on fake
tensors (memlab.core.predict.fake.fake_estimate) on a small shape of its own: 2 x 128, 2 heads, T 1024, batch 1, so
the (T, T) tensors dominate the peak.

The CUDA cases run on the CPU with the CUDA kernels' own allocations emulated, each a documented fact of ATen:
- fused dropout (`native_dropout`, what F.dropout runs on CUDA) keeps a 1-byte boolean mask, not the CPU's fp32 noise;
- softmax's CUDA backward (SoftMax.cu, softmax_backward_cuda_out) makes `tmp = grad * output` beside grad_input,
  which the meta kernels behind fake tensors do not allocate;
- a window with dropout runs SDPA's efficient backend with an explicit mask (memlab.core.attention.sdpa): the
  boolean mask turned additive in q's dtype (convert_boolean_attn_mask), saved by the efficient kernel's autograd.
Everything else (what autograd saves, when it frees it) is the real step's.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from memlab.core.predict import analytic as E
from memlab.core.config import Experiment, ModelConfig, load_profile

MIB = 2**20


def long_small(dropout: float = 0.1, vocab: int = 512) -> Experiment:
    e = Experiment(name="long-small", model=ModelConfig(n_layer=2, n_head=2, d_model=128, seq_len=1024, vocab_size=vocab, dropout=dropout))
    e.train.batch_size = 1
    return e


class _CudaSoftmaxBackward(TorchDispatchMode):
    """CUDA's softmax backward: a (T, T) `grad * output` temporary alive beside grad_input."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func is torch.ops.aten._softmax_backward_data.default:
            tmp = args[0] * args[1]
            del tmp
        return out


def _fused_dropout(input, p=0.5, training=True, inplace=False):
    return torch.native_dropout(input, p, training)[0] if training and p > 0 else input


@pytest.fixture
def cuda_kernels(monkeypatch):
    """The training step with CUDA's dropout and softmax backward (see the module's docstring)."""
    import memlab.core.techniques as techniques

    build = techniques.build_step

    def build_step(*args, **kwargs):
        step = build(*args, **kwargs)
        run = step.run

        def run_emulated(*a, **k):  # entered inside MemTracker: the temporary is tracked
            with _CudaSoftmaxBackward():
                return run(*a, **k)

        step.run = run_emulated
        return step

    monkeypatch.setattr(techniques, "build_step", build_step)
    monkeypatch.setattr(F, "dropout", _fused_dropout)


def _fake_vs_analytic(e: Experiment, profile, device: str) -> tuple[int, int]:
    from memlab.core.predict.fake import fake_estimate

    V = e.model.vocab_size
    measured = fake_estimate(e, profile, vocab_size=V).total_bytes
    est = E.estimate(e, profile, vocab_size=V, device=device)
    # Fake tensors have no library workspace; and the kernel's cached boolean (T, T) mask, made in the warm-up step
    # before MemTracker starts, is not counted by it (it is on a GPU: _model_saved counts it).
    cached = e.model.seq_len**2 if E._resolve_step(e, profile, V, None, 1, device).mask else 0
    return measured, est.total_bytes - est.components["workspace"] - cached


@pytest.mark.parametrize("name", ["baseline", "gradcp"])
def test_fp32_eager_dropout_backward_on_cuda_kernels(cuda_kernels, name):
    """fp32 eager attention with dropout: the block backward's peak is softmax's backward (7 bHT^2 beyond the saves)."""
    e, p = long_small(), load_profile(name)
    measured, predicted = _fake_vs_analytic(e, p, "cuda")
    assert E.estimate(e, p, vocab_size=512).peak_phase.startswith("block backward")
    assert predicted == pytest.approx(measured, rel=0.03), (predicted / MIB, measured / MIB)


def test_eager_keeps_an_inverted_boolean_mask_per_block(cuda_kernels):
    """masked_fill(~mask) saves the inverted mask: T^2 bytes a block (plus the cached one); no dropout here."""
    e, p = long_small(dropout=0.0), load_profile("baseline")
    measured, predicted = _fake_vs_analytic(e, p, "cuda")
    s = E._resolve_step(e, p, 512, None, 1, "cuda")
    assert E.block_saved(s.s, s.pr, s.kind, 0, mask=s.mask)["attn_mask"] == 1024 * 1024
    assert predicted == pytest.approx(measured, rel=0.03), (predicted / MIB, measured / MIB)


def _efficient_with_mask(window: int):
    """What `sdpa:efficient+mask` runs on CUDA, called op by op on fake CPU tensors: the cached boolean mask made
    additive per call, handed to the efficient kernel (whose autograd saves it) broadcast over batch and heads."""
    from memlab.core.attention.sdpa import SDPAAttention

    class EfficientWithMask(SDPAAttention):
        def __call__(self, q, k, v, dropout_p: float = 0.0):
            return _efficient_call(self._window_mask(q), q, k, v, dropout_p)

    return EfficientWithMask("efficient", window, masked=True)


def _efficient_call(mask, q, k, v, dropout_p):
    B, H, T, _ = q.shape
    additive = torch.where(mask, 0.0, torch.scalar_tensor(float("-inf"), dtype=q.dtype))
    out = torch.ops.aten._scaled_dot_product_efficient_attention(q, k, v, additive.expand(B, H, T, T), True, dropout_p, False)
    return out[0]


def test_window_with_dropout_keeps_its_additive_mask_per_block(cuda_kernels, monkeypatch):
    import memlab.core.attention as attention

    monkeypatch.setattr(attention, "kernel_for", lambda experiment, profile, device: _efficient_with_mask(profile.attention.window))
    e, p = long_small(vocab=64), load_profile("window")  # a small vocabulary: the masks, not the logits, set the peak
    measured, predicted = _fake_vs_analytic(e, p, "cuda")
    s = E._resolve_step(e, p, 64, None, 1, "cuda")
    assert s.mask == 2  # bf16: q's dtype
    assert predicted == pytest.approx(measured, rel=0.03), (predicted / MIB, measured / MIB)
