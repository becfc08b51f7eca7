"""The allocator replay's max-batch search with its traces off lines in the micro-batch (core/trace_lines.py) against
the same search tracing the step at every batch it asks about: the answer, the traces each took, and the time. Run
where find-batch predicts (on the GPU: its torch, its device's fake kernels and SM count), as find-batch asks
(maxbatch._replayed_max_batch: a 24 GiB card under --gpu-memory's cap, from half the analytic figure, its margin).

    python3 bench/trace_lines_check.py --out FILE [--jobs 8] [EXPERIMENT:PROFILE[:expandable] ...]
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

EXPERIMENTS = Path(__file__).parent / "experiments"
sys.path.insert(0, str(Path(__file__).parent))  # spawned children import this file as a module
CARD = 24 * 2**30
CASES = [f"{e}:{p}" for e in ("heldout_deep", "heldout_wide", "heldout_long", "heldout_logits")
         for p in ("bf16", "gradcp_bf16", "compile", "act_offload")] + \
        ["seed_shape:leanest", "heldout_mid:bf16:expandable", "heldout_fat:gradcp_every2", "heldout_square:chunked_ce",
         "heldout_logits:float8"]


def searched(case: str, lines: bool) -> tuple[int | str, int, float]:
    """(answer, traces, seconds) of one search, `lines` on or off."""
    from memlab.core.predict import card, maxbatch
    from memlab.core.predict import trace as allocation_trace, trace_lines
    from memlab.core.predict import analytic as est
    from memlab.core.config import apply_overrides, load_experiment, load_profile

    name, profile_name, *mode = case.split(":")
    path = EXPERIMENTS / f"{name}.toml"
    experiment, profile = load_experiment(str(path) if path.exists() else name), load_profile(profile_name)
    apply_overrides(experiment, profile, ["allocator.expandable_segments=true"] if mode else [])
    vocab, _ = est.vocab_for(experiment)
    near = est.predict_max_batch(experiment, profile, vocab_size=vocab, memory_bytes=CARD) or 16
    traced: list[int] = []
    real = allocation_trace.step_trace
    allocation_trace.step_trace = lambda *a, micro_batch, **k: traced.append(micro_batch) or real(*a, micro_batch=micro_batch, **k)
    if not lines:
        trace_lines.StepTraces.fit = lambda self, batches: False
    t = time.monotonic()
    try:  # as the prediction asks, without its silence on a failure
        answer = allocation_trace.replayed_max_batch(experiment, profile, vocab_size=vocab, budget_bytes=CARD - card.context_bytes_here(),
                                                     start=max(1, near // 2), margin=maxbatch.REPLAY_MARGIN, capped=True)
    except Exception as e:  # noqa: BLE001
        answer = f"{e.__class__.__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}"
    return answer, len(traced), time.monotonic() - t


def both(case: str) -> str:
    spawn = multiprocessing.get_context("spawn")  # CUDA in the children: no fork
    with ProcessPoolExecutor(1, mp_context=spawn) as one:  # each in a fresh process: the other's patches stay there
        off = one.submit(searched, case, False).result()
    with ProcessPoolExecutor(1, mp_context=spawn) as one:
        on = one.submit(searched, case, True).result()
    same = "same" if on[0] == off[0] else "**differs**"
    row = f"| {case} | {off[0]} | {on[0]} | {same} | {off[1]} / {on[1]} | {off[2]:.0f} / {on[2]:.0f} s |"
    print(row, flush=True)
    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("cases", nargs="*", default=CASES)
    ap.add_argument("--out", required=True)
    ap.add_argument("--jobs", type=int, default=2)
    args = ap.parse_args()
    import torch

    head = ["| case | traced at every batch | off lines | answer | traces (every batch / lines) | time |",
            "|:--|--:|--:|:--|--:|--:|"]
    with ProcessPoolExecutor(args.jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        rows = list(pool.map(both, args.cases))
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU"
    named = "" if args.cases == CASES else " " + " ".join(args.cases)
    text = "\n".join(head + rows) + (f"\n\n{device}, torch {torch.__version__}; command: python3 bench/trace_lines_check.py "
                                     f"--out FILE --jobs {args.jobs}{named}\n")
    Path(args.out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
