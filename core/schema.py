"""The run store's contract: file names and the columns of summary.parquet and steps.parquet.

Engine, table and TUI all read these names from here; the summary's columns come from memlab.core.metrics.
Units are in the names (bytes, ms, s).
A figure that does not apply on this run (NVML on CPU, MFU on an unknown GPU) is null, never 0.
"""

from __future__ import annotations

import polars as pl

from memlab.core import metrics

SCHEMA_VERSION = 1

RUN_JSON = "run.json"
EVENTS = "events.jsonl"
STEPS = "steps.parquet"
GPU = "gpu.parquet"
SUMMARY = "summary.parquet"
RANKS = "ranks.parquet"

# run.json "status" values; a folder whose run.json still says "running" and whose process is gone is incomplete.
STATUSES = ("running", "finished", "oom", "nan", "interrupted", "error", "crashed")

# One row of summary.parquet: every summary metric, in the order memlab.core.metrics declares them.
SUMMARY_SCHEMA: dict[str, pl.DataType] = metrics.summary_schema()

# ranks.parquet (RANKS), distributed runs only: one row per rank, each rank's own measurements (its memory, its step
# time, its share of the tokens); summary.parquet holds them reduced over ranks (memlab.core.distributed).
RANK_SCHEMA: dict[str, pl.DataType] = {
    "rank": pl.Int64,
    "local_rank": pl.Int64,
    "world_size": pl.Int64,
    "hostname": pl.String,
    "device": pl.String,  # e.g. cuda:1
    **{name: SUMMARY_SCHEMA[name] for name in metrics.per_rank_names()},
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
    "process_bytes": pl.Int64,  # this process, NVML's per-process figure (null where NVML does not list it)
    "util_pct": pl.Float64,
    "power_w": pl.Float64,
}
