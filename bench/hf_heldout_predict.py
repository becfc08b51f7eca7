"""The predictor against the H100's measurements of the transformers family, measured first (bench/results/hf-h100,
committed before any prediction of these shapes was made): predicted allocated peak beside measured, per case.

  python bench/hf_heldout_predict.py --out bench/results/hf-h100/predicted.md

Each measured row of peer-round2.jsonl and lora.jsonl (llama-1b, the memlab side; the fine-tuning profiles were measured
before the predictor could trace peft or a 4-bit base), qwen.jsonl (qwen-1.5b), and the H200's rows in
../hf-heldout-h200/call1 (llama-1b chunked_ce, qwen-1.5b compile) names its profile and
--set items; the same experiment, profile and items are predicted on this machine (trace: the real step on fake
tensors, then the allocator replay) at the run's micro-batch on an 80 GB H100.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from memlab.core.config import apply_overrides, load_experiment, load_profile
from memlab.core.errors import MemlabError
from memlab.core.predict import card_for, predict

RESULTS = Path(__file__).resolve().parent / "results" / "hf-h100"
H200 = "../hf-heldout-h200/call1"  # measured on an H200 and committed before any prediction of them
MEASURED = (("llama-1b", "peer-round2.jsonl"), ("qwen-1.5b", "qwen.jsonl"), ("llama-1b", "lora.jsonl"),
            ("llama-1b", f"{H200}/peaks-llama-1b/rows.jsonl"), ("qwen-1.5b", f"{H200}/peaks-qwen-1.5b/rows.jsonl"))


def cases() -> list[tuple[str, str, list[str], int]]:
    out = []
    for experiment, name in MEASURED:
        for line in (RESULTS / name).read_text().splitlines():
            row = json.loads(line)
            if row.get("side") == "memlab" and row.get("peak_alloc_bytes"):
                profile, *sets = row["mode"].split("+")
                out.append((experiment, profile, sets, row["peak_alloc_bytes"]))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--only", default="", help="comma-separated cases (profile+sets, as the table names them); default all")
    args = ap.parse_args()
    card = card_for("80GiB")
    lines = ["| experiment | profile | measured GiB | predicted GiB | error | method | seconds |", "|---|---|---|---|---|---|---|"]
    for experiment, profile, sets, measured in cases():
        if args.only and "+".join([profile, *sets]) not in args.only.split(","):
            continue
        e, p = load_experiment(experiment), load_profile(profile)
        apply_overrides(e, p, sets)
        t0 = time.time()
        try:
            pred = predict(e, p, e.train.batch_size, card)
            got, err, method = pred.allocated_bytes / 2**30, f"{pred.allocated_bytes / measured - 1:+.1%}", pred.method
        except MemlabError as ex:  # a method that cannot trace this case says so in the table
            got, err, method = float("nan"), "not predicted", f"{type(ex).__name__}: {str(ex).splitlines()[0][:90]}"
        lines.append(f"| {experiment} | {'+'.join([profile, *sets])} | {measured / 2**30:.2f} | {got:.2f} | {err} | {method} | {time.time() - t0:.0f} |")
        print(lines[-1], flush=True)
        args.out.write_text(f"command: python bench/hf_heldout_predict.py --out {args.out}\n\n" + "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
