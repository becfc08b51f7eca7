"""The trace's two fixes of bench/results/trace-heldout-cpu (DDP's gradient buckets; the additive mask a window with
dropout saves per block) held out on shapes none of those runs had: predicted on this CPU and committed first, then
measured by `memlab run` on the GPU (bench/trace_fixes_gpu.sh) at the same micro-batch.

    python bench/trace_fixes_heldout.py predict --out bench/results/trace-heldout-cpu/fixes-predicted.json
    python bench/trace_fixes_heldout.py predict --set 2 --out bench/results/trace-heldout-cpu/fixes-predicted-2.json
    python bench/trace_fixes_heldout.py predict --set 3 --out bench/results/trace-heldout-cpu/fixes-predicted-3.json
    python bench/trace_fixes_heldout.py compare --predicted ...json --rows GPU_ROWS.jsonl [...]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

EXPERIMENTS = Path(__file__).resolve().parent / "experiments"
# (experiment, PROFILE[+section.key=value...]), by set. Set 1, the fixed mechanisms (ddp_bf16, window with dropout),
# their plain step beside them, fsdp_bf16 (which the trace does not model: over on the deep shape) and a transformers
# model's DDP (the family the analytic guard does not cover): it found the DDP reserve's rebuild and third step. Set 2,
# held out from that too: DDP on four more shapes (one a transformers model), a window with dropout on two.
SETS = {
    "1": [(shape, profile) for shape in ("heldout_mid", "heldout_square") for profile in ("bf16", "ddp_bf16", "window", "fsdp_bf16")]
    + [("llama-1b", "bf16"), ("llama-1b", "ddp_bf16")],
    "2": [("qwen-1.5b", "ddp_bf16"), ("gpt2s", "ddp_bf16"), ("heldout_fat", "ddp_bf16"), ("heldout_wide", "ddp_bf16"),
          ("gpt2s", "window+model.dropout=0.1"), ("bigvocab", "window+model.dropout=0.1")],
    # Set 3: DDP with accumulation, whose micro-batches before the last run without DDP's hooks (no_sync), so their
    # gradients stand beside the buckets until the last one's backward moves them in (the analytic formula counts
    # the buckets alone); the same accumulation without DDP beside each
    "3": [(shape, spec) for shape in ("heldout_logits", "seed_shape")
          for spec in ("bf16+accumulation.steps=2", "ddp_bf16+accumulation.steps=2")],
}
PREDICTED = {"1": "fixes-predicted.json", "2": "fixes-predicted-2.json", "3": "fixes-predicted-3.json"}


def experiment_of(name: str):
    from memlab.core.config import load_experiment

    path = EXPERIMENTS / f"{name}.toml"
    return load_experiment(str(path) if path.exists() else name)


def predict_all(out: Path, cases: list[tuple[str, str]]) -> None:
    from memlab.core.config import apply_overrides, load_profile
    from memlab.core.predict import Card, predict

    rows = []
    for shape, spec in cases:
        experiment, (name, *sets) = experiment_of(shape), spec.split("+")
        profile = load_profile(name)
        apply_overrides(experiment, profile, sets)
        t = time.monotonic()
        p = predict(experiment, profile, None, Card(140 * 2**30, "NVIDIA H200", "H200"), use_cache=False)  # the run's micro-batch
        rows.append(dict(experiment=shape, profile=spec, micro_batch=p.micro_batch, allocated=p.allocated_bytes,
                         reserved=p.reserved_bytes, s=round(time.monotonic() - t, 1)))
        print(rows[-1], flush=True)
    out.write_text(json.dumps(rows, indent=1) + "\n")


def compare(predicted: Path, measured: list[Path]) -> str:
    runs = {}
    for path in measured:
        for line in path.read_text().splitlines():
            r = json.loads(line)
            # peaks-EXPERIMENT/rows.jsonl as the GPU script writes it, or rows-EXPERIMENT.jsonl as committed
            name = path.stem if path.stem.startswith("rows-") else path.parent.name
            runs[(name.split("-", 1)[1], r["mode"])] = r
    lines = ["| experiment | profile | micro-batch | allocated GiB: predicted, measured | error | reserved GiB: predicted, measured | error |",
             "|---|---|---|---|---|---|---|"]
    for p in json.loads(predicted.read_text()):
        m = runs.get((p["experiment"], p["profile"]), {})
        row = [p["experiment"], p["profile"], str(p["micro_batch"])]
        for ours, theirs in (("allocated", "peak_alloc_bytes"), ("reserved", "peak_reserved_bytes")):
            got = m.get(theirs)
            row += [f"{p[ours] / 2**30:.2f}, {got / 2**30:.2f}" if got else f"{p[ours] / 2**30:.2f}, —", _error(p[ours], got)]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def _error(predicted: int, measured: int | None) -> str:
    return f"{(predicted - measured) / measured:+.2%}" if measured else "not run"


def main() -> None:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    pr = sub.add_parser("predict")
    pr.add_argument("--out", type=Path, required=True)
    pr.add_argument("--set", default="1", choices=list(SETS))
    c = sub.add_parser("compare")
    c.add_argument("--predicted", type=Path, required=True)
    c.add_argument("--rows", type=Path, nargs="+", required=True)
    args = ap.parse_args()
    if args.cmd == "predict":
        predict_all(args.out, SETS[args.set])
    else:
        print(compare(args.predicted, args.rows))


if __name__ == "__main__":
    main()
