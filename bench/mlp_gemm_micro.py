"""Issue 17: the MLP's GELU in the epilogue of the matmul beside it (core/fused/cublaslt.py), on the GPU, at the
gpt2s shape (C 768, F 3072, bf16), rows M = batch x 1024:

  check     each epilogue matmul against the PyTorch reference (fp32 arithmetic on the same bf16 inputs)
  fwd       pre = x W1^T + b1 and act = gelu_tanh(pre): cuBLAS addmm alone (the floor), addmm + Inductor's GELU
            (the compiled loop's and memlab's before), and cuBLASLt's GELU_AUX_BIAS epilogue (mm_bias_gelu)
  bwd       d = (g W2) * gelu_tanh'(pre), then d^T x and the column sums of d: the two cuBLAS matmuls alone (the
            floor), the same with Inductor's GELU backward and bias sum between them (the compiled loop's), and
            cuBLASLt's DGELU epilogue (mm_dgelu), then the weight gradient's matmul and the bias sum
  mlp       the whole MLP branch, forward + backward, compiled with one static shape: the loop's nn.Linear / GELU /
            nn.Linear under autocast, and memlab's _MLPBranch

Timing: --iters calls back to back between two CUDA events, median of --reps; GPU time (the host is not in it).

    python3 bench/mlp_gemm_micro.py --out $OUT/mlp.jsonl --rows 16384,204800

(Before this, the epilogues were Triton matmuls, commit 13f39fa, swept there with --sweep: 5-20% slower than cuBLAS
and the elementwise kernel. results/fused-mlp-h100/NOTE.md.)
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from fused_kernels import jsonl_emitter, rel_err, time_ms  # bench/ is not a package: the script's own folder is on sys.path
from memlab.core.fused import reference
from memlab.core.fused import cublaslt as tm
from memlab.core.fused.forward import _MLPBranch

C, FF = 768, 3072


def graph_check(x, w1, b1, up, w2) -> dict:
    """The epilogue matmuls captured in a CUDA graph (as memlab's step is) and replayed: the same results as eager."""

    def both() -> list[torch.Tensor]:
        pre, act = tm.mm_bias_gelu(x, w1, b1)
        return [pre, act, tm.mm_dgelu(up, w2, pre)]

    eager = both()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the default stream, as torch.cuda.graphs asks
        both()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = both()
    for t in captured:
        t.zero_()
    graph.replay()
    torch.cuda.synchronize()
    return {"max_abs_diff": max((a.float() - b.float()).abs().max().item() for a, b in zip(captured, eager))}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--rows", default="16384,204800")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--reps", type=int, default=7)
    args = ap.parse_args()
    torch._dynamo.config.cache_size_limit = 64
    dev, bf = "cuda", torch.bfloat16

    emit = jsonl_emitter(args.out)

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
        emit(case="check", rows=M, kernel="mm_dgelu", rel_err=rel_err(tm.mm_dgelu(up, w2, pre), reference.mm_dgelu(up, w2, pre)))

        def loop_fwd(x, w, b):
            p = torch.addmm(b, x, w.t())
            return p, F.gelu(p, approximate="tanh")

        def loop_bwd(g, w, p, x):  # what the compiled loop's backward runs for these two layers
            d_act = (g @ w).float()
            t = torch.tanh(0.7978845608028654 * (p.float() + 0.044715 * p.float() ** 3))
            d = (d_act * (0.5 * (1 + t) + 0.5 * p.float() * (1 - t * t) * 0.7978845608028654 * (1 + 3 * 0.044715 * p.float() ** 2))).to(p.dtype)
            return d.t() @ x, d.sum(0), d

        def memlab_bwd(g, w, p, x):
            d = tm.mm_dgelu(g, w, p)
            return d.t() @ x, d.sum(0, dtype=torch.float32), d

        loop_fwd_c, loop_bwd_c = torch.compile(loop_fwd, dynamic=False), torch.compile(loop_bwd, dynamic=False)
        rows = [("fwd", "cuBLAS addmm (floor)", lambda: torch.addmm(b1, x, w1.t())),
                ("fwd", "addmm + Inductor GELU", lambda: loop_fwd_c(x, w1, b1)),
                ("fwd", "cuBLASLt GELU_AUX_BIAS", lambda: tm.mm_bias_gelu(x, w1, b1)),
                ("bwd", "two cuBLAS mm (floor)", lambda: (up @ w2).t() @ x),
                ("bwd", "mm, Inductor GELU backward + bias sum, mm", lambda: loop_bwd_c(up, w2, pre, x)),
                ("bwd", "cuBLASLt DGELU, mm, bias sum", lambda: memlab_bwd(up, w2, pre, x))]
        for case, name, fn in rows:
            emit(case=case, rows=M, variant=name, ms=time_ms(fn, reps=args.reps, calls=it))
        emit(case="plans", rows=M, found={str(k): p.ok for k, p in tm._plans.items()})
        emit(case="graph_check", rows=M, **graph_check(x, w1, b1, up, w2))

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
