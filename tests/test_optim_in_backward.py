"""optimizer.in_backward: AdamW stepped per parameter from post-accumulate-grad hooks (memlab.core.techniques.
optim_in_backward); the refusals; the profile's [overrides] that turn clipping off; its estimate."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from memlab.core.config import Profile, apply_overrides, load_experiment, load_profile, profile_from_dict, to_dict
from memlab.core.engine import train
from memlab.core.errors import ConfigError
from memlab.core.predict.analytic import estimate
from memlab.core.events import ListSink
from memlab.core.optim import lr_at, set_lr
from memlab.core.techniques import build_step
from memlab.core.techniques import check_plan, check_techniques
from memlab.core.techniques.optim_in_backward import InBackwardOptimizer

CPU = torch.device("cpu")
VOCAB = 128


def _experiment(clip: float = 0.0):
    e = load_experiment("tiny")
    e.train.clip = clip
    return e


def _profile(in_backward: bool, dtype: str = "fp32") -> Profile:
    p = Profile()
    p.precision.dtype = dtype
    p.optimizer.in_backward = in_backward
    return p


def _train(profile: Profile, steps: int = 6):
    """`steps` of the engine's own step (memlab.core.step) on fixed random batches, the lr schedule set as the engine
    sets it (warm-up: it changes every step); the losses, the parameters, and whether any .grad outlived backward."""
    e = _experiment()
    check_techniques(e, profile, CPU)
    torch.manual_seed(e.train.seed)
    step = build_step(e, profile, CPU, VOCAB)
    g = torch.Generator().manual_seed(3)
    losses, grads_left = [], []
    for i in range(steps):
        set_lr(step.optimizer, lr_at(i, e.train, steps))
        x = torch.randint(0, VOCAB, (4, e.model.seq_len), generator=g)
        losses.append(step.run([(x, torch.roll(x, -1, dims=1))]).loss_sum.item())
        grads_left.append([n for n, p in step.model.named_parameters() if p.grad is not None])
    return losses, [p.detach().clone() for p in step.model.parameters()], grads_left, step


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_the_step_in_backward_trains_exactly_as_adamw_without_clipping(dtype):
    """The key correctness check: the same seed, clip 0, accumulation 1; per-parameter AdamW inside backward
    against the ordinary foreach AdamW after backward. Equal up to the two AdamW loops' rounding."""
    ref_losses, ref_params, _, _ = _train(_profile(False, dtype))
    losses, params, grads_left, step = _train(_profile(True, dtype))
    assert isinstance(step.optimizer, InBackwardOptimizer)
    assert len(step.optimizer.optimizers) == len(ref_params)  # one optimizer a parameter (the tied matrix once)
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), rtol=1e-5, atol=1e-6)
    for a, b in zip(params, ref_params):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert ref_losses[-1] < ref_losses[0]  # it trained: the equality is not of two idle models
    assert grads_left == [[]] * len(grads_left)  # every gradient freed by its hook: no buffer after backward


def test_the_lr_schedule_reaches_every_per_parameter_optimizer():
    *_, step = _train(_profile(True), steps=1)
    set_lr(step.optimizer, 0.123)
    lrs = {group["lr"] for opt in step.optimizer.optimizers for group in opt.param_groups}
    assert lrs == {0.123}
    decays = sorted({opt.param_groups[0]["weight_decay"] for opt in step.optimizer.optimizers})
    assert decays == [0.0, _experiment().train.weight_decay]  # the matrices decay, biases and gains do not


def test_the_summary_says_the_step_ran_in_backward_and_that_the_profile_turned_clipping_off():
    e, p = _experiment(clip=1.0), load_profile("optim_in_bwd")
    e.train.steps, e.train.measure_after = 2, 1
    apply_overrides(e, p, [])
    summary = train(e, p, ListSink(), device=CPU)
    assert summary["status"] == "finished"
    assert summary["optimizer"] == "adamw:in_backward (per-parameter step, no gradient buffer)"
    assert summary["overrides"] == "train.clip=0.0"
    assert e.train.clip == 0.0


@pytest.mark.parametrize("change, words", [
    (lambda e, p: setattr(e.train, "clip", 1.0), "cannot clip (train.clip = 1)"),
    (lambda e, p: setattr(p.accumulation, "steps", 2), "step on every micro-batch"),
    (lambda e, p: setattr(p.precision, "dtype", "fp16"), "GradScaler"),
    (lambda e, p: setattr(p.optimizer, "offload", True), "optimizer.offload = false"),
    (lambda e, p: setattr(p.distributed, "mode", "ddp"), "before ddp's gradient reduction"),
    (lambda e, p: setattr(p.distributed, "mode", "fsdp"), "before fsdp's gradient reduction"),
    (lambda e, p: setattr(p.optimizer, "name", "adafactor"), "not adafactor"),
])
def test_what_a_step_inside_backward_cannot_do_is_refused_with_the_reason(change, words):
    e, p = _experiment(), _profile(True)
    change(e, p)
    with pytest.raises(ConfigError, match=words.replace("(", r"\(").replace(")", r"\)")) as info:
        check_plan(e, p, world=2 if p.distributed.mode != "none" else 1)
    assert "\n" not in str(info.value) and "in_backward" in str(info.value)


@pytest.mark.parametrize("sets, words", [(["train.clip=1.0"], "cannot clip"), (["accumulation.steps=2"], "every micro-batch")])
def test_the_cli_refuses_in_one_line_with_exit_2_before_any_work(sets, words, tmp_path, capsys):
    from memlab.cli import main

    args = ["run", "--profile", "optim_in_bwd", "--experiment", "tiny", "--device", "cpu", "--runs-dir", str(tmp_path)]
    with pytest.raises(SystemExit) as exit_:
        main(args + [a for s in sets for a in ("--set", s)])
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert exit_.value.code == 2 and len(lines) == 1 and words in lines[0], err
    assert not any(tmp_path.iterdir())  # no run folder


# ---------------------------------------------------------------------------------------------- [overrides]


def test_a_profile_overrides_experiment_keys_when_the_two_are_resolved():
    p = load_profile("optim_in_bwd")
    assert p.overrides == {"train.clip": 0.0}
    e = load_experiment("gpt2s")
    assert e.train.clip == 1.0
    apply_overrides(e, p, [])
    assert e.train.clip == 0.0
    e2 = load_experiment("gpt2s")
    apply_overrides(e2, copy.deepcopy(p), ["train.clip=0.5"])  # --set wins (and the check then refuses it)
    assert e2.train.clip == 0.5
    assert profile_from_dict(json.loads(json.dumps(to_dict(p)))).overrides == p.overrides  # run.json round trip


def test_a_profile_extending_one_with_overrides_keeps_them_and_adds_its_own(tmp_path):
    f = tmp_path / "mine.toml"
    f.write_text('extends = "optim_in_bwd"\n[overrides]\n"train.warmup_steps" = 3\n')
    assert load_profile(str(f)).overrides == {"train.clip": 0.0, "train.warmup_steps": 3}


@pytest.mark.parametrize("table, words", [
    ('[overrides]\n"clip" = 0\n', 'expected an experiment key as "section.key"'),
    ('[overrides]\n"precision.dtype" = "bf16"\n', "unknown experiment section 'precision'; valid: model, data, train"),
    ('[overrides]\n"train.clipp" = 0\n', "unknown key train.clipp; valid keys in [train]:"),
    ('[overrides]\n"train.clip" = "off"\n', "train.clip' must be a number"),
    ('overrides = 3\n', "[overrides] must be a table"),
])
def test_bad_overrides_are_one_line_errors_naming_the_file_and_the_valid_choices(tmp_path, table, words):
    f = tmp_path / "bad.toml"
    f.write_text(table)
    with pytest.raises(ConfigError) as info:
        load_profile(str(f))
    assert str(f) in str(info.value) and words in str(info.value) and "\n" not in str(info.value)


def test_an_experiment_file_may_not_carry_overrides(tmp_path):
    f = tmp_path / "exp.toml"
    f.write_text('[overrides]\n"train.clip" = 0\n')
    with pytest.raises(ConfigError, match="unknown key 'overrides'"):
        load_experiment(str(f))


# ---------------------------------------------------------------------------------------------- estimate


def test_the_estimate_has_no_gradient_buffer_and_a_lower_peak_by_about_the_gradients():
    e = _experiment()
    e.model.n_layer, e.model.d_model, e.model.n_head, e.model.seq_len = 12, 768, 12, 1024
    plain, in_bwd = copy.deepcopy(load_profile("bf16")), load_profile("optim_in_bwd")
    a = estimate(e, plain, vocab_size=8192, micro_batch=1)
    b = estimate(e, in_bwd, vocab_size=8192, micro_batch=1)
    grad_bytes = 4 * a.params
    assert a.peak_phase == "optimizer step" and a.components["gradients"] == grad_bytes
    assert b.components["optimizer_state"] == a.components["optimizer_state"]  # AdamW's moments, as adamw
    assert b.phases["optimizer step"] < a.phases["optimizer step"] - grad_bytes  # the buffer (and foreach's temps) gone
    assert 0 < a.total_bytes - b.total_bytes <= grad_bytes  # the peak moves to the loss backward
    assert any("in_backward" in n for n in b.notes)
