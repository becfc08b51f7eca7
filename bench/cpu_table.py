"""Issue 8, CPU side: `memlab table` over 1,000 run folders (target < 2 s).

Makes one real tiny run with `memlab run`, copies its folder 999 times under new run ids (ten profile names, so the
default latest-per-profile view and --all both have work), then times the real command in a fresh process.

    python bench/cpu_table.py --out bench/results
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import polars as pl

from memlab.core.runfolder import atomic_write_json, atomic_write_parquet, read_info


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="bench/results")
    ap.add_argument("--folders", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="memlab-table-bench-"))
    runs = work / "runs"
    subprocess.run([sys.executable, "-m", "memlab", "run", "--profile", "baseline", "--device", "cpu", "--experiment", "tiny",
                    "--steps", "4", "--runs-dir", str(runs), "--events", str(work / "ev.jsonl")], check=True, capture_output=True)
    (seed,) = list(runs.iterdir())
    summary = pl.read_parquet(seed / "summary.parquet")
    meta = read_info(seed)
    for i in range(1, args.folders):
        profile = f"profile{i % 10}"
        run_id = f"20260101-{i:06d}-{profile}-{i:04x}"
        d = runs / run_id
        shutil.copytree(seed, d)
        atomic_write_parquet(d / "summary.parquet", summary.with_columns(
            pl.lit(run_id).alias("run_id"), pl.lit(profile).alias("profile"),
            pl.lit(f"2026-01-01T{i // 3600:02d}:{i // 60 % 60:02d}:{i % 60:02d}+00:00").alias("started_at")))
        atomic_write_json(d / "run.json", meta | {"run_id": run_id, "profile": meta["profile"] | {"name": profile}})
    rows = []
    for mode in ([], ["--all"]):
        times = []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            r = subprocess.run([sys.executable, "-m", "memlab", "table", str(runs), *mode], capture_output=True, text=True, env={**os.environ, "COLUMNS": "200"})
            times.append(time.perf_counter() - t0)
            assert r.returncode == 0, r.stderr
        rows.append({"case": "table " + " ".join(mode or ["(latest)"]), "folders": args.folders, "median_s": statistics.median(times), "min_s": min(times), "max_s": max(times), "repeat": args.repeat})
    frame = pl.DataFrame(rows).with_columns(pl.lit(f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores").alias("machine"))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    frame.write_parquet(out / "cpu_table.parquet")
    (out / "cpu_table.txt").write_text(str(frame) + "\ncommand: python bench/cpu_table.py " + " ".join(sys.argv[1:]) + "\n")
    print(frame)
    shutil.rmtree(work)


if __name__ == "__main__":
    main()
