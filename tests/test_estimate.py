"""The memory estimator: exact bytes on hand-computed cases, the analytic model against a fake-tensor measurement
of the same step, the predicted max batch, and `memlab estimate` as a user runs it (CPU; no GPU needed)."""

from __future__ import annotations

import json
import math

import pytest
import torch

from model_helpers import small

from memlab.core.predict import analytic as E
from memlab.core.config import Experiment, apply_overrides, load_experiment, load_profile
from memlab.core.errors import ConfigError, MemlabError

MIB = 2**20


def gpt(e: Experiment, V: int):
    from memlab.core.attention import build_attention
    from memlab.core.config import AttentionConfig
    from memlab.core.model import GPT, GPTConfig

    m = e.model
    with torch.device("meta"):
        return GPT(GPTConfig(m.n_layer, m.n_head, m.d_model, m.d_ff or 4 * m.d_model, V, m.seq_len), build_attention(AttentionConfig(), torch.device("cpu"), torch.float32))


# ---------------------------------------------------------------------------------------------- exact figures


@pytest.mark.parametrize("L, C, T, V", [(2, 64, 64, 512), (12, 768, 1024, 8192), (3, 96, 128, 1000)])
def test_parameter_count_and_shapes_match_the_model(L, C, T, V):
    model = gpt(small(L=L, C=C, H=2, T=T, V=V), V)
    assert E.param_count(L, C, 4 * C, T, V) == model.num_params()
    assert sorted(E.param_shapes(L, C, 4 * C, T, V)) == sorted(tuple(p.shape) for p in model.parameters())


def test_fp32_adamw_is_4_plus_4_plus_8_bytes_a_parameter():
    e, p = small(), load_profile("baseline")
    N = E.param_count(2, 64, 256, 64, 512)
    est = E.estimate(e, p, vocab_size=512)
    assert est.params == N == 2 * (12 * 64 * 64 + 13 * 64) + 512 * 64 + 64 * 64 + 2 * 64
    assert est.components["weights"] == 4 * N
    assert est.components["optimizer_state"] == 8 * N
    opt = est.phases["optimizer step"]
    # at the step: weights + gradients + state + foreach AdamW's one fp32 temporary of the decayed matrices, the
    # tokens (x and y, int64) and eager attention's cached boolean T x T mask
    matrices = sum(math.prod(s) for s in E.param_shapes(2, 64, 256, 64, 512) if len(s) == 2)
    assert opt == 4 * N + 4 * N + 8 * N + 4 * matrices + 16 * 4 * 64 + 64 * 64 + E.WORKSPACE_BYTES


def _real_state_bytes(opt_name: str) -> tuple[int, int]:
    from memlab.core.config import OptimizerConfig, TrainConfig
    from memlab.core.model import GPT, GPTConfig
    from memlab.core.attention import build_attention
    from memlab.core.config import AttentionConfig
    from memlab.core.techniques.optimizer import build_optimizer

    torch.manual_seed(0)
    model = GPT(GPTConfig(2, 2, 32, 128, 96, 16), build_attention(AttentionConfig(), torch.device("cpu"), torch.float32))
    opt = build_optimizer(model, OptimizerConfig(name=opt_name), TrainConfig(), torch.device("cpu"))
    model(torch.randint(0, 96, (2, 16)), torch.randint(0, 96, (2, 16))).backward()
    opt.step()
    real = sum(t.numel() * t.element_size() for st in opt.state.values() for k, t in st.items() if torch.is_tensor(t) and k != "step")
    return real, E.optimizer_state_bytes(load_profile(opt_name if opt_name != "adamw" else "bf16"), E.param_shapes(2, 32, 128, 16, 96))


def test_adamw_state_matches_torch():
    real, predicted = _real_state_bytes("adamw")
    assert real == predicted == 8 * E.param_count(2, 32, 128, 16, 96)


def test_adafactor_factored_state_matches_torch():
    real, predicted = _real_state_bytes("adafactor")
    assert real == predicted
    # by hand: wte 96x32 -> 96 + 32 factors; wpe 16x32 -> 16 + 32; per block qkv 96x32, proj 32x32, fc 128x32,
    # proj 32x128 as rows + cols; vectors (biases, LayerNorm) keep a full variance
    matrices = (96 + 32) + (16 + 32) + 2 * ((96 + 32) + (32 + 32) + (128 + 32) + (32 + 128))
    vectors = 2 * (2 * 32 + 96 + 32 + 2 * 32 + 128 + 32) + 2 * 32
    assert predicted == 4 * (matrices + vectors)


def test_8bit_and_offloaded_optimizer_state():
    shapes = [(4096, 2), (100,)]  # one tensor quantized (8192 elements), one too small (kept fp32)
    p = load_profile("adamw8bit")
    assert E.optimizer_state_bytes(p, shapes) == 2 * (8192 + 4 * 8192 // 256) + 2 * 256 * 4 + 8 * 100
    assert E.optimizer_state_bytes(load_profile("optim_offload"), shapes) == 0


def test_activations_of_one_block_by_hand():
    """fp32, SDPA, b=4, T=64, C=64, H=2, F=256: the residual twice, both LayerNorms' inputs of the linears, q/k/v,
    the output, fc and GELU outputs (64 bytes a token-channel), two LayerNorms' mean and rstd, the log-sum-exp."""
    s = E._Shape(L=2, C=64, H=2, F=256, T=64, V=512, b=4)
    BT, BTC = 4 * 64, 4 * 64 * 64
    fp32 = E.block_saved(s, E._Precision(False, 4), "fused", 0)
    assert sum(fp32.values()) == 64 * BTC + 16 * BT + 4 * 4 * 2 * 64
    bf16 = E.block_saved(s, E._Precision(True, 2), "fused", 0)
    # bf16 autocast: residuals stay fp32 (8), casts / qkv / out / fc / GELU halve (2+6+2+2+8+8), bf16 weight copies
    assert sum(bf16.values()) == 36 * BTC + 16 * BT + 4 * 4 * 2 * 64 + 2 * (4 * 64 * 64 + 2 * 64 * 256)
    eager = E.block_saved(s, E._Precision(False, 4), "materialized", 0)
    assert sum(eager.values()) - sum(fp32.values()) == 4 * 4 * 2 * 64 * 64 - 4 * 4 * 2 * 64  # T x T softmax, no lse


# ---------------------------------------------------------------------------------------------- against a measurement

FAKE_CASES = [
    ("baseline", []),
    ("bf16", []),
    ("gradcp", []),
    ("gradcp_bf16", []),
    ("selective", []),
    ("selective", ["checkpointing.target=\"mlp\""]),
    ("gradcp_every2", []),
    ("chunked_ce", ["loss.chunk_size=128"]),
    ("gradcp_bf16", ["loss.chunked=true", "loss.chunk_size=128", "optimizer.name=\"adafactor\""]),
    ("adafactor", []),
    ("accum", []),
    ("baseline", ["model.dropout=0.1"]),
]


@pytest.mark.parametrize("name, sets", FAKE_CASES, ids=[f"{n}{'+' if s else ''}{','.join(s)}" for n, s in FAKE_CASES])
def test_analytic_peak_matches_a_fake_tensor_measurement(name, sets):
    """The same step measured tensor by tensor (FakeTensorMode + MemTracker, CPU kernels): within 1 %."""
    from memlab.core.predict.fake import fake_estimate

    e, p = small(L=3, C=64, H=4, T=128, V=1024, batch=16), load_profile(name)
    apply_overrides(e, p, sets)
    measured = fake_estimate(e, p, vocab_size=1024, gpu_kernels=False).total_bytes
    predicted = E.estimate(e, p, vocab_size=1024, device="cpu").total_bytes
    assert predicted == pytest.approx(measured, rel=0.01), (predicted / MIB, measured / MIB)


@pytest.mark.slow
def test_gpt2_small_bf16_matches_the_fake_measurement():
    from memlab.core.predict.fake import fake_estimate

    e, p = load_experiment("gpt2s"), load_profile("bf16")
    measured = fake_estimate(e, p, vocab_size=8192).total_bytes
    assert E.estimate(e, p, vocab_size=8192, device="cpu").total_bytes == pytest.approx(measured, rel=0.002)


# ---------------------------------------------------------------------------------------------- behaviour


def test_the_logits_dominate_at_the_seeds_shape_and_chunking_moves_them():
    """STACK.md: at 4 layers, d 256, T 256, batch 64, vocab 50257, the B x T x V logits are most of the peak."""
    e = load_experiment("gpt2s")
    apply_overrides(e, load_profile("bf16"), ["model.n_layer=4", "model.d_model=256", "model.n_head=4", "model.seq_len=256", "train.batch_size=64"])
    V = E.padded(50257)
    full = E.estimate(e, load_profile("baseline"), vocab_size=V)
    assert full.peak_phase == "loss backward" and full.components["logits_loss"] > 0.5 * full.total_bytes
    assert 9 * 2**30 < full.total_bytes < 12 * 2**30  # the measured ~10-11 GiB
    for name in ("bf16", "gradcp_bf16"):
        assert E.estimate(e, load_profile(name), vocab_size=V).total_bytes > 0.8 * full.total_bytes
    assert E.estimate(e, load_profile("chunked_ce"), vocab_size=V).total_bytes < 0.5 * full.total_bytes


def test_techniques_move_the_estimate_the_right_way():
    e, V = load_experiment("gpt2s"), 8192
    lean = load_profile("flash_gradcp")
    apply_overrides(e, lean, ["loss.chunked=true", "optimizer.name=\"adafactor\""])
    est = {n: E.estimate(e, load_profile(n), vocab_size=V) for n in ("baseline", "bf16", "gradcp_bf16", "flash", "window", "accum", "optim_offload", "act_offload")}
    est["leanest"] = E.estimate(e, lean, vocab_size=V)
    total = {n: x.total_bytes for n, x in est.items()}
    assert total["bf16"] < total["baseline"]
    assert total["gradcp_bf16"] < total["bf16"] and total["leanest"] < total["gradcp_bf16"]
    assert total["window"] == total["flash"]  # a fused kernel's memory does not depend on the window
    assert total["accum"] < total["bf16"]
    assert est["optim_offload"].components["optimizer_state"] == 0
    assert est["act_offload"].components["activations"] < est["bf16"].components["activations"] / 5
    for x in est.values():
        assert sum(x.components.values()) == x.total_bytes == max(x.phases.values())


def test_peak_grows_with_the_batch_and_max_batch_is_the_boundary():
    e, p = load_experiment("gpt2s"), load_profile("gradcp_bf16")
    totals = [E.estimate(e, p, vocab_size=8192, micro_batch=b).total_bytes for b in (1, 2, 8, 32, 64)]
    assert totals == sorted(totals)
    mem = 24 * 2**30
    mb = E.predict_max_batch(e, p, vocab_size=8192, memory_bytes=mem)
    budget = E.usable_bytes(mem, profile=p)
    assert E.estimate(e, p, vocab_size=8192, micro_batch=mb).total_bytes <= budget
    assert E.estimate(e, p, vocab_size=8192, micro_batch=mb + 1).total_bytes > budget
    assert E.predict_max_batch(e, p, vocab_size=8192, memory_bytes=2**20) == 0


def test_vocabulary_comes_from_the_config_the_cache_or_the_bpe_size():
    e = load_experiment("gpt2s")
    e.model.vocab_size = 50304
    assert E.vocab_for(e) == (50304, "model.vocab_size")
    e.model.vocab_size = 0
    e.data.tokenizer = "bpe:1000"
    e.data.max_docs = 7  # not tokenized in this session's cache
    assert E.vocab_for(e)[0] == 1024
    e.data.tokenizer = "hf:some-org/some-tokenizer"
    with pytest.raises(ConfigError, match="model.vocab_size"):
        E.vocab_for(e)


def test_bad_estimate_inputs_are_errors():
    with pytest.raises(ConfigError, match="micro-batch must be at least 1"):
        E.estimate(small(), load_profile("bf16"), vocab_size=512, micro_batch=0)
    with pytest.raises(ConfigError, match="vocabulary"):
        E.estimate(small(), load_profile("bf16"), vocab_size=0)


def test_engine_records_the_estimate_beside_the_measurement(tiny):
    from memlab.core.engine import train
    from memlab.core.events import ListSink

    tiny.train.steps = 2
    summary = train(tiny, load_profile("baseline"), ListSink(), device=torch.device("cpu"))
    assert summary["estimate_peak_bytes"] > 0


def test_fake_method_measures_offload_through_its_stand_in_without_cuda():
    from memlab.core.predict.fake import fake_estimate

    offloaded = load_profile("act_offload")
    kept = load_profile("act_offload")
    kept.checkpointing.offload = False
    on_host = fake_estimate(small(), offloaded, vocab_size=512, micro_batch=4).components["activations"]
    on_device = fake_estimate(small(), kept, vocab_size=512, micro_batch=4).components["activations"]
    assert on_host < on_device  # the saved tensors went to the host (host and device are one here: the stand-in)


# ---------------------------------------------------------------------------------------------- snapshot breakdown


def _frames(*items):
    return [{"filename": f, "name": n, "line": 1} for f, n in items]


def test_snapshot_breakdown_sorts_the_peak_into_categories():
    from memlab.core import model
    from memlab.core.memsnapshot import breakdown

    P = _frames(("torch/nn/modules/module.py", "_apply"), ("memlab/core/engine.py", "_train"))
    OPT = _frames(("torch/optim/adamw.py", "_init_group"))
    FWD = _frames((model.__file__, "forward"))  # frames name the file where this install keeps it
    ZG = _frames(("torch/optim/optimizer.py", "zero_grad"))
    ev = []

    def alloc(addr, size, frames=None):
        ev.append({"action": "alloc", "addr": addr, "size": size, "frames": frames or []})

    def free(addr, size, frames=None):
        ev.append({"action": "free_requested", "addr": addr, "size": size, "frames": frames or []})
        ev.append({"action": "free_completed", "addr": addr, "size": size, "frames": frames or []})

    alloc(1, 100, P)  # parameters
    for step in range(2):
        alloc(10, 7, FWD) if step == 0 else None  # a workspace made in the first forward, kept
        alloc(2, 50, FWD)  # activations
        alloc(3, 100)  # a gradient, made in backward (no Python frames)
        free(2, 50)
        if step == 0:
            alloc(4, 200, OPT)  # optimizer state, made in the first step
        free(3, 100, ZG)
    alloc(5, 30, FWD)  # a step in flight at the dump: after the last zero_grad, left out
    snapshot = {
        "device_traces": [ev],
        "segments": [{"device": 0, "blocks": [{"address": a, "size": s, "state": "active_allocated", "frames": f} for a, s, f in ((1, 100, P), (4, 200, OPT), (10, 7, FWD), (5, 30, FWD))]}],
    }
    out = breakdown(snapshot)
    # the peak: second step, activations and gradient alive with parameters, state and the workspace
    assert out["peak_bytes"] == 100 + 7 + 50 + 100 + 200
    assert out["categories"] == {"parameters": 100, "gradients": 100, "optimizer_state": 200, "activations": 50, "other": 7}
    assert out["complete_steps"] == 2 and not out["oom"]


def test_snapshot_breakdown_copes_with_a_wrapped_trace():
    from memlab.core.memsnapshot import breakdown

    ev = [{"action": "free_requested", "addr": 9, "size": 40, "frames": []}, {"action": "alloc", "addr": 2, "size": 5, "frames": []}]
    snapshot = {"device_traces": [ev], "segments": [{"device": 0, "blocks": [{"address": 1, "size": 100, "state": "active_allocated", "frames": []}, {"address": 2, "size": 5, "state": "active_allocated", "frames": []}]}]}
    out = breakdown(snapshot)
    assert out["peak_bytes"] == 140  # block 1 and the freed 9 were alive before the window began


# ---------------------------------------------------------------------------------------------- the command


def cli(*args):
    from typer.testing import CliRunner

    from memlab.cli import _register_commands, app

    _register_commands()
    return CliRunner().invoke(app, list(args))


def test_estimate_json_is_one_object_with_components_total_and_max_batch():
    r = cli("estimate", "--profile", "leanest", "--batch-size", "64", "--json", "--gpu-memory", "24GiB", "--method", "analytic")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    parts = [f"{c}_bytes" for c in E.COMPONENTS]
    assert all(isinstance(out[k], int) for k in parts)
    assert sum(out[k] for k in parts) == out["total_bytes"] and out["total_bytes"] > 0
    assert out["micro_batch"] == 64 and out["max_batch"] > 64 and out["memory_bytes"] == 24 * 2**30
    assert out["experiment"] == "gpt2s" and out["method"] == "analytic"


@pytest.mark.slow
def test_estimate_table_and_fake_method():
    r = cli("estimate", "--profile", "bf16", "--experiment", "tiny", "--method", "fake")
    assert r.exit_code == 0, r.output
    for text in ("weights", "optimizer state", "activations", "total (peak)", "predicted max micro-batch", "analytic estimate"):
        assert text in r.stdout, text


@pytest.mark.parametrize(
    "args, expect",
    [
        (["estimate", "--profile", "bf16", "--gpu-memory", "0"], "must be more than zero"),
        (["estimate", "--profile", "bf16", "--gpu-memory", "-24GiB"], "not a size"),
        (["estimate", "--profile", "bf16", "--gpu-memory", "lots"], "not a size"),
        (["estimate", "--profile", "bf16", "--gpu-memory", "24XB"], "unknown unit 'XB'"),
        (["estimate", "--profile", "bf16", "--batch-size", "0"], "--batch-size must be a positive integer"),
        (["estimate", "--profile", "bf16", "--method", "guess"], "--method 'guess' is not valid"),
        (["estimate", "--profile", "accum", "--batch-size", "6"], "must be divisible by accumulation.steps"),
        (["estimate", "--profile", "nope"], "unknown profile 'nope'"),
        (["find-batch", "--profile", "bf16"], "find-batch needs CUDA"),
        (["find-batch", "--profile", "bf16", "--gpu-memory", "24 bananas"], "unknown unit 'bananas'"),
        (["find-batch", "--profile", "bf16", "--steps", "0"], "--steps must be at least 1"),
        (["run", "--profile", "bf16", "--device", "cpu", "--batch-size", "max"], "--batch-size max measures what fits on the GPU and needs CUDA"),
        (["run", "--profile", "baseline", "--device", "cpu", "--memory-snapshot"], "needs CUDA"),
    ],
)
def test_bad_input_is_one_line_exit_2(args, expect, capsys, tmp_path, monkeypatch):
    from memlab.cli import main

    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_:
        main(args)
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert exit_.value.code == 2 and len(lines) == 1 and lines[0].startswith("memlab: error: "), err
    assert expect in lines[0]
    if args[0] == "find-batch" and "CUDA" in expect:
        assert "memlab estimate" in lines[0]  # says what does work on CPU
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_estimate_errors_are_memlab_errors():
    assert issubclass(ConfigError, MemlabError)


# ---------------------------------------------------------------------------------------------- distributed (issue 9)


def _dist(name: str, cpu_offload: bool = False):
    p = load_profile(name)
    p.distributed.cpu_offload = cpu_offload
    return p


def test_fsdp_shards_weights_grads_and_state_exactly_by_world_size():
    e, V = small(L=3, C=64, T=64, V=512), 512
    one = E.estimate(e, _dist("fsdp_bf16"), vocab_size=V, micro_batch=2, world_size=1)
    two = E.estimate(e, _dist("fsdp_bf16"), vocab_size=V, micro_batch=2, world_size=2)
    N, bp = E.param_count(3, 64, 256, 64, V), E.block_params(64, 256)
    gathered = 2 * (bp["matrix"] + bp["vector"] + V * 64 + 64 * 64 + 2 * 64)  # one bf16 block + the root, unsharded
    opt = "optimizer step"
    c1, c2 = one.components, two.components
    assert c2["weights"] == 4 * N // 2 + gathered and c1["weights"] == 4 * N + gathered
    assert c2["optimizer_state"] == 8 * N // 2 == c1["optimizer_state"] // 2
    # at the step: the shards only (every unit resharded), weights + grads + state exactly halved
    shapes = E.param_shapes(3, 64, 256, 64, V)
    static = 4 * N + 4 * N + E.optimizer_state_bytes(_dist("fsdp_bf16"), shapes) + E.optimizer_temp_bytes(_dist("fsdp_bf16"), shapes)
    rest = one.phases[opt] - static
    assert two.phases[opt] == static // 2 + rest
    assert one.total_bytes - two.total_bytes == c1["weights"] - c2["weights"] + c1["optimizer_state"] - c2["optimizer_state"] + c1["gradients"] - c2["gradients"]


def test_ddp_adds_one_fp32_copy_of_the_gradients_as_buckets():
    e, V = small(L=3, C=64, T=64, V=512), 512
    single = E.estimate(e, load_profile("bf16"), vocab_size=V, micro_batch=2)
    ddp = E.estimate(e, _dist("ddp_bf16"), vocab_size=V, micro_batch=2, world_size=2)
    N = E.param_count(3, 64, 256, 64, V)
    assert ddp.components["weights"] == single.components["weights"] == 4 * N  # nothing sharded
    assert ddp.components["optimizer_state"] == single.components["optimizer_state"]
    for phase in ("forward (last block)", "loss forward", "loss backward"):  # the buckets exist from the start
        assert ddp.phases[phase] - single.phases[phase] == 4 * N, phase
    assert ddp.phases["optimizer step"] == single.phases["optimizer step"]  # .grad are views of the buckets
    assert ddp.total_bytes > single.total_bytes


def test_fsdp_cpu_offload_moves_the_state_off_the_gpu():
    e, V = small(L=3, C=64, T=64, V=512), 512
    gpu = E.estimate(e, _dist("fsdp_bf16"), vocab_size=V, micro_batch=2, world_size=2)
    host = E.estimate(e, _dist("fsdp_bf16", cpu_offload=True), vocab_size=V, micro_batch=2, world_size=2)
    N, bp = E.param_count(3, 64, 256, 64, V), E.block_params(64, 256)
    gathered = 2 * (bp["matrix"] + bp["vector"] + V * 64 + 64 * 64 + 2 * 64)
    assert host.components["weights"] == gathered  # only the all-gathered unsharded parameters
    assert host.components["optimizer_state"] == 0 and host.components["gradients"] == 0
    assert host.phases["optimizer step"] < gpu.phases["optimizer step"]
    assert gpu.total_bytes - host.total_bytes == 4 * N // 2 + 8 * N // 2


@pytest.mark.parametrize("name, offload, measured_gib", [("ddp_bf16", False, 8.26), ("fsdp_bf16", False, 7.27), ("fsdp_bf16", True, 6.74)])
def test_distributed_estimates_match_the_h200x2_measurements(name, offload, measured_gib):
    """gpt2s, micro 16, bf16, 2 ranks on 2 x H200 (bench/results/distributed-h200x2/distributed.txt)."""
    e = load_experiment("gpt2s")
    e.model.vocab_size = 8192
    apply_overrides(e, p := _dist(name, offload), ["train.batch_size=32"])
    est = E.estimate(e, p, vocab_size=8192, world_size=2)
    assert est.micro_batch == 16  # the global batch split over the ranks, as the engine does
    assert abs(est.total_bytes / 2**30 - measured_gib) / measured_gib < 0.10
    if name == "fsdp_bf16" and not offload:
        assert abs(est.phases["optimizer step"] / 2**30 - 0.95) / 0.95 < 0.10


def test_cli_estimate_nproc():
    r = cli("estimate", "-p", "fsdp_bf16", "--nproc", "2", "--batch-size", "32", "--set", "model.vocab_size=8192", "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out["world_size"] == 2 and out["micro_batch"] == 16
    r = cli("estimate", "-p", "bf16", "--nproc", "2", "--set", "model.vocab_size=8192")
    assert r.exit_code != 0 and "distributed.mode = none" in (r.output + str(r.exception))


def test_recomputing_and_offloading_profiles_keep_a_larger_fragmentation_margin():
    """The largest batch is bounded by reserved memory: a checkpointed or offloaded step fragments more (measured)."""
    cap = 24 * 2**30
    plain, recompute, offload = (E.usable_bytes(cap, profile=load_profile(n)) for n in ("bf16", "gradcp_bf16", "act_offload"))
    assert offload < recompute < plain < cap
    # a card, real or emulated (--gpu-memory), loses the CUDA context first
    assert plain == int((cap - E.CUDA_CONTEXT_BYTES) * (1 - E.FRAGMENTATION_MARGIN["plain"]))
    assert E.usable_bytes(cap) == plain


def test_fsdp_checkpoints_keep_the_block_input_in_bf16():
    """FSDP2's MixedPrecisionPolicy casts each block's input to bf16: a checkpoint keeps 2 bytes per element, not 4,
    so each more sample costs 2 x T x C bytes less per block than plain gradcp_bf16 (same peak phase)."""
    e = load_experiment("gpt2s")

    def per_sample(name: str) -> int:
        p = load_profile(name)
        return E.estimate(e, p, vocab_size=8192, micro_batch=33).total_bytes - E.estimate(e, p, vocab_size=8192, micro_batch=32).total_bytes

    m = e.model
    assert per_sample("gradcp_bf16") - per_sample("fsdp_gradcp_bf16") == 2 * m.seq_len * m.d_model * m.n_layer


def test_fp32_eager_backward_holds_three_score_gradients():
    """gradcp (fp32, eager attention, checkpointed) peaks in a block's backward with the recomputed fp32
    probabilities and three fp32 B x H x T x T gradients alive (the H100's allocator history)."""
    e, p = load_experiment("gpt2s"), load_profile("gradcp")
    est = E.estimate(e, p, vocab_size=8192, micro_batch=16)
    assert est.peak_phase.startswith("block backward")
    m = e.model
    htt = m.n_head * m.seq_len * m.seq_len  # one sample's T x T scores, all heads
    one_more = E.estimate(e, p, vocab_size=8192, micro_batch=17).total_bytes - est.total_bytes
    # per sample: 4 bytes of saved probabilities + 3 x 4 of gradients per score, plus the block's O(T) tensors
    # (about 4 bytes a score more at this shape); two gradients would give about 16
    assert 20 * htt <= one_more < 21 * htt


def test_fake_method_warns_where_it_undercounts_fp32_eager_attention():
    from memlab.core.predict.fake import fake_estimate

    e = load_experiment("tiny")
    warned = [any("third fp32 T x T" in n for n in fake_estimate(e, load_profile(name), vocab_size=512).notes) for name in ("gradcp", "bf16")]
    assert warned == [True, False]
