"""One `memlab run` in this process with Python's garbage collections counted (issue 49: is the host's pace, which
moves gradcp_bf16's step time from process to process, the collector's?).

    python3 bench/gc_run.py auto|freeze|off -- RUN ARGS...     (RUN ARGS as `memlab run` takes them, without --events)

`auto`: the collector as Python leaves it; `freeze`: what engine commit e066bf5 did (reverted in the next: a
the CPU suite ran 332.6 s with it, 277.4 s after), one collection after the first step, then every object alive
frozen; `off`: the collector disabled once memlab is imported (the run's objects then live until exit). Prints one JSON line:
the collections (and their wall ms) between the first and the last step event, and the run's median step, forward
and backward ms from its finished event.
"""

from __future__ import annotations

import gc
import io
import json
import sys
import time


class Lines(io.TextIOBase):
    """stdout for the run's events: each line kept with the time it was written."""

    def __init__(self):
        self.lines, self._part = [], ""

    def write(self, s: str) -> int:
        self._part += s
        while "\n" in self._part:
            line, self._part = self._part.split("\n", 1)
            self.lines.append((time.perf_counter(), line))
        return len(s)


def main() -> None:
    mode, args = sys.argv[1], sys.argv[sys.argv.index("--") + 1:]
    collections: list[tuple[float, float, int]] = []  # (start, seconds, generation)
    began = [0.0]

    def clock(phase: str, info: dict) -> None:
        if phase == "start":
            began[0] = time.perf_counter()
        else:
            collections.append((began[0], time.perf_counter() - began[0], info["generation"]))

    from memlab.cli import main as memlab_main

    if mode == "off":
        gc.disable()
    elif mode == "freeze":
        from memlab.core import engine

        count = engine._count_step

        def count_then_freeze(run, i):  # as e066bf5's engine did, after the first step
            count(run, i)
            if i == 0:
                gc.collect()
                gc.freeze()

        engine._count_step = count_then_freeze
    gc.callbacks.append(clock)
    out, real = Lines(), sys.stdout
    sys.stdout = out
    try:
        memlab_main(["run", *args, "--events", "-"])
    except SystemExit:
        pass
    finally:
        sys.stdout = real
    events = [(t, json.loads(line)) for t, line in out.lines if line.startswith("{")]
    steps = [t for t, e in events if e.get("event") == "step"]
    finished = next((e for _, e in events if e.get("event") == "finished"), {})
    summary = finished.get("summary", finished)
    inside = [c for c in collections if steps and steps[0] <= c[0] <= steps[-1]]
    print(json.dumps({
        "mode": mode, "steps_seen": len(steps), "gc_in_steps": len(inside),
        "gc_ms_in_steps": round(sum(c[1] for c in inside) * 1000, 2),
        "gc_by_generation": {g: sum(1 for c in inside if c[2] == g) for g in (0, 1, 2)},
        "wall_s_of_steps": round(steps[-1] - steps[0], 3) if len(steps) > 1 else None,
        **{k: summary.get(k) for k in ("step_ms_median", "fwd_ms_median", "bwd_ms_median", "opt_ms_median", "peak_alloc_bytes")},
    }), flush=True)


if __name__ == "__main__":
    main()
