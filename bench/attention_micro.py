"""Issue 17: could a different attention kernel move `fastest` at equal batch? One attention layer's forward and
backward on the GPU, in memlab's layout (q, k, v split from one packed (B, T, 3C) projection), per kernel:

  sdpa_cudnn    SDPA's cuDNN backend (what `fastest` runs); autograd concatenates dq, dk, dv into d(qkv)
  sdpa_flash    SDPA's flash backend (FA2 inside PyTorch)
  fa4           flash_attn.cute's flash_attn_func on (B, T, nh, hs) views; autograd concatenates as above
  fa4_packed    flash_attn.cute's forward and backward called directly, the backward writing dq, dk, dv into
                views of one packed d(qkv): no concatenation

Each case: the same inputs; GPU time of `--iters` forward+backward pairs between two CUDA events, launched back
to back (the host's launch time hidden unless it is longer than the kernels), and the same pairs captured as one
CUDA graph and replayed (whether the kernel can be captured at all); gradients checked against sdpa_cudnn.

    python3 bench/attention_micro.py --out $OUT/attn.jsonl --batches 16,64
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from memlab.core.attention.flash_packed import split_heads  # (B, T, 3C) -> q, k, v as (B, T, nh, hs) views


def sdpa_case(backend):
    def run(qkv, nh, dy):
        q, k, v = (t.transpose(1, 2) for t in split_heads(qkv, nh))
        with sdpa_kernel(backend):
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y.backward(dy.transpose(1, 2))
    return run


def fa4_case(qkv, nh, dy):
    from flash_attn.cute import flash_attn_func

    q, k, v = split_heads(qkv, nh)
    out, _lse = flash_attn_func(q, k, v, causal=True)
    out.backward(dy)


def fa4_packed_case(qkv, nh, dy):
    from flash_attn.cute.interface import _flash_attn_bwd, _flash_attn_fwd

    q, k, v = split_heads(qkv.detach(), nh)
    out, lse, *_ = _flash_attn_fwd(q, k, v, causal=True, return_lse=True)
    grad = torch.empty_like(qkv)
    dq, dk, dv = split_heads(grad, nh)
    _flash_attn_bwd(q, k, v, out, dy, lse, causal=True, dq=dq, dk=dk, dv=dv)
    qkv.grad = grad


CASES = {"sdpa_cudnn": sdpa_case(SDPBackend.CUDNN_ATTENTION), "sdpa_flash": sdpa_case(SDPBackend.FLASH_ATTENTION),
         "fa4": fa4_case, "fa4_packed": fa4_packed_case}


def time_case(run, qkv, nh, dy, iters: int) -> dict:
    def pairs():
        for _ in range(iters):
            qkv.grad = None
            run(qkv, nh, dy)

    pairs()  # warm-up (FA4 compiles its kernels on the first call)
    torch.cuda.synchronize()
    launched = []
    for _ in range(5):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        h0 = time.perf_counter()
        a.record()
        pairs()
        b.record()
        host = time.perf_counter() - h0
        torch.cuda.synchronize()
        launched.append((a.elapsed_time(b) / iters, host * 1000 / iters))
    row = {"launched_ms": statistics.median(g for g, _ in launched), "host_ms": statistics.median(h for _, h in launched)}
    try:
        graph = torch.cuda.CUDAGraph()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            pairs()
        torch.cuda.current_stream().wait_stream(side)
        with torch.cuda.graph(graph):
            pairs()
        times = []
        for _ in range(5):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            graph.replay()
            b.record()
            torch.cuda.synchronize()
            times.append(a.elapsed_time(b) / iters)
        row["graphed_ms"] = statistics.median(times)
        del graph
    except Exception as e:  # noqa: BLE001 (a kernel that cannot be captured is a finding, not a crash)
        row["graph_error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:200]
        torch.cuda.synchronize()
    return row


def gradient(run, qkv, nh, dy) -> torch.Tensor:
    qkv.grad = None
    run(qkv, nh, dy)
    return qkv.grad.detach().clone()


def fp64_gradient(qkv, nh, dy) -> torch.Tensor:
    """The gradient of the same attention in fp64 (math backend), from the same bf16 inputs."""
    leaf = qkv.detach().double().requires_grad_(True)
    q, k, v = (t.transpose(1, 2) for t in split_heads(leaf, nh))
    with sdpa_kernel(SDPBackend.MATH):
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    y.backward(dy.double().transpose(1, 2))
    return leaf.grad


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="a .jsonl file: one row per case and batch, appended as it lands")
    ap.add_argument("--batches", default="16,64")
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--d-model", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--iters", type=int, default=12, help="forward+backward pairs per timing (12: one per gpt2s layer)")
    ap.add_argument("--cases", default=",".join(CASES))
    a = ap.parse_args()
    torch.manual_seed(0)
    for B in (int(b) for b in a.batches.split(",")):
        qkv = torch.randn(B, a.seq, 3 * a.d_model, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        dy = torch.randn(B, a.seq, a.heads, a.d_model // a.heads, device="cuda", dtype=torch.bfloat16)
        want = gradient(CASES["sdpa_cudnn"], qkv, a.heads, dy)
        exact = fp64_gradient(qkv, a.heads, dy)  # what every kernel's bf16 gradient is an approximation of
        flops = 3.5 * 4 * B * a.seq * a.seq * a.d_model / 2  # causal: half the scores; backward 2.5x the forward
        for name in a.cases.split(","):
            row = {"case": name, "batch": B, "seq": a.seq, "d_model": a.d_model, "heads": a.heads, "gpu": torch.cuda.get_device_name()}
            try:
                got = gradient(CASES[name], qkv, a.heads, dy)
                row["grad_max_abs_diff"] = (got.float() - want.float()).abs().max().item()
                row["grad_rel_l2"] = ((got.float() - want.float()).norm() / want.float().norm()).item()
                row["grad_rel_l2_vs_fp64"] = ((got.double() - exact).norm() / exact.norm()).item()
                row |= time_case(CASES[name], qkv, a.heads, dy, a.iters)
                row["tflops"] = flops / (min(row.get("graphed_ms") or 1e9, row["launched_ms"]) / 1000) / 1e12
            except Exception as e:  # noqa: BLE001
                row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
            print(json.dumps(row), flush=True)
            with open(a.out, "a") as f:
                f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
