"""Issue 8, CPU side: `memlab tui` under a live event stream (the TUI must stay responsive at 20 events/s).

The real app, headless (Textual's run_test, at each of --sizes), fed events shaped as a GPU run's (a step event
with every field the engine sends, then an NVML sample, in turn) from a worker thread, as a child's reader thread
feeds it, at each of --rates events a second (0: idle, the reference). Per rate:
- ui_cpu_share: CPU seconds of the UI thread per wall second, while the stream runs and no key is pressed;
- press_median_s / press_p90_s / press_max_s: Textual's pilot.press, which returns once the app has handled the key
  and gone idle (so an upper bound on what a user waits);
- redraws_per_s: live-panel redraws (the drain timer caps them at 1 / DRAIN_INTERVAL_S, whatever the rate);
- steps_fed / steps_shown: step events sent, and steps the panel counts at the end (equal: none dropped).
Every size and rate is measured --repeat times, interleaved (a busy neighbour hits all alike); the table is medians.

    python bench/tui_load.py --out bench/results
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import polars as pl

from memlab.core.events import make_event
from memlab.tui.app import MemlabApp
from memlab.core.units import GIB

KEYS = ["down", "down", "up", "tab", "shift+tab", "question_mark", "escape", "t", "t"]


def gpu_events(total: int):
    """An endless stream like a GPU child's: step i, then an NVML sample, then step i+1..."""
    t0 = time.time()
    yield make_event("started", run_id="bench-run", run_dir="/nowhere/bench-run", device="cuda", profile={"name": "fastest"},
                     experiment={"name": "gpt2s"}, total_steps=total, params=124_000_000, started_at="2026-01-01T00:00:00+00:00",
                     experiment_id="bench", changes=[], environment={}, vocab_size=50304, micro_batch=64, grad_accum=1,
                     world_size=1, distributed="none", tokens_per_step=131072, data={}, attention_kernel="flash", nvml=True)
    i = 0
    while True:
        peak = int((40 + i % 8 / 8) * GIB)
        yield make_event("step", step=i, total_steps=total, loss=10 - i / 1000, lr=6e-4, grad_norm=1.0, step_ms=197.6 + i % 5,
                         fwd_ms=60.0, bwd_ms=120.0, opt_ms=17.0, tokens=131072, tokens_per_s=663_000.0,
                         peak_alloc_fwd_bytes=peak // 2, peak_alloc_bwd_bytes=peak, peak_alloc_opt_bytes=peak // 3,
                         peak_reserved_bytes=peak + GIB, host_rss_bytes=3 * GIB, measured=i >= 2)
        yield make_event("gpu_sample", t=time.time() - t0, used_bytes=peak + 2 * GIB, util_pct=99.0, power_w=650.0)
        i += 1


async def measure(rate: float, seconds: float, size: tuple[int, int], rounds: int) -> dict:
    scratch = tempfile.TemporaryDirectory(prefix="memlab-tui-bench-")  # the app's runs folder: no run is written there
    app = MemlabApp(runs_dir=Path(scratch.name) / "runs", experiment="tiny", device="cpu")
    async with app.run_test(size=size) as pilot:
        await pilot.pause(0.5)  # mounted, the (empty) results loaded
        stop = threading.Event()
        fed = {"steps": 0}

        def feeder() -> None:
            app.feed(("run_started", 1, "fastest"))
            events = gpu_events(total=1_000_000)
            next_t = time.monotonic()
            while not stop.is_set():
                ev = next(events)
                app.feed(("event", 1, ev))
                fed["steps"] += ev["event"] == "step"
                next_t += 1 / rate
                time.sleep(max(0.0, next_t - time.monotonic()))

        thread = threading.Thread(target=feeder, daemon=True)
        if rate > 0:
            thread.start()
        await pilot.pause(0.3)
        renders0, wall0, cpu0 = app.live.renders, time.monotonic(), time.thread_time()
        await pilot.pause(seconds)
        cpu_share = (time.thread_time() - cpu0) / (time.monotonic() - wall0)
        redraws_per_s = (app.live.renders - renders0) / (time.monotonic() - wall0)
        latencies = []
        for _ in range(rounds):
            for key in KEYS:
                t0 = time.monotonic()
                await pilot.press(key)
                latencies.append(time.monotonic() - t0)
            await pilot.pause(0.1)
        stop.set()
        if rate > 0:
            thread.join()
        await pilot.pause(0.5)  # the last drain
        shown = app.live_state.step
    scratch.cleanup()
    latencies.sort()
    return {
        "events_per_s": rate, "ui_cpu_share": cpu_share, "press_median_s": statistics.median(latencies),
        "press_p90_s": latencies[int(0.9 * (len(latencies) - 1))], "press_max_s": latencies[-1], "presses": len(latencies),
        "redraws_per_s": redraws_per_s, "steps_fed": fed["steps"], "steps_shown": shown,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="bench/results")
    ap.add_argument("--rates", default="0,20,100,500", help="events a second, comma-separated (0: no stream)")
    ap.add_argument("--seconds", type=float, default=3.0, help="how long the UI thread's CPU share is measured")
    ap.add_argument("--rounds", type=int, default=3, help=f"how many times the {len(KEYS)} keys are pressed")
    ap.add_argument("--sizes", default="80x24,200x50", help="terminal sizes, COLSxROWS, comma-separated")
    ap.add_argument("--repeat", type=int, default=3, help="rounds over every size and rate, interleaved; medians reported")
    args = ap.parse_args()
    rows = []
    for repeat in range(args.repeat):
        for size in args.sizes.split(","):
            cols, lines = (int(x) for x in size.split("x"))
            for rate in args.rates.split(","):
                rows.append({"repeat": repeat, "screen": size} | asyncio.run(measure(float(rate), args.seconds, (cols, lines), args.rounds)))
                print(rows[-1], flush=True)
    machine = f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    frame = pl.DataFrame(rows).with_columns(pl.lit(machine).alias("machine"))
    figures = [c for c in frame.columns if c not in ("repeat", "screen", "events_per_s", "machine", "presses", "steps_fed", "steps_shown")]
    summary = (frame.group_by("screen", "events_per_s", maintain_order=True)
               .agg(*[pl.col(c).median() for c in figures], pl.col("presses").sum(), (pl.col("steps_fed") == pl.col("steps_shown")).all().alias("none_dropped"),
                    pl.len().alias("repeats")))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    frame.write_parquet(out / "tui_load.parquet")
    with pl.Config(tbl_cols=-1, tbl_width_chars=200, float_precision=3, tbl_rows=-1):
        text = f"medians over {args.repeat} interleaved repeats ({machine}); every repeat in tui_load.parquet\n{summary}"
    (out / "tui_load.txt").write_text(text + "\ncommand: python bench/tui_load.py " + " ".join(sys.argv[1:]) + "\n")
    print(text)


if __name__ == "__main__":
    main()
