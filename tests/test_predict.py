"""The prediction seam (memlab.core.predict): one interface, where it is calibrated, its cache, one max batch, the
longest sequence, its refusals, the Inductor reader's canary, and the CPU backend's refusal of a step the host
cannot hold."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from memlab.core.config import apply_overrides, load_experiment, load_profile
from memlab.core.errors import ConfigError
from memlab.core.predict import Card, card_for, max_batch, max_seq_len, predict, valid_for
from memlab.core.predict import analytic, calibration, fake, host, inductor, maxbatch, prediction

ROOT = Path(__file__).resolve().parents[1]


def _cli(capsys, *args: str) -> tuple[int, str, str]:
    from memlab.cli import main

    try:
        main(list(args))
        code = 0
    except SystemExit as e:
        code = e.code or 0
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture
def tiny():
    return load_experiment("tiny"), load_profile("bf16")


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MEMLAB_CACHE", str(tmp_path / "cache"))


def test_one_prediction_carries_peaks_breakdown_method_and_where_it_is_calibrated(tiny):
    e, p = tiny
    got = predict(e, p, 4, card_for("2GiB"), method="analytic")
    assert got.method == "analytic" and got.micro_batch == 4 and got.reserved_bytes is None
    assert got.allocated_bytes == sum(got.components.values()) == got.total_bytes
    assert set(got.components) == set(analytic.COMPONENTS) and got.peak_phase in got.phases
    assert got.valid_for.gpu == calibration.ASSUMED_GPU and got.valid_for.calibrated and got.fits
    traced = predict(e, p, 4, card_for("2GiB"))  # the default method: the real step on fake tensors, replayed
    assert traced.method == "trace" and traced.allocated_bytes <= traced.reserved_bytes
    assert traced.allocated_bytes == traced.total_bytes  # the breakdown adds up to the replay's tensors


def test_a_cached_shape_answers_in_under_a_second_and_a_new_batch_is_a_new_entry(tiny, tmp_path):
    e, p = tiny
    first = predict(e, p, 4, card_for("2GiB"))
    t0 = time.perf_counter()
    again = predict(e, p, 4, card_for("2GiB"))
    assert time.perf_counter() - t0 < 1.0 and again == first
    predict(e, p, 2, card_for("2GiB"))
    predict(e, p, 2, card_for("2GiB"), method="analytic")  # instant: not kept
    assert len(list((tmp_path / "cache" / "predictions").glob("*.json"))) == 2


ERR = calibration.UNCALIBRATED_ERROR_PCT


@pytest.mark.parametrize("gpu, version, note", [
    (None, "2.13.0+cpu", ""),
    ("NVIDIA H100 80GB HBM3", "2.11.0+cu130", ""),
    ("NVIDIA A100-SXM4-80GB", "2.13.0", f"not calibrated for an A100: expect +-{ERR['gpu']}%"),
    ("NVIDIA H100 80GB HBM3", "2.14.0", f"not calibrated for torch 2.14: expect +-{ERR['torch']}%"),
    ("Tesla T4", "2.14.0", f"not calibrated for torch 2.14 / a T4: expect +-{max(ERR['torch'], ERR['gpu'])}%"),
])
def test_outside_the_calibrated_gpu_and_torch_the_prediction_says_so(gpu, version, note):
    got = valid_for(gpu, torch_version=version)
    assert got.note() == note and got.calibrated == (not note)


def test_a_library_release_other_than_the_stand_ins_is_outside_the_calibration(monkeypatch):
    monkeypatch.setattr(calibration, "installed_version", lambda dist: "9.9.9")
    assert valid_for(None, ("torchao",)).note() == f"not calibrated for torchao 9.9.9: expect +-{ERR['library']}%"
    assert load_profile("adamw8bit").optimizer.name == "adamw8bit"
    from memlab.core.techniques import memory_libraries

    assert memory_libraries(load_profile("adamw8bit")) == ("torchao",) and memory_libraries(load_profile("bf16")) == ()


def test_every_view_of_estimate_says_when_it_is_not_calibrated(capsys, monkeypatch):
    monkeypatch.setattr(torch, "__version__", "2.14.0")
    note = f"not calibrated for torch 2.14: expect +-{ERR['torch']}%"
    code, out, _ = _cli(capsys, "estimate", "--profile", "bf16", "--experiment", "tiny", "--method", "analytic")
    assert code == 0 and note in out
    code, out, _ = _cli(capsys, "estimate", "--profile", "bf16", "--experiment", "tiny", "--method", "analytic", "--json")
    assert code == 0 and json.loads(out)["valid_for"] == {
        "gpu": "H100", "torch": "2.14", "libraries": {}, "calibrated": False, "outside": ["torch 2.14"],
        "error_pct": ERR["torch"], "note": note}


def test_estimate_json_carries_one_max_batch_and_names_the_others(capsys):
    code, out, _ = _cli(capsys, "estimate", "--profile", "gradcp_bf16", "--experiment", "tiny", "--gpu-memory", "1.5GiB", "--json")
    got = json.loads(out)
    assert code == 0 and "max_batch_to_plan" not in got
    assert 1 <= got["max_batch"] <= got["analytic_max_batch"] and got["max_batch"] <= got["replayed"]["max_batch"]


def test_the_longest_sequence_is_the_last_multiple_that_fits(tiny):
    e, p = tiny
    card = Card(2 * 2**30, None, "test")
    budget = analytic.usable_bytes(card.total_bytes, profile=p)

    def fits(exp) -> bool:
        return analytic.estimate(exp, p, vocab_size=512, micro_batch=8).total_bytes <= budget

    longest = max_seq_len(e, p, card, 8, fits=fits)
    assert longest % maxbatch.SEQ_GRANULE == 0 and longest > e.model.seq_len
    assert fits(prediction.with_seq_len(e, longest)) and not fits(prediction.with_seq_len(e, longest + maxbatch.SEQ_GRANULE))


@pytest.mark.parametrize("args, message", [
    (["--gpu-memory", "2GiB", "--set", "model.d_model=4096", "--set", "model.n_layer=16", "--set", "model.n_head=16"],
     r"the weights need \d+\.\d\d GiB; the card has 2.00 GiB \(--gpu-memory 2GiB\)"),
    (["--gpu-memory", "1MiB"], "is smaller than what a run holds outside the allocator"),
    (["--method", "guess"], r"--method 'guess' is not valid; choose one of: auto, analytic, trace, fake"),
])
def test_bad_input_to_estimate_is_one_line_and_exit_2(capsys, args, message):
    code, out, err = _cli(capsys, "estimate", "--profile", "bf16", "--experiment", "tiny", *args)
    assert code == 2 and re.search(message, err) and len(err.strip().splitlines()) == 1 and not out


def test_a_sequence_longer_than_the_models_positions_is_refused(tiny, monkeypatch):
    from memlab.core.predict import prediction

    e, p = tiny
    monkeypatch.setattr(prediction, "max_positions", lambda experiment: 32)  # as a transformers config would say
    with pytest.raises(ConfigError, match=r"model.seq_len = 64 is longer than the model's 32 positions"):
        predict(e, p, 1, card_for(None), method="analytic")


def test_a_family_without_a_formula_is_refused_the_analytic_method_and_a_technique_without_a_stand_in(tiny, monkeypatch):
    from memlab.core.predict import prediction

    e, _ = tiny
    monkeypatch.setattr(prediction, "family_of", lambda experiment: "hf")
    with pytest.raises(ConfigError, match="the analytic method describes the gpt family only, not hf"):
        predict(e, load_profile("bf16"), 1, card_for(None), method="analytic")
    int8 = load_profile("qlora")
    int8.finetune.base = "int8"  # bitsandbytes' 8-bit base: no stand-in declared
    with pytest.raises(ConfigError, match="qlora: .*needs a fake-tensor stand-in declared next to the technique"):
        predict(e, int8, 1, card_for(None))


def test_fsdp_is_refused_by_the_trace_and_the_gpt_family_falls_back_to_its_formula(tiny, monkeypatch):
    e, _ = tiny
    fsdp = load_profile("fsdp_bf16")
    kept = predict(e, fsdp, 2, card_for(None), use_cache=False)  # memlab's GPT: the formula's figure, named so
    assert kept.method == "analytic" and kept.reserved_bytes is None
    assert kept.allocated_bytes == predict(e, fsdp, 2, card_for(None), method="analytic").allocated_bytes
    assert any("no stand-in for FSDP2's all-gathers" in note for note in kept.notes)
    found = max_batch(e, fsdp, card_for("1.5GiB"), replay=True)
    assert found.replayed is None and found.max_batch == found.analytic_bound and "FSDP2" in found.not_replayed
    monkeypatch.setattr(prediction, "family_of", lambda experiment: "hf")  # a family without the formula: refused
    with pytest.raises(ConfigError, match="fsdp_bf16: the trace has no stand-in for FSDP2's all-gathers"):
        predict(e, fsdp, 2, card_for(None), use_cache=False)


def test_a_process_groups_communicator_leaves_the_allocator_less_of_the_card(tiny):
    from memlab.core.techniques.distributed import PROCESS_GROUP_BYTES

    e, _ = tiny
    card, ddp = card_for("2GiB"), load_profile("ddp_bf16")
    assert card.budget_for(load_profile("bf16")) == card.budget_bytes  # no group: the context alone
    assert card.budget_for(ddp) == card.budget_bytes - PROCESS_GROUP_BYTES  # NCCL's, outside the allocator
    assert predict(e, ddp, 2, card, use_cache=False).outside_bytes == PROCESS_GROUP_BYTES
    assert maxbatch.replay_for_card(e, ddp, card, at=2, limit=4).budget_bytes == card.budget_for(ddp)


def test_a_family_without_the_formula_plans_with_the_replay_alone(tiny, monkeypatch):
    e, p = tiny
    for module in (prediction, maxbatch):
        monkeypatch.setattr(module, "family_of", lambda experiment: "hf")
    found = max_batch(e, p, card_for("1.5GiB"), replay=False)
    assert found.analytic_bound is None and found.replayed is not None
    assert found.max_batch == found.replayed.max_batch >= 1
    assert maxbatch.predicted_max_batch(e, p, 3 * 2**29) is None  # no formula and no replay: no hint, the search starts at 1


def test_the_inductor_reader_refuses_a_wrapper_format_it_does_not_know():
    body = ["primals_1, primals_2 = args", "buf0 = empty_strided_cuda((8, 64), (64, 1), torch.float32)", "return (buf0, )"]
    inductor.check_wrapper_format(body)  # the format it reads
    changed = [body[0], "buf0 = torch.empty_strided_cuda(size=(8, 64), stride=(64, 1), dtype=torch.float32)", body[2]]
    with pytest.raises(inductor.WrapperFormatChanged, match="not in the format memlab.core.predict.inductor reads"):
        inductor.check_wrapper_format(changed)


def test_this_torch_is_a_release_the_wrapper_reader_was_checked_under():
    """The version guard: a new torch release fails here until the Inductor canary passes under it and its release
    is added to calibration.INDUCTOR_WRAPPER_TORCH."""
    assert calibration.torch_release() in calibration.INDUCTOR_WRAPPER_TORCH, (
        f"torch {calibration.torch_release()}: run the Inductor canary (tests/test_compile_budget_model.py::test_the_"
        "inductor_reader_reads_this_torchs_wrapper_code) and add the release to calibration.INDUCTOR_WRAPPER_TORCH")


def test_the_cpu_backend_refuses_a_step_the_host_cannot_hold(capsys, monkeypatch):
    monkeypatch.setattr(host, "host_available_bytes", lambda: 2**20)
    code, out, err = _cli(capsys, "run", "--profile", "baseline", "--experiment", "tiny", "--device", "cpu",
                          "--runs-dir", "unused-runs")
    assert code == 2 and len(err.strip().splitlines()) == 1 and not Path("unused-runs").exists()
    assert "of host memory (predicted at seq_len 64); this machine has 0.00 GiB available" in err and "--force" in err


def test_a_200_billion_parameter_gpt_is_more_than_this_host_has():
    e, p = load_experiment("tiny"), load_profile("baseline")
    big = prediction.with_seq_len(e, 64)
    big.model.d_model, big.model.n_head, big.model.n_layer = 16384, 16, 64
    assert host.host_peak_bytes(big, p) > host.host_available_bytes()
    with pytest.raises(ConfigError, match="host memory .* pass --force to try anyway"):
        host.refuse_over_host(big, p)


def test_the_predictor_has_no_function_local_imports_and_is_in_no_import_loop():
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "import_loops.py"), "--under", "core/predict"],
                         capture_output=True, text=True, check=True).stdout
    assert "function-local memlab imports: 0" in out and "core.predict" not in out


def test_no_module_of_memlab_is_in_an_import_loop():
    """Issue 46: the loop the predictor sat in ran on through the techniques, the model, the optimizers and the step,
    held together by imports inside functions; none is left (a local import now only defers something heavy)."""
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "import_loops.py")], capture_output=True, text=True, check=True).stdout
    assert "import loop" not in out, out


@pytest.mark.parametrize("experiment, profile, sets, reads", [
    ("tiny", "compile", [], True),  # memlab's GPT
    ("llama-tiny", "compile", [], True),  # a transformers Llama: its own compiled graphs
    ("llama-tiny", "bf16", [], False),  # nothing compiled
    ("llama-tiny", "lora_fast", [], True),  # peft's LoRA on a bf16 base: the reader builds the adapters too
    ("llama-tiny", "lora_fast", ['finetune.method="dora"'], False),  # not DoRA's: the eager upper bound
    ("llama-tiny", "lora_fast", ['finetune.base="nf4"'], False),  # nor a 4-bit base (bitsandbytes needs CUDA)
    ("llama-tiny", "compile", ['model.source="gemma-2-2b"', "model.n_layer=2", "model.seq_len=64"], False),  # windows, soft-cap
])
def test_the_replay_reads_a_compiled_steps_own_graphs_where_the_tracer_builds_that_model(experiment, profile, sets, reads):
    e, p = load_experiment(experiment), load_profile(profile)
    apply_overrides(e, p, sets)
    assert fake.reads_compiled_graphs(e, p) is reads


def test_a_compiled_step_whose_tracing_child_fails_keeps_the_eager_figures_and_says_why(tmp_path, monkeypatch):
    """A transformers model Dynamo splits, or an op Inductor cannot lower here: the prediction is the eager step's
    (an upper bound), with a note, not a traceback."""
    monkeypatch.setenv("MEMLAB_CACHE", str(tmp_path))
    monkeypatch.setattr(inductor, "_run_child", lambda cmd: (1, "", "Traceback ...\nUnsupported: a graph break"))
    inductor.step_events.cache_clear()
    e, p = load_experiment("llama-tiny"), load_profile("compile")
    got = predict(e, p, 2, card_for("80GiB"), use_cache=False)
    assert any("tracing the compiled step failed: Unsupported: a graph break" in n for n in got.notes), got.notes
    eager = fake.fake_estimate(e, p, vocab_size=analytic.vocab_for(e)[0], micro_batch=2)  # the eager step's tensors
    assert got.allocated_bytes == eager.total_bytes > 0 and got.reserved_bytes is None
