"""Activation offload that overlaps (checkpointing.offload_overlap, memlab.core.offload): the hooks' bookkeeping on
the CPU with plain copies standing in for the side stream; the refusals; the estimate."""

from __future__ import annotations

import json

import pytest
import torch
from memlab.core.predict import analytic as E
from memlab.core.attention import build_attention
from memlab.core.config import AttentionConfig, apply_overrides, load_experiment, load_profile
from memlab.core.errors import ConfigError, DeviceError
from memlab.core.model import GPT, GPTConfig
from memlab.core.offload import HostCopies, OverlapOffload, is_weight
from memlab.core.techniques import act_offload, check_plan

CPU = torch.device("cpu")
CFG = GPTConfig(n_layer=3, n_head=2, d_model=32, d_ff=64, vocab_size=96, seq_len=16)
SMALL = 1024  # bytes: the toy's activations (3 x 16 x 32 fp32 = 6 KiB) move, its LayerNorm stats (192 B) do not


def _model() -> GPT:
    torch.manual_seed(0)
    return GPT(CFG, build_attention(AttentionConfig(kernel="sdpa"), CPU, torch.float32))


def _batch():
    x = torch.randint(0, CFG.vocab_size, (3, CFG.seq_len), generator=torch.Generator().manual_seed(1))
    return x, torch.roll(x, -1, dims=1)


def _autocast(bf16: bool):
    return torch.autocast("cpu", torch.bfloat16, enabled=bf16)


def _offloaded(model: GPT, min_bytes: int = SMALL) -> OverlapOffload:
    off = OverlapOffload(HostCopies(), min_bytes=min_bytes)
    off.install(list(model.blocks), model.ln_f)
    return off


@pytest.mark.parametrize("bf16", [False, True], ids=["fp32", "bf16-autocast"])
def test_loss_and_gradients_equal_those_without_offload_and_every_buffer_is_released(bf16):
    ref, model = _model(), _model()
    x, y = _batch()
    with _autocast(bf16):
        ref_loss = ref(x, y)
    ref_loss.backward()
    off = _offloaded(model)
    with _autocast(bf16), off.forward():
        loss = model(x, y)
    assert off.moved > 0 and off.host_buffers() == off.moved  # on the host between forward and backward
    loss.backward()
    torch.testing.assert_close(loss, ref_loss, rtol=0, atol=0)
    for (name, a), b in zip(ref.named_parameters(), model.parameters()):
        torch.testing.assert_close(b.grad, a.grad, rtol=0, atol=0, msg=name)
    assert off.unpacked == off.packed  # every saved tensor handed back once
    assert off.copier.to_host_count == off.copier.to_device_count == off.moved
    assert off.late == 0  # each came back through a prefetch, none on demand
    assert off.host_buffers() == 0 and not off.blocks


def test_device_tensors_are_held_until_their_copy_is_waited_for_then_dropped():
    """No record_stream (it grows reserved memory): block i-2's device tensors are dropped when block i starts,
    after the compute stream waited for their copies, and the last blocks' when the forward ends."""
    model = _model()
    off = _offloaded(model)
    held: list[list[int]] = []
    model.blocks[2].register_forward_pre_hook(lambda m, a: held.append(
        [sum(mv.source is not None for mv in off.blocks[i].moved) for i in (0, 1)]))
    at_head: list[list[int]] = []
    model.ln_f.register_forward_pre_hook(lambda m, a: at_head.append(
        [sum(mv.source is not None for mv in off.blocks[i].moved) for i in (1, 2)]))
    x, y = _batch()
    with off.forward():
        model(x, y)
    zero_dropped, one_held = held[0]
    assert zero_dropped == 0 and one_held > 0  # entering block 2: block 0's copies waited for and freed
    assert at_head[0][0] == 0 and at_head[0][1] > 0  # the head (the loss: the forward's peak) beside one block only
    assert all(mv.source is None for b in off.blocks.values() for mv in b.moved)


def test_small_tensors_weights_and_tensors_saved_outside_the_blocks_stay_on_the_device():
    model = _model()
    off = _offloaded(model)
    moved, kept = [], []
    pack = off.pack

    def spy(t):
        (kept if isinstance(out := pack(t), torch.Tensor) else moved).append(t)
        return out

    off.pack = spy
    x, y = _batch()
    with _autocast(True), off.forward():
        model(x, y).backward()
    assert moved and all(t.numel() * t.element_size() >= SMALL and not is_weight(t) for t in moved)
    assert any(t.numel() * t.element_size() < SMALL for t in kept)  # LayerNorm statistics
    assert sum(is_weight(t) for t in kept) >= 4 * CFG.n_layer  # each block's four weights (their bf16 casts)
    # the final norm's and the head's inputs are saved after the last block: kept although large enough to move
    outside = [t for t in kept if t.numel() * t.element_size() >= SMALL and not is_weight(t)]
    assert any(t.shape == (3, CFG.seq_len, CFG.d_model) and t.dtype == torch.float32 for t in outside)  # ln_f's input


def test_nothing_moves_below_the_threshold_or_outside_the_context():
    model = _model()
    off = _offloaded(model, min_bytes=1 << 30)
    x, y = _batch()
    with off.forward():
        model(x, y).backward()
    assert off.packed > 0 and off.moved == 0
    other = _model()
    off2 = _offloaded(other)  # hooks installed, forward run outside forward(): nothing is packed or registered
    other(x, y).backward()
    with off2.forward(), torch.no_grad():  # evaluation: nothing is saved for a backward
        other(x, y)
    assert off2.packed == 0 and not off2.blocks


def test_weights_are_parameters_their_views_and_autocast_casts_of_them():
    lin = torch.nn.Linear(4, 4)
    assert is_weight(lin.weight) and is_weight(lin.weight.t())
    with torch.autocast("cpu", torch.bfloat16):
        cast = lin.weight.to(torch.bfloat16)
    assert is_weight(cast) and is_weight(cast.t())
    activation = lin(torch.randn(2, 4))
    assert not is_weight(activation) and not is_weight(activation.to(torch.bfloat16))


def test_a_forward_without_backward_is_dropped_by_the_next_forward():
    ref, model = _model(), _model()
    x, y = _batch()
    ref(x, y).backward()
    off = _offloaded(model)
    with off.forward():
        model(x, y)  # never differentiated (e.g. an interrupted step)
    with off.forward():
        loss = model(x, y)
    assert off.host_buffers() == off.moved // 2
    loss.backward()
    for a, b in zip(ref.parameters(), model.parameters()):
        torch.testing.assert_close(b.grad, a.grad, rtol=0, atol=0)
    assert off.host_buffers() == 0


def test_a_second_backward_through_the_same_graph_is_refused_in_one_line():
    model = _model()
    off = _offloaded(model)
    x, y = _batch()
    with off.forward():
        loss = model(x, y)
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match=r"retain_graph=True\) is not supported"):
        loss.backward()


def test_the_step_runs_with_the_hooks_and_matches_the_plain_bf16_step(monkeypatch, tiny):
    """The technique's wiring (apply, TrainStep's offload context) on the CPU, plain copies for the CUDA stream."""
    from memlab.core.techniques import build_step

    monkeypatch.setattr(act_offload, "CudaCopies", lambda device: HostCopies())
    monkeypatch.setattr(act_offload, "OverlapOffload", lambda copier: OverlapOffload(copier, min_bytes=SMALL))
    losses = {}
    for name in ("bf16", "act_offload_overlap"):
        torch.manual_seed(0)
        step = build_step(tiny, load_profile(name), CPU, vocab_size=256)
        x = torch.randint(0, 256, (2, tiny.model.seq_len), generator=torch.Generator().manual_seed(2))
        losses[name] = [step.run([(x, torch.roll(x, -1, dims=1))]).loss_sum.item() for _ in range(2)]
    assert losses["act_offload_overlap"] == losses["bf16"]
    offload = step.offload.__self__  # the OverlapOffload whose forward() the step ran under
    assert offload.moved > 0 and offload.host_buffers() == 0
    assert step.applied["act_offload"] == act_offload.OVERLAP


# ---------------------------------------------------------------------------------------------- refusals


def test_offload_overlap_without_offload_is_a_config_error():
    e, p = load_experiment("tiny"), load_profile("bf16")
    with pytest.raises(ConfigError, match="offload_overlap applies with checkpointing.offload = true"):
        apply_overrides(e, p, ["checkpointing.offload_overlap=true"])


@pytest.mark.parametrize(
    "setting, expect",
    [
        ("checkpointing.mode=full", "recomputes them instead"),
        ("compile.enabled=true", "break torch.compile's graph"),
        ("kernels.fused=true", "kernels.fused bypasses"),
        ("distributed.mode=ddp", "not tested under distributed.mode = 'ddp'"),
    ],
)
def test_combinations_the_hooks_cannot_follow_are_refused_on_any_device(setting, expect):
    e, p = load_experiment("gpt2s"), load_profile("act_offload_overlap")
    apply_overrides(e, p, [setting])
    with pytest.raises(ConfigError, match=expect) as err:
        act_offload.check(e, p, torch.device("cuda"), 1)
    assert "\n" not in str(err.value) and "offload_overlap = false" in str(err.value)
    with pytest.raises(ConfigError, match=expect):  # memlab estimate's checks, for a GPU that need not be here
        check_plan(e, p)


def test_the_sync_offload_still_combines_with_checkpointing():
    e, p = load_experiment("gpt2s"), load_profile("act_offload")
    apply_overrides(e, p, ["checkpointing.mode=full"])
    act_offload.check(e, p, torch.device("cuda"), 1)
    with pytest.raises(DeviceError, match="checkpointing.offload moves activations"):
        act_offload.check(e, p, CPU, 1)


def test_run_on_the_cpu_is_refused_in_one_line_before_any_work(tmp_path, capsys):
    from memlab.cli import main

    runs = tmp_path / "runs"
    with pytest.raises(SystemExit) as exit_:
        main(["run", "--profile", "act_offload_overlap", "--device", "cpu", "--experiment", "tiny", "--runs-dir", str(runs)])
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert exit_.value.code == 2 and len(lines) == 1, lines
    assert "checkpointing.offload_overlap" in lines[0] and "needs CUDA" in lines[0]
    assert not runs.exists() or not any(runs.iterdir())


# ---------------------------------------------------------------------------------------------- estimate


def test_estimate_keeps_the_weight_copies_and_one_block_in_flight():
    e = load_experiment("gpt2s")
    est = {n: E.estimate(e, load_profile(n), vocab_size=8192) for n in ("bf16", "act_offload", "act_offload_overlap")}
    acts = {n: v.components["activations"] for n, v in est.items()}
    assert acts["act_offload"] < acts["act_offload_overlap"] < acts["bf16"] / 5
    assert any("offload_overlap" in note for note in est["act_offload_overlap"].notes)


def test_estimate_command_works_on_the_cpu():
    from typer.testing import CliRunner

    from memlab.cli import _register_commands, app

    _register_commands()
    # the formula (instant); the offload stand-ins' traces: tests/test_replay_standins.py
    r = CliRunner().invoke(app, ["estimate", "--profile", "act_offload_overlap", "--json", "--method", "analytic"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["total_bytes"] > 0 and out["max_batch"] > 0
