"""Shared by the TUI tests (no tests here): fixed run folders, synthetic child events and a polling helper."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import polars as pl

from memlab.core import schema

GIB = 1024**3
EXP_ID = "f00dfeed1234"
H100 = "NVIDIA H100 80GB HBM3"

# profile -> (peak alloc GiB, step ms, tokens/s, val ppl): a GPU-looking comparison with fixed numbers
FIXED = {
    "baseline": (10.6, 212.0, 77_300.0, 41.20),
    "bf16": (7.9, 118.0, 138_900.0, 41.31),
    "gradcp_bf16": (4.1, 151.0, 108_500.0, 41.29),
}


def write_run(root: Path, profile: str, n: int, *, peak_gib: float, step_ms: float, tps: float, ppl: float, steps: int = 40, status: str = "finished", reason: str | None = None) -> Path:
    """A run folder as the engine leaves it (run.json, summary, steps, gpu), every value fixed: no clock, no randomness."""
    run_id = f"20260102-0900{n:02d}-{profile}-{n:04x}"
    d = Path(root) / run_id
    d.mkdir(parents=True)
    started = f"2026-01-02T09:00:{n:02d}+00:00"
    info = {
        "schema_version": schema.SCHEMA_VERSION, "run_id": run_id, "status": status, "reason": reason,
        "message": reason, "profile": {"name": profile}, "device": "cuda",
        "experiment": {"name": "gpt2s", "train": {"batch_size": 16}, "model": {"seq_len": 1024}},
        "experiment_id": EXP_ID, "environment": {"device": "cuda", "gpu_name": H100}, "started_at": started,
    }
    (d / schema.RUN_JSON).write_text(json.dumps(info))
    peak = int(peak_gib * GIB)
    finished = status == "finished"
    summary = dict.fromkeys(schema.SUMMARY_SCHEMA)
    summary.update(
        schema_version=schema.SCHEMA_VERSION, run_id=run_id, profile=profile, experiment="gpt2s", experiment_id=EXP_ID,
        status=status, device="cuda", gpu_name=H100, n_gpus=1, batch_size=16, micro_batch=16, grad_accum=1, seq_len=1024,
        steps=steps, tokens=steps * 16 * 1024, started_at=started,
    )
    if finished:
        summary.update(
            peak_alloc_fwd_bytes=int(peak * 0.7), peak_alloc_bwd_bytes=peak, peak_alloc_opt_bytes=int(peak * 0.8),
            peak_alloc_bytes=peak, peak_reserved_bytes=int(peak * 1.1), peak_nvml_bytes=int(peak * 1.15),
            step_ms_median=step_ms, step_ms_p90=step_ms * 1.05, tokens_per_s=tps, mfu=0.31, total_s=steps * step_ms / 1000 + 5,
            val_loss=3.7, val_ppl=ppl,
        )
    pl.DataFrame([summary], schema=schema.SUMMARY_SCHEMA).write_parquet(d / schema.SUMMARY)
    rows = []
    for i in range(steps):
        ramp = min(1.0, (i + 1) / 4)
        rows.append({
            "step": i, "loss": 10.8 - 7.0 * i / steps, "lr": 6e-4, "grad_norm": 1.0, "step_ms": step_ms * (3 if i == 0 else 1) + (i % 5),
            "fwd_ms": step_ms * 0.3, "bwd_ms": step_ms * 0.6, "opt_ms": step_ms * 0.1, "tokens": 16 * 1024, "tokens_per_s": tps,
            "peak_alloc_fwd_bytes": int(peak * 0.7 * ramp), "peak_alloc_bwd_bytes": int(peak * ramp), "peak_alloc_opt_bytes": int(peak * 0.8 * ramp),
            "peak_reserved_bytes": int(peak * 1.1 * ramp), "host_rss_bytes": 3 * GIB, "measured": i >= 3,
        })
    pl.DataFrame(rows, schema=schema.STEP_SCHEMA).write_parquet(d / schema.STEPS)
    gpu = [{"t": i * 0.05, "used_bytes": int(peak * 1.15 * min(1.0, (i + 1) / 30)), "util_pct": 90.0, "power_w": 500.0} for i in range(120)]
    pl.DataFrame(gpu, schema=schema.GPU_SCHEMA).write_parquet(d / schema.GPU)
    return d


def fixed_runs(root: Path) -> list[Path]:
    return [write_run(root, p, n, peak_gib=g, step_ms=ms, tps=t, ppl=ppl) for n, (p, (g, ms, t, ppl)) in enumerate(FIXED.items(), 1)]


async def wait_for(pilot, condition, timeout: float = 60.0, what: str = "condition") -> None:
    """Let the app run until condition() holds (the worker and the drain timer do their part meanwhile)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        await pilot.pause(0.1)
    await asyncio.sleep(0)


def step_event(i: int, total: int, t: float) -> dict:
    peak = int((1 + i / total) * GIB)
    return {
        "event": "step", "t": t, "step": i, "total_steps": total, "loss": 10 - i / 100, "step_ms": 100.0 + i % 7,
        "tokens_per_s": 80_000.0, "peak_alloc_fwd_bytes": peak // 2, "peak_alloc_bwd_bytes": peak, "peak_alloc_opt_bytes": peak // 3,
        "peak_reserved_bytes": peak + GIB // 4, "host_rss_bytes": 2 * GIB,
    }


def started_event(profile: str, total: int) -> dict:
    return {"event": "started", "t": time.time(), "run_id": f"r-{profile}", "run_dir": f"/nowhere/{profile}", "device": "cuda",
            "profile": {"name": profile}, "experiment": {"name": "gpt2s"}, "total_steps": total, "params": 124_000_000}
