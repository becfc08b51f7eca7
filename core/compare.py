"""Compare runs: read many run folders into one polars frame, pick a baseline per experiment, add relative columns.

Pure polars. Rendering lives elsewhere (the CLI renders with rich, the TUI with Textual) and both read
`DISPLAY_COLUMNS` so that they show the same columns, headers and units.

    frame, skipped = read_runs(["runs/"])       # one row per run folder; skipped = [(folder, reason), ...]
    table = comparison(frame, baseline=None)    # latest run of each profile per group, relative columns added

Groups. Runs are compared only with runs of the same experiment fingerprint (`experiment_id`) on the same hardware
(`device`, `gpu_name`): peak memory on a CPU host and on an H100 are not the same quantity, nor are step times on two
different GPUs. Every row carries its `group` label; a table never mixes groups.

Robustness. Each run folder is read on its own terms: a folder whose run.json or summary.parquet is missing, partial
or corrupt is returned in `skipped` with the reason, never raised (unless `strict=True`). A folder that has a run.json
but no summary.parquet is a row with no figures and the status "running" (run.json's pid is alive on this host),
"incomplete" (killed mid-run), or the failure status its run.json recorded (e.g. "crashed", set by a supervisor).

Speed. Summaries are read with one multi-file parquet scan (parallel: ~0.15 s for 1,000 folders on 2 cores). One bad
file fails such a scan without naming itself, so a failed scan is split in halves until the bad files are found and
named; good files are never read one by one.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import polars as pl

from memlab.core import schema
from memlab.core.errors import MemlabError

GIB = 1024**3

# ---------------------------------------------------------------------------------------------- display columns

Kind = Literal["text", "int", "gib", "ms", "rate", "fraction_pct", "seconds", "ppl", "signed_pct", "times"]


@dataclass(frozen=True)
class DisplayColumn:
    """One column as every view shows it: `name` in the frame, `header` on screen, `kind` says how to format."""

    name: str
    header: str
    kind: Kind
    help: str = ""
    figure: bool = True  # a measured figure: blank for runs that did not finish


DISPLAY_COLUMNS: tuple[DisplayColumn, ...] = (
    DisplayColumn("profile", "profile", "text", "technique profile", figure=False),
    DisplayColumn("status", "status", "text", "finished, or why not: oom, nan, interrupted, crashed, error; running, incomplete (no summary)", figure=False),
    DisplayColumn("batch_size", "batch", "int", "effective batch (sequences per optimizer step)", figure=False),
    DisplayColumn("n_gpus", "GPUs", "int", "GPUs the run trained on: its world size (ranks) on CUDA, 0 on CPU; memory figures are per GPU"),
    DisplayColumn("peak_alloc_fwd_bytes", "fwd GiB", "gib", "peak allocated during forward"),
    DisplayColumn("peak_alloc_bwd_bytes", "bwd GiB", "gib", "peak allocated during backward"),
    DisplayColumn("peak_alloc_opt_bytes", "opt GiB", "gib", "peak allocated during the optimizer step"),
    DisplayColumn("peak_alloc_bytes", "peak GiB", "gib", "peak allocated over a step (max of the phases)"),
    DisplayColumn("peak_reserved_bytes", "reserved GiB", "gib", "peak reserved by the caching allocator"),
    DisplayColumn("peak_nvml_bytes", "NVML GiB", "gib", "device-wide peak from NVML (includes the CUDA context)"),
    DisplayColumn("peak_host_rss_bytes", "host GiB", "gib", "peak resident memory of the host process"),
    DisplayColumn("max_batch", "max batch", "int", "largest micro-batch that completes full steps"),
    DisplayColumn("step_ms_median", "step ms", "ms", "median step time over measured steps"),
    DisplayColumn("tokens_per_s", "tokens/s", "rate", "training throughput"),
    DisplayColumn("mfu", "MFU", "fraction_pct", "model FLOPs utilisation against the GPU's dense peak"),
    DisplayColumn("total_s", "total s", "seconds", "wall time of the whole run"),
    DisplayColumn("val_ppl", "val ppl", "ppl", "validation perplexity on the experiment's held-out tokens"),
    DisplayColumn("mem_saved_pct", "mem saved", "signed_pct", "100 × (1 − peak / baseline peak)"),
    DisplayColumn("speedup_x", "speed-up", "times", "baseline step time / step time"),
    DisplayColumn("ppl_change_pct", "ppl Δ", "signed_pct", "100 × (val ppl / baseline val ppl − 1)"),
)

RELATIVE_COLUMNS = ("mem_saved_pct", "speedup_x", "ppl_change_pct")

# Columns every frame from read_runs carries besides the summary's own.
EXTRA_SCHEMA: dict[str, pl.DataType] = {
    "path": pl.String,  # the run folder
    "complete": pl.Boolean,  # summary.parquet was there
    "reason": pl.String,  # run.json's reason for a run that did not finish
}
FRAME_SCHEMA: dict[str, pl.DataType] = {**schema.SUMMARY_SCHEMA, **EXTRA_SCHEMA}
GROUP_KEYS = ("experiment_id", "device", "gpu_name")
FAILED_STATUSES = ("oom", "nan", "interrupted", "error", "crashed")


def format_value(value: object, kind: Kind) -> str:
    """A cell as text: GiB with 2 decimals, MFU as percent, relative figures signed; None (null) is "—"."""
    if value is None or (isinstance(value, float) and value != value):
        return "—"
    if kind == "text":
        return str(value)
    if kind == "int":
        return f"{int(value):,}"
    v = float(value)  # type: ignore[arg-type]
    if kind == "gib":
        return f"{v / GIB:.2f}"
    if kind == "ms":
        return f"{v:,.1f}" if v < 1000 else f"{v:,.0f}"
    if kind == "rate":
        return f"{v:,.0f}"
    if kind == "fraction_pct":
        return f"{100 * v:.1f}%"
    if kind == "seconds":
        return f"{v:,.1f}"
    if kind == "ppl":
        return f"{v:,.2f}"
    if kind == "signed_pct":
        return f"{v + 0.0 if round(v, 1) else 0.0:+.1f}%"  # never "-0.0%"
    if kind == "times":
        return f"{v:.2f}×"
    raise ValueError(f"unknown column kind {kind!r}")


# ---------------------------------------------------------------------------------------------- reading


def find_run_dirs(paths: Sequence[str | os.PathLike]) -> list[Path]:
    """Run folders under `paths`: a path that is a run folder itself, or the run folders inside it (two levels deep,
    so that `runs/` and `runs/<sweep>/` both work). A folder is a run when it has a run.json or a summary.parquet.
    A path that does not exist is a MemlabError."""
    found: list[Path] = []
    seen: set[str] = set()

    def is_run(d: str) -> bool:
        return os.path.isfile(os.path.join(d, schema.RUN_JSON)) or os.path.isfile(os.path.join(d, schema.SUMMARY))

    def walk(d: str, depth: int) -> None:
        try:
            entries = sorted((e for e in os.scandir(d) if e.is_dir() and not e.name.startswith(".")), key=lambda e: e.name)
        except OSError:
            return
        for e in entries:
            if is_run(e.path):
                if e.path not in seen:
                    seen.add(e.path)
                    found.append(Path(e.path))
            elif depth > 1:
                walk(e.path, depth - 1)

    for p in paths:
        p = os.path.normpath(os.fspath(p))
        if not os.path.exists(p):
            raise MemlabError(f"{p}: no such folder")
        if not os.path.isdir(p):
            raise MemlabError(f"{p}: not a folder (give a run folder or a folder of runs)")
        if is_run(p):
            if p not in seen:
                seen.add(p)
                found.append(Path(p))
        else:
            walk(p, 2)
    return found


def _read_run_json(d: Path) -> dict:
    """run.json as a dict; raises ValueError with a short reason when it is missing, partial or not a run."""
    f = d / schema.RUN_JSON
    try:
        text = f.read_text()
    except FileNotFoundError:
        raise ValueError(f"no {schema.RUN_JSON}") from None
    except OSError as e:
        raise ValueError(f"{schema.RUN_JSON} unreadable ({e.strerror or e})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{schema.RUN_JSON} is not valid JSON (line {e.lineno}: {e.msg})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{schema.RUN_JSON} is not a JSON object")
    version = data.get("schema_version")
    if isinstance(version, int) and version > schema.SCHEMA_VERSION:
        raise ValueError(f"{schema.RUN_JSON} has schema_version {version}, newer than this memlab ({schema.SCHEMA_VERSION})")
    return data


def _conform(df: pl.DataFrame) -> pl.DataFrame:
    """Cast a summary (or a fast-path batch of them) to SUMMARY_SCHEMA: missing columns null, extra ones dropped."""
    cols = []
    for name, dtype in schema.SUMMARY_SCHEMA.items():
        if name in df.columns:
            cols.append(pl.col(name).cast(dtype, strict=False))
        else:
            cols.append(pl.lit(None, dtype=dtype).alias(name))
    extra = [c for c in df.columns if c.startswith("_")]
    return df.select(*cols, *[pl.col(c) for c in extra])


def _scan_fast(files: list[str]) -> pl.DataFrame:
    """Every summary in one parallel scan, with the file each row came from in `_file`. Raises on any bad file."""
    kwargs: dict = dict(
        glob=False,
        include_file_paths="_file",
        missing_columns="insert",
        extra_columns="ignore",
        schema=schema.SUMMARY_SCHEMA,
    )
    try:
        kwargs["cast_options"] = pl.ScanCastOptions(integer_cast=["upcast", "allow-float"], float_cast="upcast")
    except (AttributeError, TypeError):  # older polars: exact dtypes only, the slow path handles the rest
        pass
    return pl.scan_parquet(files, **kwargs).collect()


def _scan_robust(files: list[str]) -> tuple[list[pl.DataFrame], list[tuple[str, str]]]:
    """Scan many summaries at once; when a scan fails, split it in halves to find the bad files (k bad files cost
    about k log n scans, not n single reads). Returns (frames, [(file, reason), ...]) in the order of `files`."""
    if not files:
        return [], []
    try:
        df = _scan_fast(files)
    except Exception:  # noqa: BLE001
        if len(files) == 1:
            try:
                return [_read_one(files[0])], []  # the scan's cast options refused it; a plain read may not
            except ValueError as e:
                return [], [(files[0], str(e))]
        half = len(files) // 2
        a_frames, a_bad = _scan_robust(files[:half])
        b_frames, b_bad = _scan_robust(files[half:])
        return a_frames + b_frames, a_bad + b_bad
    counts = df.group_by("_file").len()
    odd = set(counts.filter(pl.col("len") != 1)["_file"].to_list()) | (set(files) - set(counts["_file"].to_list()))
    bad = []
    if odd:
        df = df.filter(~pl.col("_file").is_in(list(odd)))
        for f in files:
            if f in odd:
                n = counts.filter(pl.col("_file") == f)["len"].sum()
                bad.append((f, f"{schema.SUMMARY} has {n} rows, expected 1"))
    return [_conform(df)], bad


def _read_one(f: str) -> pl.DataFrame:
    """One summary.parquet, checked: raises ValueError with a short reason."""
    try:
        df = pl.read_parquet(f)
    except FileNotFoundError:
        raise ValueError(f"no {schema.SUMMARY}") from None
    except Exception as e:  # noqa: BLE001 (polars raises ComputeError / OSError / its own types for corrupt or partial files)
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ValueError(f"{schema.SUMMARY} is corrupt or partial ({msg[:120]})") from None
    if df.height != 1:
        raise ValueError(f"{schema.SUMMARY} has {df.height} rows, expected 1")
    return _conform(df).with_columns(pl.lit(f).alias("_file"))


def _incomplete_row(d: Path, info: dict) -> dict:
    """A row for a folder with run.json and no summary: who it is, its status, no figures. ValueError if it cannot
    say which profile it ran."""
    status = info.get("status")
    if status not in FAILED_STATUSES:
        # No summary yet: still running (its process is alive on this host), or killed before it could write one.
        status = "running" if _alive(info) else "incomplete"
    profile = info.get("profile")
    name = profile.get("name") if isinstance(profile, dict) else profile
    if not isinstance(name, str) or not name:
        raise ValueError(f"no {schema.SUMMARY}, and {schema.RUN_JSON} names no profile")
    experiment = info.get("experiment")
    train = experiment.get("train") if isinstance(experiment, dict) else None
    model = experiment.get("model") if isinstance(experiment, dict) else None
    env = info.get("environment") if isinstance(info.get("environment"), dict) else {}
    device = info.get("device") if isinstance(info.get("device"), str) else env.get("device")
    return {
        "schema_version": info.get("schema_version"),
        "run_id": info.get("run_id") or d.name,
        "profile": name,
        "experiment": experiment.get("name") if isinstance(experiment, dict) else experiment,
        "experiment_id": info.get("experiment_id"),
        "status": status,
        "device": device,
        "gpu_name": env.get("gpu_name"),
        "batch_size": train.get("batch_size") if isinstance(train, dict) else None,
        "seq_len": model.get("seq_len") if isinstance(model, dict) else None,
        "started_at": info.get("started_at"),
        "path": str(d),
        "complete": False,
        "reason": _reason_text(info) or ("no summary.parquet yet" if status == "running" else "no summary.parquet: killed mid-run?"),
    }


def _alive(info: dict) -> bool:
    """Whether run.json's `pid` is a live process on this host (a run in progress rather than a dead one)."""
    import socket

    pid = info.get("pid")
    env = info.get("environment") if isinstance(info.get("environment"), dict) else {}
    if not isinstance(pid, int) or pid <= 0 or env.get("hostname") not in (None, socket.gethostname()):
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    except OSError:
        return False
    return True


def _typed(v: object, dtype: pl.DataType) -> object:
    """A run.json value fit for a column of `dtype`, or None (a malformed run.json never breaks the frame)."""
    if dtype == pl.String:
        return v if isinstance(v, str) else None
    if dtype == pl.Int64:
        return v if isinstance(v, int) and not isinstance(v, bool) and -(2**63) <= v < 2**63 else None
    if dtype == pl.Float64:
        return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None
    if dtype == pl.Boolean:
        return v if isinstance(v, bool) else None
    return None


def _reason_text(info: dict) -> str | None:
    """Why a run did not finish, in one line, from run.json's `message` (the error) or `reason` (its kind)."""
    for key in ("message", "reason"):
        value = info.get(key)
        if isinstance(value, str) and value.strip():
            return value.strip().splitlines()[0][:300]
        if value not in (None, "") and not isinstance(value, str):
            return json.dumps(value)[:300]
    return None


def read_runs(
    paths: Sequence[str | os.PathLike] | str | os.PathLike, strict: bool = False
) -> tuple[pl.DataFrame, list[tuple[str, str]]]:
    """Every run folder under `paths` as one frame (FRAME_SCHEMA: the summary's columns plus path, complete, reason).

    Returns (frame, skipped) where skipped lists (folder, reason) for folders that could not be read. With
    `strict=True` the first such folder raises MemlabError instead. A path that does not exist raises MemlabError.
    """
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    dirs = find_run_dirs(paths)
    skipped: list[tuple[str, str]] = []

    def skip(d: Path, reason: str) -> None:
        if strict:
            raise MemlabError(f"{d}: {reason}")
        skipped.append((str(d), reason))

    infos: dict[str, dict] = {}
    with_summary: list[Path] = []
    incomplete: list[dict] = []
    for d in dirs:
        try:
            info = _read_run_json(d)
        except ValueError as e:
            skip(d, str(e))
            continue
        infos[str(d)] = info
        if os.path.isfile(d / schema.SUMMARY):
            with_summary.append(d)
        else:
            try:
                incomplete.append(_incomplete_row(d, info))
            except ValueError as e:
                skip(d, str(e))

    files = [str(d / schema.SUMMARY) for d in with_summary]
    frames, bad = _scan_robust(files)
    for f, reason in bad:
        skip(Path(f).parent, reason)
    summaries = pl.concat(frames, how="diagonal_relaxed") if frames else pl.DataFrame(schema={**schema.SUMMARY_SCHEMA, "_file": pl.String})

    if summaries.height:
        # Per-run facts that only run.json has (why a run failed), and identity where the summary left it blank.
        files_now = summaries["_file"].to_list()
        folders = [str(Path(f).parent) for f in files_now]
        info_of = [infos.get(d, {}) for d in folders]
        facts = pl.DataFrame(
            {
                "_file": files_now,
                "path": folders,
                "reason": [_reason_text(i) for i in info_of],
                "_run_id": [_typed(i.get("run_id"), pl.String) for i in info_of],
                "_experiment_id": [_typed(i.get("experiment_id"), pl.String) for i in info_of],
            },
            schema={"_file": pl.String, "path": pl.String, "reason": pl.String, "_run_id": pl.String, "_experiment_id": pl.String},
        )
        summaries = summaries.join(facts, on="_file", how="left", maintain_order="left").with_columns(
            pl.lit(True).alias("complete"),
            pl.coalesce("run_id", "_run_id").alias("run_id"),
            pl.coalesce("experiment_id", "_experiment_id").alias("experiment_id"),
        ).drop("_run_id", "_experiment_id")
    if summaries.height and (summaries["schema_version"] > schema.SCHEMA_VERSION).any():
        newer = summaries.filter(pl.col("schema_version") > schema.SCHEMA_VERSION)
        for f, v in newer.select("_file", "schema_version").iter_rows():
            skip(Path(f).parent, f"{schema.SUMMARY} has schema_version {v}, newer than this memlab ({schema.SCHEMA_VERSION})")
        summaries = summaries.filter(pl.col("schema_version").fill_null(0) <= schema.SCHEMA_VERSION)
    summaries = summaries.drop("_file", strict=False)

    frame = summaries.select(
        [pl.col(c).cast(t, strict=False) if c in summaries.columns else pl.lit(None, dtype=t).alias(c) for c, t in FRAME_SCHEMA.items()]
    )
    if incomplete:
        rows = [{k: _typed(row.get(k), t) for k, t in FRAME_SCHEMA.items()} for row in incomplete]
        frame = pl.concat([frame, pl.DataFrame(rows, schema=FRAME_SCHEMA, strict=False)], how="vertical")
    return frame, sorted(skipped)


# ---------------------------------------------------------------------------------------------- comparison


def group_label(experiment: str | None, experiment_id: str | None, device: str | None, gpu_name: str | None) -> str:
    """How a group is named on screen: `tiny (3f2a1b2c3d4e) on cpu` / `… on NVIDIA H100 80GB HBM3`."""
    where = gpu_name or device or "unknown device"
    return f"{experiment or 'unnamed'} ({experiment_id or 'no id'}) on {where}"


def select_experiment(frame: pl.DataFrame, key: str) -> pl.DataFrame:
    """Rows whose experiment name or experiment_id (or an id prefix of 4+ characters) is `key`."""
    match = (pl.col("experiment") == key) | (pl.col("experiment_id") == key)
    if len(key) >= 4:
        match = match | pl.col("experiment_id").str.starts_with(key)
    out = frame.filter(match.fill_null(False))
    if out.height == 0:
        present = sorted({f"{n} ({i})" for n, i in frame.select("experiment", "experiment_id").unique().iter_rows()}, key=str)
        raise MemlabError(f"no runs of experiment {key!r}; present: {', '.join(present) or 'none'}")
    return out


def sortable_columns() -> dict[str, str]:
    """Names `--sort` accepts (frame column names and on-screen headers, lower case) -> frame column."""
    out: dict[str, str] = {}
    for c in DISPLAY_COLUMNS:
        out[c.name] = c.name
        out[c.header.lower()] = c.name
    for name in ("run_id", "started_at", "experiment", "device"):
        out[name] = name
    return out


def resolve_sort(column: str) -> tuple[str, bool]:
    """`--sort` value -> (frame column, descending). A leading '-' sorts descending."""
    descending = column.startswith("-")
    key = column.lstrip("-").strip().lower()
    names = sortable_columns()
    if key not in names:
        raise MemlabError(f"unknown sort column {column!r}; choose one of: {', '.join(c.name for c in DISPLAY_COLUMNS)}")
    return names[key], descending


def comparison(
    frame: pl.DataFrame,
    baseline: str | None = None,
    latest_only: bool = True,
    sort: str | None = None,
) -> pl.DataFrame:
    """The comparison frame: one row per run (the latest of each profile per group unless `latest_only=False`),
    grouped by experiment and hardware, with the baseline's profile and the relative columns.

    baseline: profile name; default "baseline" where a group has it, else the group's first row (oldest run).
    A name no group has is a MemlabError listing the profiles present; a group that lacks it has null relative
    columns. Runs that did not finish keep their identity and status; their figures are null.

    Relative columns: mem_saved_pct = 100 (1 - peak / base peak) on peak_alloc_bytes, or on peak_host_rss_bytes in a
    group with no device figures (CPU); speedup_x = base step ms / step ms when both do the same tokens per step, else
    tokens/s / base tokens/s; ppl_change_pct = 100 (val ppl / base val ppl - 1).
    """
    if frame.height == 0:
        return _empty_comparison(frame)
    df = frame.with_columns(
        pl.col("started_at").fill_null(pl.col("run_id")).alias("_order"),
        pl.col("profile").fill_null("?"),
    )
    # Runs that did not finish: keep who and what, blank every measured figure.
    figures = [c.name for c in DISPLAY_COLUMNS if c.figure and c.name in df.columns and c.name not in RELATIVE_COLUMNS]
    figures += ["step_ms_p90", "fwd_ms_median", "bwd_ms_median", "opt_ms_median", "final_loss", "val_loss", "time_to_first_step_s", "compile_s"]
    finished = pl.col("status") == "finished"
    df = df.with_columns([pl.when(finished).then(pl.col(c)).otherwise(None).alias(c) for c in figures])

    df = df.sort([*GROUP_KEYS, "_order", "run_id"], nulls_last=True)
    if latest_only:
        df = df.unique(subset=[*GROUP_KEYS, "profile"], keep="last", maintain_order=True)

    parts = [g for _, g in df.group_by(list(GROUP_KEYS), maintain_order=True)]
    if baseline is not None and baseline not in set(df["profile"].to_list()):
        raise MemlabError(f"unknown baseline {baseline!r}; profiles present: {', '.join(sorted(set(df['profile'].to_list())))}")
    out = [_relative(g, baseline) for g in parts]
    # Groups in a stable order: by experiment name, then id, then hardware.
    out.sort(key=lambda g: tuple(str(g[c][0] or "") for c in ("experiment", "experiment_id", "device", "gpu_name")))
    out = [g.with_columns(pl.lit(i, dtype=pl.Int64).alias("group_index")) for i, g in enumerate(out)]
    result = pl.concat(out, how="diagonal_relaxed")
    if sort:
        # Sort within each group, keeping the groups in their order; ties stay in run order.
        column, descending = resolve_sort(sort)
        result = result.sort(["group_index", column, "_order"], descending=[False, descending, False], nulls_last=True, maintain_order=True)
    keep = ["group", "group_index", "baseline", "is_baseline", *FRAME_SCHEMA, *RELATIVE_COLUMNS]
    return result.select([c for c in keep if c in result.columns])


def _relative(g: pl.DataFrame, baseline: str | None) -> pl.DataFrame:
    profiles = g["profile"].to_list()
    name = baseline if baseline is not None else ("baseline" if "baseline" in profiles else profiles[0])
    base_rows = g.filter(pl.col("profile") == name)
    first = g.row(0, named=True)
    label = group_label(first["experiment"], first["experiment_id"], first["device"], first["gpu_name"])
    if base_rows.height == 0:
        g = g.with_columns(
            pl.lit(label).alias("group"),
            pl.lit(None, dtype=pl.String).alias("baseline"),
            pl.lit(False).alias("is_baseline"),
            *[pl.lit(None, dtype=pl.Float64).alias(c) for c in RELATIVE_COLUMNS],
        )
        return g
    # With --all a profile has several runs: the baseline is its latest finished one (else its latest).
    fin = base_rows.filter(pl.col("status") == "finished")
    base = (fin if fin.height else base_rows).row(-1, named=True)
    mem_col = "peak_alloc_bytes"
    if base["peak_alloc_bytes"] is None and g["peak_alloc_bytes"].null_count() == g.height:
        mem_col = "peak_host_rss_bytes"  # a CPU group: host memory is what was measured
    base_mem = base[mem_col]
    base_tokens_step = _tokens_per_step(base)
    same_work = (pl.col("batch_size") * pl.col("seq_len")) == (base_tokens_step if base_tokens_step is not None else -1)

    def ratio(num: pl.Expr, den: pl.Expr) -> pl.Expr:
        return pl.when(den > 0).then(num / den).otherwise(None)

    speed_by_step = ratio(pl.lit(base["step_ms_median"], dtype=pl.Float64), pl.col("step_ms_median"))
    speed_by_tps = ratio(pl.col("tokens_per_s"), pl.lit(base["tokens_per_s"], dtype=pl.Float64))
    is_base = (pl.col("run_id") == base["run_id"]).fill_null(False)
    relative = {
        "mem_saved_pct": 100 * (1 - ratio(pl.col(mem_col).cast(pl.Float64), pl.lit(base_mem, dtype=pl.Float64))),
        "speedup_x": pl.when(same_work.fill_null(False) & speed_by_step.is_not_null()).then(speed_by_step).otherwise(speed_by_tps),
        "ppl_change_pct": 100 * (ratio(pl.col("val_ppl"), pl.lit(base["val_ppl"], dtype=pl.Float64)) - 1),
    }
    # The baseline against itself is exactly 0 % / 1x (polars may divide by a literal as a multiply by its inverse).
    exact = {"mem_saved_pct": 0.0, "speedup_x": 1.0, "ppl_change_pct": 0.0}
    return g.with_columns(
        pl.lit(label).alias("group"),
        pl.lit(name).alias("baseline"),
        is_base.alias("is_baseline"),
        *[pl.when(is_base & e.is_not_null()).then(pl.lit(exact[c])).otherwise(e).alias(c) for c, e in relative.items()],
    )


def _tokens_per_step(row: dict) -> int | None:
    if row.get("batch_size") is None or row.get("seq_len") is None:
        return None
    return int(row["batch_size"]) * int(row["seq_len"])


def _empty_comparison(frame: pl.DataFrame) -> pl.DataFrame:
    extra = {"group": pl.String, "group_index": pl.Int64, "baseline": pl.String, "is_baseline": pl.Boolean}
    rel = {c: pl.Float64 for c in RELATIVE_COLUMNS}
    return pl.DataFrame(schema={**extra, **FRAME_SCHEMA, **rel})


def load(
    paths: Sequence[str | os.PathLike] | str | os.PathLike,
    baseline: str | None = None,
    latest_only: bool = True,
    experiment: str | None = None,
    sort: str | None = None,
    strict: bool = False,
) -> tuple[pl.DataFrame, list[tuple[str, str]]]:
    """read_runs + select_experiment + comparison in one call (what `memlab table` and the TUI's results view do).
    Returns (comparison frame, skipped folders)."""
    frame, skipped = read_runs(paths, strict=strict)
    if experiment is not None and frame.height:
        frame = select_experiment(frame, experiment)
    return comparison(frame, baseline=baseline, latest_only=latest_only, sort=sort), skipped


def groups(table: pl.DataFrame) -> Iterable[tuple[str, pl.DataFrame]]:
    """(label, rows) for each group of a comparison frame, in order."""
    for (_, label), g in table.group_by(["group_index", "group"], maintain_order=True):
        yield label, g


def write_parquet(table: pl.DataFrame, path: str | os.PathLike) -> Path:
    """Write the comparison frame atomically (temp file + rename)."""
    path = Path(path)
    if path.is_dir():
        path = path / "comparison.parquet"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        table.write_parquet(tmp)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    return path
