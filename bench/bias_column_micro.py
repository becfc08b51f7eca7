"""Issue 17: a bias gradient as one more output column of the weight gradient's matmul, on the GPU, at gpt2s's
shapes (C 768, bf16), rows M = batch x 1024. The MLP input layer's bias gradient is the column sums of d (M, 3072),
a pass over d of its own (5.3 ms a step at batch 200: gemm-tune-h100 run 12). With a column of ones after the
layer's input x, the weight gradient's matmul d^T [x 1] gives the weight gradient and the bias gradient at once:
timed here for x padded to 776..896 columns against the plain matmul plus the sum.

    python3 bench/bias_column_micro.py --out $OUT/bias_column.jsonl
"""

from __future__ import annotations

import argparse
import statistics

import torch
from fused_kernels import jsonl_emitter, rel_err, time_ms  # bench/ is not a package: the script's own folder is on sys.path
from memlab.core.fused import cublaslt

C = 768


def measure(emit, M: int, F: int, rounds: int) -> None:
    g = torch.Generator(device="cuda").manual_seed(0)
    d = torch.randn(M, F, device="cuda", generator=g).bfloat16()
    x = torch.randn(M, C, device="cuda", generator=g).bfloat16()
    parts = {"plain": lambda: cublaslt.matmul(d, x, True, False),
             "sum": lambda: d.sum(dim=0, dtype=torch.float32)}
    for width in (776, 784, 800, 832, 896):
        xa = torch.zeros(M, width, device="cuda", dtype=torch.bfloat16)
        xa[:, :C], xa[:, C] = x, 1.0
        both = cublaslt.matmul(d, xa, True, False)
        emit(what="check", rows=M, f=F, width=width, bias_rel_err=rel_err(both[:, C].float(), d.float().sum(0)),
             weight_rel_err=rel_err(both[:, :C].float(), cublaslt.matmul(d, x, True, False).float()))
        parts[f"ones_{width}"] = (lambda xa=xa: cublaslt.matmul(d, xa, True, False))
    times: dict[str, list[float]] = {name: [] for name in parts}
    for _ in range(rounds):
        for name, fn in parts.items():
            times[name].append(time_ms(fn, reps=5, calls=10))
    med = {name: round(statistics.median(t), 4) for name, t in times.items()}
    emit(what="time", rows=M, f=F, **{f"{n}_ms": v for n, v in med.items()},
         plain_plus_sum_ms=round(med["plain"] + med["sum"], 4))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--rows", default="16384,204800")
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    emit = jsonl_emitter(args.out)
    for M in (int(m) for m in args.rows.split(",")):
        for F in (3072, 2304):
            measure(emit, M, F, args.rounds)
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
