"""Issue 17: FA4's forward tile on gpt2s's attention (12 heads of 64, causal, T 1024) on the H100. FA4 picks a
192 x 128 tile for head dim 64 on SM90; causal at T = 1024 a 192-row tile leaves its last block of queries two
thirds empty and walks more key blocks than a 128-row one (32 tile-pairs of 192 x 128 against 36 of 128 x 128:
33% more area). This times memlab's packed forward (memlab::flash_packed's kernel) at each --tiles choice, in
rounds, interleaved, and checks each output and log-sum-exp against the default's.

    python3 bench/fa4_tile_micro.py --out $OUT/tiles.jsonl --batches 16,200
"""

from __future__ import annotations

import argparse

import torch
from fused_kernels import jsonl_emitter, time_ms  # bench/ is not a package: the script's own folder is on sys.path
from memlab.core.attention.flash_packed import split_heads


def forward(qkv: torch.Tensor, heads: int, tile):
    from flash_attn.cute import interface

    q, k, v = split_heads(qkv, heads)
    B, T, nh, hs = q.shape
    out = qkv.new_empty((B, T, nh, hs))
    lse = qkv.new_empty((B, nh, T), dtype=torch.float32)
    interface._flash_attn_fwd(q, k, v, causal=True, return_lse=True, out=out, lse=lse, tile_mn=tile)
    return out, lse


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--batches", default="16,200")
    ap.add_argument("--tiles", default="default,128x128,128x176,128x96,192x96")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    tiles = {name: None if name == "default" else tuple(int(n) for n in name.split("x")) for name in args.tiles.split(",")}

    emit = jsonl_emitter(args.out)

    for B in (int(b) for b in args.batches.split(",")):
        g = torch.Generator(device="cuda").manual_seed(B)
        qkv = torch.randn(B, 1024, 3 * 768, device="cuda", generator=g).to(torch.bfloat16)
        ref_out, ref_lse = forward(qkv, 12, None)
        usable = {}
        for name, tile in tiles.items():
            try:
                out, lse = forward(qkv, 12, tile)
            except (RuntimeError, AssertionError, ValueError, TypeError) as err:  # a tile FA4 cannot build: recorded, not timed
                emit(batch=B, tile=name, error=f"{type(err).__name__}: {err}"[:300])
                continue
            usable[name] = tile
            emit(batch=B, tile=name, case="check", out_max_diff=(out.float() - ref_out.float()).abs().max().item(),
                 lse_max_diff=(lse - ref_lse).abs().max().item())
        for rnd in range(args.rounds):
            for name, tile in usable.items():
                emit(batch=B, tile=name, case="time", round=rnd, ms=time_ms(lambda: forward(qkv, 12, tile), reps=7, calls=12))
        qkv = ref_out = ref_lse = None
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
