"""loss.fused = liger | cce (memlab.core.linear_ce): refused on the CPU and without the package, in one line; the
adapter hands the library what its source expects (checked with a pure-torch stand-in that has the library's
signature, since both kernels are Triton and CUDA-only); the estimator ranks them on the large-vocabulary experiment."""

from __future__ import annotations

import copy
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from memlab.core.predict import analytic as E
from memlab.core import linear_ce
from memlab.core.attention import build_attention
from memlab.core.config import AttentionConfig, Experiment, apply_overrides, load_experiment, load_profile
from memlab.core.errors import ConfigError
from memlab.core.model import GPT, GPTConfig
from memlab.core.step import TrainStep
from memlab.core.techniques import loss as loss_technique

CPU = torch.device("cpu")
CFG = GPTConfig(n_layer=2, n_head=2, d_model=32, d_ff=64, vocab_size=96, seq_len=16)


def _cli(args, tmp_path, capsys) -> tuple[int, list[str], str]:
    from memlab.cli import main

    with pytest.raises(SystemExit) as exit_:
        main([*args, "--runs-dir", str(tmp_path)])
    captured = capsys.readouterr()
    return exit_.value.code, [ln for ln in captured.err.splitlines() if ln.strip()], captured.out


# ---------------------------------------------------------------------------------------------- refusals


@pytest.mark.parametrize("name, fused", [("liger_ce", "liger"), ("cce", "cce")])
def test_fused_profiles_are_refused_on_the_cpu_in_one_line_before_any_work(name, fused, tmp_path, capsys):
    code, lines, _ = _cli(["run", "--profile", name, "--device", "cpu", "--experiment", "tiny"], tmp_path, capsys)
    assert code == 2 and len(lines) == 1, lines
    assert lines[0] == (f"memlab: error: loss.fused = {fused} runs Triton kernels and needs CUDA; "
                        "on the CPU backend use loss.chunked = true (profile chunked_ce)")
    assert not any(tmp_path.iterdir())  # no run folder


@pytest.mark.parametrize(
    "args, expect",
    [
        (["--profile", "liger_ce", "--set", "loss.chunked=true"], "loss.chunked = true and loss.fused = liger are two ways to avoid the logits; choose one"),
        (["--profile", "cce", "--set", 'precision.dtype="fp32"'], "loss.fused = cce needs 16-bit inputs (its backward takes bf16 or fp16 only): use precision.dtype = bf16 or fp16, not fp32"),
        (["--profile", "bf16", "--set", 'loss.fused="apple"'], "choose one of: none, liger, cce"),
    ],
)
def test_conflicting_loss_settings_are_one_line(args, expect, tmp_path, capsys):
    code, lines, _ = _cli(["run", *args, "--device", "cpu", "--experiment", "tiny"], tmp_path, capsys)
    assert code == 2 and len(lines) == 1 and expect in lines[0], lines


@pytest.mark.parametrize("name, module, install", [("liger", "liger_kernel", "needs liger-kernel: pip install 'memlab[liger]'"),
                                                   ("cce", "cut_cross_entropy", "needs cut-cross-entropy: pip install 'memlab[cce]'")])
def test_a_missing_library_is_one_line_naming_the_extra(name, module, install, monkeypatch, tiny):
    """On a CUDA device (the check asks no GPU anything), with the package made unimportable."""
    monkeypatch.setitem(sys.modules, module, None)  # `import module` now raises ImportError
    profile = load_profile("liger_ce" if name == "liger" else "cce")
    with pytest.raises(ConfigError) as err:
        loss_technique.check(tiny, profile, torch.device("cuda"), 1)
    assert str(err.value) == f"loss.fused = {name} {install} (or loss.chunked = true, which needs nothing)"


# ---------------------------------------------------------------------------------------------- the adapter


def _reference(calls: list[dict]):
    """A stand-in with the libraries' signature: the same mean cross-entropy in plain torch, recording its inputs."""

    def kernel(e, c, targets, *, ignore_index, reduction, **rest):
        calls.append({"e": e, "c": c, "targets": targets, "ignore_index": ignore_index, "reduction": reduction, **rest})
        return F.cross_entropy((e @ c.t()).float(), targets, ignore_index=ignore_index, reduction=reduction)

    return kernel


def _step(profile_name: str, monkeypatch, calls: list[dict]) -> TrainStep:
    """The loss technique applied through its door to a tiny model, the library's kernel replaced by the stand-in."""
    monkeypatch.setattr(linear_ce, "kernel_function", lambda name: _reference(calls))
    monkeypatch.setattr(linear_ce.importlib.metadata, "version", lambda dist: {"liger-kernel": "0.8.5", "cut-cross-entropy": "25.1.1"}[dist])
    torch.manual_seed(0)
    model = GPT(CFG, build_attention(AttentionConfig(kernel="sdpa"), CPU, torch.float32))
    step = TrainStep(Experiment(), load_profile(profile_name), CPU, CFG.vocab_size, model=model, train_model=model)
    loss_technique.apply(step)
    return step


def _loss_and_grads(model: GPT, autocast: bool):
    g = torch.Generator().manual_seed(3)
    x = torch.randint(0, CFG.vocab_size, (3, CFG.seq_len), generator=g)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        loss = model(x, torch.roll(x, -1, dims=1))
    loss.backward()
    return loss.detach(), {n: p.grad for n, p in model.named_parameters()}


@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "bf16-autocast"])
@pytest.mark.parametrize("profile_name, fused", [("liger_ce", "liger"), ("cce", "cce")])
def test_the_adapter_gives_the_stock_loss_and_gradients(profile_name, fused, autocast, monkeypatch):
    calls: list[dict] = []
    step = _step(profile_name, monkeypatch, calls)
    dtype = torch.bfloat16 if autocast else torch.float32
    step.model.loss_kernel = linear_ce.head_loss(fused, dtype, kernel=_reference(calls))  # this autocast's dtype
    stock = copy.deepcopy(step.model)
    stock.loss_kernel = None
    loss, grads = _loss_and_grads(step.model, autocast)
    ref_loss, ref_grads = _loss_and_grads(stock, autocast)
    torch.testing.assert_close(loss, ref_loss)
    for name, g in ref_grads.items():
        torch.testing.assert_close(grads[name], g, msg=name)
    (call,) = calls
    assert call["e"].shape == (3 * CFG.seq_len, CFG.d_model) and call["e"].dtype == dtype  # (B*T, C), compute dtype
    assert call["targets"].shape == (3 * CFG.seq_len,) and call["ignore_index"] == -100 and call["reduction"] == "mean"
    if fused == "liger":  # the parameter itself: Liger casts under autocast and accumulates its gradient in fp32
        assert call["c"] is step.model.lm_head.weight and call["accum_dtype"] == torch.float32 and "impl" not in call
    else:  # CCE's backward takes 16-bit inputs only: both cast here
        assert call["c"].dtype == dtype and call["c"].shape == (CFG.vocab_size, CFG.d_model) and call["impl"] == "cce"
        assert "filter_eps" in call and call["filter_eps"] is None  # exact gradients, not the library's filtered default


@pytest.mark.parametrize("profile_name, label", [("liger_ce", "liger 0.8.5 fused linear CE"), ("cce", "cce 25.1.1 (cce kernel, exact: filter_eps=None)")])
def test_the_summary_names_the_library_and_its_version(profile_name, label, monkeypatch):
    step = _step(profile_name, monkeypatch, [])
    assert step.applied["loss_kernel"] == label and step.model.loss_kernel is not None


def test_the_stock_and_chunked_paths_say_what_ran(monkeypatch):
    for name, label in (("bf16", "full logits"), ("chunked_ce", "chunked (4096 rows)")):
        step = _step(name, monkeypatch, [])
        assert step.applied["loss_kernel"] == label and step.model.loss_kernel is None


_LIGER_IN_INTERPRETER = """
import torch, torch.nn.functional as F
from memlab.core import linear_ce
torch.manual_seed(0)
h = torch.randn(2, 9, 16, requires_grad=True)  # 18 rows: Liger cuts them in chunks of 8, 8, 2 (V 40 / C 16)
w = torch.randn(40, 16, requires_grad=True)
t = torch.randint(0, 40, (2, 9))
ref = F.cross_entropy((h.flatten(0, 1) @ w.t()).float(), t.flatten())
loss = linear_ce.head_loss("liger", torch.float32)(h, w, t)
for a, b in zip(torch.autograd.grad(loss, (h, w)), torch.autograd.grad(ref, (h, w))):
    torch.testing.assert_close(a, b)
torch.testing.assert_close(loss, ref)
print("liger ok")
"""


@pytest.mark.slow
def test_liger_itself_gives_the_stock_loss_in_tritons_interpreter():
    """Liger's own kernel on the CPU (Triton's interpreter, chosen at import: a subprocess), fp32, when the extra is
    installed. CCE's kernels do not run in the interpreter (triton 3.9), so its adapter is checked above only."""
    if not (importlib.util.find_spec("liger_kernel") and importlib.util.find_spec("triton")):
        pytest.skip("liger-kernel is not installed here: pip install 'memlab[liger]' to run its kernel in Triton's CPU interpreter")
    env = os.environ | {"TRITON_INTERPRET": "1", "PYTHONWARNINGS": "ignore"}
    r = subprocess.run([sys.executable, "-c", _LIGER_IN_INTERPRETER], capture_output=True, text=True, env=env,
                       cwd=Path(__file__).resolve().parent.parent, timeout=300)
    assert r.returncode == 0 and "liger ok" in r.stdout, r.stderr[-3000:]


# ---------------------------------------------------------------------------------------------- bigvocab and the estimate


def test_liger_chunk_rows_follow_its_rule():
    """liger_kernel 0.8.5: inc = ceil(V / C); rows = next power of two of ceil(BT / inc), at most BT."""
    assert E.liger_chunk_rows(24 * 1024, 128256, 768) == 256  # inc 167, ceil(24576 / 167) = 148 -> 256
    assert E.liger_chunk_rows(4096 * 4, 32000, 4096) == 2048  # the example in Liger's own comment
    assert E.liger_chunk_rows(100, 50, 64) == 100  # V < C: one chunk, never more rows than there are


def test_bigvocab_is_logits_dominated_and_the_estimator_ranks_the_losses():
    e = load_experiment("bigvocab")
    assert (e.model.vocab_size, e.model.n_layer, e.model.d_model, e.model.seq_len, e.data.source) == (128256, 6, 768, 1024, "stdlib")
    V, _ = E.vocab_for(e)
    est = {name: E.estimate(e, load_profile(name), vocab_size=V) for name in ("bf16", "chunked_ce", "liger_ce", "cce")}
    torch_peak = est["bf16"]
    assert torch_peak.peak_phase.startswith("loss") and torch_peak.components["logits_loss"] > 0.5 * torch_peak.total_bytes
    assert torch_peak.total_bytes < 0.75 * 80e9  # runs without chunking on an 80 GB H100
    total = {name: x.total_bytes for name, x in est.items()}
    assert total["cce"] <= total["liger_ce"] <= total["chunked_ce"] < total["bf16"], total


def test_a_vocabulary_larger_than_the_tokenizers_trains_on_the_builtin_data(tiny):
    """bigvocab's 128,256 rows over an 8192-token BPE, in miniature: tiny's bpe:512 under a 1024-row head."""
    from memlab.core.engine import train
    from memlab.core.events import ListSink

    profile = load_profile("chunked_ce")
    apply_overrides(tiny, profile, ["model.vocab_size=1024", "train.steps=2", "precision.dtype=\"fp32\""])
    summary = train(tiny, profile, ListSink(), device=CPU)
    assert summary["status"] == "finished" and summary["loss_kernel"] == "chunked (4096 rows)"


def test_estimate_runs_for_the_fused_profiles_on_bigvocab(capsys):
    from memlab.cli import main

    for name in ("liger_ce", "cce"):  # the formula (instant); their stand-ins' traces: tests/test_replay_standins.py
        main(["estimate", "--profile", name, "--experiment", "bigvocab", "--method", "analytic"])
        out = capsys.readouterr().out
        assert f"{name} · bigvocab · micro-batch 24 x 1 accumulation · analytic" in out and "vocabulary 128,256" in out


def test_profiles_lists_the_fused_losses_as_needing_cuda(capsys):
    from memlab.cli import main

    main(["profiles"])
    rows = {ln.split()[0]: ln for ln in capsys.readouterr().out.splitlines() if ln.strip()}
    assert rows["liger_ce"].split()[1].rstrip(",") == "CUDA" and "memlab[liger]" in rows["liger_ce"]
    assert rows["cce"].split()[1].rstrip(",") == "CUDA" and "memlab[cce]" in rows["cce"]
