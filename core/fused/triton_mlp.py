"""The MLP's two matmuls that meet its GELU, with the GELU in the matmul's epilogue (Triton, CUDA).

- mm_bias_gelu:  pre = A @ B + bias, act = gelu_tanh(pre)        the input layer's forward: writes pre (saved for
                 backward) and act from the accumulator, so no kernel reads pre back to make act
- mm_dgelu:      d = (A @ B) * gelu_tanh'(pre), and per-tile column sums of d     the output layer's input gradient
                 with the GELU backward and the input layer's bias gradient in its epilogue: the gradient with
                 respect to act is never written, nor read back

Each rounds where the stock graph rounds (pre and A @ B to the output dtype before the GELU or its derivative), so
the arithmetic is the stock model's: cuBLAS's matmul, then the elementwise kernel. Column sums are written per
tile row and added up by the caller (deterministic, no atomics). memlab.core.fused.reference holds the PyTorch
version of each.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# Launch shapes for the H100 (bench/mlp_gemm_micro.py sweeps them; results/fused-mlp-h100/). programs_per_sm 0:
# one program a tile; else a persistent grid of that many programs a multiprocessor, each walking tiles.
MM_GELU = dict(block_m=128, block_n=256, block_k=64, group_m=8, warps=8, stages=3, programs_per_sm=0, flatten=False)
MM_DGELU = dict(block_m=128, block_n=128, block_k=64, group_m=8, warps=8, stages=4, programs_per_sm=0, flatten=False)

_K0 = tl.constexpr(0.7978845608028654)  # sqrt(2 / pi); a constexpr, which a kernel may read


@triton.jit
def _tile(tile, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """A tile's first (row, column), GROUP_M tile rows swept together so that their B tiles stay in L2."""
    grid_m = tl.cdiv(M, BLOCK_M)
    grid_n = tl.cdiv(N, BLOCK_N)
    in_group = GROUP_M * grid_n
    first_m = (tile // in_group) * GROUP_M
    rows_here = min(grid_m - first_m, GROUP_M)
    return (first_m + (tile % in_group) % rows_here) * BLOCK_M, ((tile % in_group) // rows_here) * BLOCK_N


@triton.jit
def _accumulate(a_desc, b_desc, off_m, off_n, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                STAGES: tl.constexpr, B_ROWS_ARE_N: tl.constexpr, PRECISION: tl.constexpr):
    """A[off_m:, :] @ B[:, off_n:] in fp32, tiles through TMA (out-of-range reads are zeros). B is stored (N, K)
    when B_ROWS_ARE_N (a weight used as W^T), else (K, N)."""
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k in tl.range(0, tl.cdiv(K, BLOCK_K), num_stages=STAGES):
        a = a_desc.load([off_m, k * BLOCK_K])
        if B_ROWS_ARE_N:
            b = b_desc.load([off_n, k * BLOCK_K]).T
        else:
            b = b_desc.load([k * BLOCK_K, off_n])
        acc = tl.dot(a, b, acc, input_precision=PRECISION)  # fp32 inputs in full fp32, as cuBLAS by default
    return acc


@triton.jit
def _gelu_parts(x):
    """(tanh(u), u = sqrt(2/pi) (x + 0.044715 x^3)) for gelu_tanh(x) = x/2 (1 + tanh(u)) and its derivative."""
    return 1.0 - 2.0 / (tl.exp(2.0 * _K0 * (x + 0.044715 * x * x * x)) + 1.0)


@triton.jit
def _mm_bias_gelu_kernel(a_desc, b_desc, pre_desc, act_desc, BIAS, M, N, K, PROGRAMS,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                         STAGES: tl.constexpr, FLATTEN: tl.constexpr, PRECISION: tl.constexpr):
    n_tiles = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)
    for tile in tl.range(tl.program_id(0), n_tiles, PROGRAMS, flatten=FLATTEN):
        off_m, off_n = _tile(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        acc = _accumulate(a_desc, b_desc, off_m, off_n, K, BLOCK_M, BLOCK_N, BLOCK_K, STAGES, True, PRECISION)
        rn = off_n + tl.arange(0, BLOCK_N)
        acc += tl.load(BIAS + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
        pre = acc.to(pre_desc.dtype)
        x = pre.to(tl.float32)  # the GELU of the rounded pre, as the stock graph computes it
        pre_desc.store([off_m, off_n], pre)  # out-of-range rows and columns are not written
        act_desc.store([off_m, off_n], (0.5 * x * (1.0 + _gelu_parts(x))).to(act_desc.dtype))


@triton.jit
def _mm_dgelu_kernel(a_desc, b_desc, pre_desc, d_desc, PART, M, N, K, PROGRAMS,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                     STAGES: tl.constexpr, FLATTEN: tl.constexpr, PRECISION: tl.constexpr):
    n_tiles = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)
    for tile in tl.range(tl.program_id(0), n_tiles, PROGRAMS, flatten=FLATTEN):
        off_m, off_n = _tile(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        acc = _accumulate(a_desc, b_desc, off_m, off_n, K, BLOCK_M, BLOCK_N, BLOCK_K, STAGES, False, PRECISION)
        g = acc.to(d_desc.dtype).to(tl.float32)  # the stock graph's gradient of act, rounded as it stores it
        x = pre_desc.load([off_m, off_n]).to(tl.float32)  # zeros out of range: d is 0 there
        t = _gelu_parts(x)
        d = g * (0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * _K0 * (1.0 + 3.0 * 0.044715 * x * x))
        d_desc.store([off_m, off_n], d.to(d_desc.dtype))
        rn = off_n + tl.arange(0, BLOCK_N)
        tl.store(PART + (off_m // BLOCK_M) * N + rn, tl.sum(d, axis=0), mask=rn < N)


def _descriptor(t: torch.Tensor, block: list[int]):
    from triton.tools.tensor_descriptor import TensorDescriptor

    return TensorDescriptor.from_tensor(t, block)


def usable(*tensors: torch.Tensor) -> bool:
    """TMA reads rows that start on 16-byte boundaries: contiguous rows a multiple of 16 bytes long."""
    return all(t.is_contiguous() and (t.shape[-1] * t.element_size()) % 16 == 0 and t.data_ptr() % 16 == 0 for t in tensors)


def _launch(kernel, a, b, out1, out2, extra, M, N, K, cfg, b_rows_are_n: bool):
    bm, bn, bk = cfg["block_m"], cfg["block_n"], cfg["block_k"]
    n_tiles = triton.cdiv(M, bm) * triton.cdiv(N, bn)
    per_sm = cfg["programs_per_sm"]
    programs = n_tiles if per_sm == 0 else min(n_tiles, per_sm * torch.cuda.get_device_properties(a.device).multi_processor_count)
    kernel[(programs,)](
        _descriptor(a, [bm, bk]), _descriptor(b, [bn, bk] if b_rows_are_n else [bk, bn]),
        _descriptor(out1, [bm, bn]), _descriptor(out2, [bm, bn]), extra, M, N, K, programs,
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=cfg["group_m"], STAGES=cfg["stages"], FLATTEN=cfg["flatten"],
        PRECISION="ieee" if a.dtype == torch.float32 else "tf32", num_warps=cfg["warps"],
    )


def mm_bias_gelu(x, weight, bias, **launch):
    """(pre, act): x (M, K) @ weight (N, K)^T + bias, and its GELU (tanh), both in x's dtype."""
    cfg = MM_GELU | launch
    M, K = x.shape
    N = weight.shape[0]
    pre = torch.empty((M, N), dtype=x.dtype, device=x.device)
    act = torch.empty_like(pre)
    _launch(_mm_bias_gelu_kernel, x, weight, pre, act, bias, M, N, K, cfg, b_rows_are_n=True)
    return pre, act


def mm_dgelu(g, weight, pre, **launch):
    """(d, column sums of d in fp32): d = (g (M, K) @ weight (K, N)) * gelu_tanh'(pre), in pre's dtype."""
    cfg = MM_DGELU | launch
    M, K = g.shape
    N = weight.shape[1]
    d = torch.empty_like(pre)
    part = torch.empty((triton.cdiv(M, cfg["block_m"]), N), dtype=torch.float32, device=g.device)
    _launch(_mm_dgelu_kernel, g, weight, pre, d, part, M, N, K, cfg, b_rows_are_n=False)
    return d, part.sum(dim=0)
