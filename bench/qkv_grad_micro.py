"""Micro-benchmark for issue 8: the backward of the fused QKV projection, with and without concatenating dq, dk, dv.

Autograd's backward of `linear(x).split(C)` concatenates the attention kernel's dq, dk, dv into one (N, 3C)
gradient (a copy of 6 x N x C bytes in bf16) before the two matmuls. The alternative takes them apart:
dX = dq Wq + dk Wk + dv Wv as accumulating matmuls, dW as three (C, C) blocks. This times both on the GPU at the
GPT-2-small shape (C = 768) for N = batch x 1024 rows, eager, with CUDA events; prints the median of `--reps`.

    python3 bench/qkv_grad_micro.py --batches 16,64,128
"""

from __future__ import annotations

import argparse
import statistics

import torch


def packed(dq, dk, dv, x, w):
    d = torch.cat([dq, dk, dv], dim=1)  # (N, 3C)
    return d @ w, d.t() @ x, d.sum(0)


def split(dq, dk, dv, x, w):
    C = dq.size(1)
    wq, wk, wv = w[:C], w[C : 2 * C], w[2 * C :]
    dx = torch.addmm(torch.addmm(dq @ wq, dk, wk), dv, wv)
    dw = torch.cat([dq.t() @ x, dk.t() @ x, dv.t() @ x])
    return dx, dw, torch.cat([dq.sum(0), dk.sum(0), dv.sum(0)])


def time_ms(fn, args, reps: int) -> float:
    for _ in range(3):
        fn(*args)
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn(*args)
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", default="16,64,128")
    ap.add_argument("--C", type=int, default=768)
    ap.add_argument("--T", type=int, default=1024)
    ap.add_argument("--reps", type=int, default=30)
    args = ap.parse_args()
    C = args.C
    print(f"{'batch':>6} {'packed ms':>10} {'split ms':>10} {'split/packed':>13} {'max rel err dx':>15}")
    for b in (int(s) for s in args.batches.split(",")):
        N = b * args.T
        g = torch.Generator(device="cuda").manual_seed(b)
        dq, dk, dv, x = (torch.randn(N, C, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(4))
        w = torch.randn(3 * C, C, device="cuda", dtype=torch.bfloat16, generator=g) * 0.02
        ref = torch.cat([dq, dk, dv], 1).double() @ w.double()
        err = ((split(dq, dk, dv, x, w)[0].double() - ref).norm() / ref.norm()).item()
        err_p = ((packed(dq, dk, dv, x, w)[0].double() - ref).norm() / ref.norm()).item()
        tp, ts = time_ms(packed, (dq, dk, dv, x, w), args.reps), time_ms(split, (dq, dk, dv, x, w), args.reps)
        print(f"{b:>6} {tp:>10.3f} {ts:>10.3f} {ts / tp:>13.3f} {err:>15.2e} (packed {err_p:.2e})", flush=True)
        del dq, dk, dv, x, w, ref
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
