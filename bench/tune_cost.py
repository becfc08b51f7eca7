"""Issue 17: what choosing cuBLASLt's algorithms by timing costs a `fastest` run, and that a second process takes
the remembered choices untimed (memlab.core.fused.algo_choices). Runs `memlab run` in this process with the
timing function wrapped, and prints one JSON row: the seconds spent timing, how many matmul shapes were timed, and
the run's own first-step time.

    MEMLAB_CACHE=/root/cache python3 bench/tune_cost.py --batch 200 --steps 6   # twice: cold, then remembered
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from memlab.core.fused import cublaslt


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--profile", default="fastest")
    args = ap.parse_args()
    spent, shapes = [0.0], [0]
    timing = cublaslt._fastest

    def wrapped(calls):
        start = time.perf_counter()
        try:
            return timing(calls)
        finally:
            spent[0] += time.perf_counter() - start
            shapes[0] += 1

    cublaslt._fastest = wrapped
    from memlab.cli import main as memlab_main

    sys.argv = ["memlab", "run", "--profile", args.profile, "--steps", str(args.steps), "--batch-size", str(args.batch), "--no-meters"]
    try:
        memlab_main()
    except SystemExit:
        pass
    print(json.dumps({"batch": args.batch, "timing_s": round(spent[0], 3), "shapes_timed": shapes[0],
                      "plans": len(cublaslt._plans), "choices_file": str(cublaslt._choices_path())}), flush=True)


if __name__ == "__main__":
    main()
