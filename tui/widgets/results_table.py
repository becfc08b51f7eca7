"""The comparison table, the same frame and columns as `memlab table` (memlab.core.compare), filled in as runs finish.

`s` sorts by the column under the cursor (again: descending), as `memlab table --sort`: within each experiment.
Enter opens the row's run folder in the live panel.
"""

from __future__ import annotations

from dataclasses import dataclass

from rich.text import Text
from textual.binding import Binding
from textual.message import Message
from textual.widgets import DataTable

STATUS_STYLE = {"finished": "green", "interrupted": "yellow", "incomplete": "yellow", "running": "yellow"}


class ResultsTable(DataTable):
    BINDINGS = [
        Binding("s", "sort", "Sort", tooltip="Sort by the column under the cursor (again: descending), within each experiment"),
        Binding("enter", "open", "Open run", show=False, tooltip="Open the row's run folder in the live panel"),
    ]

    @dataclass
    class OpenRun(Message):
        path: str

    def __init__(self, **kwargs) -> None:
        super().__init__(cursor_type="cell", zebra_stripes=True, **kwargs)
        self.frame = None  # compare.read_runs output (all runs)
        self.table = None  # compare.comparison output (what is shown)
        self.sort_column: str | None = None
        self.sort_descending = False
        self.notes: list[str] = []
        self._paths: dict[str, str] = {}
        self._columns: list = []

    # --------------------------------------------------------------------------------------------- data

    def load(self, frame) -> None:
        """Show the comparison of `frame` (from compare.read_runs); keeps the sort and the cursor's column."""
        self.frame = frame
        self._render()

    def sort_by(self, column: str, descending: bool = False) -> None:
        self.sort_column, self.sort_descending = column, descending
        self._render()

    @property
    def row_profiles(self) -> list[str]:
        """Profiles of the run rows, top to bottom (group label rows left out)."""
        if self.table is None:
            return []
        return [r for r in self.table["profile"].to_list()]

    def _render(self) -> None:
        from memlab.core import compare

        if self.frame is None or self.frame.height == 0:
            self.table = None
            self.clear(columns=True)
            self._columns = []
            self.notes = ["no runs yet: finished runs appear here"]
            return
        sort = None
        if self.sort_column is not None:
            sort = ("-" if self.sort_descending else "") + self.sort_column
        table = compare.comparison(self.frame, sort=sort)
        self.table = table
        shown, _ = compare.visible_columns(table)  # the columns of memlab.core.metrics.TABLE that have figures
        cursor_col = self._columns[self.cursor_column].name if self._columns and self.cursor_column < len(self._columns) else None
        cursor_row = self.cursor_row
        self.clear(columns=True)
        self._columns = shown
        self._paths = {}
        for c in shown:
            mark = ""
            if c.name == self.sort_column:
                mark = " ▼" if self.sort_descending else " ▲"
            header = Text(c.header + mark, justify="left" if c.kind == "text" else "right")
            self.add_column(header, key=c.name)
        labels = list(compare.groups(table))
        for label, g in labels:
            if len(labels) > 1:
                self.add_row(*[Text(f"── {label}", style="bold dim") if i == 0 else "" for i in range(len(shown))], key=f"group:{label}")
            for r in g.iter_rows(named=True):
                cells = []
                for c in shown:
                    value = compare.format_value(r[c.name], c.kind)
                    if c.name == "status":
                        cell = Text(value, style=STATUS_STYLE.get(value, "red"))
                    elif c.name == "profile" and r["is_baseline"]:
                        cell = Text.assemble((value, "bold"), (" (base)", "dim"))
                    else:
                        cell = Text(value, justify="left" if c.kind == "text" else "right")
                    cells.append(cell)
                key = r["run_id"] or r["path"]
                self._paths[key] = r["path"]
                self.add_row(*cells, key=key)
        if cursor_col is not None and cursor_col in [c.name for c in shown]:
            self.move_cursor(row=min(cursor_row, self.row_count - 1), column=[c.name for c in shown].index(cursor_col), animate=False)
        self.notes = self._notes(table, shown)

    def _notes(self, table, shown) -> list[str]:
        from memlab.core import compare

        notes = []
        for label, g in compare.groups(table):
            base = g["baseline"][0]
            notes.append(f"{label}: " + (f"relative to {base}" if base else "no baseline, relative columns blank"))
        if compare.host_memory_only(table):
            notes.append("memory is host RSS (CPU: no device memory)")
        for r in table.filter(table["status"] != "finished").select("profile", "status", "reason").iter_rows(named=True):
            if r["reason"]:
                notes.append(f"{r['profile']} ({r['status']}): {r['reason'][:120]}")
        return notes

    # --------------------------------------------------------------------------------------------- keys

    def action_sort(self) -> None:
        if not self._columns:
            return
        column = self._columns[self.cursor_column].name
        descending = not self.sort_descending if column == self.sort_column else False
        self.sort_by(column, descending)

    def action_open(self) -> None:
        if not self.row_count:
            return
        key = self.coordinate_to_cell_key(self.cursor_coordinate).row_key.value
        if key in self._paths:
            self.post_message(self.OpenRun(self._paths[key]))

    def _on_data_table_header_selected(self, event: DataTable.HeaderSelected) -> None:
        event.stop()
        column = str(event.column_key.value)
        descending = not self.sort_descending if column == self.sort_column else False
        self.sort_by(column, descending)
