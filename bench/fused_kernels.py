"""kernels.fused on the GPU: each Triton kernel checked against its PyTorch reference, then timed over a sweep of
launch shapes at the gpt2s shape (C = 768, batch x 1024 rows), with the bytes each must move and the
bandwidth it reached beside a plain device-to-device copy's. "default" is the launch shape in
core/fused/triton_kernels.py (the one the H100 results used); "best" is the fastest of the sweep.

    python3 bench/fused_kernels.py --out $OUT --batch 128
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
from pathlib import Path

import torch

from memlab.core.fused import reference
from memlab.core.fused import triton_kernels as tk


def time_ms(fn, reps: int = 15, calls: int = 10) -> float:
    """GPU milliseconds per call: the median over `reps` of `calls` back-to-back calls between two events, so the
    host's launch work overlaps the kernels (as in training) instead of being counted."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(calls):
            fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / calls)
    return statistics.median(times)


def jsonl_emitter(path: str):
    """emit(**row) for the micro-benchmarks: the row, with the GPU's name, printed and appended to `path` as it
    lands, so that a run cut short keeps what it measured."""

    def emit(**row) -> None:
        row["gpu"] = torch.cuda.get_device_name()
        print(json.dumps(row), flush=True)
        with open(path, "a") as sink:
            sink.write(json.dumps(row) + "\n")

    return emit


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    if not torch.isfinite(a).all():
        return float("inf")
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def inputs(N: int, C: int, dtype: torch.dtype, seed: int) -> dict:
    g = torch.Generator(device="cuda").manual_seed(seed)

    def r(*shape, scale=1.0, dt=torch.float32):
        return (torch.randn(*shape, device="cuda", generator=g) * scale).to(dt)

    return dict(x_prev=r(N, C), branch=r(N, C, dt=dtype), bias=r(C, scale=0.1), weight=1 + r(C, scale=0.1), ln_bias=r(C, scale=0.1),
                g_h=r(N, C, dt=dtype), g_x=r(N, C))


def check(N: int, C: int, dtype: torch.dtype) -> dict:
    """Max relative error of every output against the reference (fp32 arithmetic on the same inputs)."""
    t = inputs(N, C, dtype, seed=N + C)
    out = {}
    fwd = tk.add_ln_fwd(t["x_prev"], t["branch"], t["bias"], t["weight"], t["ln_bias"], 1e-5, dtype)
    ref = reference.add_ln_fwd(t["x_prev"], t["branch"], t["bias"], t["weight"], t["ln_bias"], 1e-5, dtype)
    out["add_ln_fwd"] = max(rel_err(a, b) for a, b in zip(fwd, ref))
    x, mean, rstd = ref[0], ref[2], ref[3]
    for name, g_x in (("add_ln_bwd", t["g_x"]), ("add_ln_bwd_no_gx", None)):
        got = tk.add_ln_bwd(t["g_h"], g_x, x, mean, rstd, t["weight"], dtype)
        want = reference.add_ln_bwd(t["g_h"], g_x, x, mean, rstd, t["weight"], dtype)
        out[name] = max(rel_err(a, b) for a, b in zip(got, want))
    return out


def model_check(compiled: bool, dropout: float = 0.0, bf16: bool = True) -> str:
    """A small GPT on the GPU, stock vs kernels.fused, under bf16 autocast (or in fp32, TF32 off): loss and the worst
    gradient's relative error. With dropout, each forward starts from the same RNG state: the fused model drops
    where the stock one does."""
    import copy

    from memlab.core.attention import build_attention
    from memlab.core.config import AttentionConfig
    from memlab.core.model import GPT, GPTConfig

    torch.manual_seed(0)
    cfg = GPTConfig(n_layer=2, n_head=4, d_model=256, d_ff=1024, vocab_size=1024, seq_len=128, dropout=dropout)
    dtype = torch.bfloat16 if bf16 else torch.float32
    stock = GPT(cfg, build_attention(AttentionConfig(kernel="sdpa"), torch.device("cuda"), dtype, dropout)).cuda()
    fused = copy.deepcopy(stock)
    fused.fused = True
    idx = torch.randint(0, 1024, (8, 128), device="cuda")
    tgt = torch.randint(0, 1024, (8, 128), device="cuda")
    losses = []
    for m in (stock, fused):
        run = torch.compile(m) if compiled else m
        torch.cuda.manual_seed(1)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
            loss = run(idx, tgt)
        loss.backward()
        losses.append(loss.item())
    worst = max(((n, rel_err(a.grad, b.grad)) for (n, a), b in zip(stock.named_parameters(), fused.parameters())), key=lambda t: t[1])
    label = ", ".join(["compiled" if compiled else "eager"] + ([f"dropout {dropout}"] if dropout else []) + ([] if bf16 else ["fp32"]))
    return f"model check ({label}): loss stock {losses[0]:.6f} fused {losses[1]:.6f}; worst grad {worst[0]} rel err {worst[1]:.1e}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="bench/results/fused")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--C", type=int, default=768)
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows, lines = [], []
    dt = torch.bfloat16
    for N, C in ((1, 7), (37, 96), (1000, 768), (4099, 1000), (2048, 2048)):
        errs = check(N, C, dt)
        ok = all(e < 1e-2 for e in errs.values())
        lines.append(f"check N={N} C={C}: " + " ".join(f"{k}={v:.1e}" for k, v in errs.items()) + ("  ok" if ok else "  FAILED"))
        rows.append({"kind": "check", "N": N, "C": C, **errs, "ok": ok})
        print(lines[-1], flush=True)

    for compiled in (False, True):
        try:
            lines.append(model_check(compiled))
        except Exception:  # noqa: BLE001 (report and go on to the timings)
            import traceback

            lines.append(f"model check ({compiled=}) FAILED:\n" + traceback.format_exc())
        print(lines[-1], flush=True)

    N, C = args.batch * args.seq, args.C
    t = inputs(N, C, dt, seed=0)
    src = torch.empty(N * C * 2, dtype=torch.float32, device="cuda")
    dst = torch.empty_like(src)
    copy_ms = time_ms(lambda: dst.copy_(src))
    copy_gbs = 2 * src.numel() * 4 / copy_ms / 1e6
    lines.append(f"device-to-device copy: {copy_gbs:,.0f} GB/s (read + write)")
    print(lines[-1], flush=True)
    ref = reference.add_ln_fwd(t["x_prev"], t["branch"], t["bias"], t["weight"], t["ln_bias"], 1e-5, dt)
    x, mean, rstd = ref[0], ref[2], ref[3]
    del ref
    e = N * C
    cases = {
        # name: (bytes moved once each, {param: choices}, call)
        "add_ln_fwd": (e * (4 + 2 + 4 + 2), {"rows": (1, 2), "warps": (4, 8), "programs_per_sm": (0, 8), "stages": (2,)},
                       lambda **k: tk.add_ln_fwd(t["x_prev"], t["branch"], t["bias"], t["weight"], t["ln_bias"], 1e-5, dt, **k)),
        "add_ln_bwd": (e * (2 + 4 + 4 + 4 + 2), {"rows": (1, 2, 4), "warps": (4, 8), "programs_per_sm": (1, 2, 4, 8), "stages": (2,)},
                       lambda **k: tk.add_ln_bwd(t["g_h"], t["g_x"], x, mean, rstd, t["weight"], dt, **k)),
    }
    for name, (nbytes, grid, call) in cases.items():
        best = None
        for values in itertools.product(*grid.values()):
            params = dict(zip(grid, values))
            try:
                ms = time_ms(lambda: call(**params))
            except Exception as ex:  # noqa: BLE001 (a shape Triton cannot compile is just not a candidate)
                print(f"  {name} {params}: {type(ex).__name__}", flush=True)
                continue
            gbs = nbytes / ms / 1e6
            rows.append({"kind": "time", "kernel": name, "params": json.dumps(params), "ms": ms, "gb_s": gbs, "N": N, "C": C})
            if best is None or ms < best[0]:
                best = (ms, params, gbs)
        default_ms = time_ms(lambda: call())
        lines.append(f"{name}: default {default_ms:.3f} ms ({nbytes / default_ms / 1e6:,.0f} GB/s); best {best[0]:.3f} ms "
                     f"({best[2]:,.0f} GB/s = {best[2] / copy_gbs:.0%} of copy) at {best[1]}; bytes {nbytes / 1e9:.2f} GB")
        print(lines[-1], flush=True)
    env = f"GPU {torch.cuda.get_device_name()} · torch {torch.__version__} · triton {__import__('triton').__version__} · N={N} C={C} bf16"
    text = "\n".join([env] + lines)
    (out / "fused_kernels.txt").write_text(text + "\n")
    (out / "fused_kernels.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(text)


if __name__ == "__main__":
    main()
