"""The README's study table, printed from a committed study's comparison.parquet (no figure typed in).

usage: python bench/study_readme_table.py [STUDY_DIR]   (default bench/results/study-so-posts-h100)
"""

from __future__ import annotations

import sys
from pathlib import Path

import polars as pl

GIB = 2**30
HEADER = ("| method | max batch (predicted) | peak allocated | device (NVML) | mem saved | step ms | speed-up | val ppl |\n"
          "|:---|---:|---:|---:|---:|---:|---:|---:|")


def _num(value, fmt: str, dash: str = "—") -> str:
    return dash if value is None else format(value, fmt)


def _method(row: dict) -> str:
    if (row["grad_accum"] or 1) > 1:
        return f"{row['profile']} (micro {row['micro_batch']} × {row['grad_accum']})"
    return row["profile"]


def _line(row: dict) -> str:
    max_batch = f"{_num(row['max_batch'], ',')} ({_num(row['predicted_max_batch'], ',')})"
    saved = "—" if row["mem_saved_pct"] is None else f"{row['mem_saved_pct']:+.1f}%"
    speed = "—" if row["speedup_x"] is None else f"{row['speedup_x']:.2f}×"
    return (f"| {_method(row)} | {max_batch} | {row['peak_alloc_bytes'] / GIB:.2f} GiB | "
            f"{row['peak_nvml_bytes'] / GIB:.2f} GiB | {saved} | {row['step_ms_median']:.1f} | {speed} | "
            f"{_num(row['val_ppl'], ',.2f')} |")


def table(study: Path) -> str:
    frame = pl.read_parquet(study / "comparison.parquet").filter(pl.col("study_kind") == "common")
    return "\n".join([HEADER, *(_line(row) for row in frame.iter_rows(named=True))])


if __name__ == "__main__":
    print(table(Path(sys.argv[1] if len(sys.argv) > 1 else "bench/results/study-so-posts-h100")))
