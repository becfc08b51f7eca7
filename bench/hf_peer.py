"""memlab against the transformers Trainer (and Trainer + peft) on one experiment, at equal batch, interleaved.

  python3 bench/hf_peer.py --out DIR --experiment llama-1b --steps 30 --rounds 2 \
      --cases memlab:bf16+optimizer.fused=true,trainer:bf16,memlab:gradcp_bf16+optimizer.fused=true,trainer:gradcp

A case is `memlab:PROFILE[+section.key=value...]` (a `memlab run` child) or `trainer:MODE[:lora|:dora]`
(bench/trainer_peer.py). Every round runs every case once, in order, each in its own process (its own CUDA context);
rounds repeat the list, so the two sides alternate on the same GPU and clock. Both sides are timed by the wall clock
over the steps after warm-up (memlab: tokens_per_s_wall over its measured steps; the Trainer: from the end of step 5
to the end of the last, synchronized at those two points). rows.jsonl gets a row as each run lands; table.md the
medians over rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq

HERE = Path(__file__).resolve().parent


def run_memlab(spec: str, args, out: Path) -> dict:
    profile, *sets = spec.split("+")
    runs = out / "runs"
    cmd = [sys.executable, "-m", "memlab", "run", "--profile", profile, "--experiment", args.experiment,
           "--steps", str(args.steps), "--runs-dir", str(runs)] + [a for s in sets for a in ("--set", s)] + args.run_args.split()
    before = set(runs.glob("*")) if runs.exists() else set()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    new = sorted(set(runs.glob("*")) - before)
    row = {"side": "memlab", "mode": spec, "rc": proc.returncode, "tail": proc.stderr.strip().splitlines()[-1:] if proc.returncode else []}
    if not new or not (new[-1] / "summary.parquet").exists():
        row["error"] = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        return row
    s = pq.read_table(new[-1] / "summary.parquet").to_pylist()[0]
    tokens = s["batch_size"] * s["seq_len"]
    keys = ("status", "step_ms_median", "tokens_per_s_wall", "peak_alloc_bytes", "peak_reserved_bytes", "attention_kernel",
            "checkpointing", "loss_kernel", "compile", "optimizer", "final_loss", "params", "architecture", "run_id")
    row |= {k: s.get(k) for k in keys}
    row |= {k: s[k] for k in ("trainable_params", "frozen_params", "finetune") if k in s}
    row["wall_step_ms"] = tokens / s["tokens_per_s_wall"] * 1000 if s.get("tokens_per_s_wall") else None
    return row


def run_trainer(spec: str, args, out: Path) -> dict:
    mode, *extra = spec.split(":")
    dest = out / f"trainer-{time.time_ns()}.json"
    cmd = [sys.executable, str(HERE / "trainer_peer.py"), "--experiment", args.experiment, "--mode", mode,
           "--steps", str(args.steps), "--out", str(dest)] + [f"--{x}" for x in extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    if proc.returncode or not dest.exists():
        return {"side": "trainer", "mode": spec, "rc": proc.returncode, "error": (proc.stderr or proc.stdout).strip().splitlines()[-3:]}
    return json.loads(dest.read_text()) | {"mode": spec, "rc": 0}


def table(rows: list[dict]) -> str:
    by: dict[tuple, list[dict]] = {}
    for r in rows:
        by.setdefault((r["side"].split("+")[0], r["mode"]), []).append(r)
    lines = ["| side | case | wall ms/step (median of rounds) | rounds | peak allocated GiB | notes |", "|---|---|---|---|---|---|"]
    for (side, mode), rs in by.items():
        ok = [r for r in rs if r.get("wall_step_ms")]
        if not ok:
            lines.append(f"| {side} | {mode} | failed | {len(rs)} | | {rs[-1].get('error') or rs[-1].get('tail')} |")
            continue
        ms = statistics.median(r["wall_step_ms"] for r in ok)
        peaks = [r["peak_alloc_bytes"] for r in ok if r.get("peak_alloc_bytes")]
        peak = max(peaks) / 2**30 if peaks else float("nan")  # none on the CPU backend
        note = ", ".join(str(ok[-1].get(k)) for k in ("attention_kernel", "checkpointing", "loss_kernel") if ok[-1].get(k))
        each = ", ".join(f"{r['wall_step_ms']:.1f}" for r in ok)
        lines.append(f"| {side} | {mode} | {ms:.1f} ({each}) | {len(ok)} | {peak:.2f} | {note} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--experiment", default="llama-1b")
    ap.add_argument("--cases", required=True)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--timeout", type=int, default=600)
    ap.add_argument("--run-args", default="", help="more `memlab run` options for every memlab case, e.g. '--data stdlib --tokenizer bpe:8192'")
    ap.add_argument("--budget-s", type=float, default=1e9, help="stop starting runs after this many seconds")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rows, start = [], time.time()
    for rnd in range(args.rounds):
        for case in args.cases.split(","):
            if time.time() - start > args.budget_s:
                break
            side, spec = case.split(":", 1)
            row = (run_memlab if side == "memlab" else run_trainer)(spec, args, args.out) | {"round": rnd, "case": case}
            rows.append(row)
            with open(args.out / "rows.jsonl", "a") as f:
                f.write(json.dumps(row) + "\n")
            print(json.dumps({k: row.get(k) for k in ("case", "round", "wall_step_ms", "peak_alloc_bytes", "error", "tail")}), flush=True)
            (args.out / "table.md").write_text(f"experiment {args.experiment}, {args.steps} steps, command: {' '.join(sys.argv)}\n\n" + table(rows))
    print((args.out / "table.md").read_text())


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
