"""Issue 17: the MLP's GELU in the epilogue of the matmul beside it (core/fused/triton_mlp.py), on the GPU, at the
gpt2s shape (C 768, F 3072, bf16), rows M = batch x 1024:

  check     each Triton kernel against the PyTorch reference (fp32 arithmetic on the same bf16 inputs)
  fwd       pre = x W1^T + b1 and act = gelu_tanh(pre): cuBLAS addmm alone (the floor), addmm + Inductor's GELU
            (the compiled loop's, and memlab's before), and mm_bias_gelu over a sweep of launch shapes
  bwd       d = (g W2) * gelu_tanh'(pre) with its column sums: cuBLAS mm alone (the floor), mm + Inductor's GELU
            backward and bias sum (the compiled loop's), mm + memlab's gelu_bwd kernel (memlab's before), and
            mm_dgelu over a sweep
  mlp       the whole MLP branch, forward + backward, compiled with one static shape: the loop's nn.Linear / GELU /
            nn.Linear under autocast, and memlab's _MLPBranch

Timing: --iters calls back to back between two CUDA events, median of --reps; GPU time (the host is not in it).

    python3 bench/mlp_gemm_micro.py --out $OUT/mlp.jsonl --rows 16384,204800 --sweep
"""

from __future__ import annotations

import argparse
import itertools
import json

import torch
import torch.nn.functional as F
from fused_kernels import rel_err, time_ms  # bench/ is not a package: the script's own folder is on sys.path
from memlab.core.fused import reference
from memlab.core.fused import triton_kernels as tk
from memlab.core.fused import triton_mlp as tm
from memlab.core.fused.forward import _MLPBranch

C, FF = 768, 3072


def launch_shapes(default: dict, sweep: bool) -> list[dict]:
    shapes = [dict(default)]
    if sweep:
        for bm, bn, warps, stages, per_sm, flatten in itertools.product((64, 128), (128, 256), (4, 8), (3, 4), (0, 1, 2), (False, True)):
            if bm * bn // (32 * warps) <= 128 and bm * bn >= 32 * warps * 32 and not (flatten and per_sm == 0):
                shapes.append(dict(block_m=bm, block_n=bn, block_k=64, group_m=8, warps=warps, stages=stages, programs_per_sm=per_sm, flatten=flatten))
    return shapes


def timed(fn, reps: int, calls: int) -> dict:
    """{"ms": ...}, or {"error": ...} for a launch shape that does not compile (shared memory, registers)."""
    try:
        return {"ms": time_ms(fn, reps=reps, calls=calls)}
    except Exception as e:  # noqa: BLE001 (a failed shape is a row of the sweep, not the end of it)
        return {"error": f"{type(e).__name__}: {str(e)[:200]}"}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--rows", default="16384,204800")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--sweep", action="store_true", help="also sweep the two kernels' launch shapes")
    args = ap.parse_args()
    torch._dynamo.config.cache_size_limit = 64
    dev, bf = "cuda", torch.bfloat16

    def emit(**row):
        row["gpu"] = torch.cuda.get_device_name()
        print(json.dumps(row), flush=True)
        with open(args.out, "a") as sink:  # appended as each row lands: a run cut short keeps what it measured
            sink.write(json.dumps(row) + "\n")

    for M in (int(r) for r in args.rows.split(",")):
        it = max(2, args.iters * 16384 // M)
        g = torch.Generator(device=dev).manual_seed(M)
        x = torch.randn(M, C, device=dev, generator=g).to(bf)
        w1 = (torch.randn(FF, C, device=dev, generator=g) * 0.02).to(bf)
        b1 = (torch.randn(FF, device=dev, generator=g) * 0.02).to(bf)
        w2 = (torch.randn(C, FF, device=dev, generator=g) * 0.02).to(bf)
        up = torch.randn(M, C, device=dev, generator=g).to(bf)
        pre = (torch.randn(M, FF, device=dev, generator=g) * 2).to(bf)

        emit(case="check", rows=M, kernel="mm_bias_gelu",
             rel_err=max(rel_err(a, b) for a, b in zip(tm.mm_bias_gelu(x, w1, b1), reference.mm_bias_gelu(x, w1, b1))))
        emit(case="check", rows=M, kernel="mm_dgelu",
             rel_err=max(rel_err(a, b) for a, b in zip(tm.mm_dgelu(up, w2, pre), reference.mm_dgelu(up, w2, pre))))

        def loop_fwd(x, w, b):
            p = torch.addmm(b, x, w.t())
            return p, F.gelu(p, approximate="tanh")

        def loop_bwd(g, w, p):
            pp = p.float().requires_grad_()
            d_act = g @ w
            (d,) = torch.autograd.grad(F.gelu(pp, approximate="tanh"), pp, d_act.float())
            return d.to(p.dtype), d.sum(0)

        loop_fwd_c, loop_bwd_c = torch.compile(loop_fwd, dynamic=False), torch.compile(loop_bwd, dynamic=False)
        rows = [("fwd", "cuBLAS addmm (floor)", lambda: torch.addmm(b1, x, w1.t())),
                ("fwd", "addmm + Inductor GELU", lambda: loop_fwd_c(x, w1, b1)),
                ("bwd", "cuBLAS mm (floor)", lambda: up @ w2),
                ("bwd", "mm + Inductor GELU backward", lambda: loop_bwd_c(up, w2, pre)),
                ("bwd", "mm + memlab gelu_bwd", lambda: tk.gelu_bwd(up @ w2, pre))]
        for case, name, fn in rows:
            emit(case=case, rows=M, variant=name, ms=time_ms(fn, reps=args.reps, calls=it))
        for cfg in launch_shapes(tm.MM_GELU, args.sweep):
            emit(case="fwd", rows=M, variant="mm_bias_gelu", **cfg, **timed(lambda: tm.mm_bias_gelu(x, w1, b1, **cfg), args.reps, it))
        for cfg in launch_shapes(tm.MM_DGELU, args.sweep):
            emit(case="bwd", rows=M, variant="mm_dgelu", **cfg, **timed(lambda: tm.mm_dgelu(up, w2, pre, **cfg), args.reps, it))

        # the whole branch, forward + backward, compiled as a training step compiles it (one static shape)
        h = x.view(M // 1024, 1024, C).clone().requires_grad_()
        params = [p.float().requires_grad_() for p in (w1, b1, w2)]

        def loop_mlp(h, w1, b1, w2):
            with torch.autocast("cuda", dtype=bf):
                return F.linear(F.gelu(F.linear(h, w1, b1), approximate="tanh"), w2)

        def memlab_mlp(h, w1, b1, w2):
            with torch.autocast("cuda", dtype=bf):
                return _MLPBranch.apply(h, w1, b1, w2)

        cases = {"loop (compiled)": torch.compile(loop_mlp, dynamic=False), "memlab _MLPBranch (compiled)": torch.compile(memlab_mlp, dynamic=False)}
        grads = {}
        for name, fn in cases.items():
            out = fn(h, *params)
            out.backward(up.view_as(out))
            grads[name] = [out.detach().float()] + [t.grad.float() for t in (h, *params)]
            for t in (h, *params):
                t.grad = None
        ref = grads["loop (compiled)"]
        for name, got in grads.items():
            emit(case="mlp_check", rows=M, variant=name, out_rel=rel_err(got[0], ref[0]),
                 **{f"d_{n}_rel": rel_err(a, b) for n, a, b in zip(("h", "w1", "b1", "w2"), got[1:], ref[1:])})
        del grads, ref

        def runner(fn):
            def run():
                fn(h, *params).backward(up.view(M // 1024, 1024, C))
                for t in (h, *params):
                    t.grad = None
            return run

        for _ in range(2):  # interleaved rounds
            for name, fn in cases.items():
                emit(case="mlp", rows=M, variant=name, ms=time_ms(runner(fn), reps=args.reps, calls=it))
        h = params = cases = None
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
