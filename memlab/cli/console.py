"""Human-facing output of a run: progress updated in place on a terminal, plain lines otherwise; the summary."""

from __future__ import annotations

import sys
import time
from typing import Any

from rich.console import Console
from rich.table import Table

from memlab.core.config import warmup_warning
from memlab.core.units import gib


PIPE_WIDTH = 240  # tables written to a file or a pipe: wide enough for every column, nothing folded at 80


def make_console(stderr: bool = False) -> Console:
    """memlab's rich console: on a terminal, its width; elsewhere (CI logs, `| grep`) lines are never hard-wrapped."""
    stream = sys.stderr if stderr else sys.stdout
    if stream.isatty():
        return Console(stderr=stderr, highlight=False)
    return Console(stderr=stderr, highlight=False, soft_wrap=True, width=PIPE_WIDTH)


def num(x: float | None, fmt: str = "{:,.0f}") -> str:
    return "—" if x is None else fmt.format(x)


class ConsoleSink:
    """Prints progress from events. On a terminal one line is rewritten in place; otherwise a line every ~5%."""

    def __init__(self, console: Console | None = None, interactive: bool | None = None):
        self.console = console or make_console(stderr=True)
        self.interactive = self.console.is_terminal if interactive is None else interactive
        self.total = 0
        self._last_plain = -1
        self._last_draw = 0.0
        self.memory_label = "alloc"

    def _line(self, ev: dict[str, Any]) -> str:
        step, total = ev["step"] + 1, ev.get("total_steps") or self.total
        mem = ev.get("peak_alloc_bwd_bytes")
        mem_txt = f"peak {gib(max(filter(None, [ev.get('peak_alloc_fwd_bytes'), mem, ev.get('peak_alloc_opt_bytes')]), default=None))}" if mem is not None else f"host rss {gib(ev.get('host_rss_bytes'))}"
        loss = ev.get("loss")
        return (
            f"step {step}/{total}  loss {num(loss, '{:.4f}')}  {num(ev.get('tokens_per_s'))} tok/s  "
            f"{num(ev.get('step_ms'), '{:.1f}')} ms/step  {mem_txt}"
        )

    def emit(self, ev: dict[str, Any]) -> None:
        kind = ev["event"]
        if kind == "started":
            self.total = ev["total_steps"]
            d = ev.get("data", {})
            self.console.print(
                f"[bold]memlab[/] {ev['profile']['name']} on {ev['experiment']['name']} · {ev['device']} · "
                f"{ev['params'] / 1e6:.1f}M params · {ev['attention_kernel']} · {batch_split(ev)} · {self.total} steps"
            )
            self.console.print(f"  data: {d.get('source')} · {d.get('tokenizer')} · {d.get('train_tokens', 0):,} train / {d.get('val_tokens', 0):,} val tokens")
            from memlab.core.data.tokens import holdout_warning  # the data package imports torch: only when a run starts

            train = ev["experiment"].get("train", {})
            for warning in (holdout_warning(d.get("train_tokens") or 0, d.get("val_tokens") or 0),
                            warmup_warning(train.get("warmup_steps") or 0, self.total)):
                if warning:
                    self.console.print(f"  [yellow]warning[/] {warning}", soft_wrap=True)
            if ev.get("run_dir"):
                self.console.print(f"  run folder: {ev['run_dir']}")
        elif kind == "step":
            line = self._line(ev)
            if self.interactive:
                now = time.monotonic()
                if now - self._last_draw > 0.1 or ev["step"] + 1 == ev.get("total_steps"):
                    self.console.file.write("\r\x1b[2K" + line)
                    self.console.file.flush()
                    self._last_draw = now
            else:
                pct = int(20 * (ev["step"] + 1) / max(1, ev.get("total_steps") or 1))
                if pct != self._last_plain:
                    self._last_plain = pct
                    self.console.print(line)
        elif kind == "eval":
            self._newline()
            self.console.print(f"eval @ step {ev['step']}: val loss {ev['val_loss']:.4f}  ppl {ev['val_ppl']:.2f}")
        elif kind == "failed":
            self._newline()
            reason, message = ev["reason"], ev.get("message") or ""
            shown = message if message.startswith(reason) else f"{reason}: {message}"  # never "oom: oom ..."
            self.console.print(f"[bold red]{shown}[/]")

    def _newline(self) -> None:
        if self.interactive:
            self.console.file.write("\n")

    def close(self) -> None:
        pass


def batch_split(ev: dict[str, Any]) -> str:
    """`batch 8 (8 x 1)`: micro-batch x accumulation; on several ranks `batch 8 (4 per rank x 1 x 2 ranks)`."""
    batch, micro, accum = ev["experiment"]["train"]["batch_size"], ev["micro_batch"], ev["grad_accum"]
    world = ev.get("world_size") or 1
    if world > 1:
        return f"batch {batch} ({micro} per rank x {accum} x {world} ranks)"
    return f"batch {batch} ({micro} x {accum})"


def print_summary(summary: dict[str, Any], run_dir: Any, console: Console | None = None) -> None:
    console = console or make_console()
    s = summary
    table = Table(title=f"{s['profile']} · {s['experiment']} · {s['status']}", show_header=False, box=None, pad_edge=False)
    table.add_column(style="bold")
    table.add_column()
    if s["device"] == "cuda":
        table.add_row("peak memory", f"fwd {gib(s['peak_alloc_fwd_bytes'])} · bwd {gib(s['peak_alloc_bwd_bytes'])} · opt {gib(s['peak_alloc_opt_bytes'])}")
        table.add_row("", f"allocated {gib(s['peak_alloc_bytes'])} · reserved {gib(s['peak_reserved_bytes'])} · device (NVML) {gib(s['peak_nvml_bytes'])}")
        if s.get("estimate_peak_bytes") and s.get("peak_alloc_bytes"):
            table.add_row("", f"estimated {gib(s['estimate_peak_bytes'])} ({(s['estimate_peak_bytes'] - s['peak_alloc_bytes']) / s['peak_alloc_bytes']:+.1%} against allocated; memlab estimate)")
    else:
        table.add_row("peak memory", f"host RSS {gib(s['peak_host_rss_bytes'])} (CPU backend: no device memory)")
    table.add_row("step time", f"median {num(s['step_ms_median'], '{:.1f}')} ms · p90 {num(s['step_ms_p90'], '{:.1f}')} ms")
    mfu = s.get("mfu")
    table.add_row("throughput", f"{num(s['tokens_per_s'])} tokens/s" + (f" · MFU {mfu * 100:.1f}%" if mfu is not None else ""))
    table.add_row("quality", f"val loss {num(s['val_loss'], '{:.4f}')} · ppl {num(s['val_ppl'], '{:.2f}')}")
    table.add_row("run", f"{s['steps']} steps · {s['tokens']:,} tokens · {num(s['total_s'], '{:.1f}')} s · first step {num(s['time_to_first_step_s'], '{:.1f}')} s")
    fused = f" · {s['kernels']}" if s.get("kernels") not in (None, "off") else ""
    table.add_row("kernel", f"{s['attention_kernel']} · {s['precision']} · checkpointing {s['checkpointing']}{fused}")
    table.add_row("folder", str(run_dir))
    console.print(table)


def stderr_is_terminal() -> bool:
    return sys.stderr.isatty()
