"""Why `memlab run --memory-snapshot` fails inside some backward passes (issue 17: heldout_mid gradcp_every2 failed
with "SystemError: run_backward returned NULL without setting an exception", and leanest's traces stopped after the
first forward): memlab's own step, recorded with each setting of _record_memory_history, and with the
non-reentrant checkpoint's early stop (which raises inside the recomputation) off.

    python3 bench/snapshot_stop_probe.py [EXPERIMENT PROFILE MICRO_BATCH]      # on a GPU
    python3 bench/snapshot_stop_probe.py EXPERIMENT PROFILE MICRO_BATCH --save SNAPSHOT --context alloc
                                    # one recording of three steps, torch's snapshot saved (bench/allocator_replay.py reads it)
"""

from __future__ import annotations

import sys

import torch
import torch.utils.checkpoint as ckpt

from memlab.cli.options import resolve
from memlab.core.techniques import build_step


def recorded(experiment: str, profile: str, b: int, context: str | None, stacks: str, early_stop: bool,
             steps: int = 2, save: str = "") -> str:
    e, p = resolve(experiment, profile, "cuda", [])
    step = build_step(e, p, torch.device("cuda"), 8192)
    batch = [(torch.randint(0, 8192, (b, e.model.seq_len)), torch.randint(0, 8192, (b, e.model.seq_len)))]
    torch.cuda.memory._record_memory_history(enabled="all", context=context, stacks=stacks, max_entries=500_000)
    try:
        with ckpt.set_checkpoint_early_stop(early_stop):
            for _ in range(steps):
                step.run(batch)
        torch.cuda.synchronize()
        outcome = "ran"
    except Exception as err:  # noqa: BLE001 (the probe reports what failed)
        outcome = f"{type(err).__name__}: {str(err)[:120]}"
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    if save:
        import pickle

        with open(save, "wb") as f:
            pickle.dump(snap, f)
    trace = snap["device_traces"][0]
    allocs = sum(1 for ev in trace if ev["action"] == "alloc")
    return f"context={context} stacks={stacks} early_stop={early_stop}: {outcome}; {allocs} allocs recorded"


if __name__ == "__main__":
    if "--save" in sys.argv:
        experiment, profile, b = sys.argv[1:4]
        context = sys.argv[sys.argv.index("--context") + 1] if "--context" in sys.argv else "all"
        print(recorded(experiment, profile, int(b), None if context == "none" else context, "python", True, steps=3,
                       save=sys.argv[sys.argv.index("--save") + 1]))
        raise SystemExit
    experiment, profile, b = (sys.argv[1:4] if len(sys.argv) > 3 else ("bench/experiments/heldout_mid.toml", "gradcp_every2", "4"))
    for context, stacks, early in (("all", "python", True), ("alloc", "python", True), ("state", "python", True),
                                   ("all", "python", False), (None, "python", True)):
        print(recorded(experiment, profile, int(b), context, stacks, early), flush=True)
