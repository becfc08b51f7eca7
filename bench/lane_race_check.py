"""A study's lanes predict max batches in threads (memlab study --lanes N). Each prediction traces fake steps, which
patch module attributes (memsnapshot.FAKE_STEP_LOCK says which). This runs the same replayed predictions one at a
time, then `--threads` at a time, `--tries` times, and says whether each threaded round gave the same figures and
left torch's functions as it found them. `--without-lock` swaps the lock for one that does nothing: the code as it
was before the lock.

    python bench/lane_race_check.py [--without-lock] [--tries 2] [--threads 3] [--out FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

PROFILES = ["bf16", "gradcp_bf16", "flash", "sac_ops", "chunked_ce", "baseline"]
BUDGET = 2 * 2**30  # tiny under a 2 GiB card: each prediction takes a few traces


def predicted(name: str) -> int | None:
    from memlab.core.predict import maxbatch
    from memlab.core.config import load_experiment, load_profile

    return maxbatch.predicted_max_batch(load_experiment("tiny"), load_profile(name), BUDGET, replay=True, capped=True)


def patched_now() -> tuple:
    import torch.nn.functional as F

    from memlab.core.model import GPT

    return F.scaled_dot_product_attention, F.dropout, GPT.__init__


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--without-lock", action="store_true")
    ap.add_argument("--tries", type=int, default=2)
    ap.add_argument("--threads", type=int, default=3)
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    from memlab.core.predict import fake as memsnapshot

    if a.without_lock:
        memsnapshot.FAKE_STEP_LOCK = contextlib.nullcontext()
    before = patched_now()
    t = time.monotonic()
    alone = {n: predicted(n) for n in PROFILES}
    lines = [f"one at a time ({time.monotonic() - t:.0f} s): {alone}"]
    for i in range(a.tries):
        t = time.monotonic()
        with ThreadPoolExecutor(a.threads) as pool:
            threaded = dict(zip(PROFILES, pool.map(predicted, PROFILES)))
        differ = {n: (threaded[n], alone[n]) for n in PROFILES if threaded[n] != alone[n]}
        restored = patched_now() == before
        lines.append(f"{a.threads} threads, try {i + 1} ({time.monotonic() - t:.0f} s): "
                     + (f"DIFFERENT (threaded, alone): {differ}" if differ else "the same figures")
                     + ("; torch's functions as they were" if restored else "; torch's functions LEFT PATCHED"))
    text = "\n".join(lines) + f"\n\ncommand: python bench/lane_race_check.py{' --without-lock' if a.without_lock else ''}" \
        f" --tries {a.tries} --threads {a.threads}" + (f" --out {a.out}" if a.out else "") + "\n"
    print(text)
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(text)


if __name__ == "__main__":
    main()
