"""The optimizer-state techniques (issue 19): refusals, Muon's split, CPU steps, GaLore, the estimator's ordering."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from memlab.core.config import Experiment, OptimizerConfig, TrainConfig, load_experiment, load_profile
from memlab.core.errors import ConfigError
from memlab.core.predict.analytic import optimizer_state_bytes, param_shapes
from memlab.core.muon import MuonWithAdamW, build_muon, split_params
from memlab.core.optim import set_lr
from memlab.core.techniques import check_techniques
from memlab.core.techniques.optimizer import build_optimizer, describe

CPU = torch.device("cpu")
TINY = ["--experiment", "tiny", "--device", "cpu", "--steps", "2"]
HAS_MUON = hasattr(torch.optim, "Muon")
HAS_GALORE = all(importlib.util.find_spec(m) is not None for m in ("galore_torch", "transformers", "bitsandbytes"))


# Each case runs memlab's real entry point (memlab.cli:main, what the console script calls) in a child process; the
# cases share one child, which imports torch and torchao once rather than once a case (~5 s each). `block` names a
# module made unimportable for that case (a missing extra). The installed `memlab` executable itself is run by
# tests/test_cli.py.
_CLI_DRIVER = """
import json, os, sys, tempfile
from memlab.cli import main

results = {}
for name, argv, block in json.loads(sys.argv[1]):
    if block:
        sys.modules[block] = None
    with tempfile.TemporaryFile("w+") as err:  # file descriptor 2 itself: whatever writes there, Python or not
        sys.stderr.flush()
        saved = os.dup(2)
        os.dup2(err.fileno(), 2)
        try:
            main(argv)
            code = 0
        except SystemExit as e:
            code = e.code
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
        err.seek(0)
        results[name] = {"returncode": code, "stderr": err.read()}
    if block:
        del sys.modules[block]
print(json.dumps(results))
"""


# The tests that read cli_refusals share one xdist worker, so that its child runs once.
SHARES_CLI_REFUSALS = pytest.mark.xdist_group("optimizer-cli-refusals")


@pytest.fixture(scope="module")
def cli_refusals(tmp_path_factory) -> dict[str, tuple[subprocess.CompletedProcess, Path]]:
    """name -> (the case's exit status and stderr, its runs folder), for the CLI refusals of this file."""
    cases = {name: ("run", "--profile", name, *TINY) for name in ("adamw4bit", "paged_adamw8bit")}
    cases["galore"] = ("run", "--profile", "galore", *TINY)
    blocks = {"galore": "galore_torch"}
    runs = {name: tmp_path_factory.mktemp(f"runs-{name}") for name in cases}
    todo = [(name, [*argv, "--runs-dir", str(runs[name])], blocks.get(name, "")) for name, argv in cases.items()]
    r = subprocess.run([sys.executable, "-c", _CLI_DRIVER, json.dumps(todo)], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "COLUMNS": "200"})
    assert r.returncode == 0, r.stderr
    results = json.loads(r.stdout.splitlines()[-1])
    return {name: (subprocess.CompletedProcess(cases[name], **results[name], stdout=""), runs[name]) for name in cases}


def _gpt():
    from memlab.core.attention import build_attention
    from memlab.core.config import AttentionConfig
    from memlab.core.model import GPT, GPTConfig

    torch.manual_seed(0)
    cfg = GPTConfig(n_layer=2, n_head=2, d_model=32, d_ff=64, vocab_size=96, seq_len=16)
    return GPT(cfg, build_attention(AttentionConfig(kernel="sdpa"), CPU, torch.float32))


# ---------------------------------------------------------------------------------------------- refusals


@SHARES_CLI_REFUSALS
@pytest.mark.parametrize("name", ["adamw4bit", "paged_adamw8bit"])
def test_cuda_only_optimizers_are_refused_on_cpu_in_one_line(name, cli_refusals):
    r, runs = cli_refusals[name]
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and "needs CUDA" in r.stderr, r.stderr
    assert not any(runs.iterdir())  # before any work: no run folder


@pytest.mark.parametrize(("name", "module", "extra"), [
    ("adamw4bit", "torchao", "torchao"), ("bf16_sr", "torchao", "torchao"), ("adamw8bit", "torchao", "torchao"),
    ("paged_adamw8bit", "bitsandbytes", "bnb"), ("galore", "galore_torch", "galore"),
])
def test_a_missing_library_names_its_extra(name, module, extra, monkeypatch):
    monkeypatch.setitem(sys.modules, module, None)
    monkeypatch.setitem(sys.modules, f"{module}.optim", None)
    with pytest.raises(ConfigError, match=rf"pip install 'memlab\[{extra}\]'"):
        check_techniques(load_experiment("tiny"), load_profile(name), torch.device("cuda"))


@SHARES_CLI_REFUSALS
def test_a_missing_library_exits_2_in_one_line_on_the_cli(cli_refusals):
    r, _ = cli_refusals["galore"]
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and "memlab[galore]" in r.stderr, r.stderr


def test_muon_without_torch_muon_names_the_torch_version(monkeypatch):
    monkeypatch.delattr(torch.optim, "Muon", raising=False)
    with pytest.raises(ConfigError, match=rf"torch >= 2.9 .*{re.escape(torch.__version__)}"):
        check_techniques(load_experiment("tiny"), load_profile("muon"), CPU)


def test_bf16_sr_needs_bf16_parameters():
    p = load_profile("bf16_sr")
    p.precision.dtype = "bf16"
    with pytest.raises(ConfigError, match="bf16_pure"):
        check_techniques(load_experiment("tiny"), p, CPU)


def test_bf16_pure_refuses_fsdp():
    p = load_profile("bf16_sr")
    p.distributed.mode = "fsdp"
    with pytest.raises(ConfigError, match="fsdp"):
        check_techniques(load_experiment("tiny"), p, CPU, world=2)


# ---------------------------------------------------------------------------------------------- muon


def test_muon_takes_the_blocks_matrices_and_leaves_embeddings_head_and_vectors_to_adamw():
    model = _gpt()
    muon, rest = split_params(model)
    names = {id(p): n for n, p in model.named_parameters()}
    assert sorted(names[id(p)] for p in muon) == sorted(
        f"blocks.{i}.{w}.weight" for i in range(2) for w in ("attn.qkv", "attn.proj", "mlp.fc", "mlp.proj"))
    rest_names = {names[id(p)] for p in rest}
    assert {"wte.weight", "wpe.weight", "ln_f.weight", "blocks.0.attn.qkv.bias"} <= rest_names
    assert len(muon) + len(rest) == len(list(model.parameters()))  # lm_head is wte: counted once


def test_muon_refuses_a_model_without_hidden_matrices():
    class EmbeddingOnly(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.wte = nn.Embedding(10, 4)
            self.lm_head = nn.Linear(4, 10, bias=False)
            self.ln = nn.LayerNorm(4)

    with pytest.raises(ConfigError, match="no 2-D hidden weight"):
        split_params(EmbeddingOnly())


@pytest.mark.skipif(not HAS_MUON, reason=f"torch.optim.Muon needs torch >= 2.9 (this is {torch.__version__})")
def test_muon_steps_lower_the_loss_and_follow_the_schedule():
    model = _gpt()
    opt = build_optimizer(model, OptimizerConfig(name="muon"), TrainConfig(lr=1e-2, weight_decay=0.0), CPU)
    assert isinstance(opt, MuonWithAdamW)
    x = torch.randint(0, 96, (4, 16))
    losses = []
    for _ in range(8):
        loss = model(x, x)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 0.5, losses
    set_lr(opt, 3e-4)
    assert all(g["lr"] == 3e-4 for o in opt.optimizers for g in o.param_groups)
    assert opt.optimizers[0].param_groups[0]["adjust_lr_fn"] == "match_rms_adamw"
    assert all(p.grad is None for p in model.parameters())


@pytest.mark.skipif(not HAS_MUON, reason=f"torch.optim.Muon needs torch >= 2.9 (this is {torch.__version__})")
def test_muon_runs_under_fp16s_grad_scaler():
    model = _gpt()
    opt = build_muon(model, TrainConfig(lr=1e-2))
    scaler = torch.amp.GradScaler("cpu")
    x = torch.randint(0, 96, (2, 16))
    scaler.scale(model(x, x)).backward()
    scaler.unscale_(opt)
    scaler.step(opt)
    scaler.update()
    assert opt.state  # both halves made their state


# ---------------------------------------------------------------------------------------------- galore, bf16_sr


@pytest.mark.skipif(not HAS_GALORE, reason="galore-torch (with transformers and bitsandbytes) not installed: pip install 'memlab[galore]'")
def test_galore_projects_the_hidden_matrices_and_trains_on_cpu(tiny):
    from memlab.core.engine import train
    from memlab.core.events import ListSink

    sink = ListSink()
    summary = train(tiny, load_profile("galore"), sink, device=CPU)
    assert summary["status"] == "finished" and summary["val_loss"] is not None
    assert summary["optimizer"].startswith("galore (galore-torch ")


@pytest.mark.skipif(not HAS_GALORE, reason="galore-torch (with transformers and bitsandbytes) not installed: pip install 'memlab[galore]'")
def test_galore_state_is_rank_r():
    model = _gpt()
    opt = build_optimizer(model, OptimizerConfig(name="galore", rank=4), TrainConfig(), CPU)
    x = torch.randint(0, 96, (2, 16))
    model(x, x).backward()
    opt.step()
    qkv = model.blocks[0].attn.qkv.weight  # 96 x 32: projected on the right, 96 x 4 moments
    assert opt.state[qkv]["exp_avg"].shape == (96, 4)
    assert opt.state[model.wte.weight]["exp_avg"].shape == model.wte.weight.shape


def test_bf16_pure_makes_bf16_parameters(tiny):
    from memlab.core.techniques import build_step

    p = load_profile("bf16_sr")
    p.optimizer.name = "adamw"  # the precision alone (bf16_sr's library may be absent here)
    step = build_step(tiny, p, CPU, vocab_size=8192)
    assert {q.dtype for q in step.model.parameters()} == {torch.bfloat16}


def test_describe_names_the_library_and_version():
    assert describe(load_profile("muon")) == f"muon (torch {torch.__version__})"


# ---------------------------------------------------------------------------------------------- estimate


def test_state_bytes_order_4bit_8bit_bf16_adamw_and_muon_below_adamw():
    e: Experiment = load_experiment("gpt2s")
    m = e.model
    shapes = param_shapes(m.n_layer, m.d_model, 4 * m.d_model, m.seq_len, 8192)
    b = {n: optimizer_state_bytes(load_profile(n), shapes) for n in ("adamw4bit", "adamw8bit", "bf16_sr", "bf16", "muon", "galore")}
    assert b["adamw4bit"] < b["adamw8bit"] < b["bf16_sr"] < b["bf16"]
    assert b["muon"] < b["bf16"] and b["galore"] < b["bf16"]
    n = sum(torch.Size(s).numel() for s in shapes)
    assert b["bf16_sr"] == 4 * n and b["bf16"] == 8 * n


def test_paged_state_is_outside_the_allocator_and_said_so():
    from memlab.core.predict.analytic import estimate

    est = estimate(load_experiment("gpt2s"), load_profile("paged_adamw8bit"), vocab_size=8192)
    assert est.components["optimizer_state"] < 10 * 2**20  # block scales and small tensors only
    assert any("unified memory" in note for note in est.notes)


@pytest.mark.xdist_group("memlab-profiles")
def test_profiles_lists_the_optimizer_profiles(profiles_listing):
    r = profiles_listing
    assert r.returncode == 0
    for name in ("adamw4bit", "bf16_sr", "muon", "paged_adamw8bit", "galore"):
        assert name in r.stdout


def test_adafactor_follows_the_schedule_at_its_own_relative_step_size():
    """torch's Adafactor step is lr x the weights' RMS: at AdamW's lr it barely trained (val ppl 31,782 in the H100
    study). The schedule's shape is kept, its peak mapped onto Adafactor's own 1e-2; AdamW's groups are untouched."""
    import torch

    from memlab.core.config import load_experiment, load_profile
    from memlab.core.optim import ADAFACTOR_LR, set_lr

    e = load_experiment("tiny")
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.LayerNorm(8))
    ada = build_optimizer(model, load_profile("adafactor").optimizer, e.train, torch.device("cpu"))
    adamw = build_optimizer(model, load_profile("bf16").optimizer, e.train, torch.device("cpu"))
    for opt in (ada, adamw):
        set_lr(opt, e.train.lr / 2)
    assert [g["lr"] for g in ada.param_groups] == pytest.approx([ADAFACTOR_LR / 2] * len(ada.param_groups))
    assert [g["lr"] for g in adamw.param_groups] == pytest.approx([e.train.lr / 2] * len(adamw.param_groups))


@pytest.mark.parametrize("name", ["adamw8bit", "adamw4bit", "bf16_sr", "paged_adamw8bit"])
def test_every_library_optimizer_is_built_by_its_library_class(name, monkeypatch):
    """build_library_optimizer reaches each library's class (adamw8bit once fell out of it, so every real adamw8bit
    run failed at build). The libraries are CUDA-only here: stand-in modules record what was built."""
    import types

    from memlab.core.optim_library import build_library_optimizer

    built = []

    def recorder(cls_name):
        def make(groups, lr, betas, **kw):
            built.append((cls_name, lr, betas, kw))
            return torch.optim.AdamW(groups, lr=lr, betas=betas)

        return make

    classes = ("AdamW8bit", "AdamW4bit", "_AdamW", "PagedAdamW8bit")
    for module in ("torchao.optim", "bitsandbytes.optim"):
        monkeypatch.setitem(sys.modules, module, types.SimpleNamespace(**{c: recorder(c) for c in classes}))
    model = nn.Linear(4, 4)
    train = TrainConfig()
    build_library_optimizer(model, [{"params": list(model.parameters())}], OptimizerConfig(name=name), train)
    want = {"adamw8bit": "AdamW8bit", "adamw4bit": "AdamW4bit", "bf16_sr": "_AdamW", "paged_adamw8bit": "PagedAdamW8bit"}[name]
    assert [b[0] for b in built] == [want] and built[0][1] == train.lr


def test_fused_adamw_takes_the_clip_factor_as_its_grad_scale_and_steps_as_clip_grad_norm_does(tiny, monkeypatch):
    """With fused AdamW the step folds clipping into the optimizer's kernel (no pass of its own over the gradients):
    the same parameters and grad norm as clip_grad_norm_ then foreach AdamW, from the same gradients."""
    from memlab.core.techniques import build_step

    tiny.train.clip = 0.05  # small enough that this step clips
    steps = {}
    for fused in (False, True):
        p = load_profile("fused_adamw")
        p.optimizer.fused = fused
        torch.manual_seed(0)
        steps[fused] = build_step(tiny, p, CPU, vocab_size=64)
    steps[True].model.load_state_dict(steps[False].model.state_dict())
    calls = {False: 0, True: 0}
    norms = {}
    for fused, step in steps.items():
        real = torch.nn.utils.clip_grad_norm_

        def counting(*a, _real=real, _fused=fused, **k):
            calls[_fused] += 1
            return _real(*a, **k)

        monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", counting)
        for q in step.model.parameters():
            q.grad = torch.full_like(q, 0.01) * (1 + torch.arange(q.numel(), dtype=q.dtype).view_as(q) % 7)
        norms[fused], _ = step._optimizer_step()
        monkeypatch.undo()
    assert calls == {False: 1, True: 0}  # the fused step never made a clipping pass
    assert getattr(steps[True].optimizer, "grad_scale").item() > 1  # ... and did clip, through grad_scale
    torch.testing.assert_close(norms[True], norms[False])
    for (name, a), b in zip(steps[False].model.named_parameters(), steps[True].model.parameters()):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-7, msg=name)
