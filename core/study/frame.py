"""A study's results as one polars frame (what comparison.parquet holds and every table, figure and finding reads).

One row per training item (kind `common`, then `at_max`), in the study's profile order: the run's own
summary.parquet row (memlab.core.compare.read_runs), the relative columns against the baseline's common run
(memlab.core.compare.comparison, the same as `memlab table`), and the study's own columns:

    study_kind            common | at_max (another optimisation: its perplexity is not comparable)
    study_status          the item's outcome (a profile refused before any run keeps its row)
    study_message         why it did not finish
    max_batch             measured on CUDA (find-batch's probes); null on the CPU
    predicted_max_batch   the estimator's, at accumulation 1 under the study's memory
    max_batch_measured    whether max_batch was measured (False: CPU, or the search failed)
    train_tokens          the corpus' training tokens (run.json)
    epoch_s               one epoch at the measured pace: train_tokens / tokens_per_s
    estimate_error_pct    100 (estimate_peak_bytes / peak_alloc_bytes - 1), CUDA only
    throughput_x          tokens/s against the baseline's common run (the speed figure an at-max row has)
"""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl

from memlab.core.compare import FRAME_SCHEMA, comparison, read_runs
from memlab.core.runfolder import open_events
from memlab.core.study.state import StudyState

KIND_ORDER = ("common", "at_max")
STUDY_COLUMNS = {
    "study_kind": pl.String, "study_status": pl.String, "study_message": pl.String, "predicted_max_batch": pl.Int64,
    "max_batch_measured": pl.Boolean, "train_tokens": pl.Int64, "epoch_s": pl.Float64, "estimate_error_pct": pl.Float64,
    "throughput_x": pl.Float64,
}


def study_frame(state: StudyState, out: Path, baseline: str) -> pl.DataFrame:
    items = [state.items[f"{k}/{p}"] for k in KIND_ORDER for p in state.options.profiles if f"{k}/{p}" in state.items]
    items = [i for i in items if i.status != "pending"]
    parts = [_with_relative(_runs(out, [i for i in items if i.kind == kind and i.run_dir]), baseline) for kind in KIND_ORDER]
    runs = pl.concat([p for p in parts if p.height], how="diagonal_relaxed") if any(p.height for p in parts) else pl.DataFrame()
    by_path = {str(Path(r["path"]).resolve()): r for r in runs.to_dicts()} if runs.height else {}
    rows = []
    for item in items:
        row = by_path.get(str((out / item.run_dir).resolve())) if item.run_dir else None
        row = dict(row) if row else {"profile": item.profile, "status": item.status}
        own = state.items.get(f"max/{item.profile}")
        row.update(study_kind=item.kind, study_status=item.status, study_message=item.message or None,
                   max_batch=own.max_batch if own else None, predicted_max_batch=own.predicted_max_batch if own else None,
                   max_batch_measured=bool(own and own.status == "measured"),
                   train_tokens=_train_tokens(out, item.run_dir))
        rows.append(row)
    schema = {**FRAME_SCHEMA, "group": pl.String, "baseline": pl.String, "is_baseline": pl.Boolean,
              "mem_saved_pct": pl.Float64, "speedup_x": pl.Float64, "ppl_change_pct": pl.Float64, **STUDY_COLUMNS}
    frame = pl.DataFrame([{k: row.get(k) for k in schema} for row in rows], schema=schema, strict=False)
    return _derived(frame, baseline)


def _runs(out: Path, items: list) -> pl.DataFrame:
    if not items:
        return pl.DataFrame()
    frame, _ = read_runs([out / i.run_dir for i in items if (out / i.run_dir).exists()] or [out / "runs"])
    wanted = {str((out / i.run_dir).resolve()) for i in items}
    return frame.filter(pl.col("path").map_elements(lambda p: str(Path(p).resolve()) in wanted, return_dtype=pl.Boolean))


def _with_relative(runs: pl.DataFrame, baseline: str) -> pl.DataFrame:
    if runs.height == 0:
        return runs
    present = baseline in set(runs["profile"].to_list())
    return comparison(runs, baseline=baseline if present else None, latest_only=False)


def started_event(run_dir: Path) -> dict:
    """The run's `started` event (events.jsonl, or its .gz in an archived folder): what run.json does not keep
    (vocabulary, corpus size, micro-batch)."""
    try:
        with open_events(run_dir) as f:
            for line in f:
                if '"started"' in line:
                    event = json.loads(line)
                    if isinstance(event, dict) and event.get("event") == "started":
                        return event
    except (OSError, ValueError):
        pass
    return {}


def _train_tokens(out: Path, run_dir: str | None) -> int | None:
    value = (started_event(out / run_dir).get("data") or {}).get("train_tokens") if run_dir else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _derived(frame: pl.DataFrame, baseline: str) -> pl.DataFrame:
    base = frame.filter((pl.col("study_kind") == "common") & (pl.col("profile") == baseline) & (pl.col("status") == "finished"))
    base_tps = base["tokens_per_s"][0] if base.height else None
    at_max = pl.col("study_kind") == "at_max"
    return frame.with_columns(
        pl.when(pl.col("tokens_per_s") > 0).then(pl.col("train_tokens") / pl.col("tokens_per_s")).otherwise(None).alias("epoch_s"),
        pl.when(pl.col("peak_alloc_bytes") > 0).then(100 * (pl.col("estimate_peak_bytes") / pl.col("peak_alloc_bytes") - 1)).otherwise(None).alias("estimate_error_pct"),
        (pl.col("tokens_per_s") / base_tps if base_tps else pl.lit(None, dtype=pl.Float64)).alias("throughput_x"),
        # an at-max row is its own optimisation: no relative memory or perplexity against the common batch
        *[pl.when(at_max).then(None).otherwise(pl.col(c)).alias(c) for c in ("mem_saved_pct", "speedup_x", "ppl_change_pct")],
    )


def peak_column(frame: pl.DataFrame) -> tuple[str, str]:
    """(column, label) of the peak this study measured: the allocator's on CUDA, the host's RSS on the CPU."""
    if "peak_alloc_bytes" in frame.columns and frame["peak_alloc_bytes"].null_count() < frame.height:
        return "peak_alloc_bytes", "peak allocated"
    return "peak_host_rss_bytes", "peak host RSS (CPU backend)"


def common(frame: pl.DataFrame) -> pl.DataFrame:
    return frame.filter(pl.col("study_kind") == "common")


def finished(frame: pl.DataFrame) -> pl.DataFrame:
    return frame.filter(pl.col("status") == "finished")
