"""How long `predict` takes to plan with (issue 46): a large step traced on fake tensors (the default method), then
the same shape again from the prediction cache.

    python bench/predict_speed.py [--layers 32 --d-model 4096 --d-ff 14336 --heads 32 --vocab 128256 --seq 4096]

The defaults are a Llama-3.1-8B-sized memlab GPT (bf16, gradient checkpointing, seq 4096, micro-batch 1): the hf
family's Llama itself needs the family adapter; the trace path is the same. Prints wall and CPU seconds of each.
2026-11-28, this 2-core CPU (torch 2.13): traced 22.6 s wall (22.5 s CPU), 120.18 GiB allocated, 126.13 GiB
reserved; cached 0.0 s.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

from memlab.core.config import apply_overrides, load_experiment, load_profile
from memlab.core.predict import card_for, predict


def timed(fn):
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - wall, time.process_time() - cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for name, default in (("layers", 32), ("d-model", 4096), ("d-ff", 14336), ("heads", 32), ("vocab", 128256), ("seq", 4096)):
        ap.add_argument(f"--{name}", type=int, default=default)
    ap.add_argument("--profile", default="gradcp_bf16")
    ap.add_argument("--card", default="80GiB")
    a = ap.parse_args()
    os.environ.setdefault("MEMLAB_CACHE", tempfile.mkdtemp(prefix="predict-speed-"))
    experiment, profile = load_experiment("gpt2s"), load_profile(a.profile)
    apply_overrides(experiment, profile, [f"model.n_layer={a.layers}", f"model.d_model={a.d_model}", f"model.d_ff={a.d_ff}",
                                          f"model.n_head={a.heads}", f"model.vocab_size={a.vocab}", f"model.seq_len={a.seq}",
                                          "model.dropout=0.0"])
    card = card_for(a.card)
    for label in ("traced", "cached"):
        got, wall, cpu = timed(lambda: predict(experiment, profile, 1, card))
        print(f"{label}: {wall:.1f} s wall, {cpu:.1f} s CPU · allocated {got.allocated_bytes / 2**30:.2f} GiB, "
              f"reserved {got.reserved_bytes / 2**30 if got.reserved_bytes else float('nan'):.2f} GiB · {got.valid_for.note() or 'calibrated'}")


if __name__ == "__main__":
    main()
