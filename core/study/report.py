"""A study's report: report.md, a self-contained report.html (figures inline as base64 PNG), comparison.parquet and
commands.txt, all from the state and the runs' own Parquet files. Both documents are rendered from one list of
blocks (heading, paragraph, bullet list, table, figure), so they say the same thing.
"""

from __future__ import annotations

import base64
import html
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import polars as pl

from memlab.core.compare import format_value
from memlab.core.runfolder import atomic_write_bytes, atomic_write_parquet, read_info
from memlab.core.study.figures import write_figures
from memlab.core.study.findings import estimates, findings, share_of_peak
from memlab.core.study.frame import common, finished, peak_column, study_frame
from memlab.core.study.state import StudyState
from memlab.core.units import MISSING, gib

AT_MAX_MARK = "†"


@dataclass
class Block:
    kind: str  # h1 | h2 | p | list | table | figure
    text: str = ""
    items: list | None = None  # list: lines; table: [headers, *rows]


def write_report(state: StudyState, out: Path, baseline: str) -> pl.DataFrame:
    frame = study_frame(state, out, baseline)
    atomic_write_parquet(out / "comparison.parquet", frame)
    breakdown = estimates(frame, out)
    try:
        figures, figure_note = write_figures(frame, out / "figures"), ""
    except ImportError as e:
        figures, figure_note = [], f"Figures not drawn: {e} (pip install matplotlib, then run the same command again)."
    blocks = _blocks(state, frame, breakdown, figures, baseline, out)
    if figure_note:
        blocks.insert(next(i for i, b in enumerate(blocks) if b.text == "Figures") + 1, Block("p", figure_note))
    atomic_write_bytes(out / "report.md", render_markdown(blocks).encode())
    atomic_write_bytes(out / "report.html", render_html(blocks, out).encode())
    atomic_write_bytes(out / "commands.txt", _commands(state).encode())
    return frame


def _budget_text(state: StudyState) -> str:
    """What the max-batch probes left the allocator of the capped card (each probe measures it through NVML)."""
    budgets = sorted({i.allocator_budget_bytes for i in state.items.values() if i.allocator_budget_bytes})
    if not budgets:
        return ""
    span = gib(budgets[0]) if len(budgets) == 1 else f"{gib(budgets[0])} to {gib(budgets[-1])}"
    return f" (the allocator's budget its max-batch probes measured: {span}; the rest is the CUDA context and the driver's reserve)"


def _blocks(state: StudyState, frame: pl.DataFrame, breakdown: dict, figures: list, baseline: str, out: Path) -> list[Block]:
    o = state.options
    col, label = peak_column(frame)
    where = f"{o.device}" + (f", memory capped at {o.gpu_memory}{_budget_text(state)}" if o.gpu_memory else "")
    blocks = [
        Block("h1", f"memlab study: {o.recipe or Path(o.experiment).stem}"),
        Block("p", f"{len(o.profiles)} profiles on {where}; common effective batch: {_batch_text(o.batch, frame)}; baseline: "
                   f"{baseline}. Written {datetime.now(timezone.utc).isoformat(timespec='seconds')}."),
        *[Block("p", line) for line in _unfinished(state)],
        Block("h2", "Environment"), Block("list", items=_environment(frame) + _searches_made_with(state)),
        Block("h2", "Table 1: methods at the common batch" + (" and at their own max" if o.at_max else "")),
        Block("table", items=_table1(frame, label, col)),
        Block("p", f"{AT_MAX_MARK} at the profile's own max micro-batch: a different optimisation (another batch), so its perplexity is "
                   "not comparable and it has no relative columns; throughput is shown against the baseline's common run."
                   if o.at_max else "Relative columns are against the baseline's run at the same batch."),
        *[Block("p", line) for line in _own_overrides(frame)],
        Block("h2", "Memory by phase"), Block("table", items=_memory_table(frame)),
        Block("h2", "Where the predicted peak goes (memlab's GPT: the analytic formula; another family: the trace)"), Block("table", items=_breakdown_table(breakdown)),
        Block("h2", "Findings"), Block("list", items=findings(frame, breakdown, baseline)),
        Block("h2", "Figures"),
        *[Block("figure", title, [str(path.relative_to(out))]) for title, path in figures],
        Block("p", "Files: comparison.parquet (these rows, every column), commands.txt (the exact commands), runs/ (every run folder)."),
    ]
    return blocks


def _unfinished(state: StudyState) -> list[str]:
    """The profiles whose work is not done (a stopped study, or a failure to be retried), said at the top so that a
    partial report is not read as the whole study."""
    kinds = ("max", "common", "at_max") if state.options.at_max else ("max", "common")
    left = []
    for name in state.options.profiles:
        todo = [k for k in kinds if not getattr(state.items.get(f"{k}/{name}"), "final", False)]
        if todo:
            found = state.items.get(f"max/{name}")
            known = f"max batch {found.max_batch:,} measured; " if found and found.max_batch and "max" not in todo else ""
            left.append(f"{name} ({known}to do: {', '.join(_KIND_WORDS[k] for k in todo)})")
    if not left:
        return []
    return [f"Not done yet: {len(left)} of {len(state.options.profiles)} profiles; the same command resumes. " + "; ".join(left) + "."]


_KIND_WORDS = {"max": "max-batch search", "common": "run at the common batch", "at_max": "run at its own max"}


def _versions(frame: pl.DataFrame) -> list[str]:
    """Runs made by different memlab commits or torch versions (a study resumed after an upgrade): said, with
    which profile ran under which, since their figures may differ for that reason alone."""
    seen: dict[tuple[str, str], list[str]] = {}
    for r in finished(frame).iter_rows(named=True):
        env = read_info(Path(r["path"])).get("environment") or {}
        version = (str(env.get("git_sha") or env.get("memlab") or MISSING), str(env.get("torch") or MISSING))
        seen.setdefault(version, []).append(_method(r))
    if len(seen) < 2:
        return []
    groups = "; ".join(f"memlab {m} · torch {t}: {', '.join(names)}" for (m, t), names in seen.items())
    return [f"NOTE: these runs come from {len(seen)} different versions (memlab commit, torch): {groups}"]


def _searches_made_with(state: StudyState) -> list[str]:
    """Which memlab made the max-batch searches (their probes are child runs, not run folders: the runs' versions
    above do not cover them); a search resumed after an update lists each commit it ran under."""
    made: dict[str, list[str]] = {}
    for item in state.items.values():
        if item.kind == "max" and item.searched_with:
            made.setdefault(" then ".join(item.searched_with), []).append(item.profile)
    if not made:
        return []
    if len(made) == 1:
        (which, names), = made.items()
        return [f"max-batch searches: memlab {which} ({len(names)} profile{'s' if len(names) != 1 else ''})"]
    return ["max-batch searches by different memlab commits: " + "; ".join(f"memlab {w}: {', '.join(n)}" for w, n in made.items())]


def _own_overrides(frame: pl.DataFrame) -> list[str]:
    """A profile that changes the experiment for itself (its [overrides], e.g. optim_in_bwd's train.clip = 0) ran
    another experiment: say so, where its missing relative columns would otherwise go unexplained."""
    if "overrides" not in frame.columns:
        return []
    rows = frame.filter(pl.col("overrides").is_not_null()).select("profile", "overrides").unique(maintain_order=True).rows()
    return [f"{name} ran with its own experiment overrides ({what}): another experiment than the baseline's, so it has "
            "no relative columns and its perplexity is not comparable." for name, what in rows]


def _batch_text(mode: str, frame: pl.DataFrame) -> str:
    sizes = sorted({b for b in common(frame)["batch_size"].to_list() if b is not None})
    size = ", ".join(map(str, sizes)) or MISSING
    return {"experiment": f"{size} (the experiment's)", "baseline-max": f"{size} (the largest batch the baseline fits)"}.get(mode, size)


def _environment(frame: pl.DataFrame) -> list[str]:
    run = next((r for r in finished(frame).iter_rows(named=True)), None)
    if run is None:
        return ["no finished run yet"]
    env = read_info(Path(run["path"])).get("environment") or {}
    lines = [f"device: {run['gpu_name'] or run['device']}" + (f" ({env.get('gpu_memory_bytes', 0) / 2**30:.0f} GiB)" if env.get("gpu_memory_bytes") else ""),
             f"driver: {env.get('driver') or MISSING} · torch {env.get('torch') or MISSING} · CUDA {env.get('cuda') or MISSING} · "
             f"flash-attn {env.get('flash_attn_4') or env.get('flash_attn') or MISSING} · memlab {env.get('git_sha') or env.get('memlab') or MISSING}",
             *_versions(frame)]
    for r in finished(frame).iter_rows(named=True):
        mark = f" {AT_MAX_MARK}" if r["study_kind"] == "at_max" else ""
        lines.append(f"kernels that ran, {r['profile']}{mark}: attention {r['attention_kernel'] or MISSING} · {r['precision']} · "
                     f"checkpointing {r['checkpointing']} · optimizer {r['optimizer']} · compile {r['compile']} · fused {r['kernels']}")
    return lines


def _method(r: dict) -> str:
    return r["profile"] + (f" {AT_MAX_MARK}" if r["study_kind"] == "at_max" else "")


def _max_cell(r: dict) -> str:
    if r["max_batch_measured"]:
        return format_value(r["max_batch"], "int")
    return f"~{r['predicted_max_batch']:,} predicted (not measured)" if r["predicted_max_batch"] else MISSING


def _table1(frame: pl.DataFrame, label: str, col: str) -> list[list[str]]:
    head = ["method", "status", "batch (micro × accum)", "max batch", label, "mem saved", "step ms", "speed-up", "tokens/s",
            "total s", "epoch s", "val ppl", "ppl Δ"]
    rows = [head]
    for r in frame.iter_rows(named=True):
        batch = f"{r['batch_size']} ({r['micro_batch']} × {r['grad_accum']})" if r["batch_size"] else MISSING
        speed = format_value(r["speedup_x"], "times") if r["study_kind"] == "common" else f"{format_value(r['throughput_x'], 'times')} tok/s"
        ppl = format_value(r["val_ppl"], "ppl") + (" (not comparable)" if r["study_kind"] == "at_max" and r["val_ppl"] else "")
        rows.append([_method(r), r["study_status"], batch, _max_cell(r), format_value(r[col], "gib") + " GiB" if r[col] else MISSING,
                     format_value(r["mem_saved_pct"], "signed_pct"), format_value(r["step_ms_median"], "ms"), speed,
                     format_value(r["tokens_per_s"], "rate"), format_value(r["total_s"], "seconds"), format_value(r["epoch_s"], "seconds"),
                     ppl, format_value(r["ppl_change_pct"], "signed_pct")])
    return rows


def _memory_table(frame: pl.DataFrame) -> list[list[str]]:
    """Per phase and per kind of figure; a column no run measured (the allocator's on the CPU, NVML without it) is left out."""
    columns = [("forward (GiB)", "peak_alloc_fwd_bytes"), ("backward (GiB)", "peak_alloc_bwd_bytes"), ("optimizer (GiB)", "peak_alloc_opt_bytes"),
               ("peak allocated (GiB)", "peak_alloc_bytes"), ("reserved (GiB)", "peak_reserved_bytes"), ("device, NVML (GiB)", "peak_nvml_bytes"),
               ("host RSS (GiB)", "peak_host_rss_bytes"), ("estimator's peak (GiB)", "estimate_peak_bytes")]
    runs = finished(frame)
    columns = [(h, c) for h, c in columns if runs[c].null_count() < runs.height]
    rows = [["method", *[h for h, _ in columns], "estimate vs measured"]]
    for r in runs.iter_rows(named=True):
        rows.append([_method(r), *[format_value(r[c], "gib") for _, c in columns], format_value(r["estimate_error_pct"], "signed_pct")])
    return rows


def _breakdown_table(breakdown: dict) -> list[list[str]]:
    rows = [["method", "micro-batch", "peak at", "predicted (GiB)", "largest parts"]]
    for name, est in breakdown.items():
        parts = ", ".join(f"{k} {v:.0f}%" for k, v in share_of_peak(est) if v >= 1)
        rows.append([name, str(est.micro_batch), est.peak_phase, format_value(est.total_bytes, "gib"), parts])
    return rows


def _commands(state: StudyState) -> str:
    lines = ["# the study (each invocation, UTC)", *state.invocations, "", "# each child, as the study ran it"]
    lines += [f"{key}: {item.command}" for key, item in state.items.items() if item.command]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------- rendering


def render_markdown(blocks: list[Block]) -> str:
    out = []
    for b in blocks:
        if b.kind in ("h1", "h2"):
            out.append(("# " if b.kind == "h1" else "## ") + b.text)
        elif b.kind == "p":
            out.append(b.text)
        elif b.kind == "list":
            out.append("\n".join(f"- {line}" for line in b.items or []))
        elif b.kind == "table":
            head, *rows = b.items or [[]]
            lines = ["| " + " | ".join(head) + " |", "|" + "|".join(":---" if i == 0 else "---:" for i in range(len(head))) + "|"]
            out.append("\n".join(lines + ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in rows]))
        elif b.kind == "figure":
            out.append(f"![{b.text}]({(b.items or [''])[0]})")
    return "\n\n".join(out) + "\n"


def _md_cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def render_html(blocks: list[Block], out: Path) -> str:
    body = []
    for b in blocks:
        if b.kind in ("h1", "h2"):
            body.append(f"<{b.kind}>{html.escape(b.text)}</{b.kind}>")
        elif b.kind == "p":
            body.append(f"<p>{_inline(b.text)}</p>")
        elif b.kind == "list":
            body.append("<ul>" + "".join(f"<li>{_inline(line)}</li>" for line in b.items or []) + "</ul>")
        elif b.kind == "table":
            head, *rows = b.items or [[]]
            cells = "".join(f"<th>{html.escape(h)}</th>" for h in head)
            trs = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for row in rows)
            body.append(f"<table><thead><tr>{cells}</tr></thead><tbody>{trs}</tbody></table>")
        elif b.kind == "figure":
            data = base64.b64encode((out / (b.items or [""])[0]).read_bytes()).decode()
            body.append(f'<figure><img alt="{html.escape(b.text)}" src="data:image/png;base64,{data}"><figcaption>{html.escape(b.text)}</figcaption></figure>')
    return _HTML.replace("{body}", "\n".join(body))


def _inline(text: str) -> str:
    """The one markdown the blocks use, **bold**, as HTML."""
    parts = html.escape(text).split("**")
    return "".join(f"<b>{p}</b>" if i % 2 else p for i, p in enumerate(parts))


_HTML = """<!doctype html>
<html><head><meta charset="utf-8"><title>memlab study</title>
<style>body{font-family:sans-serif;max-width:1200px;margin:2em auto;padding:0 1em}table{border-collapse:collapse;font-size:13px}
td,th{border:1px solid #ccc;padding:3px 6px;text-align:right}td:first-child,th:first-child{text-align:left}
img{max-width:100%}figure{margin:1em 0}</style></head>
<body>
{body}
</body></html>
"""
