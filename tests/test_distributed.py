"""Several ranks (issue 9): torchrun with gloo on the CPU, DDP and FSDP2 as memory techniques.

Two real torchrun spawns of 2 ranks (a few seconds each): DDP, and FSDP2 with every block checkpointed through the
supervisor (`memlab sweep --nproc 2`), in fp32 must train exactly as one process on the same global batch (same seed,
same data: each rank a disjoint half). The rest is in process: one-line errors before any process starts, the
one-process group the engine makes for ddp/fsdp outside torchrun, and how rank summaries combine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
import torch
import torch.distributed as dist

from memlab.core import distributed, schema
from memlab.core.config import apply_overrides, load_experiment, load_profile
from memlab.core.engine import train
from memlab.core.errors import ConfigError, DeviceError, MemlabError
from memlab.core.events import ListSink

STEPS = 4
TINY = ["--experiment", "tiny", "--device", "cpu", "--set", f"train.steps={STEPS}", "--set", "train.measure_after=1"]


def memlab(*args, timeout=120):
    env = {**os.environ, "COLUMNS": "200", "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "memlab", *args], capture_output=True, text=True, timeout=timeout, env=env)


def single_process_losses(profile: str, overrides: list[str]) -> list[float]:
    """The reference: one process, no process group, the whole global batch."""
    e, p = load_experiment("tiny"), load_profile(profile)
    apply_overrides(e, p, [f"train.steps={STEPS}", "train.measure_after=1", *overrides])
    sink = ListSink()
    assert train(e, p, sink, device="cpu")["status"] == "finished"
    return [ev["loss"] for ev in sink.of("step")]


def two_ranks(tmp_path: Path, profile: str, overrides: list[str]) -> tuple[list[dict], Path]:
    r = memlab("run", "--nproc", "2", "--profile", profile, *TINY, *[a for o in overrides for a in ("--set", o)],
               "--runs-dir", str(tmp_path), "--events", "-")
    assert r.returncode == 0, r.stderr[-3000:]
    events = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    return events, Path(events[0]["run_dir"])


def check_rank_rows(events: list[dict], run_dir: Path, world: int = 2) -> pl.DataFrame:
    # only rank 0 speaks: one started event, one step event per step, one outcome
    kinds = [e["event"] for e in events]
    assert kinds.count("started") == 1 and kinds.count("step") == STEPS and kinds[-1] == "finished"
    assert events[0]["world_size"] == world and events[0]["micro_batch"] * world * events[0]["grad_accum"] == 8
    ranks = pl.read_parquet(run_dir / schema.RANKS).sort("rank")
    assert ranks["rank"].to_list() == list(range(world)) and set(ranks["world_size"]) == {world}
    assert set(ranks["status"]) == {"finished"} and set(ranks["steps"]) == {STEPS}
    summary = pl.read_parquet(run_dir / schema.SUMMARY).row(0, named=True)
    assert summary["status"] == "finished" and summary["n_gpus"] == 0  # CPU: no GPUs, however many ranks
    # each rank saw its own half of every global batch; the summary counts the whole run
    assert ranks["tokens"].sum() == summary["tokens"] == STEPS * 8 * 64
    # memory and time: max over ranks; tokens/s: global tokens per step / the slowest rank's median step
    assert summary["peak_host_rss_bytes"] == ranks["peak_host_rss_bytes"].max()
    assert summary["step_ms_median"] == pytest.approx(ranks["step_ms_median"].max())
    assert summary["tokens_per_s"] == pytest.approx(8 * 64 / (summary["step_ms_median"] / 1000.0))
    run_json = json.loads((run_dir / schema.RUN_JSON).read_text())
    assert run_json["world_size"] == world and run_json["status"] == "finished"
    return ranks


@pytest.mark.slow
def test_ddp_on_two_ranks_trains_exactly_as_one_process(tmp_path):
    """fp32, accumulation 2 (DDP all-reduces once per optimizer step): global batch 8 = 2 ranks x 2 micro x 2."""
    overrides = ["accumulation.steps=2"]
    reference = single_process_losses("baseline", overrides)
    events, run_dir = two_ranks(tmp_path, "baseline", ["distributed.mode=ddp", *overrides])
    check_rank_rows(events, run_dir)
    assert events[0]["distributed"] == "ddp x2"
    losses = [e["loss"] for e in events if e["event"] == "step"]  # the mean over ranks, not rank 0's own
    torch.testing.assert_close(losses, reference, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_sweep_runs_fsdp_with_checkpointing_on_two_ranks_exactly_as_one_process(tmp_path):
    """FSDP2 through the supervisor (the child becomes torchrun, rank 0's events are the one stream it reads), fp32
    with an fp32 mixed-precision policy and every block checkpointed: sharded weights, grads and AdamW state (on
    each rank's local shards), the same training as one process."""
    overrides = ["checkpointing.mode=full"]
    reference = single_process_losses("baseline", overrides)
    r = memlab("sweep", "--profiles", "baseline", "--nproc", "2", *TINY, "--set", "distributed.mode=fsdp",
               "--set", overrides[0], "--runs-dir", str(tmp_path))
    assert r.returncode == 0, r.stderr[-3000:]
    assert "baseline: finished" in r.stderr and "1/1 finished" in r.stderr
    (run_dir,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    ranks = pl.read_parquet(run_dir / schema.RANKS)
    assert ranks.height == 2 and set(ranks["status"]) == {"finished"} and set(ranks["steps"]) == {STEPS}
    summary = pl.read_parquet(run_dir / schema.SUMMARY).row(0, named=True)
    assert summary["checkpointing"].startswith("full")
    assert json.loads((run_dir / schema.RUN_JSON).read_text())["distributed"].startswith("fsdp x2 (2 blocks + root")
    losses = pl.read_parquet(run_dir / schema.STEPS)["loss"].to_list()  # the mean over ranks, as the events carry it
    torch.testing.assert_close(losses, reference, rtol=1e-5, atol=1e-5)
    assert summary["final_loss"] == pytest.approx(losses[-1])


# ---------------------------------------------------------------------------------------------- in process


@pytest.mark.parametrize(
    "args, expect",
    [
        (["--profile", "baseline"], "distributed.mode = none with 2 ranks"),
        (["--profile", "ddp_bf16", "--set", "train.batch_size=6", "--set", "accumulation.steps=2"], "must be divisible by ranks (2) x accumulation.steps (2) = 4"),
        (["--profile", "fsdp_bf16", "--set", "optimizer.offload=true"], "use distributed.cpu_offload = true instead"),
        (["--profile", "fsdp_bf16", "--set", "optimizer.name=adafactor"], "adafactor does not run on FSDP2"),
        (["--profile", "ddp_bf16", "--set", "distributed.cpu_offload=true"], "applies to distributed.mode = fsdp, not ddp"),
        (["--profile", "ddp_bf16", "--set", "distributed.local_optimizer=false"], "distributed.local_optimizer applies to distributed.mode = fsdp"),
        (["--profile", "fsdp_bf16", "--set", "distributed.cpu_offload=true"], "needs CUDA"),
        (["--profile", "ddp_bf16", "--batch-size", "max"], "--batch-size max probes one GPU at a time"),
    ],
)
def test_bad_distributed_combinations_are_one_line_before_torchrun_starts(args, expect, tmp_path, capsys, monkeypatch):
    from memlab.cli import main

    def no_exec(*a, **k):
        raise AssertionError("torchrun would have started")

    monkeypatch.setattr(os, "execve", no_exec)
    with pytest.raises(SystemExit) as exit_:
        main(["run", "--nproc", "2", *args, "--experiment", "tiny", "--device", "cpu", "--runs-dir", str(tmp_path)])
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert exit_.value.code == 2 and len(lines) == 1 and lines[0].startswith("memlab: error: "), err
    assert expect in lines[0]
    assert not any(tmp_path.iterdir())


def test_nproc_execs_torchrun_with_the_same_run(tmp_path, monkeypatch):
    from memlab.cli import main

    seen = {}

    def fake_exec(path, argv, env):
        seen.update(path=path, argv=argv, env=env)
        raise MemlabError("exec")  # (ends the command as a one-line error, exit 2)

    monkeypatch.setattr(os, "execve", fake_exec)
    with pytest.raises(SystemExit):
        main(["run", "--nproc", "3", "--profile", "ddp_bf16", "--experiment", "tiny", "--device", "cpu", "--steps", "5",
              "--set", "train.batch_size=12", "--runs-dir", str(tmp_path), "--events", "-"])
    argv = seen["argv"]
    assert argv[:7] == [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "3", "-m"]
    rest = argv[7:]
    assert rest[:3] == ["memlab", "run", "--profile"] and "--nproc" not in rest
    assert "train.batch_size=12" in rest and "train.steps=5" in rest and rest[-2:] == ["--events", "-"]
    assert float(seen["env"]["MEMLAB_PROCESS_START"]) > 0


def test_torchrun_world_without_a_distributed_mode_is_refused():
    e, p = load_experiment("tiny"), load_profile("bf16")
    distributed.check(e, p, 1, "cpu")  # one rank: fine
    with pytest.raises(ConfigError, match="--set distributed.mode=ddp"):
        distributed.check(e, p, 2, "cpu")
    with pytest.raises(DeviceError):
        p2 = load_profile("fsdp_bf16")
        p2.distributed.cpu_offload = True
        distributed.check(e, p2, 1, "cpu")


@pytest.mark.parametrize("mode", ["ddp", "fsdp"])
def test_ddp_or_fsdp_outside_torchrun_is_one_rank_of_its_own(mode, tiny):
    """The engine makes a one-process group (FSDP on one rank is legal) and ends it: nothing leaks to later runs."""
    p = load_profile("baseline")
    apply_overrides(tiny, p, ["train.steps=2", f"distributed.mode={mode}"])
    sink = ListSink()
    summary = train(tiny, p, sink, device="cpu")
    assert summary["status"] == "finished" and summary["n_gpus"] == 0
    (finished,) = sink.of("finished")
    assert [r["rank"] for r in finished["ranks"]] == [0] and finished["ranks"][0]["world_size"] == 1
    assert sink.of("started")[0]["distributed"].startswith(mode)
    assert not dist.is_initialized()
    single = ListSink()
    train(tiny, load_profile("baseline"), single, device="cpu")
    assert "ranks" not in single.of("finished")[0]  # mode none, one process: no ranks.parquet


def test_every_block_kept_after_forward_is_sharded_with_the_root_and_trains_the_same(tiny):
    """distributed.blocks_per_unit >= the blocks, kept after forward: one FSDP group (the root's), not a unit of all
    the blocks beside it; the same training as a unit per block (one rank, fp32)."""
    losses = {}
    for sets in (["distributed.blocks_per_unit=2", "distributed.reshard_after_forward=false"], []):
        p = load_profile("baseline")
        apply_overrides(tiny, p, ["train.steps=3", "distributed.mode=fsdp", *sets])
        sink = ListSink()
        assert train(tiny, p, sink, device="cpu")["status"] == "finished"
        losses[bool(sets)] = [e["loss"] for e in sink.of("step")]
        described = sink.of("started")[0]["distributed"]
        assert ("one unit with the root" in described) == bool(sets), described
    torch.testing.assert_close(losses[True], losses[False], rtol=1e-6, atol=1e-6)


def test_rank_summaries_combine_as_the_run_summary():
    base = {"status": "finished", "tokens_per_s": 1000.0, "mfu": 0.2, "alloc_retries": 1, "final_loss": 2.0}
    r0 = {**base, "step_ms_median": 100.0, "peak_alloc_bytes": 5, "peak_host_rss_bytes": 7}
    r1 = {**base, "step_ms_median": 125.0, "peak_alloc_bytes": 9, "peak_host_rss_bytes": 3}
    out = distributed.aggregate([r0, r1], 2)
    assert out["peak_alloc_bytes"] == 9 and out["peak_host_rss_bytes"] == 7 and out["alloc_retries"] == 2
    assert out["step_ms_median"] == 125.0
    assert out["tokens_per_s"] == pytest.approx(800.0) and out["mfu"] == pytest.approx(0.16)  # the slowest rank's pace
    assert distributed.aggregate([r0, {**r1, "status": "oom"}], 2)["status"] == "oom"
