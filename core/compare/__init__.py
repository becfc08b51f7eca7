"""Compare runs: read many run folders into one polars frame, pick a baseline per experiment, add relative columns.

Pure polars, in three steps, one module each:

    frame, skipped = read_runs(["runs/"])       # reading: one row per run folder; skipped = [(folder, reason), ...]
    table = comparison(frame, baseline=None)    # comparing: latest run of each profile per group, relative columns
    render_markdown(table)                      # presenting: columns, cells and notes every view shares

The CLI renders with rich and the TUI with Textual; both read DISPLAY_COLUMNS (memlab.core.metrics) and
format_value, so that they show the same columns, headers and units.
"""

from memlab.core.compare.comparing import (
    GROUP_KEYS,
    RELATIVE_COLUMNS,
    comparison,
    experiment_changes,
    group_label,
    group_labels,
    groups,
    load,
    resolve_sort,
    select_experiment,
    sortable_columns,
)
from memlab.core.compare.presenting import (
    DISPLAY_COLUMNS,
    DisplayColumn,
    Kind,
    format_value,
    group_notes,
    host_memory_only,
    machine_frame,
    render_markdown,
    visible_columns,
    write_parquet,
)
from memlab.core.compare.reading import EXTRA_SCHEMA, FAILED_STATUSES, FRAME_SCHEMA, read_runs
from memlab.core.runfolder import find_run_dirs
from memlab.core.units import GIB

__all__ = [
    "DISPLAY_COLUMNS", "EXTRA_SCHEMA", "FAILED_STATUSES", "FRAME_SCHEMA", "GIB", "GROUP_KEYS", "RELATIVE_COLUMNS",
    "DisplayColumn", "Kind", "comparison", "experiment_changes", "find_run_dirs", "format_value", "group_label",
    "group_labels", "group_notes", "groups",
    "host_memory_only", "load", "machine_frame", "read_runs", "render_markdown", "resolve_sort", "select_experiment",
    "sortable_columns", "visible_columns", "write_parquet",
]
