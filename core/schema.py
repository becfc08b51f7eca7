"""The run store's contract: file names and the columns of summary.parquet and steps.parquet.

Engine, table and TUI all read these names from here. Units are in the names (bytes, ms, s).
A figure that does not apply on this run (NVML on CPU, MFU on an unknown GPU) is null, never 0.
"""

from __future__ import annotations

import polars as pl

SCHEMA_VERSION = 1

RUN_JSON = "run.json"
EVENTS = "events.jsonl"
STEPS = "steps.parquet"
GPU = "gpu.parquet"
SUMMARY = "summary.parquet"
RANKS = "ranks.parquet"

# run.json "status" values; a folder whose run.json still says "running" and whose process is gone is incomplete.
STATUSES = ("running", "finished", "oom", "nan", "interrupted", "error", "crashed")

SUMMARY_SCHEMA: dict[str, pl.DataType] = {
    "schema_version": pl.Int64,
    "run_id": pl.String,
    "profile": pl.String,
    "experiment": pl.String,
    "experiment_id": pl.String,  # fingerprint of the resolved experiment: only equal ids are compared
    "status": pl.String,
    "device": pl.String,  # cuda | cpu
    "gpu_name": pl.String,
    "n_gpus": pl.Int64,
    "params": pl.Int64,
    "batch_size": pl.Int64,  # effective batch (sequences per optimizer step)
    "micro_batch": pl.Int64,
    "grad_accum": pl.Int64,
    "seq_len": pl.Int64,
    "precision": pl.String,
    "attention_kernel": pl.String,  # the kernel that actually ran, e.g. sdpa:cudnn
    "window": pl.Int64,
    "checkpointing": pl.String,
    "optimizer": pl.String,
    "compile": pl.String,
    "kernels": pl.String,  # kernels.fused: "off", "fused (triton <version>)" or "fused (CPU reference)"
    "steps": pl.Int64,  # optimizer steps completed
    "tokens": pl.Int64,  # training tokens processed
    "peak_alloc_fwd_bytes": pl.Int64,
    "peak_alloc_bwd_bytes": pl.Int64,
    "peak_alloc_opt_bytes": pl.Int64,
    "peak_alloc_bytes": pl.Int64,
    "peak_reserved_bytes": pl.Int64,
    "peak_nvml_bytes": pl.Int64,
    "peak_host_rss_bytes": pl.Int64,
    "alloc_retries": pl.Int64,
    "ooms": pl.Int64,
    "estimate_peak_bytes": pl.Int64,
    "max_batch": pl.Int64,
    "step_ms_median": pl.Float64,
    "step_ms_p90": pl.Float64,
    "fwd_ms_median": pl.Float64,
    "bwd_ms_median": pl.Float64,
    "opt_ms_median": pl.Float64,
    "tokens_per_s": pl.Float64,
    "flops_per_token": pl.Float64,
    "mfu": pl.Float64,  # fraction (0..1) of the GPU's dense peak for the compute dtype; null when unknown
    "time_to_first_step_s": pl.Float64,
    "compile_s": pl.Float64,
    "total_s": pl.Float64,
    "final_loss": pl.Float64,
    "val_loss": pl.Float64,
    "val_ppl": pl.Float64,
    "skipped_steps": pl.Int64,  # fp16: steps the GradScaler skipped for inf/nan gradients
    "torch_version": pl.String,
    "started_at": pl.String,  # UTC ISO-8601
}

STEP_SCHEMA: dict[str, pl.DataType] = {
    "step": pl.Int64,
    "loss": pl.Float64,
    "lr": pl.Float64,
    "grad_norm": pl.Float64,
    "step_ms": pl.Float64,
    "fwd_ms": pl.Float64,
    "bwd_ms": pl.Float64,
    "opt_ms": pl.Float64,
    "tokens": pl.Int64,
    "tokens_per_s": pl.Float64,
    "peak_alloc_fwd_bytes": pl.Int64,
    "peak_alloc_bwd_bytes": pl.Int64,
    "peak_alloc_opt_bytes": pl.Int64,
    "peak_reserved_bytes": pl.Int64,
    "host_rss_bytes": pl.Int64,
    "measured": pl.Boolean,  # False for the warm-up steps left out of the summary figures
}

GPU_SCHEMA: dict[str, pl.DataType] = {
    "t": pl.Float64,  # seconds since the run started
    "used_bytes": pl.Int64,
    "util_pct": pl.Float64,
    "power_w": pl.Float64,
}
