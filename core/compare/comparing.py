"""Comparing runs: groups of comparable runs, the latest run of each profile, the baseline and relative columns.

Groups. Runs are compared only with runs of the same experiment fingerprint (`experiment_id`) on the same hardware
(`device`, `gpu_name`): peak memory on a CPU host and on an H100 are not the same quantity, nor are step times on two
different GPUs. Every row carries its `group` label (group_label: the experiment and what differs from it as written,
e.g. `tiny · steps=300 · n_layer=4 on cpu`), which the table, the plot and the TUI all show; a table never mixes groups.
"""

from __future__ import annotations

import collections
import functools
import json
import os
from collections.abc import Iterable, Sequence

import polars as pl

from memlab.core import metrics
from memlab.core.compare.reading import FRAME_SCHEMA, read_runs
from memlab.core.errors import MemlabError

GROUP_KEYS = ("experiment_id", "device", "gpu_name")
RELATIVE_COLUMNS = tuple(m.name for m in metrics.RELATIVE)
HIDDEN_COLUMNS = ("experiment_config",)  # read to name groups; not part of the comparison frame


def group_label(experiment: str | None, changes: str | None, device: str | None, gpu_name: str | None) -> str:
    """How a group is named on screen: the experiment and what its runs changed against it as written, then the
    hardware: `tiny · steps=300 · n_layer=4 on cpu`, `gpt2s on NVIDIA H100 80GB HBM3`."""
    where = gpu_name or device or "unknown device"
    return " · ".join(filter(None, [experiment or "unnamed", changes])) + f" on {where}"


def group_labels(firsts: list[dict]) -> list[str]:
    """The label of each group (given its first row), all distinct. A built-in experiment's changes are read against
    its TOML; an experiment memlab cannot look up (a file of the user's) is told apart by its id when it must be."""
    names = {}
    for r in firsts:
        names.setdefault(r["experiment"], set()).add(r["experiment_id"])
    labels = []
    for r in firsts:
        changes = experiment_changes(r.get("experiment_config"), r["experiment"])
        if changes is None:
            changes = r["experiment_id"] if len(names[r["experiment"]]) > 1 else ""
        model = r.get("architecture") if r.get("model_family") == "hf" else None  # what a transformers run trained
        name = f"{r['experiment'] or 'unnamed'} ({model})" if model else r["experiment"]
        labels.append(group_label(name, changes, r["device"], r["gpu_name"]))
    seen = collections.Counter(labels)  # the same changes twice (a built-in edited between runs): keep them apart
    return [f"{label} ({r['experiment_id']})" if seen[label] > 1 else label for label, r in zip(labels, firsts)]


def experiment_changes(config_json: str | None, name: str | None) -> str | None:
    """`steps=300 · n_layer=4`: the knobs where a run's experiment differs from the built-in experiment `name`
    ("" when none); None when there is no such built-in or the run did not record its experiment."""
    written = _builtin_experiment(name)
    if written is None or not config_json:
        return None
    try:
        ran = json.loads(config_json)
    except ValueError:
        return None
    changes = []
    for section, fields in written.items():
        if not isinstance(fields, dict) or not isinstance(ran.get(section), dict):
            continue
        for key, value in fields.items():
            if key in ran[section] and ran[section][key] != value:
                changes.append(f"{key}={_short(ran[section][key])}")
    return " · ".join(changes)


@functools.lru_cache(maxsize=None)
def _builtin_experiment(name: str | None) -> dict | None:
    from memlab.core.config import builtin_names, load_experiment, to_dict

    if name not in builtin_names("experiment"):
        return None
    return to_dict(load_experiment(name))


def _short(value: object) -> str:
    text = str(value)
    if isinstance(value, str) and ("/" in text or os.sep in text):
        text = os.path.basename(text.rstrip("/" + os.sep)) or text  # a data path: its name is enough to tell apart
    return text if len(text) <= 32 else text[:31] + "…"


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
    for c in metrics.TABLE:
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
        raise MemlabError(f"unknown sort column {column!r}; choose one of: {', '.join(c.name for c in metrics.TABLE)}")
    return names[key], descending


def comparison(
    frame: pl.DataFrame,
    baseline: str | None = None,
    latest_only: bool = True,
    sort: str | None = None,
) -> pl.DataFrame:
    """The comparison frame: one row per run (the latest finished run of each profile per group, else its latest,
    unless `latest_only=False`), grouped by experiment and hardware, with the baseline's profile, the relative
    columns, and `later_run`: how a later run of the profile ended when one did not finish (else null).

    baseline: profile name; default "baseline" where a group has it, else the group's first row (oldest run).
    A name no group has is a MemlabError listing the profiles present; a group that lacks it has null relative
    columns. Runs that failed keep their identity and status; their figures are null. Interrupted runs keep their
    figures (of the steps they completed).

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
    # Runs that failed: keep who and what, blank every measured figure. An interrupted run keeps the figures its
    # summary has (of the steps it completed); the notes under its table say so.
    figures = [name for name in metrics.figure_names() if name in df.columns]
    measured = pl.col("status").is_in(["finished", "interrupted"])
    df = df.with_columns([pl.when(measured).then(pl.col(c)).otherwise(None).alias(c) for c in figures])

    df = df.sort([*GROUP_KEYS, "_order", "run_id"], nulls_last=True)
    df = _latest_finished(df) if latest_only else df.with_columns(pl.lit(None, dtype=pl.String).alias("later_run"))

    parts = [g for _, g in df.group_by(list(GROUP_KEYS), maintain_order=True)]
    if baseline is not None and baseline not in set(df["profile"].to_list()):
        raise MemlabError(f"unknown baseline {baseline!r}; profiles present: {', '.join(sorted(set(df['profile'].to_list())))}")
    labels = group_labels([g.row(0, named=True) for g in parts])
    out = [_relative(g, baseline, label) for g, label in zip(parts, labels)]
    # Groups in a stable order: by experiment name, then id, then hardware.
    out.sort(key=lambda g: tuple(str(g[c][0] or "") for c in ("experiment", "experiment_id", "device", "gpu_name")))
    out = [g.with_columns(pl.lit(i, dtype=pl.Int64).alias("group_index")) for i, g in enumerate(out)]
    result = pl.concat(out, how="diagonal_relaxed")
    if sort:
        # Sort within each group, keeping the groups in their order; ties stay in run order.
        column, descending = resolve_sort(sort)
        result = result.sort(["group_index", column, "_order"], descending=[False, descending, False], nulls_last=True, maintain_order=True)
    keep = ["group", "group_index", "baseline", "is_baseline", *FRAME_SCHEMA, *RELATIVE_COLUMNS, "later_run"]
    return result.select([c for c in keep if c in result.columns and c not in HIDDEN_COLUMNS])


def _latest_finished(df: pl.DataFrame) -> pl.DataFrame:
    """One row per profile and group (`df` in run order): its latest finished run, else its latest run. When a later
    run of it did not finish, `later_run` says how that one ended and which it was (the notes under the table say
    so), so that an interrupted retry never hides the figures of the run before it."""
    keys = [*GROUP_KEYS, "profile"]
    df = df.with_row_index("_idx")
    picks = df.group_by(keys, maintain_order=True).agg(
        pl.col("_idx").filter(pl.col("status") == "finished").max().alias("_finished"),
        pl.col("_idx").max().alias("_last"),
        pl.col("status").last().alias("_last_status"),
        pl.col("run_id").last().alias("_last_run"),
    ).with_columns(pl.coalesce("_finished", "_last").alias("_keep"))
    picks = picks.select(
        "_keep",
        pl.when(pl.col("_keep") != pl.col("_last"))
        .then(pl.format("{} ({})", pl.col("_last_status").fill_null("?"), pl.col("_last_run").fill_null("?")))
        .otherwise(None).alias("later_run"),
    )
    return df.join(picks, left_on="_idx", right_on="_keep", how="inner", maintain_order="left").drop("_idx")


def _relative(g: pl.DataFrame, baseline: str | None, label: str) -> pl.DataFrame:
    profiles = g["profile"].to_list()
    name = baseline if baseline is not None else ("baseline" if "baseline" in profiles else profiles[0])
    base_rows = g.filter(pl.col("profile") == name)
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
    frame_cols = {c: t for c, t in FRAME_SCHEMA.items() if c not in HIDDEN_COLUMNS}
    return pl.DataFrame(schema={**extra, **frame_cols, **rel, "later_run": pl.String})


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
