"""What the CUDA kernels of one backward allocate beyond their outputs (issue 17: the allocator replay's fake step
lacks them). The H100's traces of liger_ce and cce on the T 8192 shape (tests/data/gpu/replay-check-h100/) held, in
every block's backward, transient blocks the fake step never makes (132 MiB twice, 64 MiB, 32.5 MiB); on a shape
without a logits segment to land in, they fragment the reserve. This runs each suspect op alone, records the
allocator's history with C++ stacks, and prints every block its backward allocates: size, freed within it or not,
and the frames that name the kernel.

    python3 bench/backward_transients.py [--out DIR]      # on a GPU
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import torch
import torch.nn.functional as F

MIB = 2**20
INTERESTING = re.compile(r"(at::native::\w+|at::cuda::\w+|cublas\w*|flash\w*|mem_eff\w*|cudnn\w*|_efficient\w*|"
                         r"Reduce\w*|gemm\w*|layer_norm\w*|sum\w*|launch\w*)")


def kernel_frames(frames: list[dict]) -> list[str]:
    names = []
    for f in frames:
        m = INTERESTING.search(f.get("name", ""))
        if m and m.group(1) not in names:
            names.append(m.group(1))
    return names[:6]


def backward_blocks(run_backward) -> list[dict]:
    """Blocks allocated while run_backward() runs: bytes, whether freed before it returned, kernel frames."""
    torch.cuda.synchronize()
    torch.cuda.memory._record_memory_history(max_entries=200_000, stacks="all", context="all")
    run_backward()
    torch.cuda.synchronize()
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    live: dict[int, dict] = {}
    blocks = []
    for ev in snap["device_traces"][torch.cuda.current_device()]:
        if ev["action"] == "alloc":
            b = {"bytes": ev["size"], "freed": False, "frames": kernel_frames(ev.get("frames", []))}
            live[ev["addr"]] = b
            blocks.append(b)
        elif ev["action"] == "free_completed" and ev["addr"] in live:
            live.pop(ev["addr"])["freed"] = True
    return blocks


def linear_case(tokens: int, fan_in: int, fan_out: int, bias: bool = True) -> list[dict]:
    layer = torch.nn.Linear(fan_in, fan_out, bias=bias, device="cuda")
    x = torch.randn(tokens, fan_in, device="cuda", requires_grad=True)
    with torch.autocast("cuda", torch.bfloat16):
        y = layer(x)
    g = torch.randn_like(y)
    return backward_blocks(lambda: y.backward(g))


def sdpa_case(b: int, h: int, t: int, d: int, dropout: float, backend: str) -> list[dict]:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q, k, v = (torch.randn(b, h, t, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    with sdpa_kernel(getattr(SDPBackend, backend)):
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=True)
    g = torch.randn_like(y)
    return backward_blocks(lambda: y.backward(g))


def model_layout_case(b: int, h: int, t: int, d: int, dropout: float, backend: str) -> list[dict]:
    """SDPA as memlab's model calls it: q, k, v split from one projection and viewed (B, H, T, d) over (B, T, H, d)
    storage; the output transposed back and made contiguous."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    qkv = torch.randn(b, t, 3 * h * d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    q, k, v = (z.view(b, t, h, d).transpose(1, 2) for z in qkv.split(h * d, dim=2))
    with sdpa_kernel(getattr(SDPBackend, backend)):
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=True)
    y = y.transpose(1, 2).contiguous().view(b, t, h * d)
    g = torch.randn_like(y)
    return backward_blocks(lambda: y.backward(g))


def layer_norm_case(tokens: int, width: int) -> list[dict]:
    ln = torch.nn.LayerNorm(width, device="cuda")
    x = torch.randn(tokens, width, device="cuda", requires_grad=True)
    y = ln(x)
    g = torch.randn_like(y)
    return backward_blocks(lambda: y.backward(g))


CASES = {
    **{f"linear K{k} {i}->{o}": (linear_case, (k, i, o)) for k, i, o in [
        (16384, 512, 2048), (16384, 512, 1536), (16384, 512, 512), (16384, 2048, 512),
        (16384, 768, 3072), (16384, 768, 2304), (16384, 768, 768), (16384, 3072, 768),
        (8192, 512, 2048), (32768, 512, 2048), (4096, 512, 2048), (16384, 256, 1024), (16384, 1024, 4096)]},
    "linear K16384 512->2048 no bias": (linear_case, (16384, 512, 2048, False)),
    **{f"sdpa {b}x{h}x{t}x{d} p{p} {be}": (sdpa_case, (b, h, t, d, p, be)) for b, h, t, d, p, be in [
        (2, 8, 8192, 64, 0.1, "FLASH_ATTENTION"), (2, 8, 8192, 64, 0.0, "FLASH_ATTENTION"),
        (16, 12, 1024, 64, 0.0, "FLASH_ATTENTION"), (64, 8, 256, 32, 0.1, "FLASH_ATTENTION"),
        (2, 8, 8192, 64, 0.1, "EFFICIENT_ATTENTION"), (2, 8, 8192, 64, 0.0, "CUDNN_ATTENTION"),
        (16, 12, 1024, 64, 0.0, "CUDNN_ATTENTION")]},
    **{f"model layout {b}x{h}x{t}x{d} p{p} {be}": (model_layout_case, (b, h, t, d, p, be)) for b, h, t, d, p, be in [
        (2, 8, 8192, 64, 0.1, "CUDNN_ATTENTION"), (64, 8, 256, 32, 0.1, "CUDNN_ATTENTION"), (16, 12, 1024, 64, 0.0, "CUDNN_ATTENTION"),
        (2, 8, 8192, 64, 0.1, "FLASH_ATTENTION"), (64, 8, 256, 32, 0.1, "FLASH_ATTENTION"), (16, 12, 1024, 64, 0.0, "FLASH_ATTENTION"),
        (148, 12, 1024, 64, 0.0, "FLASH_ATTENTION")]},
    **{f"layer_norm {k}x{w}": (layer_norm_case, (k, w)) for k, w in [(16384, 512), (16384, 768)]},
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--min-mib", type=float, default=1.0)
    args = ap.parse_args()
    print(f"{torch.cuda.get_device_name()} · torch {torch.__version__}", flush=True)
    rows = []
    for name, (fn, fn_args) in CASES.items():
        try:
            blocks = fn(*fn_args)
        except Exception as e:  # noqa: BLE001 (a backend this build lacks: say so, go on)
            print(f"== {name}: {type(e).__name__}: {str(e).splitlines()[0][:120]}", flush=True)
            continue
        torch.cuda.empty_cache()
        print(f"== {name}", flush=True)
        for b in blocks:
            if b["bytes"] >= args.min_mib * MIB:
                print(f"   {b['bytes'] / MIB:9.3f} MiB {'transient' if b['freed'] else 'kept     '} {' < '.join(b['frames'])}")
            rows.append({"case": name, **b})
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "backward_transients.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


if __name__ == "__main__":
    main()
