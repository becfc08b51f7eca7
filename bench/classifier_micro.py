"""Issue 17: where could `fastest` still gain at equal batch? Micro-timings on the GPU of the LM head, C 768, V 8192
(gpt2s's BPE), 50257 (GPT-2's) and 128256 (Llama 3's, the bigvocab experiment), rows M = batch x 1024:

  mm        the head's three matmuls (forward, input gradient, weight gradient) at V and, where V is odd, with the
            vocabulary padded to 128 bytes a row (50304), as memlab pads it: cuBLAS on an odd row length
  ce        cross-entropy forward + backward given the logits: Inductor's (as the compiled loop runs it) against
            memlab's _ce_rows_kernel, which overwrites the logits with their gradient in the forward (launch sweep)
  head      the whole head, (h @ W^T) -> loss, forward + backward: compiled as the loop has it, against memlab's
            fused_head_loss (padded weight, one matmul, the kernel; the backward's two matmuls), eager and compiled

Timing: --iters calls back to back between two CUDA events, median of --reps; GPU time (the host is not in it).

    python3 bench/classifier_micro.py --out $OUT/micro.jsonl --rows 16384,204800 --vocabs 8192,50257,128256 --sweep
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from fused_kernels import jsonl_emitter, time_ms  # bench/ is not a package: the script's own folder is on sys.path
from memlab.core.fused import triton_kernels as tk
from memlab.core.fused.forward import fused_head_loss


def gpu_ms(fn, iters: int, reps: int) -> float:
    return time_ms(fn, reps=reps, calls=iters)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--rows", default="16384,204800")
    ap.add_argument("--vocabs", default="8192,50257,128256", help="gpt2s's BPE 8192, GPT-2's 50257, Llama 3's 128256 (bigvocab)")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--sweep", action="store_true", help="also sweep _ce_rows_kernel's launch shape")
    args = ap.parse_args()
    torch.manual_seed(0)
    torch._dynamo.config.cache_size_limit = 64  # a static compile per shape
    C = 768
    dev = "cuda"

    emit = jsonl_emitter(args.out)

    for M, V in ((int(r), int(v)) for r in args.rows.split(",") for v in args.vocabs.split(",")):
        if M * V * 2 > 25e9:  # the loop's logits and their gradient must fit beside the timing's copies
            continue
        it = max(2, args.iters * 16384 * 8192 // (M * V))
        Vp = -(-V // 64) * 64
        h = (torch.randn(M, C, device=dev) * 0.5).bfloat16()
        y = torch.randint(0, V, (M,), device=dev)
        for Vx in sorted({V, Vp}):
            W = (torch.randn(Vx, C, device=dev) * 0.02).bfloat16()
            emit(case="mm", rows=M, vocab_real=V, vocab=Vx, variant="forward", ms=gpu_ms(lambda: h @ W.t(), it, args.reps))
            G = torch.randn(M, Vx, device=dev, dtype=torch.bfloat16) * 1e-5
            emit(case="mm", rows=M, vocab_real=V, vocab=Vx, variant="dgrad", ms=gpu_ms(lambda: G @ W, it, args.reps))
            emit(case="mm", rows=M, vocab_real=V, vocab=Vx, variant="wgrad", ms=gpu_ms(lambda: G.t() @ h, it, args.reps))
            G = None  # noqa: F841 (freed before the next vocabulary's)
        W = (torch.randn(Vp, C, device=dev) * 0.02).bfloat16()
        W[V:] = 0
        logits = (h @ W.t())[:, :V].requires_grad_()  # the loop's logits: rows of V in a stride padded to 128 bytes, as Inductor pads them

        @torch.compile(dynamic=False)  # each shape compiled for itself, as a training run's one shape is
        def ce_inductor(lg, t):
            return F.cross_entropy(lg.float(), t)

        def ind():
            ce_inductor(logits, y).backward()
            logits.grad = None

        emit(case="ce", rows=M, vocab=V, variant="inductor", ms=gpu_ms(ind, it, args.reps))
        logits = None
        lg = h @ W.t()
        loss = torch.empty(M, device=dev)
        sms = torch.cuda.get_device_properties(dev).multi_processor_count
        shapes = [(tk.CE["programs_per_sm"], tk.CE["block"], tk.CE["warps"])]
        if args.sweep:
            shapes += [(p, b, w) for p in (1, 2, 4, 8) for b in (4096, 8192, 16384) for w in (8, 16, 32)]
        for per_sm, block, warps in shapes:
            def kern():
                tk._ce_rows_kernel[(min(M, sms * per_sm),)](lg, y, loss, M, V, Vp, 1.0 / M, BLOCK=block, num_warps=warps)
            emit(case="ce", rows=M, vocab=V, variant="memlab kernel", per_sm=per_sm, block=block, warps=warps, ms=gpu_ms(kern, it, args.reps))
        lg = None

        hh = h.clone().requires_grad_()
        Wf = (torch.randn(V, C, device=dev) * 0.02).requires_grad_()

        def loop_head(x, w, t):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                return F.cross_entropy((x @ w.t()).float(), t)

        def memlab_head(x, w, t):
            with torch.autocast("cuda", dtype=torch.bfloat16):  # as memlab's step runs it: h arrives in bf16
                return fused_head_loss(x, w, t)

        cases = {"loop (compiled)": torch.compile(loop_head, dynamic=False), "memlab fused_head_loss": memlab_head,
                 "memlab fused_head_loss (compiled)": torch.compile(memlab_head, dynamic=False)}
        grads = {}
        for name, fn in cases.items():
            loss_v = fn(hh, Wf, y)
            loss_v.backward()
            grads[name] = (loss_v.item(), hh.grad.float(), Wf.grad.float())
            hh.grad = Wf.grad = None
        ref = grads["loop (compiled)"]
        for name, (lv, gh, gw) in grads.items():
            emit(case="head_check", rows=M, vocab=V, variant=name, loss_diff=abs(lv - ref[0]),
                 dh_rel=((gh - ref[1]).norm() / ref[1].norm()).item(), dw_rel=((gw - ref[2]).norm() / ref[2].norm()).item())
        del grads, ref

        def runner(fn):
            def run():
                fn(hh, Wf, y).backward()
                hh.grad = Wf.grad = None
            return run

        for _ in range(2):  # interleaved rounds
            for name, fn in cases.items():
                emit(case="head", rows=M, vocab=V, variant=name, ms=gpu_ms(runner(fn), it, args.reps))
        hh = Wf = h = W = cases = None
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
