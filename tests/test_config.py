"""Profiles and experiments: loading, inheritance, overrides, and one-line errors for every bad input."""

from __future__ import annotations

from pathlib import Path

import pytest

from memlab.core import config as C
from memlab.core.errors import ConfigError

BAD = Path(__file__).parent / "bad_configs"

REQUIRED_PROFILES = {"baseline", "tf32", "bf16", "fp16", "gradcp", "gradcp_bf16"}


def test_builtin_profiles_load_and_describe_themselves():
    names = set(C.builtin_names("profile"))
    assert REQUIRED_PROFILES <= names
    for name in names:
        p = C.load_profile(name)
        assert p.name == name
        assert p.description, f"{name} has no description"


def test_extends_inherits_and_overrides():
    p = C.load_profile("gradcp_bf16")
    assert p.precision.dtype == "bf16" and p.attention.kernel == "sdpa"  # from bf16
    assert p.checkpointing.mode == "full"
    assert C.load_profile("tf32").attention.kernel == "eager"  # from baseline
    assert C.load_profile("fp16").precision.dtype == "fp16"


def test_user_profile_file_extends_builtin(tmp_path):
    f = tmp_path / "mine.toml"
    f.write_text('description = "mine"\nextends = "gradcp_bf16"\n[attention]\nkernel = "eager"\n')
    p = C.load_profile(str(f))
    assert (p.name, p.precision.dtype, p.checkpointing.mode, p.attention.kernel) == ("mine", "bf16", "full", "eager")


def test_a_files_extends_path_is_read_beside_it_from_any_working_directory(tmp_path, monkeypatch):
    lab = tmp_path / "lab"
    (lab / "sub").mkdir(parents=True)
    (lab / "base.toml").write_text('description = "base"\nextends = "bf16"\n[checkpointing]\nmode = "full"\n')
    (lab / "sub" / "mine.toml").write_text('description = "mine"\nextends = "../base.toml"\n[attention]\nkernel = "eager"\n')
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    p = C.load_profile(str(lab / "sub" / "mine.toml"))
    assert (p.precision.dtype, p.checkpointing.mode, p.attention.kernel) == ("bf16", "full", "eager")


def test_an_extends_path_still_resolves_from_the_working_directory_where_not_beside_the_file(tmp_path, monkeypatch):
    (tmp_path / "base.toml").write_text('description = "base"\nextends = "bf16"\n[checkpointing]\nmode = "full"\n')
    (tmp_path / "profiles").mkdir()
    (tmp_path / "profiles" / "mine.toml").write_text('description = "mine"\nextends = "base.toml"\n')
    monkeypatch.chdir(tmp_path)
    assert C.load_profile("profiles/mine.toml").checkpointing.mode == "full"


def test_an_extends_cycle_between_files_is_one_line(tmp_path):
    (tmp_path / "a.toml").write_text('description = "a"\nextends = "b.toml"\n')
    (tmp_path / "b.toml").write_text('description = "b"\nextends = "a.toml"\n')
    with pytest.raises(ConfigError, match="forms a cycle") as err:
        C.load_profile(str(tmp_path / "a.toml"))
    assert "\n" not in str(err.value)
    # the chain once, from the file asked for (issue 50: each file along it used to wrap it again)
    a, b = str(tmp_path / "a.toml"), str(tmp_path / "b.toml")
    assert str(err.value) == f"{a}: `extends` forms a cycle: {a} -> {b} -> {a}"


def test_builtin_experiments():
    tiny, gpu = C.load_experiment("tiny"), C.load_experiment("gpt2s")
    assert (gpu.model.n_layer, gpu.model.d_model, gpu.model.n_head, gpu.model.seq_len) == (12, 768, 12, 1024)
    assert tiny.model.d_model < 128
    assert tiny.fingerprint() != gpu.fingerprint()
    assert tiny.fingerprint() == C.load_experiment("tiny").fingerprint()


def test_overrides_route_to_the_owning_section():
    e, p = C.load_experiment("tiny"), C.load_profile("bf16")
    C.apply_overrides(e, p, ["train.batch_size=32", "model.n_layer=4", "attention.window=16", "data.source=./x.jsonl", "train.lr=3e-4"])
    assert (e.train.batch_size, e.model.n_layer, p.attention.window, e.data.source, e.train.lr) == (32, 4, 16, "./x.jsonl", 3e-4)


def test_int_for_float_is_accepted_and_converted():
    e, p = C.load_experiment("tiny"), C.load_profile("bf16")
    C.apply_overrides(e, p, ["train.lr=1"])
    assert e.train.lr == 1.0 and isinstance(e.train.lr, float)


@pytest.mark.parametrize(
    "item, expect",
    [
        ("train.batchsize=3", "unknown key train.batchsize; valid keys in [train]: batch_size"),
        ("trian.batch_size=3", "unknown section 'trian'; valid sections: model, data, train, precision"),
        ("train.batch_size=abc", "train.batch_size must be an integer, got 'abc'"),
        ("train.batch_size=0", "train.batch_size must be at least 1, got 0"),
        ("precision.dtype=fp8", "'fp8' is not valid; choose one of: fp32, tf32, bf16, fp16"),
        ("compile.enabled=yes", "compile.enabled must be true or false"),
        ("batch_size=3", "expected section.key=value"),
        ("train.batch_size", "expected section.key=value"),
        ("model.n_head=5", "model.d_model (64) must be divisible by model.n_head (5)"),
        ("attention.window=-1", "attention.window must be >= 0"),
    ],
)
def test_bad_overrides_raise_one_line_config_errors(item, expect):
    e, p = C.load_experiment("tiny"), C.load_profile("bf16")
    with pytest.raises(ConfigError) as err:
        C.apply_overrides(e, p, [item])
    assert expect in str(err.value)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    "name, expect",
    [
        ("extra_key.toml", "unknown key precision.speed; valid keys in [precision]: dtype"),
        ("not_toml.toml", "not valid TOML"),
        ("wrong_type.toml", "attention.window must be an integer, got 'wide'"),
        ("unknown_section.toml", "unknown key 'precison'; valid: description, extends, name, overrides, [precision]"),
        ("bad_choice.toml", "'fp8' is not valid; choose one of: fp32, tf32, bf16, fp16"),
        ("bad_extends.toml", "unknown profile 'no_such_profile'; built-in profiles: accum"),
        ("zero_accum.toml", "accumulation.steps must be at least 1"),
        ("extends_not_string.toml", "extends must be the name of a built-in profile or a path"),
    ],
)
def test_bad_profile_files_raise_naming_the_problem(name, expect):
    with pytest.raises(ConfigError) as err:
        C.load_profile(str(BAD / name))
    message = str(err.value)
    assert expect in message
    assert "\n" not in message.strip()
    if name not in ("bad_extends.toml",):
        assert name in message  # the file is named


def test_empty_section_is_fine():
    assert C.load_profile(str(BAD / "ok_empty_section.toml")).precision.dtype == "fp32"


def test_unknown_profile_lists_the_builtins():
    with pytest.raises(ConfigError, match="unknown profile .nope.; built-in profiles: accum, act_offload"):
        C.load_profile("nope")


def test_missing_profile_file():
    with pytest.raises(ConfigError, match="profile file not found: ./nope.toml"):
        C.load_profile("./nope.toml")


def test_extends_cycle_is_an_error(tmp_path):
    a, b = tmp_path / "a.toml", tmp_path / "b.toml"
    a.write_text(f'extends = "{b}"\n')
    b.write_text(f'extends = "{a}"\n')
    with pytest.raises(ConfigError, match="cycle"):
        C.load_profile(str(a))


def test_pair_checks_accumulation_and_a_window_as_long_as_the_context_is_full_attention():
    import torch

    from memlab.core.attention import kernel_for
    from memlab.core.techniques import check_techniques

    e, p = C.load_experiment("tiny"), C.load_profile("bf16")
    p.attention.window = e.model.seq_len  # every causal pair is inside it: full attention, and the name says so
    kernel = kernel_for(e, p, torch.device("cpu"))
    assert kernel.window == 0 and kernel.name.endswith("(window 64 >= seq_len 64: full causal attention)"), kernel.name
    p.attention.window, p.accumulation.steps = 0, 3
    with pytest.raises(ConfigError, match=r"train.batch_size \(8\) must be divisible by accumulation.steps \(3\)"):
        check_techniques(e, p, torch.device("cpu"))


def test_round_trip_through_dict():
    p = C.load_profile("gradcp_bf16")
    assert C.profile_from_dict(C.to_dict(p)) == p
    e = C.load_experiment("gpt2s")
    assert C.experiment_from_dict(C.to_dict(e)) == e


def test_describe_changes():
    assert C.describe_changes(C.load_profile("gradcp_bf16")) == "precision.dtype=bf16 checkpointing.mode=full"
