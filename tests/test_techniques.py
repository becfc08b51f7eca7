"""Techniques beyond the model: the CPU-offloaded optimizer computes plain AdamW's update; every built-in profile
either trains a few steps on the CPU backend or stops at once with an error that says it needs CUDA."""

from __future__ import annotations

import copy

import pytest
import torch

from memlab.core.config import Experiment, OptimizerConfig, Profile, TrainConfig, apply_overrides, builtin_names, load_experiment, load_profile
from memlab.core.engine import train
from memlab.core.errors import ConfigError, DeviceError, MemlabError
from memlab.core.events import ListSink
from memlab.core.model import GPT, GPTConfig
from memlab.core.optim import lr_at, set_lr
from memlab.core.techniques.optimizer import build_optimizer
from memlab.core.step import TrainStep
from memlab.core.techniques import check_plan
from memlab.core.techniques import torch_compile
from memlab.core.techniques.optim_offload import CPUOffloadOptimizer, build_offloaded

CPU = torch.device("cpu")
CFG = GPTConfig(n_layer=2, n_head=2, d_model=32, d_ff=64, vocab_size=96, seq_len=16)

# ---------------------------------------------------------------------------------------------- optimizer offload


def _model(seed=0):
    from memlab.core.attention import build_attention
    from memlab.core.config import AttentionConfig

    torch.manual_seed(seed)
    return GPT(CFG, build_attention(AttentionConfig(kernel="sdpa"), CPU, torch.float32))


def _train_steps(model, optimizer, steps=4, scaler=None, train_cfg=None):
    """A few of the engine's own steps (memlab.core.step: clipping at 1.0, zero_grad(set_to_none)), the lr schedule
    through set_lr as the engine sets it; returns losses."""
    train_cfg = train_cfg or TrainConfig(warmup_steps=2, lr=1e-2)
    step = TrainStep(Experiment(train=train_cfg), Profile(), CPU, CFG.vocab_size, model=model, train_model=model,
                     optimizer=optimizer, scaler=scaler)
    g = torch.Generator().manual_seed(7)
    losses = []
    for i in range(steps):
        set_lr(optimizer, lr_at(i, train_cfg, steps))
        x = torch.randint(0, CFG.vocab_size, (3, CFG.seq_len), generator=g)
        losses.append(step.run([(x, torch.roll(x, -1, dims=1))]).loss_sum.item())
    return losses


@pytest.mark.parametrize("name, fused", [("adamw", False), ("adamw", True), ("adafactor", False)])
def test_offloaded_optimizer_computes_the_same_update_as_the_plain_one(name, fused):
    train_cfg = TrainConfig(warmup_steps=2, lr=1e-2, weight_decay=0.1)
    ref_model, off_model = _model(), _model()
    cfg = OptimizerConfig(name=name, fused=fused)
    ref = build_optimizer(ref_model, cfg, train_cfg, CPU)
    off = build_offloaded(off_model, cfg, train_cfg, CPU)
    assert isinstance(off, CPUOffloadOptimizer) and isinstance(off, torch.optim.Optimizer)
    assert _train_steps(ref_model, ref, train_cfg=train_cfg) == _train_steps(off_model, off, train_cfg=train_cfg)
    for (n, a), b in zip(ref_model.named_parameters(), off_model.parameters()):
        torch.testing.assert_close(a, b, atol=0, rtol=0, msg=n)
    # the learning rate the engine sets is the one the CPU optimizer used, and state lives on the CPU
    assert off.inner.param_groups[0]["lr"] == off.param_groups[0]["lr"] == lr_at(3, train_cfg, 4)
    state = off.state_dict()["state"]
    assert state and all(t.device.type == "cpu" for s in state.values() for t in s.values() if isinstance(t, torch.Tensor))
    assert all(p.grad is None for p in off_model.parameters())  # zero_grad(set_to_none=True) reached the model


def test_offloaded_optimizer_works_with_a_grad_scaler_and_skips_overflowing_steps():
    ref_model, off_model = _model(), _model()
    cfg, train_cfg = OptimizerConfig(name="adamw"), TrainConfig(lr=1e-2)
    ref, off = build_optimizer(ref_model, cfg, train_cfg, CPU), build_offloaded(off_model, cfg, train_cfg, CPU)
    _train_steps(ref_model, ref, 3, torch.amp.GradScaler("cpu", init_scale=1024.0))
    _train_steps(off_model, off, 3, torch.amp.GradScaler("cpu", init_scale=1024.0))
    for a, b in zip(ref_model.parameters(), off_model.parameters()):
        torch.testing.assert_close(a, b)
    before = [p.detach().clone() for p in off_model.parameters()]
    scaler = torch.amp.GradScaler("cpu")
    scaler.scale(torch.ones(()))  # starts the scaler's bookkeeping, as scaling the loss would
    for p in off_model.parameters():
        p.grad = torch.full_like(p, float("inf"))
    scaler.step(off)  # inf gradients: the scaler skips the step, the masters and the model stay put
    for a, b in zip(before, off_model.parameters()):
        torch.testing.assert_close(a, b)


def test_offloaded_optimizer_skips_parameters_without_gradients_and_reloads_state():
    model = _model()
    off = build_offloaded(model, OptimizerConfig(), TrainConfig(lr=1e-2), CPU)
    frozen = model.wpe.weight.detach().clone()
    model.wpe.weight.requires_grad_(False)  # no gradient reaches it: it must not move (AdamW would decay it)
    _train_steps(model, off, 2)
    torch.testing.assert_close(model.wpe.weight, frozen, atol=0, rtol=0)
    saved = copy.deepcopy(off.state_dict())
    model.wpe.weight.requires_grad_(True)  # the same parameter groups as `off` had
    again = build_offloaded(model, OptimizerConfig(), TrainConfig(lr=1e-2), CPU)
    again.load_state_dict(saved)
    assert again.state_dict()["state"].keys() == saved["state"].keys()


def apply_compile(model, profile):
    """The compile technique's own door, applied to a step holding `model`; returns what forward would run."""
    step = TrainStep(Experiment(), profile, CPU, CFG.vocab_size, model=model, train_model=model)
    torch_compile.apply(step)
    return step.train_model


def test_offload_refuses_8bit_adamw():
    with pytest.raises(ConfigError, match="adamw or adafactor"):
        build_offloaded(_model(), OptimizerConfig(name="adamw8bit", offload=True), TrainConfig(), CPU)


# ---------------------------------------------------------------------------------------------- built-in profiles

REQUIRED = (
    "baseline tf32 bf16 fp16 flash window gradcp gradcp_bf16 flash_gradcp selective act_offload accum adafactor "
    "adamw8bit optim_offload compile chunked_ce liger_ce cce fastest leanest"
).split()
# On the CPU backend these stop before any work with a DeviceError that says they need CUDA.
# The transformers family's alone: refused on the tiny GPT before any work, naming the family.
HF_ONLY = {"liger"}
NEEDS_CUDA = {"tf32", "act_offload", "act_offload_overlap", "adamw8bit", "optim_offload", "fastest", "leanest", "adamw4bit", "paged_adamw8bit", "float8", "liger_ce", "cce", "qlora", "qlora_gradcp", "gradcp_adamw8bit"}


def _missing_library(profile) -> bool:
    """Whether the profile's optimizer library (an optional extra) is absent here."""
    from memlab.core.optim_library import PACKAGES, require_package

    if profile.optimizer.name not in PACKAGES:
        return False
    try:
        require_package(profile.optimizer.name)
    except ConfigError:
        return True
    return False


def test_every_required_profile_is_built_in_with_a_one_line_description():
    names = builtin_names("profile")
    assert set(REQUIRED) <= set(names)
    for name in names:
        p = load_profile(name)
        assert p.description and "\n" not in p.description and len(p.description) <= 120, name


@pytest.mark.parametrize("experiment", ["gpt2s", "long8k"])
@pytest.mark.parametrize("profile", ["window", "flash", "bf16", "accum", "leanest"])
def test_gpu_experiments_accept_the_long_context_profiles(experiment, profile):
    check_plan(load_experiment(experiment), load_profile(profile))


@pytest.mark.parametrize("name", builtin_names("profile"))
def test_every_builtin_profile_trains_on_cpu_or_says_it_needs_cuda(name, tiny):
    """Two steps of the tiny experiment. compile is turned off here (a cold compile costs ~30 s on 2 cores: it has
    its own test below); a window is shrunk to fit the tiny experiment's 64 tokens."""
    profile = load_profile(name)
    overrides = ["train.steps=2", "train.measure_after=1", "compile.enabled=false"]
    if profile.attention.window:
        overrides.append("attention.window=16")
    if profile.checkpointing.budget < 1:
        overrides.append("checkpointing.budget=1")  # a compile setting; compiled under a budget in test_ckpt_frontier
    apply_overrides(tiny, profile, overrides)
    sink = ListSink()
    if name in HF_ONLY:
        with pytest.raises(ConfigError, match="model.family = hf, not gpt"):
            train(tiny, profile, sink, device=CPU)
        assert not sink.of("step")
        return
    missing = _missing_library(profile)
    if missing and name not in NEEDS_CUDA:  # CI installs no extras: refused before any work, naming the extra
        with pytest.raises(ConfigError, match=r"pip install 'memlab\["):
            train(tiny, profile, sink, device=CPU)
        assert not sink.of("step")
        return
    if name in NEEDS_CUDA:
        with pytest.raises(DeviceError, match="CUDA"):
            train(tiny, profile, sink, device=CPU)
        assert not sink.of("step")  # refused before any work
        return
    summary = train(tiny, profile, sink, device=CPU)
    assert summary["status"] == "finished", sink.of("failed")
    assert summary["steps"] == 2 and summary["val_loss"] is not None
    kernel = summary["attention_kernel"]
    if profile.attention.kernel in ("flash", "flex"):
        assert kernel.startswith("sdpa:") and kernel.endswith(")"), kernel  # the fallback, and why
    if profile.attention.window:
        assert kernel.startswith("sdpa:masked"), kernel


def test_apply_compile_wraps_the_model_only_when_enabled():
    p = load_profile("compile")
    model = _model()
    compiled = apply_compile(model, p)
    assert compiled is not model and isinstance(compiled, torch._dynamo.eval_frame.OptimizedModule)
    assert apply_compile(model, load_profile("bf16")) is model


def test_tune_kernels_spells_the_mode_as_options_and_adds_coordinate_descent(monkeypatch):
    seen = []
    monkeypatch.setattr(torch, "compile", lambda model, **kw: seen.append(kw) or model)
    p = load_profile("compile")
    apply_compile(_model(), p)
    p.compile.tune_kernels = True
    apply_compile(_model(), p)
    p.compile.mode = "reduce-overhead"
    apply_compile(_model(), p)
    assert seen == [
        {"mode": None},
        {"options": {"coordinate_descent_tuning": True}},
        {"options": {"triton.cudagraphs": True, "coordinate_descent_tuning": True}},
    ]


@pytest.mark.parametrize("mode", ["reduce-overhead", "max-autotune"])
def test_cuda_graph_compile_modes_are_refused_with_the_reason_and_the_valid_modes(mode):
    """CUDA graphs keep a memory pool outside the per-phase peak resets: memory would be measured wrong."""
    p = load_profile("compile")
    p.compile.mode = mode
    with pytest.raises(ConfigError, match="CUDA graphs") as e:
        torch_compile.check(load_experiment("tiny"), p, CPU, 1)
    assert "'default'" in str(e.value) and "'max-autotune-no-cudagraphs'" in str(e.value) and "\n" not in str(e.value)
    p.compile.mode = "max-autotune-no-cudagraphs"
    torch_compile.check(load_experiment("tiny"), p, CPU, 1)  # no CUDA graphs: accepted


def test_compile_profile_trains_and_reports_compile_time_apart(tiny, monkeypatch):
    """The engine path of `compile`, traced by Dynamo and AOTAutograd (forward and backward) but without Inductor's
    C++ code generation, which costs ~30 s cold on 2 cores (the real thing: the next test, and bench/techniques.py)."""
    real_compile = torch.compile
    monkeypatch.setattr(torch, "compile", lambda model, mode=None, **kw: real_compile(model, backend="aot_eager", **kw))
    torch._dynamo.reset()
    p = load_profile("compile")
    apply_overrides(tiny, p, ["train.steps=3", "train.measure_after=1", "precision.dtype=fp32"])
    try:
        summary = train(tiny, p, ListSink(), device=CPU)
    finally:
        torch._dynamo.reset()  # leave no aot_eager graphs behind for later tests
    assert summary["status"] == "finished" and summary["compile"] == "default"
    # compile time is its own figure, and the measured steps (after the first) do not include it
    assert summary["compile_s"] is not None and summary["compile_s"] > 0
    assert summary["time_to_first_step_s"] > summary["compile_s"]


@pytest.mark.slow
def test_inductor_compiles_the_model_and_changes_nothing():
    """One real (cold) Inductor compile, forward only: ~30 s on 2 CPU cores."""
    model = _model().eval()
    compiled = apply_compile(model, load_profile("compile"))
    x = torch.randint(0, CFG.vocab_size, (2, CFG.seq_len))
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), atol=1e-5, rtol=1e-5)


def test_a_knob_the_cpu_cannot_honour_is_an_error_not_a_crash(tiny):
    for name in sorted(NEEDS_CUDA):
        with pytest.raises(MemlabError):
            train(tiny, load_profile(name), ListSink(), device=CPU)


def test_fp16_step_adds_no_host_sync_beyond_the_grad_scalers_own(monkeypatch):
    """Skipped steps are counted from the scaler's found-inf flags on the device, read at summary time: the step
    reads one scalar back (GradScaler.step's own), not get_scale() before and after."""
    model = _model()
    opt = build_optimizer(model, OptimizerConfig(name="adamw"), TrainConfig(lr=1e-2), CPU)
    scaler = torch.amp.GradScaler("cpu", init_scale=1e38)  # the scaled loss overflows: the first step is skipped
    step = TrainStep(Experiment(train=TrainConfig(lr=1e-2)), Profile(), CPU, CFG.vocab_size, model=model,
                     train_model=model, optimizer=opt, scaler=scaler)
    monkeypatch.setattr(torch.amp.GradScaler, "get_scale", lambda self: pytest.fail("get_scale() syncs the host"))
    reads = []
    real_item = torch.Tensor.item
    monkeypatch.setattr(torch.Tensor, "item", lambda t: reads.append(1) or real_item(t))
    x = torch.randint(0, CFG.vocab_size, (3, CFG.seq_len), generator=torch.Generator().manual_seed(0))
    batch = [(x, torch.roll(x, -1, dims=1))]
    skipped = step.run(batch).skipped
    assert len(reads) == 1  # GradScaler.step's own read of found_inf
    assert isinstance(skipped, torch.Tensor) and bool(skipped)
    scaler.update(1024.0)  # a scale that does not overflow
    assert not bool(step.run(batch).skipped)
