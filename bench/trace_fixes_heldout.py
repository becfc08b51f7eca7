"""The trace's two fixes of bench/results/trace-heldout-cpu (DDP's gradient buckets; the additive mask a window with
dropout saves per block) held out on shapes none of those runs had: predicted on this CPU and committed first, then
measured by `memlab run` on the GPU (bench/trace_fixes_gpu.sh) at the same micro-batch.

    python bench/trace_fixes_heldout.py predict --out bench/results/trace-heldout-cpu/fixes-predicted.json
    python bench/trace_fixes_heldout.py compare --predicted ...json --rows GPU_ROWS.jsonl [...]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

EXPERIMENTS = Path(__file__).resolve().parent / "experiments"
# (experiment, profile): the fixed mechanisms (ddp_bf16, window with dropout), their plain step beside them, fsdp_bf16
# (which the trace does not model: over on the deep shape) and a transformers model's DDP (the family the analytic
# guard does not cover)
CASES = [(shape, profile) for shape in ("heldout_mid", "heldout_square") for profile in ("bf16", "ddp_bf16", "window", "fsdp_bf16")]
CASES += [("llama-1b", "bf16"), ("llama-1b", "ddp_bf16")]


def experiment_of(name: str):
    from memlab.core.config import load_experiment

    path = EXPERIMENTS / f"{name}.toml"
    return load_experiment(str(path) if path.exists() else name)


def predict_all(out: Path) -> None:
    from memlab.core.config import load_profile
    from memlab.core.predict import Card, predict

    rows = []
    for shape, profile in CASES:
        experiment = experiment_of(shape)
        t = time.monotonic()
        p = predict(experiment, load_profile(profile), experiment.train.batch_size, Card(141 * 10**9, "NVIDIA H200", "H200"),
                    use_cache=False)
        rows.append(dict(experiment=shape, profile=profile, micro_batch=p.micro_batch, allocated=p.allocated_bytes,
                         reserved=p.reserved_bytes, s=round(time.monotonic() - t, 1)))
        print(rows[-1], flush=True)
    out.write_text(json.dumps(rows, indent=1) + "\n")


def compare(predicted: Path, measured: list[Path]) -> str:
    runs = {}
    for path in measured:
        for line in path.read_text().splitlines():
            r = json.loads(line)
            runs[(path.parent.name.removeprefix("peaks-"), r["mode"])] = r
    lines = ["| experiment | profile | micro-batch | predicted GiB | measured GiB | error |", "|---|---|---|---|---|---|"]
    for p in json.loads(predicted.read_text()):
        m = runs.get((p["experiment"], p["profile"]), {})
        got = m.get("peak_alloc_bytes")
        error = f"{(p['allocated'] - got) / got:+.2%}" if got else m.get("error", "not run")
        lines.append(f"| {p['experiment']} | {p['profile']} | {p['micro_batch']} | {p['allocated'] / 2**30:.2f} | "
                     f"{got / 2**30 if got else 0:.2f} | {error} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("predict").add_argument("--out", type=Path, required=True)
    c = sub.add_parser("compare")
    c.add_argument("--predicted", type=Path, required=True)
    c.add_argument("--rows", type=Path, nargs="+", required=True)
    args = ap.parse_args()
    if args.cmd == "predict":
        predict_all(args.out)
    else:
        print(compare(args.predicted, args.rows))


if __name__ == "__main__":
    main()
