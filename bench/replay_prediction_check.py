"""The max-batch prediction find-batch and the study start from on a GPU host (maxbatch.predicted_max_batch with the
allocator replay) beside the analytic one, for a few profiles on the seed shape under a 24 GiB card: run it on a CPU
and on the GPU machine, and the two must agree (the replay's trace runs on fake tensors wherever it runs).

    python3 bench/replay_prediction_check.py [PROFILE ...]
"""

from __future__ import annotations

import sys
import time

import torch

from memlab.core.predict import maxbatch
from memlab.core.config import load_experiment, load_profile

GIB = 2**30


def main() -> None:
    profiles = sys.argv[1:] or ["bf16", "baseline", "gradcp_bf16", "chunked_ce", "compile"]
    print(f"torch {torch.__version__}, CUDA {'yes' if torch.cuda.is_available() else 'no'}")
    for name in profiles:
        experiment, profile = load_experiment("bench/experiments/seed_shape.toml"), load_profile(name)
        t = time.monotonic()
        replayed = maxbatch.predicted_max_batch(experiment, profile, 24 * GIB, replay=True)
        analytic = maxbatch.predicted_max_batch(experiment, profile, 24 * GIB)
        print(f"{name:<14} predicted with the replay {replayed} · analytic {analytic} · {time.monotonic() - t:.0f} s", flush=True)


if __name__ == "__main__":
    main()
