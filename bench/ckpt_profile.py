"""Where a checkpointing mode's step time goes: host (Python, dispatch) against device (kernels), per mode.

  python3 bench/ckpt_profile.py --experiment gpt2s --profiles bf16,gradcp_bf16,selective,sac_ops --steps 8 --out DIR

For each profile: the step built as the engine builds it (memlab.core.techniques.build_step), `--steps` steps timed by
CUDA events and by the wall clock, then two steps under torch.profiler: the total device time of the kernels, the
host's busy time, and the ten ops with the most host time. DIR/ckpt_profile.md gets one section per profile.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from memlab.core.config import apply_overrides, load_experiment, load_profile
from memlab.core.data import load_tokens
from memlab.core.engine import padded_vocab
from memlab.core.techniques import build_step
from memlab.core.techniques import check_techniques


def batches(e, vocab: int, n: int):
    g = torch.Generator().manual_seed(0)
    B, T = e.train.batch_size, e.model.seq_len
    return [[(torch.randint(0, vocab, (B, T), generator=g), torch.randint(0, vocab, (B, T), generator=g))] for _ in range(n)]


def measure(experiment: str, profile_name: str, steps: int, sets: list[str]) -> str:
    e, p = load_experiment(experiment), load_profile(profile_name)
    apply_overrides(e, p, sets)
    device = torch.device("cuda")
    check_techniques(e, p, device)
    vocab = padded_vocab(load_tokens(e.data).vocab_size, e.model.vocab_size)
    torch.manual_seed(0)
    step = build_step(e, p, device, vocab)
    data = batches(e, min(vocab, 8192), steps + 5)
    for mb in data[:3]:
        step.run(mb)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for mb in data[3:3 + steps]:
        step.run(mb)
    torch.cuda.synchronize()
    wall = (time.perf_counter() - t0) / steps * 1000
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]) as prof:
        for mb in data[-2:]:
            step.run(mb)
        torch.cuda.synchronize()
    events = prof.key_averages()
    device_ms = sum(ev.self_device_time_total for ev in events) / 1000 / 2
    top = sorted(events, key=lambda ev: ev.self_cpu_time_total, reverse=True)[:10]
    lines = [f"## {profile_name} ({experiment}, batch {e.train.batch_size})", "",
             f"wall {wall:.1f} ms/step; kernels {device_ms:.1f} ms/step (profiled); applied: {step.applied}", "",
             "| op | calls/step | self host ms/step | self device ms/step |", "|---|---|---|---|"]
    lines += [f"| {ev.key[:60]} | {ev.count // 2} | {ev.self_cpu_time_total / 2000:.2f} | {ev.self_device_time_total / 2000:.2f} |" for ev in top]
    return "\n".join(lines) + "\n\n"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--experiment", default="gpt2s")
    ap.add_argument("--profiles", default="bf16,gradcp_bf16,selective,sac_ops")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--set", action="append", default=[])
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    report = args.out / "ckpt_profile.md"
    for name in args.profiles.split(","):
        text = measure(args.experiment, name, args.steps, args.set)
        with open(report, "a") as f:
            f.write(text)
        print(text, flush=True)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
