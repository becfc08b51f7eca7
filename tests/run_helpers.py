"""Run folders as the engine writes them, and the PNG checks, for the tests of compare, table, plot and the
checkpointing frontier."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import polars as pl

from memlab.core import compare, schema

GIB = 1024**3
EXP_ID = "aaaa1111bbbb"

_counter = iter(range(1_000_000))


def write_run(
    root: Path,
    profile: str,
    *,
    status: str = "finished",
    experiment: str = "tiny",
    experiment_id: str = EXP_ID,
    device: str = "cpu",
    gpu_name: str | None = None,
    started_at: str | None = None,
    summary: bool = True,
    reason: str | None = None,
    **figures,
) -> Path:
    """A run folder as the engine writes it: run.json, and a one-row summary.parquet with SUMMARY_SCHEMA."""
    n = next(_counter)
    started_at = started_at or f"2026-01-01T00:{n // 60 % 60:02d}:{n % 60:02d}+00:00"
    run_id = f"20260101-{n:06d}-{profile}-{n:04x}"
    d = Path(root) / run_id
    d.mkdir(parents=True)
    info = {
        "schema_version": schema.SCHEMA_VERSION,
        "run_id": run_id,
        "status": status,
        "profile": {"name": profile},
        "experiment": {"name": experiment, "train": {"batch_size": 8}, "model": {"seq_len": 64}},
        "experiment_id": experiment_id,
        "environment": {"device": device, "gpu_name": gpu_name},
        "started_at": started_at,
        "ended_at": None,
        "reason": reason,
    }
    (d / schema.RUN_JSON).write_text(json.dumps(info))
    if summary:
        row = dict.fromkeys(schema.SUMMARY_SCHEMA)
        row.update(
            schema_version=schema.SCHEMA_VERSION, run_id=run_id, profile=profile, experiment=experiment,
            experiment_id=experiment_id, status=status, device=device, gpu_name=gpu_name, batch_size=8, seq_len=64,
            started_at=started_at, steps=6, tokens=6 * 8 * 64,
            peak_alloc_fwd_bytes=1 * GIB, peak_alloc_bwd_bytes=2 * GIB, peak_alloc_opt_bytes=GIB + GIB // 2,
            peak_alloc_bytes=2 * GIB, peak_reserved_bytes=3 * GIB, step_ms_median=100.0, step_ms_p90=120.0,
            tokens_per_s=5120.0, total_s=12.5, val_loss=3.9, val_ppl=50.0,
        )
        row.update(figures)
        pl.DataFrame([row], schema=schema.SUMMARY_SCHEMA).write_parquet(d / schema.SUMMARY)
    return d



PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def png_size(path: Path) -> tuple[int, int]:
    """(width, height) from the PNG's IHDR chunk, after checking the signature."""
    head = path.read_bytes()[:24]
    assert head[:8] == PNG_SIGNATURE, "not a PNG"
    assert head[12:16] == b"IHDR"
    return struct.unpack(">II", head[16:24])


def table_of(root: Path, **kw):
    return compare.comparison(compare.read_runs([root])[0], **kw)
