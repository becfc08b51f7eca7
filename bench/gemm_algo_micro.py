"""Issue 17: how far cuBLASLt's first heuristic choice is from the best of its candidates, for every matmul of a
gpt2s step (C 768, F 3072, V 8192 padded, bf16), rows M = batch x 1024.

For each matmul (forward, input gradient, weight gradient of qkv, attention projection, MLP in, MLP out, head) it
times torch's matmul (what the compiled loop runs) and memlab's (core/fused/cublaslt.py: cuBLASLt, the algorithm
chosen by timing at the first call, torch's own call among the candidates), and checks memlab's result against
torch's; then the MLP's two epilogue matmuls as memlab runs them. With --sweep, every candidate the heuristic offers
is timed as well, the first (the heuristic's choice) against the best. With --dgelu-layouts, only the MLP's DGELU
matmul, every candidate, with the output layer's weight as stored (C, F) and as a transposed copy (F, C): cuBLASLt
offers other kernels for the other operand order.

Timing: --calls calls back to back between two CUDA events, median of --reps; GPU time (the host is not in it).

    python3 bench/gemm_algo_micro.py --out $OUT/gemm.jsonl --rows 16384,204800 [--sweep | --dgelu-layouts]
"""

from __future__ import annotations

import argparse

import torch
from fused_kernels import jsonl_emitter, rel_err, time_ms  # bench/ is not a package: the script's own folder is on sys.path
from memlab.core.fused import cublaslt as tm
from memlab.core.fused import reference

C, FF, V = 768, 3072, 8192


def matmuls(M: int, dev: str, bf: torch.dtype) -> list[tuple]:
    """(name, a, b, transpose_a, transpose_b): the matmuls of one block and the head at M rows, d = op(a) @ op(b)."""
    g = torch.Generator(device=dev).manual_seed(M)

    def rnd(*shape, scale=1.0):
        return (torch.randn(*shape, device=dev, generator=g) * scale).to(bf)

    out = []
    for name, n_out, n_in in (("qkv", 3 * C, C), ("attn_proj", C, C), ("mlp_in", FF, C), ("mlp_out", C, FF), ("head", V, C)):
        x, w, gy = rnd(M, n_in), rnd(n_out, n_in, scale=0.02), rnd(M, n_out)
        out += [(f"{name}.fwd", x, w, False, True), (f"{name}.dgrad", gy, w, False, False), (f"{name}.wgrad", gy, x, True, False)]
    return out


def sweep(a, b, ta, tb, d, epilogue: int, reps: int, calls: int, bias=None, aux=None, ref=None) -> dict:
    """Every candidate the heuristic offers for this matmul, timed: the first (what memlab ran before) and the best;
    with `ref`, the best one's result against it as well (rel_err)."""
    (op_a, la), (op_b, lb) = tm._operand(b, tb), tm._operand(a, ta)
    M, N = d.shape
    plan = tm._Plan(epilogue, (op_a, op_b), la, lb, (N, M, N), d.dtype, 0 if bias is None else bias.data_ptr(),
                    0 if aux is None else aux.data_ptr())
    times = [time_ms(lambda: plan.run(b, a, d, bias, aux, i), reps=reps, calls=calls) for i in range(len(plan.candidates))]
    row = {"candidates": len(times), "first_ms": times[0] if times else None, "best_ms": min(times, default=None),
           "best_index": times.index(min(times)) if times else None, "times": times,
           "workspace_bytes": [c.workspace_size for c in plan.candidates]}
    if ref is not None and times:
        plan.run(b, a, d, bias, aux, row["best_index"])
        row["rel_err"] = rel_err(d, ref)
    return row


def dgelu_layouts(emit, M: int, dev: str, bf: torch.dtype, reps: int, calls: int) -> None:
    """DGELU, d = (g @ w2) * gelu'(pre), with w2 (C, F) as stored ("NN" in cuBLASLt's terms, what memlab ran) and as
    a transposed copy w2t (F, C) ("TN", the forward GELU matmul's order), every candidate; the plain matmul of each
    order beside it as the floor."""
    g = torch.Generator(device=dev).manual_seed(M + 2)
    up = torch.randn(M, C, device=dev, generator=g).to(bf)
    w2 = (torch.randn(C, FF, device=dev, generator=g) * 0.02).to(bf)
    w2t = w2.t().contiguous()
    pre = (torch.randn(M, FF, device=dev, generator=g) * 2).to(bf)
    ref = reference.mm_dgelu(up, w2, pre)
    for order, b, tb in (("NN", w2, False), ("TN", w2t, True)):
        row = sweep(up, b, False, tb, torch.empty_like(pre), tm._EPILOGUE_DGELU, reps, calls, aux=pre, ref=ref)
        emit(case="dgelu_layout", rows=M, order=order, **row)
        plain = sweep(up, b, False, tb, torch.empty_like(pre), tm._EPILOGUE_DEFAULT, reps, calls)
        emit(case="plain_layout", rows=M, order=order, **plain)
    torch.cuda.empty_cache()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--rows", default="16384,204800")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--calls", type=int, default=10)
    ap.add_argument("--sweep", action="store_true", help="also time every candidate algorithm of every matmul")
    ap.add_argument("--dgelu-layouts", action="store_true", help="only DGELU, with the weight as stored and transposed")
    args = ap.parse_args()
    dev, bf = "cuda", torch.bfloat16

    emit = jsonl_emitter(args.out)
    if args.dgelu_layouts:
        for M in (int(r) for r in args.rows.split(",")):
            dgelu_layouts(emit, M, dev, bf, args.reps, max(2, args.calls * 16384 // M))
        return

    for M in (int(r) for r in args.rows.split(",")):
        calls = max(2, args.calls * 16384 // M)
        for name, a, b, ta, tb in matmuls(M, dev, bf):
            x, y = (a.t() if ta else a), (b.t() if tb else b)
            ref = x @ y
            emit(case="torch", rows=M, mm=name, ms=time_ms(lambda: x @ y, reps=args.reps, calls=calls))
            got = tm.matmul(a, b, ta, tb)  # the first call chooses the algorithm
            plan = next(reversed(tm._plans.values()))
            emit(case="memlab", rows=M, mm=name, ms=time_ms(lambda: tm.matmul(a, b, ta, tb), reps=args.reps, calls=calls),
                 choice="torch" if plan.choice == len(plan.candidates) else plan.choice, candidates=len(plan.candidates),
                 rel_err=rel_err(got, ref))
            if args.sweep:
                emit(case="sweep", rows=M, mm=name, epilogue="default", **sweep(a, b, ta, tb, torch.empty_like(ref), tm._EPILOGUE_DEFAULT, args.reps, calls))
            ref = got = None
        # the MLP's epilogue matmuls, as memlab runs them (the first call chooses), against the PyTorch reference
        g = torch.Generator(device=dev).manual_seed(M + 1)
        x, up = (torch.randn(M, n, device=dev, generator=g).to(bf) for n in (C, C))
        w1, b1, w2 = ((torch.randn(*s, device=dev, generator=g) * 0.02).to(bf) for s in ((FF, C), (FF,), (C, FF)))
        pre = (torch.randn(M, FF, device=dev, generator=g) * 2).to(bf)
        for name, fn, ref_fn in (("mlp_in.fwd gelu_aux_bias", lambda: tm.mm_bias_gelu(x, w1, b1), lambda: reference.mm_bias_gelu(x, w1, b1)[1]),
                                 ("mlp_out.dgrad dgelu", lambda: tm.mm_dgelu(up, w2, pre), lambda: reference.mm_dgelu(up, w2, pre))):
            out = fn()
            out = out[1] if isinstance(out, tuple) else out
            plan = next(reversed(tm._plans.values()))
            emit(case="memlab", rows=M, mm=name, ms=time_ms(fn, reps=args.reps, calls=calls), choice=plan.choice,
                 candidates=len(plan.candidates), rel_err=rel_err(out, ref_fn()))
            if args.sweep:
                d = torch.empty_like(pre)
                row = sweep(x, w1, False, True, d, tm._EPILOGUE_GELU_AUX_BIAS, args.reps, calls, bias=b1, aux=torch.empty_like(pre)) \
                    if "gelu_aux" in name else sweep(up, w2, False, False, d, tm._EPILOGUE_DGELU, args.reps, calls, aux=pre)
                emit(case="sweep", rows=M, mm=name, **row)
        x = up = pre = None
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
