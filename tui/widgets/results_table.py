"""The comparison table, the same frame and columns as `memlab table` (memlab.core.compare), filled in as runs finish.

`s` sorts by the column under the cursor (again: descending), as `memlab table --sort`: within each experiment.
Enter opens the row's run folder in the live panel.

The panel shows the columns that fit its width, most telling first (the relative columns right after the profile);
`w` (from any panel) cycles the column sets: key figures, memory, speed, then all of them in pages that fit, the
profile first on each: a column is shown whole or not at all. A group's name is a row of its own, its words laid
over the row's cells rather than widening the profile column.
"""

from __future__ import annotations

from dataclasses import dataclass

from rich.text import Text
from textual.binding import Binding
from textual.message import Message
from textual.widgets import DataTable

STATUS_STYLE = {"finished": "green", "interrupted": "yellow", "incomplete": "yellow", "running": "yellow"}
CELL_PAD = 2  # DataTable's cell padding, both sides
BASE_MARK = " (base)"

# Column sets `w` cycles through: (name, columns in the order they are given room; None: every column, in pages).
COLUMN_SETS: tuple[tuple[str, tuple[str, ...] | None], ...] = (
    ("key figures", ("profile", "mem_saved_pct", "speedup_x", "ppl_change_pct", "status", "peak_alloc_bytes", "peak_host_rss_bytes",
                     "tokens_per_s", "val_ppl", "step_ms_median", "max_batch", "peak_nvml_bytes", "mfu")),
    ("memory", ("profile", "mem_saved_pct", "peak_alloc_bytes", "peak_host_rss_bytes", "peak_alloc_fwd_bytes", "peak_alloc_bwd_bytes",
                "peak_alloc_opt_bytes", "peak_reserved_bytes", "peak_nvml_bytes", "max_batch", "status", "batch_size")),
    ("speed", ("profile", "speedup_x", "tokens_per_s", "step_ms_median", "mfu", "total_s", "status", "batch_size", "n_gpus")),
    ("all", None),
)


def spread_words(text: str, widths: list[int]) -> list[str]:
    """`text` laid over cells of `widths`, whole words per cell (the gap between cells falls between words); the
    last cell ends with an ellipsis when the text is longer than the row."""
    words, cells = text.split(" "), []
    for i, width in enumerate(widths):
        line = ""
        while words and len(line + (" " if line else "") + words[0]) <= width:
            line += (" " if line else "") + words.pop(0)
        if not line and words:  # one word wider than the cell: cut it
            line, words[0] = words[0][:width], words[0][width:]
        cells.append(line)
    if words and cells:
        last = cells[-1]
        cells[-1] = (last[: max(0, widths[-1] - 1)] + "…") if widths[-1] else last
    return cells


def fit_columns(columns: list, widths: dict[str, int], order: tuple[str, ...] | None, room: int, keep: str | None = None) -> list:
    """The columns of `order` (by name, most wanted first) that fit `room` cells side by side, in that order; the
    first always, and `keep` (the sorted column: its mark must not push it off) before any other. `order` None:
    all of `columns`, as they are."""
    if order is None:
        return list(columns)
    by_name = {c.name: c for c in columns}
    need = {name: widths.get(name, len(by_name[name].header)) + CELL_PAD for name in order if name in by_name}
    wanted = [n for n in order if n in need]
    if keep in need and keep != wanted[0]:
        wanted.remove(keep)
        wanted.insert(1, keep)
    chosen, used = set(), 0
    for name in wanted:
        if chosen and used + need[name] > room:
            continue  # a narrower one further down may still fit
        chosen.add(name)
        used += need[name]
    return [by_name[n] for n in order if n in chosen]


def page_columns(columns: list, widths: dict[str, int], room: int) -> list[list]:
    """All of `columns` in pages that fit `room` cells, in order; the first column (the profile) leads every page.
    A column too wide for a page of its own still gets one."""
    if not columns:
        return [[]]
    first, pages = columns[0], []
    page, used = [first], widths.get(first.name, len(first.header)) + CELL_PAD
    for c in columns[1:]:
        need = widths.get(c.name, len(c.header)) + CELL_PAD
        if len(page) > 1 and used + need > room:
            pages.append(page)
            page, used = [first], widths.get(first.name, len(first.header)) + CELL_PAD
        page.append(c)
        used += need
    pages.append(page)
    return pages


REASON_CHARS = 80  # of a run's reason in the notes: two lines of the panel at 80 columns; enter on its row shows it whole


def _short(reason: str) -> str:
    line = " ".join(reason.split())
    return line if len(line) <= REASON_CHARS else line[: REASON_CHARS - 1].rstrip() + "…"


class ResultsTable(DataTable):
    BINDINGS = [
        Binding("s", "sort", "Sort", tooltip="Sort by the column under the cursor (again: descending), within each experiment"),
        Binding("enter", "open", "Open run", show=False, tooltip="Open the row's run folder in the live panel"),
    ]

    @dataclass
    class OpenRun(Message):
        path: str

    @dataclass
    class Rendered(Message):
        notes: list[str]
        columns: str = ""  # which columns are shown and how to see the others, for the panel's border

    def __init__(self, **kwargs) -> None:
        super().__init__(cursor_type="cell", zebra_stripes=True, **kwargs)
        self.frame = None  # compare.read_runs output (all runs)
        self.table = None  # compare.comparison output (what is shown)
        self.sort_column: str | None = None
        self.sort_descending = False
        self.notes: list[str] = []
        self._paths: dict[str, str] = {}
        self._columns: list = []
        self.column_set = 0  # index into COLUMN_SETS
        self.page = 0  # of the "all" set: which page of columns
        self._pages = 1
        self.columns_hint = ""
        self._rendered_width = 0

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

    @property
    def column_set_name(self) -> str:
        name = COLUMN_SETS[self.column_set][0]
        return f"{name} {self.page + 1}/{self._pages}" if self._pages > 1 else name

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
        visible, _ = compare.visible_columns(table)  # the columns of memlab.core.metrics.TABLE that have figures
        widths = self._widths(table, visible)
        room = self.size.width - self.styles.scrollbar_size_vertical
        order = COLUMN_SETS[self.column_set][1]
        if order is not None and (table["status"] == "finished").all():  # nothing to tell: status gets room last
            order = tuple(n for n in order if n != "status") + ("status",)
        shown = self._choose(visible, widths, order, room)
        self._rendered_width = self.size.width
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
            self.add_column(header, key=c.name, width=widths["profile"] if c.name == "profile" else None)
        self._add_rows(table, shown, [widths[c.name] for c in shown])
        if cursor_col is not None and cursor_col in [c.name for c in shown]:
            self.move_cursor(row=min(cursor_row, self.row_count - 1), column=[c.name for c in shown].index(cursor_col), animate=False)
        self.notes = self._notes(table, shown)
        hidden = len(visible) - len(shown)
        self.columns_hint = f"{self.column_set_name} · {hidden} more · w cycles" if hidden else f"{self.column_set_name} · w cycles"
        self.post_message(self.Rendered(list(self.notes), self.columns_hint))

    def _choose(self, visible: list, widths: dict[str, int], order: tuple[str, ...] | None, room: int) -> list:
        """The columns of the current set that fit `room` (a page of them for "all")."""
        self._pages = 1
        if room <= 0:
            return visible
        if order is not None:
            return fit_columns(visible, widths, order, room, keep=self.sort_column)
        pages = page_columns(visible, widths, room)
        self._pages, self.page = len(pages), min(self.page, len(pages) - 1)
        return pages[self.page]

    def _widths(self, table, columns) -> dict[str, int]:
        """Each column's width in cells: its header (with room for a sort mark) or its widest value."""
        from memlab.core import compare

        widths = {}
        for c in columns:
            values = [len(compare.format_value(v, c.kind)) for v in table[c.name].to_list()]
            mark = 2 if c.name == self.sort_column else 0
            widths[c.name] = max([len(c.header) + mark, *values])
        names = [len(str(p or "")) + (len(BASE_MARK) if b else 0) for p, b in zip(table["profile"], table["is_baseline"])]
        widths["profile"] = max([len("profile") + (2 if self.sort_column == "profile" else 0), *names])
        return widths

    def _add_rows(self, table, shown, widths: list[int]) -> None:
        from memlab.core import compare

        labels = list(compare.groups(table))
        for label, g in labels:
            if len(labels) > 1:  # the group's name on a row of its own, over all its cells: never widening a column
                cells = spread_words(f"── {label}", widths)
                self.add_row(*[Text(c, style="bold dim", justify="left") for c in cells], key=f"group:{label}")
            for r in g.iter_rows(named=True):
                cells = []
                for c in shown:
                    value = compare.format_value(r[c.name], c.kind)
                    if c.name == "status":
                        cell = Text(value, style=STATUS_STYLE.get(value, "red"))
                    elif c.name == "profile" and r["is_baseline"]:
                        cell = Text.assemble((value, "bold"), (BASE_MARK, "dim"))
                    else:
                        cell = Text(value, justify="left" if c.kind == "text" else "right")
                    cells.append(cell)
                key = r["run_id"] or r["path"]
                self._paths[key] = r["path"]
                self.add_row(*cells, key=key)

    def on_resize(self) -> None:
        if self.frame is not None and self.size.width != self._rendered_width:
            self._render()

    def _notes(self, table, shown) -> list[str]:
        from memlab.core import compare

        notes = []  # why a run did not finish first: the most telling, and never the line cut off
        for r in table.filter(table["status"] != "finished").select("profile", "status", "reason").iter_rows(named=True):
            if r["reason"]:
                notes.append(f"{r['profile']} ({r['status']}): {_short(r['reason'])}")
        for label, g in compare.groups(table):
            base = g["baseline"][0]
            notes.append(f"{label}: " + (f"relative to {base}" if base else "no baseline, relative columns blank"))
        if compare.host_memory_only(table):
            notes.append("memory is host RSS (CPU: no device memory)")
        return notes

    # --------------------------------------------------------------------------------------------- keys

    def action_sort(self) -> None:
        if not self._columns:
            return
        column = self._columns[self.cursor_column].name
        descending = not self.sort_descending if column == self.sort_column else False
        self.sort_by(column, descending)

    def action_next_columns(self) -> None:
        """The next page of "all", else the next set (the panel's border names it: no toast over the rows)."""
        if COLUMN_SETS[self.column_set][1] is None and self.page + 1 < self._pages:
            self.page += 1
        else:
            self.column_set, self.page = (self.column_set + 1) % len(COLUMN_SETS), 0
        self._render()

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
