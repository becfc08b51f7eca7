"""kernels.fused: the fused forward computes the stock model's function (loss and every gradient), its ops match
autograd of the plain formulas, the Triton kernels match the reference (in Triton's CPU interpreter, when Triton is
installed), and the knobs it cannot honour are refused before any work."""

from __future__ import annotations

import copy
import dataclasses
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from memlab.core.attention import build_attention
from memlab.core.config import AttentionConfig, load_profile
from memlab.core.techniques import check_techniques
from memlab.core.engine import train
from memlab.core.errors import ConfigError
from memlab.core.events import ListSink
from memlab.core.fused import ops  # noqa: F401  (registers torch.ops.memlab.*)
from memlab.core.model import GPT, GPTConfig

CPU = torch.device("cpu")
CFG = GPTConfig(n_layer=3, n_head=2, d_model=48, d_ff=96, vocab_size=100, seq_len=16)
ROOT = Path(__file__).resolve().parent.parent


def _pair(seed: int = 0, cfg: GPTConfig = CFG) -> tuple[GPT, GPT]:
    torch.manual_seed(seed)
    stock = GPT(cfg, build_attention(AttentionConfig(kernel="sdpa"), CPU, torch.float32, cfg.dropout))
    fused = copy.deepcopy(stock)
    fused.fused = True
    return stock, fused


def _loss_and_grads(model: GPT, idx: torch.Tensor, autocast: bool) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        loss = model(idx, torch.roll(idx, -1, dims=1))
    loss.backward()
    return loss.detach(), {n: p.grad for n, p in model.named_parameters()}


def test_fused_forward_is_the_stock_models_function_in_fp32():
    stock, fused = _pair()
    idx = torch.randint(0, CFG.vocab_size, (3, CFG.seq_len), generator=torch.Generator().manual_seed(1))
    loss_s, grads_s = _loss_and_grads(stock, idx, autocast=False)
    loss_f, grads_f = _loss_and_grads(fused, idx, autocast=False)
    torch.testing.assert_close(loss_f, loss_s, rtol=1e-6, atol=1e-6)
    assert grads_f.keys() == grads_s.keys()
    for name in grads_s:  # every parameter, biases and LayerNorm gains included
        torch.testing.assert_close(grads_f[name], grads_s[name], rtol=1e-4, atol=1e-6, msg=name)
    with torch.no_grad():  # the logits path (no targets) too
        torch.testing.assert_close(fused(idx), stock(idx), rtol=1e-5, atol=1e-5)


def test_fused_block_drops_the_key_bias_and_adds_the_value_bias_after_the_attention():
    """What the fused block's biases rest on, checked on the stock model: k's bias changes no output (softmax
    takes a row's constant out), v's adds itself to every attention output row; so the fused gradient of k's
    bias is exactly 0 and v's equals the stock one."""
    stock, fused = _pair()
    idx = torch.randint(0, CFG.vocab_size, (3, CFG.seq_len), generator=torch.Generator().manual_seed(3))
    attn, C = stock.blocks[0].attn, CFG.d_model
    x = torch.randn(2, CFG.seq_len, C, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        before = attn.attend(x)
        attn.qkv.bias[C : 2 * C] += 5.0
        torch.testing.assert_close(attn.attend(x), before, rtol=1e-5, atol=1e-5)
        attn.qkv.bias[2 * C :] += 1.0
        torch.testing.assert_close(attn.attend(x), before + 1.0, rtol=1e-5, atol=1e-5)
    stock, fused = _pair()
    _, grads_s = _loss_and_grads(stock, idx, autocast=False)
    _, grads_f = _loss_and_grads(fused, idx, autocast=False)
    for i in range(CFG.n_layer):
        d_s, d_f = grads_s[f"blocks.{i}.attn.qkv.bias"], grads_f[f"blocks.{i}.attn.qkv.bias"]
        assert torch.count_nonzero(d_f[C : 2 * C]) == 0
        assert d_s[C : 2 * C].abs().max() < 1e-6 < d_s[2 * C :].abs().max()
        torch.testing.assert_close(d_f[2 * C :], d_s[2 * C :], rtol=1e-4, atol=1e-6)


def test_fused_forward_applies_the_stock_models_dropout_in_the_same_order():
    """model.dropout > 0 (the seeds' 0.1): the same dropout calls in the same order, so the same masks from one seed."""
    stock, fused = _pair(cfg=dataclasses.replace(CFG, dropout=0.1))
    idx = torch.randint(0, CFG.vocab_size, (3, CFG.seq_len), generator=torch.Generator().manual_seed(1))
    torch.manual_seed(7)
    loss_s, grads_s = _loss_and_grads(stock, idx, autocast=False)
    torch.manual_seed(7)
    loss_f, grads_f = _loss_and_grads(fused, idx, autocast=False)
    torch.manual_seed(8)
    loss_other, _ = _loss_and_grads(stock, idx, autocast=False)
    assert not torch.equal(loss_other, loss_s)  # dropout is really on: another seed, another loss
    torch.testing.assert_close(loss_f, loss_s, rtol=1e-6, atol=1e-6)
    for name in grads_s:
        torch.testing.assert_close(grads_f[name], grads_s[name], rtol=1e-4, atol=1e-6, msg=name)


def test_fused_forward_under_bf16_autocast_differs_only_by_rounding():
    """The stock graph rounds each projection's output (bias included) and each bias gradient to bf16; the fused
    kernels add the bias and sum its gradient in fp32. So: equal up to bf16 rounding, not bit for bit."""
    stock, fused = _pair()
    idx = torch.randint(0, CFG.vocab_size, (3, CFG.seq_len), generator=torch.Generator().manual_seed(2))
    loss_s, grads_s = _loss_and_grads(stock, idx, autocast=True)
    loss_f, grads_f = _loss_and_grads(fused, idx, autocast=True)
    torch.testing.assert_close(loss_f, loss_s, rtol=1e-3, atol=1e-3)
    for name in grads_s:
        rel = ((grads_f[name] - grads_s[name]).norm() / grads_s[name].norm()).item()
        assert rel < 2e-2, (name, rel)


def test_fused_model_takes_its_loss_from_the_head_op():
    _, fused = _pair()
    idx = torch.randint(0, CFG.vocab_size, (2, CFG.seq_len), generator=torch.Generator().manual_seed(1))
    calls = []

    class Seen(torch.utils._python_dispatch.TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            calls.append(str(func))
            return func(*args, **(kwargs or {}))

    with Seen():
        fused(idx, torch.roll(idx, -1, dims=1))
    assert any("memlab.head_cross_entropy" in c for c in calls)
    fused.loss_chunk_size = 8  # a chunked loss keeps its own path
    calls.clear()
    with Seen():
        fused(idx, torch.roll(idx, -1, dims=1))
    assert not any("head_cross_entropy" in c for c in calls)


def test_head_op_matches_autograd_of_cross_entropy_with_pad_rows_and_any_loss_gradient():
    g = torch.Generator().manual_seed(5)
    M, C, V = 11, 24, 37
    h = torch.randn(M, C, generator=g).requires_grad_()
    w = torch.cat([torch.randn(V, C, generator=g), torch.zeros(64 - V, C)]).requires_grad_()
    t = torch.randint(0, V, (M,), generator=g)
    loss, grad = torch.ops.memlab.head_cross_entropy(h, w, t, V)
    (2.5 * loss).backward()  # a loss gradient other than 1 (accumulation, a loss scale) reaches both matmuls
    got = h.grad.clone(), w.grad.clone()
    h.grad = w.grad = None
    ref = F.cross_entropy(h @ w[:V].t(), t)
    (2.5 * ref).backward()
    torch.testing.assert_close(loss, ref.detach())
    torch.testing.assert_close(got[0], h.grad, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got[1][:V], w.grad[:V], rtol=1e-5, atol=1e-6)
    assert grad.shape == (M, 64) and not got[1][V:].any() and not grad[:, V:].any()


def test_head_op_compiles_whole_and_passes_opcheck():
    g = torch.Generator().manual_seed(6)
    h = torch.randn(8, 16, generator=g, requires_grad=True)
    w = torch.randn(32, 16, generator=g, requires_grad=True)
    t = torch.randint(0, 30, (8,), generator=g)
    torch.library.opcheck(torch.ops.memlab.head_cross_entropy, (h, w, t, 30))
    compiled = torch.compile(lambda a, b: torch.ops.memlab.head_cross_entropy(a, b, t, 30)[0], fullgraph=True, backend="aot_eager")
    compiled(h, w).backward()
    got = h.grad.clone(), w.grad.clone()
    h.grad = w.grad = None
    torch.ops.memlab.head_cross_entropy(h, w, t, 30)[0].backward()
    torch.testing.assert_close(got[0], h.grad)
    torch.testing.assert_close(got[1], w.grad)


@pytest.mark.parametrize("pad", [0, 4])
def test_add_layer_norm_op_matches_autograd_of_the_plain_formula(pad):
    """With pad, h's rows end in the ones column (a 1, then zeros), a constant: the gradient arriving for it (junk
    here) reaches no input."""
    g = torch.Generator().manual_seed(3)
    N, C = 10, 24
    leaves = [torch.randn(*s, generator=g).requires_grad_() for s in ((N, C), (N, C), (C,), (C,), (C,))]
    x_prev, branch, bias, weight, ln_bias = leaves
    gx, gh, junk = torch.randn(N, C, generator=g), torch.randn(N, C, generator=g), torch.randn(N, pad, generator=g)

    x, h, mean, rstd = torch.ops.memlab.add_layer_norm(x_prev, branch, bias, weight, ln_bias, 1e-5, torch.float32, pad)
    assert h.shape == (N, C + pad) and (h[:, C:] == torch.eye(1, pad)).all()
    torch.autograd.backward([x, h], [gx, torch.cat([gh, junk], dim=1)])
    h = h[:, :C]
    got = [t.grad.clone() for t in leaves]
    for t in leaves:
        t.grad = None
    x_ref = x_prev + branch + bias
    h_ref = F.layer_norm(x_ref, (C,), weight, ln_bias, 1e-5)
    torch.testing.assert_close(x, x_ref)
    torch.testing.assert_close(h, h_ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(mean, x_ref.mean(-1))
    torch.autograd.backward([x_ref, h_ref], [gx, gh])
    for name, a, t in zip(("x_prev", "branch", "bias", "weight", "ln_bias"), got, leaves):
        torch.testing.assert_close(a, t.grad, rtol=1e-5, atol=1e-5, msg=name)


def test_mlp_matmul_ops_give_the_gelu_mlps_values_and_gradients():
    """The ops the MLP's epilogue matmuls run (here through their PyTorch reference): pre and gelu_tanh(pre) with the
    bias; the gradient through the output layer and the GELU, whence the input layer's weight and bias gradients."""
    g = torch.Generator().manual_seed(4)
    x, w1, b1 = torch.randn(12, 8, generator=g), torch.randn(20, 8, generator=g), torch.randn(20, generator=g)
    w2, up = torch.randn(8, 20, generator=g), torch.randn(12, 8, generator=g)
    leaves = [t.clone().requires_grad_() for t in (x, w1, b1, w2)]
    pre = F.linear(leaves[0], leaves[1], leaves[2])
    pre.retain_grad()
    F.linear(F.gelu(pre, approximate="tanh"), leaves[3]).backward(up)
    got_pre, got_act = torch.ops.memlab.mm_bias_gelu(x, w1, b1)
    torch.testing.assert_close(got_pre, pre.detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got_act, F.gelu(pre.detach(), approximate="tanh"), rtol=1e-5, atol=1e-5)
    d = torch.ops.memlab.mm_dgelu(up, w2, got_pre)
    torch.testing.assert_close(d, pre.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(d.t() @ x, leaves[1].grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(d.sum(0), leaves[2].grad, rtol=1e-5, atol=1e-5)


def test_matmul_op_transposes_as_asked_adds_the_bias_and_passes_opcheck():
    """memlab::matmul takes its operands as stored and transposes where asked (what the fused linears' forward,
    input-gradient and weight-gradient matmuls each ask for), the bias added before the result's rounding."""
    g = torch.Generator().manual_seed(5)
    a, b, bias = torch.randn(6, 4, generator=g), torch.randn(5, 4, generator=g), torch.randn(5, generator=g)
    torch.testing.assert_close(torch.ops.memlab.matmul(a, b, False, True), a @ b.t())
    torch.testing.assert_close(torch.ops.memlab.matmul(a, b, False, True, bias), a @ b.t() + bias)
    c = torch.randn(6, 3, generator=g)
    torch.testing.assert_close(torch.ops.memlab.matmul(a, c, True, False), a.t() @ c)
    torch.testing.assert_close(torch.ops.memlab.matmul(b, a.t().contiguous(), False, False), b @ a.t())
    d = torch.randn(4, 6, generator=g)
    torch.testing.assert_close(torch.ops.memlab.matmul(c, d, True, True), c.t() @ d.t())
    bf = torch.ops.memlab.matmul(a.bfloat16(), b.bfloat16(), False, True, bias.bfloat16())
    assert bf.dtype == torch.bfloat16 and bf.shape == (6, 5)
    torch.library.opcheck(torch.ops.memlab.matmul.default, (a, b, False, True, bias))
    torch.library.opcheck(torch.ops.memlab.matmul.default, (a, c, True, False))


def test_matmul_op_reads_the_leading_columns_of_a_wider_input_and_pads_its_output_with_zeros():
    """The ones column's matmuls: the forward's input carries pad columns past the weight's (ignored), the input
    gradient comes out with zero pad columns, and the weight gradient's matmul over the padded input ends in the
    bias gradient (the column sums of g)."""
    g = torch.Generator().manual_seed(6)
    h, w, grad = torch.randn(6, 4, generator=g), torch.randn(5, 4, generator=g), torch.randn(6, 5, generator=g)
    padded = torch.cat([h, torch.ones(6, 1), torch.zeros(6, 3)], dim=1)
    torch.testing.assert_close(torch.ops.memlab.matmul(padded, w, False, True), h @ w.t())
    d_h = torch.ops.memlab.matmul(grad, w, False, False, None, 4)
    assert d_h.shape == (6, 8) and not d_h[:, 4:].any()
    torch.testing.assert_close(d_h[:, :4], grad @ w)
    d_wb = torch.ops.memlab.matmul(grad, padded, True, False)
    torch.testing.assert_close(d_wb[:, :4], grad.t() @ h)
    torch.testing.assert_close(d_wb[:, 4], grad.sum(0))
    assert not d_wb[:, 5:].any()
    torch.library.opcheck(torch.ops.memlab.matmul.default, (padded, w, False, True))
    torch.library.opcheck(torch.ops.memlab.matmul.default, (grad, w, False, False, None, 4))


_INTERPRETER_CHECK = textwrap.dedent(
    """
    import torch
    from memlab.core.fused import reference, triton_kernels as tk
    from memlab.core.fused.forward import ones_pad

    def close(got, want, tol):
        for a, b in zip(got, want):
            err = ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-12)).item()
            assert err < tol, (err, a.shape, a.dtype)
        assert len({t.untyped_storage().data_ptr() for t in got}) == len(got)  # a custom op's outputs never alias

    g = torch.Generator().manual_seed(0)
    for N, C, dt, launch in ((7, 48, torch.bfloat16, {}), (13, 100, torch.float32, dict(rows=4, warps=4, stages=1)),
                             (5, 64, torch.bfloat16, dict(rows=2, programs_per_sm=0))):
        tol = 1e-2 if dt == torch.bfloat16 else 1e-5
        x_prev, gx = torch.randn(N, C, generator=g), torch.randn(N, C, generator=g)
        branch, gh = torch.randn(N, C, generator=g).to(dt), torch.randn(N, C, generator=g).to(dt)
        bias, w, b = torch.randn(C, generator=g), 1 + torch.randn(C, generator=g) / 10, torch.randn(C, generator=g)
        want = reference.add_ln_fwd(x_prev, branch, bias, w, b, 1e-5, dt)
        close(tk.add_ln_fwd(x_prev, branch, bias, w, b, 1e-5, dt, **launch), want, tol)
        x, mean, rstd = want[0], want[2], want[3]
        for g_x in (gx, None):
            close(tk.add_ln_bwd(gh, g_x, x, mean, rstd, w, dt, **launch),
                  reference.add_ln_bwd(gh, g_x, x, mean, rstd, w, dt), tol)
        # with the ones column (pad 8 for bf16 C 48 and 64, 4 for fp32 C 100): written after h; the pad's incoming
        # gradient (junk here) is left out
        pad = ones_pad(C, dt)
        got = tk.add_ln_fwd(x_prev, branch, bias, w, b, 1e-5, dt, pad, **launch)
        close(got, reference.add_ln_fwd(x_prev, branch, bias, w, b, 1e-5, dt, pad), tol)
        assert got[1].shape == (N, C + pad) and (got[1][:, C] == 1).all() and not got[1][:, C + 1:].any()
        gh_padded = torch.cat([gh, torch.randn(N, pad, generator=g).to(dt)], dim=1)
        close(tk.add_ln_bwd(gh_padded, gx, x, mean, rstd, w, dt, **launch), reference.add_ln_bwd(gh, gx, x, mean, rstd, w, dt), tol)
    # the head: V 100 in rows padded to 128 (pad rows zero), chunks of 32 columns, fewer programs than rows
    for M, dt in ((9, torch.float32), (6, torch.bfloat16)):
        tol = 1e-2 if dt == torch.bfloat16 else 1e-5
        h = torch.randn(M, 48, generator=g).to(dt)
        w = torch.cat([torch.randn(100, 48, generator=g), torch.zeros(28, 48)]).to(dt)
        t = torch.randint(0, 100, (M,), generator=g)
        got, want = tk.head_cross_entropy(h, w, t, 100, block=32), reference.head_cross_entropy(h, w, t, 100)
        close(got, want, tol)
        assert got[1].shape == (M, 128) and not got[1][:, 100:].any()
    print("interpreter ok")
    """
)


def test_norm_kernels_take_int64_offsets_from_the_largest_tensor_they_index():
    """A padded h (or its gradient) has more elements than x: rows whose x offsets fit in int32 may not for h."""
    pytest.importorskip("triton", reason="memlab's Triton kernels need Triton")
    from memlab.core.fused.triton_kernels import _big

    rows = 2**31 // 770  # x (rows, 768) stays under 2**31 elements, h (rows, 776) does not
    x, h = torch.empty(rows, 768, device="meta"), torch.empty(rows, 776, device="meta")
    assert not _big(x) and _big(h) and _big(x, h) and _big(h, x)


def test_triton_kernels_match_the_reference_in_tritons_interpreter():
    """The CUDA kernels themselves, run by Triton's CPU interpreter on odd shapes (C not a power of two, rows not a
    multiple of the tile, no incoming residual gradient). A subprocess: the interpreter is chosen at import."""
    try:
        import triton  # noqa: F401
    except ImportError:
        pytest.skip("Triton is not installed here: pip install triton to run memlab's Triton kernels in its CPU interpreter")
    env = os.environ | {"TRITON_INTERPRET": "1", "PYTHONWARNINGS": "ignore"}
    r = subprocess.run([sys.executable, "-c", _INTERPRETER_CHECK], capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert r.returncode == 0 and "interpreter ok" in r.stdout, r.stderr[-3000:]


@pytest.mark.parametrize(
    "overrides, expect",
    [
        ({"checkpointing.mode": "full"}, "kernels.fused runs the blocks itself and cannot checkpoint them"),
        ({"distributed.mode": "fsdp"}, "kernels.fused cannot run under distributed.mode = fsdp"),
    ],
)
def test_knobs_the_fused_path_cannot_honour_are_refused(tiny, overrides, expect):
    profile = load_profile("bf16")
    profile.kernels.fused = True
    for key, value in overrides.items():
        section, name = key.split(".")
        setattr(getattr(tiny if section == "model" else profile, section), name, value)
    with pytest.raises(ConfigError, match=expect):
        check_techniques(tiny, profile, CPU)


def test_engine_trains_with_fused_kernels_on_the_cpu_reference(tiny):
    profile = load_profile("baseline")
    profile.kernels.fused = True
    tiny.train.steps = 3
    summary = train(tiny, profile, ListSink(), device=CPU)
    assert summary["status"] == "finished" and summary["steps"] == 3 and summary["val_loss"] is not None
    assert summary["kernels"] == "fused (CPU reference)"
    stock = train(tiny, load_profile("baseline"), ListSink(), device=CPU)
    assert stock["kernels"] == "off"
    assert summary["val_loss"] == pytest.approx(stock["val_loss"], rel=1e-4)  # same function, same data, same seed


def test_cublaslt_matmuls_fall_back_to_the_reference_where_they_cannot_run():
    """A tensor cuBLASLt's epilogue kernels cannot take (here: on the CPU) gets the PyTorch reference, not an error."""
    from memlab.core.fused import cublaslt, reference

    g = torch.Generator().manual_seed(5)
    x, w1, b1 = torch.randn(6, 8, generator=g), torch.randn(16, 8, generator=g), torch.randn(16, generator=g)
    assert not cublaslt.usable(x, w1, b1)
    for got, want in zip(cublaslt.mm_bias_gelu(x, w1, b1), reference.mm_bias_gelu(x, w1, b1)):
        torch.testing.assert_close(got, want)
    up, w2, pre = torch.randn(6, 8, generator=g), torch.randn(8, 16, generator=g), torch.randn(6, 16, generator=g)
    torch.testing.assert_close(cublaslt.mm_dgelu(up, w2, pre), reference.mm_dgelu(up, w2, pre))
    torch.testing.assert_close(cublaslt.matmul(x, w1, False, True, b1), torch.addmm(b1, x, w1.t()))
    torch.testing.assert_close(cublaslt.matmul(pre, x, True, False), pre.t() @ x)
    assert not cublaslt._plans  # nothing was planned, nothing timed: no cuBLASLt off CUDA


def test_algorithm_choices_are_remembered_per_gpu_model_and_timed_again_when_no_longer_offered(tmp_path, monkeypatch):
    """cuBLASLt's timed choices go to one file per GPU model and library version in memlab's cache, merged across
    writers; a later process takes a remembered choice untimed while the heuristic still offers it."""
    from memlab.core.fused import algo_choices, cublaslt

    monkeypatch.setenv("MEMLAB_CACHE", str(tmp_path))
    path = algo_choices.choices_path("NVIDIA H100 80GB HBM3", 130100)
    assert path == tmp_path / "cublaslt" / "NVIDIA-H100-80GB-HBM3-130100.json"
    assert algo_choices.load(path) == {}
    algo_choices.remember(path, "a", "torch")
    algo_choices.remember(path, "b", "00ff")
    assert algo_choices.load(path) == {"a": "torch", "b": "00ff"}

    timed = []
    monkeypatch.setattr(cublaslt, "_fastest", lambda calls: timed.append(len(calls)) or 1)
    monkeypatch.setattr(cublaslt, "_choices_path", lambda: path)
    calls = [lambda: None] * 3
    assert cublaslt._choose("k", calls, ["aa", "bb", "torch"]) == 1 and timed == [3]
    assert cublaslt._choose("k", calls, ["aa", "bb", "torch"]) == 1 and timed == [3]  # remembered, not timed
    assert cublaslt._choose("k", calls, ["cc", "dd", "bb"]) == 2 and timed == [3]  # found by name at a new place
    assert cublaslt._choose("k", calls, ["cc", "dd", "torch"]) == 1 and timed == [3, 3]  # no longer offered: timed
    assert algo_choices.load(path) == {"a": "torch", "b": "00ff", "k": "dd"}

    path.write_text("{half a file", encoding="utf-8")
    assert algo_choices.load(path) == {}  # unreadable counts as empty; the next choice rewrites it whole


_DECLARE_CHECK = textwrap.dedent(
    """
    import torch
    from torch._inductor import lowering
    from memlab.core.config import load_profile
    from memlab.core.fused import ops
    from memlab.core.techniques.torch_compile import compiled

    mine = [op._opoverload for op in (ops.add_layer_norm, ops.add_layer_norm_backward, ops.mm_bias_gelu, ops.mm_dgelu,
                                      ops.head_cross_entropy)]
    assert not any(op in lowering.lowerings for op in mine)  # a fresh process: nothing declared yet
    compiled(torch.nn.Linear(2, 2), load_profile("bf16"))
    assert not any(op in lowering.lowerings for op in mine)  # no kernels.fused: nothing to declare
    compiled(torch.nn.Linear(2, 2), load_profile("fastest"))  # compiling is lazy: this only wraps, and declares
    assert all(op in lowering.lowerings for op in mine)
    print("declared ok")
    """
)


def test_fused_ops_are_declared_to_inductor_before_a_fused_model_compiles():
    """torch 2.11's Inductor, meeting an op it has no lowering for, spells out the op's whole input graph in a log
    line (exponential in the fused model's depth: gpt2s never finished compiling); compile.enabled with
    kernels.fused declares memlab's ops first, as the fallbacks Inductor would make of them. A fresh process, so
    that no earlier compile has registered them."""
    r = subprocess.run([sys.executable, "-c", _DECLARE_CHECK], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 0 and "declared ok" in r.stdout, r.stderr[-3000:]
