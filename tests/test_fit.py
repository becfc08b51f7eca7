"""`memlab fit` and what it stands on (issue 47): the predictor traces LoRA, DoRA and a 4-bit base on fake tensors;
a deep step's trace made from five blocks; the search from a guess; the command's table and refusals.
All on llama-tiny (the Llama architecture, CPU-sized): each trace takes a fraction of a second."""

from __future__ import annotations

import json
import random

import pytest

pytest.importorskip("transformers")
pytest.importorskip("peft")

from memlab.core.config import apply_overrides, load_experiment, load_profile  # noqa: E402
from memlab.core.predict import card_for  # noqa: E402
from memlab.core.predict.analytic import vocab_for  # noqa: E402
from memlab.core.predict.search import largest_near  # noqa: E402


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MEMLAB_CACHE", str(tmp_path / "cache"))


def _tiny(profile: str, *sets: str):
    e, p = load_experiment("llama-tiny"), load_profile(profile)
    apply_overrides(e, p, list(sets))
    return e, p


@pytest.mark.parametrize("seed", range(3))
def test_largest_near_finds_the_largest_size_that_fits_from_any_guess(seed):
    rng = random.Random(seed)
    for _ in range(500):
        answer, limit, guess = rng.randint(0, 300), rng.randint(1, 400), rng.randint(-5, 500)
        asked = []

        def fits(b: int) -> bool:
            assert 1 <= b <= limit
            asked.append(b)
            return b <= answer

        assert largest_near(fits, guess, limit, confirm=rng.randint(0, 2)) == min(answer, limit)
        assert len(asked) == len(set(asked))  # each size asked once


@pytest.mark.parametrize("answer", [10, 100, 250])
def test_a_right_guess_costs_itself_one_above_and_the_ladder_below(answer):
    """A guess on the answer asks it and the size above; confirming adds the ladder's rungs, 1, 2, 4, ... below,
    down to an eighth (log2(answer / 8) + 1 of them), nothing else."""
    asked = []

    def fits(b: int) -> bool:
        asked.append(b)
        return b <= answer

    assert largest_near(fits, answer, 400) == answer and asked == [answer, answer + 1]
    asked.clear()
    rungs = [answer - 2**k for k in range(8) if 2**k <= max(1, answer // 8)]
    assert largest_near(fits, answer, 400, confirm=True) == answer and asked == [answer, answer + 1, *rungs]


@pytest.mark.parametrize("profile", ["gradcp_bf16", "lora", "adafactor"])
def test_a_deep_steps_trace_made_from_five_blocks_is_the_trace_at_its_depth(profile):
    """deep_trace: the build and both steps of 11 blocks made from a trace of 5 allocate the same sizes by the same
    ops in the same order, and the allocator replays them to the same peaks (bench/deepen_check.py, every profile)."""
    from memlab.core.predict import trace
    from memlab.core.predict.allocator import replay

    e, p = _tiny(profile, "model.n_layer=11")
    vocab = vocab_for(e)[0]
    made = trace.deep_trace(e, p, vocab_size=vocab, micro_batch=2)
    traced = trace.fake_trace(e, p, vocab_size=vocab, micro_batch=2)
    assert made is not None
    assert [ev[2:] for ev in made if ev[0] == "alloc"] == [ev[2:] for ev in traced if ev[0] == "alloc"]
    a, b = replay(made), replay(traced)
    assert (a.peak_allocated, a.peak_reserved) == (b.peak_allocated, b.peak_reserved)


def test_a_step_that_does_not_repeat_block_by_block_is_traced_at_its_depth():
    """What each technique declares does not repeat (a compiled step, a captured one, freeze's last blocks, every-n
    checkpointing), and a model too shallow to gain, are not made; nor are blocks whose traces differ."""
    from memlab.core.predict import deepen, trace

    assert trace.deep_trace(*_tiny("bf16", "model.n_layer=9"), vocab_size=512, micro_batch=1) is None
    for name in ("compile", "freeze", "gradcp_every2"):
        e, p = _tiny(name, "model.n_layer=12")
        assert trace.deep_trace(e, p, vocab_size=512, micro_batch=1) is None, name

    def block(i: int, extra: int = 0) -> list[tuple]:  # forward: a block's output, and what it frees of the last's
        made = [(deepen.BLOCK, i, 0, ""), ("alloc", f"out{i}", 64 + extra, "mm")]
        return made + ([("free", f"out{i - 1}", 0, "")] if i else [])

    steps = [("steps", None, 0, ""), ("phase", "forward", 0, "")]
    owners = deepen.Owners({}, {}, 0)
    alike = steps + [ev for i in range(5) for ev in block(i)]
    made = deepen.deepened(alike, owners, 8)
    assert [ev[2] for ev in made if ev[0] == "alloc"] == [64] * 8
    assert sum(ev[0] == "free" for ev in made) == 7
    unlike = steps + [ev for i in range(5) for ev in block(i, extra=i == deepen.MIDDLE)]
    assert deepen.deepened(unlike, owners, 8) is None and "does not repeat" in deepen.refusal[0]


def test_lora_and_a_4bit_base_are_traced_with_what_they_keep():
    from memlab.core.predict import predict

    card = card_for("80GiB")
    weights = {}
    for profile in ("bf16", "lora", "qlora"):
        e, p = _tiny(profile, "model.n_layer=1")
        got = predict(e, p, 2, card)
        assert got.method == "trace" and got.allocated_bytes > 0, profile
        weights[profile] = got.components["weights"]
    # the frozen bf16 base holds half of full training's fp32 weights, plus the fp32 adapters; NF4 about a quarter of bf16
    e, _ = _tiny("lora", "model.n_layer=1")
    linear = _block_linear_weights(e)
    assert weights["lora"] < weights["bf16"]
    assert weights["lora"] - weights["qlora"] == pytest.approx(2 * linear - _nf4_bytes(e), rel=0.02)


def test_the_searches_guess_aims_at_the_reserve_the_verdict_allows():
    """fit's guesses aim at verdict_room, the largest reserve trace_fits accepts (the card less the margin's share of
    what the step adds to the built model's reserve): a card one byte either side of it flips the verdict."""
    from memlab.core.predict.axis import Axis, batches
    from memlab.core.predict.card import Card
    from memlab.core.techniques.accumulation import single

    e, p = _tiny("lora", "model.n_layer=2")
    one, vocab = single(p), vocab_for(e)[0]

    def axis(total: int) -> Axis:
        return batches(e, one, vocab, Card(total, None, "test", capped=True))

    probe = axis(2**34)
    reserved = probe.peaks(2)[1]
    room = probe.verdict_room(2)
    assert reserved < room < probe.budget  # the built model's reserve needs no headroom: above the card's 97%
    # the card whose verdict_room is exactly the step's reserve: that card fits it, one a few bytes smaller does not
    total = 2**34 - (room - reserved) * 103 // 100
    at, below = axis(total), axis(total - 8)
    assert at.verdict_room(2) >= reserved > below.verdict_room(2)
    assert at.fits(2) and not below.fits(2)


def test_the_4bit_stand_in_frees_each_bf16_weight_as_its_layer_is_quantized():
    """finetune._quantize drops each bf16 Linear once its 4-bit twin is in place, so the build peaks at about the bf16
    model, not the bf16 model plus the whole 4-bit base (Llama-3.1-8B on an H200: 16.07 GB, replayed 16.24; with
    every bf16 weight freed last it replayed 19.83, bench/results/qlora-build-h200)."""
    from memlab.core.predict.allocator import STEPS, Allocator, replayed
    from memlab.core.techniques.accumulation import single
    from memlab.core.predict.trace import step_trace

    e, p = _tiny("qlora", "model.n_layer=2")
    events = step_trace(e, single(p), vocab_size=vocab_for(e)[0], micro_batch=2)
    model = Allocator()
    for event in events[:next(i for i, ev in enumerate(events) if ev[0] == STEPS)]:
        replayed(model, event)
    linear, nf4 = 2 * _block_linear_weights(e), _nf4_bytes(e)
    largest_layer_nf4 = max(_nf4_bytes(e, [m]) for m in _targets(e))
    assert model.peak_allocated - model.allocated <= linear - nf4 + largest_layer_nf4


def _targets(e) -> list:
    from memlab.core.models import family
    from memlab.core.techniques.finetune import target_layers

    return list(target_layers(family.skeleton(e), "all-linear").values())


def _block_linear_weights(e) -> int:
    from memlab.core.models import family
    from memlab.core.techniques.finetune import target_layers

    return sum(m.weight.numel() for m in target_layers(family.skeleton(e), "all-linear").values())


def _nf4_bytes(e, layers: list | None = None) -> int:
    from memlab.core.predict.standins import NF4_BLOCK, NF4_NESTED_BLOCK

    total = 0
    for m in layers if layers is not None else _targets(e):
        n = m.weight.numel()
        blocks = -(-n // NF4_BLOCK)
        total += -(-n // 2) + blocks + 4 * -(-blocks // NF4_NESTED_BLOCK)
    return total


@pytest.mark.slow
def test_fit_table_answers_each_axis_with_the_largest_size_the_replay_fits(capsys):
    from memlab.cli import main
    from memlab.core.predict.axis import batches
    from memlab.core.techniques.accumulation import single
    from memlab.core.predict.prediction import with_seq_len

    one_block = "model.n_layer=1"  # the search is what is checked: one block traces faster
    main(["fit", "--experiment", "llama-tiny", "--profiles", "lora", "--gpu-memory", "1.6GiB", "--format", "json",
          "--set", one_block])
    out = json.loads(capsys.readouterr().out)
    assert "micro-batch 8 x 64 tokens" in out["header"] and "without an allocator retry" in out["header"]
    card = card_for("1.6GiB")
    for row in out["rows"]:
        e, p = _tiny(row["profile"], one_block)
        p, vocab = single(p), vocab_for(e)[0]
        assert row["fits"] and row["max_batch"] > 8 and row["longest_seq"] > 64

        def fits(exp, b):
            return batches(exp, p, vocab, card).fits(b)

        # the search asked the answers themselves (largest_near: test above); one size more does not fit
        assert not fits(e, row["max_batch"] + 1)
        assert not fits(with_seq_len(e, row["longest_seq"] + 64), 1)


@pytest.mark.parametrize("args, expect", [
    (["--profiles", "lora,nope"], "unknown profile 'nope'"),
    (["--profiles", "lora,lora"], "--profiles names a profile twice: lora,lora"),
    (["--profiles", ","], "--profiles is empty"),
    (["--gpu-memory", "lots"], "lots"),
    (["--measure"], "memlab fit --measure needs CUDA"),
    (["--predicted", "/nonexistent/fit.json"], "--predicted /nonexistent/fit.json: not the JSON of memlab fit --format json"),
])
def test_fit_refuses_bad_input_in_one_line(args, expect, capsys):
    from memlab.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["fit", "--experiment", "llama-tiny", *(["--profiles", "lora"] if "--profiles" not in args else []), *args])
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert exit_.value.code == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert expect in lines[0], lines[0]


def test_a_card_smaller_than_a_transformers_models_weights_is_refused_before_any_trace(capsys):
    from memlab.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["estimate", "--experiment", "llama-8b", "--profile", "qlora_gradcp", "--gpu-memory", "4GiB"])
    err = capsys.readouterr().err.strip()
    # 4-bit block weights and bf16 embeddings, head and norms: 5.61 GiB for Llama-3.1-8B
    assert exit_.value.code == 2 and "\n" not in err
    assert "the weights need 5.61 GiB; the card has 4.00 GiB (--gpu-memory 4GiB)" in err, err


def test_ddp_ranks_each_hold_the_weights_so_a_card_smaller_than_them_is_refused_and_fsdp_is_not():
    from memlab.core.errors import ConfigError
    from memlab.core.predict.prediction import refuse_weights_over_card

    card = card_for("4GiB")
    e = load_experiment("llama-1b")  # 1.24B parameters: 4.6 GiB of fp32 weights under bf16 autocast
    with pytest.raises(ConfigError, match="the weights need .* GiB; the card has 4.00 GiB"):
        refuse_weights_over_card(e, load_profile("ddp_bf16"), card)
    refuse_weights_over_card(e, load_profile("fsdp_bf16"), card)  # each rank holds its share


@pytest.mark.parametrize("name", ["bf16", "lora", "dora", "freeze"])
def test_fits_trainable_count_on_the_skeleton_is_what_the_engine_trains(name):
    """memlab fit counts trainable parameters on the meta skeleton (an 8B model is never built); the engine counts
    them on the model it built, adapters and all. (On the H100, Llama-3.2-1B's lora: 11,272,192; dora: 11,649,024.)"""
    import torch

    from memlab.core.models import family
    from memlab.core.techniques import build_step
    from memlab.core.techniques import finetune

    e, p = load_experiment("llama-tiny"), load_profile(name)
    step = build_step(e, p, torch.device("cpu"), vocab_for(e)[0])
    assert finetune.trainable_params(family.skeleton(e), p) == step.applied["trainable_params"] > 0


def test_a_profile_whose_weights_alone_exceed_the_card_is_not_searched():
    """Full training of an 8B model on a 24 GiB card: no search; the peaks from the trace made from five blocks
    (deep_trace), and the note says why the sizes are 0."""
    from memlab.core.predict.fit import fit
    from memlab.core.predict.prediction import weights_bytes

    e, p = _tiny("bf16", "model.n_layer=12", "model.d_model=768", "model.d_ff=3072", "model.n_head=12", "model.n_kv_head=4")
    card = card_for("1.6GiB")
    assert weights_bytes(e, p) > card.budget_bytes
    row = fit(e, p, card)
    assert not row.fits and (row.max_batch, row.longest_seq) == (0, 0)
    assert row.note.startswith("the weights alone need 0.4 GiB") and row.reserved_bytes >= row.allocated_bytes > weights_bytes(e, p)


# A model whose weights alone exceed the card: each row is quick (nothing to search), the children's path is checked.
CHILDREN_FIT = ["fit", "--experiment", "tiny", "--profiles", "bf16,lora", "--gpu-memory", "2GiB", "--format", "csv",
                "--set", "model.d_model=4096"]


@pytest.mark.slow
def test_a_large_models_rows_are_predicted_in_children_and_a_failed_childs_row_here(tmp_path, monkeypatch, capsys):
    """bf16's row from a real child, through the prediction cache; lora's child fails, so the command predicts it."""
    import subprocess
    import sys

    from memlab.cli import fit_children, main
    from memlab.core.predict import fit as fit_module

    monkeypatch.setenv("MEMLAB_CACHE", str(tmp_path))
    monkeypatch.setattr(fit_children, "LARGE_PARAMS", 0)  # tiny counts as large here
    monkeypatch.setattr(fit_children.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(fit_children, "FORK_SAFE", False)  # a child `memlab fit` (the forked child: the test below)
    real_start, real_fitted, real_searched, here = fit_children._start, fit_module._fitted, fit_module.searched, []
    monkeypatch.setattr(fit_module, "searched", lambda *args: True)  # each row to a child, as a searched row goes

    def start(experiment, overrides, gpu_memory, name):
        if name == "lora":
            return subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
        return real_start(experiment, overrides, gpu_memory, name)

    def fitted(experiment, profile, card, micro):
        here.append(profile.name)
        with monkeypatch.context() as m:
            m.setattr(fit_module, "searched", real_searched)
            return real_fitted(experiment, profile, card, micro)

    monkeypatch.setattr(fit_children, "_start", start)
    monkeypatch.setattr(fit_module, "_fitted", fitted)
    main(CHILDREN_FIT)
    out, err = capsys.readouterr()
    assert "predicting 2 profiles, 2 at a time" in err and "bf16: predicted" in err
    assert "lora: its child ended with status 3; predicting it here" in err
    assert here == ["lora"]  # bf16's row came from its child, through the cache
    assert "bf16," in out and "lora," in out and out.count("the weights alone need") == 2


def test_a_mid_sized_models_rows_go_to_forks_and_to_new_processes_only_when_large(monkeypatch):
    """A fork costs a fraction of a second: GPT-2-small's eight rows on the default card took 9 min 12 s in one
    process on two cores. A new `memlab fit` process costs 5-6 s: only a large model's rows are worth one."""
    from memlab.cli import fit_children

    monkeypatch.setattr(fit_children.os, "cpu_count", lambda: 2)
    for fork_safe, gpt2s, llama_8b in ((True, True, True), (False, False, True)):
        monkeypatch.setattr(fit_children, "FORK_SAFE", fork_safe)
        assert fit_children.worth_children(12, 768, 8) is gpt2s and fit_children.worth_children(32, 4096, 8) is llama_8b
        assert not fit_children.worth_children(2, 64, 8) and not fit_children.worth_children(12, 768, 1)


def test_rows_that_search_nothing_are_predicted_here_while_the_children_run(monkeypatch):
    """predict_in_children starts the children, then runs `meanwhile` here once, then waits for them."""
    import subprocess
    import sys

    from memlab.cli import fit_children

    order = []

    def start(experiment, overrides, gpu_memory, name):
        order.append(f"start {name}")
        return subprocess.Popen([sys.executable, "-c", "pass"])

    monkeypatch.setattr(fit_children, "_start", start)
    monkeypatch.setattr(fit_children.os, "cpu_count", lambda: 2)
    fit_children.predict_in_children("tiny", [], None, ["a", "b", "c"], order.append,
                                     meanwhile=lambda: order.append("meanwhile"))
    assert order[:4] == ["predicting 3 profiles, 2 at a time, each in its own process…", "start a", "start b",
                         "meanwhile"]
    assert order.count("meanwhile") == 1 and "start c" in order and "c: predicted" in order


def test_on_linux_a_row_is_predicted_in_a_fork_and_a_failed_fork_is_said(tmp_path, monkeypatch):
    """With `row`, each child is this process forked to run row(name); one that raises ends with status 1."""
    from memlab.cli import fit_children

    if not fit_children.FORK_SAFE:
        pytest.skip("forked children only on Linux")

    def row(name: str) -> None:
        if name == "bad":
            raise RuntimeError("no fake kernel")
        (tmp_path / name).write_text("predicted")

    said = []
    monkeypatch.setattr(fit_children.os, "cpu_count", lambda: 2)
    fit_children.predict_in_children("tiny", [], None, ["a", "bad", "c"], said.append, row=row)
    assert (tmp_path / "a").exists() and (tmp_path / "c").exists() and not (tmp_path / "bad").exists()
    assert "a: predicted" in said and "bad: its child ended with status 1; predicting it here" in said
