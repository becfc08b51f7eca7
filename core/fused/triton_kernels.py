"""Triton kernels behind kernels.fused (CUDA). Each one does in one pass over memory what Inductor does in two or
three, for the same arithmetic; memlab.core.fused.reference holds the PyTorch version of each.

- add_ln_fwd:  x = x_prev + branch + bias;  h = LayerNorm(x)       writes x (fp32), h (compute dtype), mean, rstd;
               h's rows may end in a ones column (memlab.core.fused.forward says why)
- add_ln_bwd:  dx = g_x + LayerNorm'(g_h);  also dx in the compute dtype (the branch's gradient) and per-program
               column sums of g_h * xhat, g_h and dx (the LayerNorm weight, LayerNorm bias and branch-bias grads)
- head_cross_entropy: the LM head's logits (one cuBLAS matmul, vocabulary padded), then one kernel per row that
               computes the row's loss and overwrites its logits with their gradient: the backward is the matmuls

Rows are the B*T tokens, columns the features. A LayerNorm row (C <= 8192) fits one block of BLOCK_C lanes.
Column sums are accumulated per program over its rows (in a tile, reduced once at the end), written per program
and added up by the caller: deterministic, no atomics. Offsets are int32 unless a tensor has 2**31 elements or
more (BIG).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from memlab.core.fused.cublaslt import matmul

# Launch shapes: each program walks its share of rows in a loop, its loads software-pipelined STAGES deep.
# bench/fused_kernels.py sweeps alternatives; these are the best of its sweeps at gpt2s's batch 16 and 200 on the
# H100 (forward 0.060 / 0.649 ms a call; backward 0.094 / 0.903,
# where the shape used before was 0.097 / 0.939). The backward's best number of programs differs with the rows.
FWD = dict(rows=2, warps=4, programs_per_sm=0, stages=2)
BWD = dict(rows=4, warps=4, stages=2)  # programs a multiprocessor: 2 up to BWD_FEW_ROWS rows (batch 16), else 8
BWD_FEW_ROWS = 65536
# the head's rows: near-best at every shape of bench/classifier_micro.py's sweep on an H100
CE = dict(block=8192, warps=8, programs_per_sm=8)


@triton.jit
def _add_ln_fwd_kernel(XP, BR, BIAS, W, B, X, H, MEAN, RSTD, N, C, eps, rows_per_prog, PAD: tl.constexpr,
                       BLOCK_PAD: tl.constexpr, BLOCK_C: tl.constexpr, ROWS: tl.constexpr, STAGES: tl.constexpr, BIG: tl.constexpr):
    """H's rows are C + PAD long: after the norm's C values come a 1 and PAD - 1 zeros (the ones column)."""
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_C)
    cmask = cols < C
    bias = tl.load(BIAS + cols, mask=cmask, other=0.0).to(tl.float32)
    w = tl.load(W + cols, mask=cmask, other=0.0).to(tl.float32)
    b = tl.load(B + cols, mask=cmask, other=0.0).to(tl.float32)
    start = pid * rows_per_prog
    for r in tl.range(start, start + rows_per_prog, ROWS, num_stages=STAGES):
        rows = r + tl.arange(0, ROWS)
        if BIG:
            rows = rows.to(tl.int64)
        rmask = rows < N
        m = rmask[:, None] & cmask[None, :]
        offs = rows[:, None] * C + cols[None, :]
        x = tl.load(XP + offs, mask=m, other=0.0).to(tl.float32) + tl.load(BR + offs, mask=m, other=0.0).to(tl.float32)
        x = tl.where(m, x + bias[None, :], 0.0)
        tl.store(X + offs, x, mask=m)
        mean = tl.sum(x, axis=1) / C
        xc = tl.where(m, x - mean[:, None], 0.0)
        rstd = 1.0 / tl.sqrt(tl.sum(xc * xc, axis=1) / C + eps)
        h = xc * rstd[:, None] * w[None, :] + b[None, :]
        h_row = rows[:, None] * (C + PAD)
        tl.store(H + h_row + cols[None, :], h.to(H.dtype.element_ty), mask=m)
        if PAD > 0:
            pad = tl.arange(0, BLOCK_PAD)
            ones = tl.where(pad == 0, 1.0, 0.0)[None, :] + tl.zeros([ROWS, BLOCK_PAD], dtype=tl.float32)
            tl.store(H + h_row + C + pad[None, :], ones.to(H.dtype.element_ty), mask=rmask[:, None] & (pad < PAD)[None, :])
        tl.store(MEAN + rows, mean, mask=rmask)
        tl.store(RSTD + rows, rstd, mask=rmask)


@triton.jit
def _add_ln_bwd_kernel(GH, GX, X, MEAN, RSTD, W, DX, DXL, PART, N, C, rows_per_prog, n_progs, GH_PAD: tl.constexpr,
                       HAS_GX: tl.constexpr, BLOCK_C: tl.constexpr, ROWS: tl.constexpr, STAGES: tl.constexpr,
                       BIG: tl.constexpr):
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_C)
    cmask = cols < C
    w = tl.load(W + cols, mask=cmask, other=0.0).to(tl.float32)
    acc_dw = tl.zeros([ROWS, BLOCK_C], dtype=tl.float32)
    acc_db = tl.zeros([ROWS, BLOCK_C], dtype=tl.float32)
    acc_dbias = tl.zeros([ROWS, BLOCK_C], dtype=tl.float32)
    start = pid * rows_per_prog
    for r in tl.range(start, start + rows_per_prog, ROWS, num_stages=STAGES):
        rows = r + tl.arange(0, ROWS)
        if BIG:
            rows = rows.to(tl.int64)
        rmask = rows < N
        m = rmask[:, None] & cmask[None, :]
        offs = rows[:, None] * C + cols[None, :]
        g = tl.load(GH + rows[:, None] * (C + GH_PAD) + cols[None, :], mask=m, other=0.0).to(tl.float32)  # pad: no gradient
        x = tl.load(X + offs, mask=m, other=0.0).to(tl.float32)
        mean = tl.load(MEAN + rows, mask=rmask, other=0.0)
        rstd = tl.load(RSTD + rows, mask=rmask, other=0.0)
        xhat = tl.where(m, (x - mean[:, None]) * rstd[:, None], 0.0)
        wg = g * w[None, :]
        c1 = tl.sum(xhat * wg, axis=1) / C
        c2 = tl.sum(wg, axis=1) / C
        dx = (wg - (xhat * c1[:, None] + c2[:, None])) * rstd[:, None]
        if HAS_GX:
            dx += tl.load(GX + offs, mask=m, other=0.0).to(tl.float32)
        dx = tl.where(m, dx, 0.0)
        tl.store(DX + offs, dx, mask=m)
        tl.store(DXL + offs, dx.to(DXL.dtype.element_ty), mask=m)
        acc_dw += g * xhat
        acc_db += g
        acc_dbias += dx
    tl.store(PART + pid * C + cols, tl.sum(acc_dw, axis=0), mask=cmask)
    tl.store(PART + (n_progs + pid) * C + cols, tl.sum(acc_db, axis=0), mask=cmask)
    tl.store(PART + (2 * n_progs + pid) * C + cols, tl.sum(acc_dbias, axis=0), mask=cmask)


@triton.jit
def _ce_rows_kernel(LOGITS, TGT, LOSS, M, V, stride, scale, BLOCK: tl.constexpr):
    """Per row of LOGITS (M rows of `stride` columns, the first V real): LOSS = logsumexp - logit[target], and the
    row overwritten with its gradient, (softmax - onehot) * scale, 0 in the pad columns. Two passes over a row:
    max and sum-exp online, then the gradient; each program walks rows p, p + grid, ... so that the second pass
    reads a row just read, from L2. The target's logit is read before the row is overwritten."""
    pid = tl.program_id(0)
    for row in tl.range(pid, M, tl.num_programs(0)):
        base = tl.cast(row, tl.int64) * stride
        m = tl.full([], float("-inf"), tl.float32)
        s = tl.zeros([], dtype=tl.float32)
        for start in tl.range(0, V, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            x = tl.load(LOGITS + base + cols, mask=cols < V, other=float("-inf")).to(tl.float32)
            m_new = tl.maximum(m, tl.max(x, axis=0))
            s = s * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new), axis=0)
            m = m_new
        lse = m + tl.log(s)
        t = tl.load(TGT + row)
        tl.store(LOSS + row, lse - tl.load(LOGITS + base + t).to(tl.float32))
        for start in tl.range(0, stride, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            x = tl.load(LOGITS + base + cols, mask=cols < V, other=float("-inf")).to(tl.float32)
            p = tl.exp(x - lse) * scale
            p = tl.where(cols == t, p - scale, p)
            tl.store(LOGITS + base + cols, p.to(LOGITS.dtype.element_ty), mask=cols < stride)


@functools.lru_cache(maxsize=None)
def _multiprocessors(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def _programs(device: torch.device, per_sm: int) -> int:
    """How many programs to split the rows over: per_sm per multiprocessor; 0 = as many as there are row tiles."""
    if per_sm == 0:
        return 2**31 - 1
    if device.type != "cuda":  # the interpreter (tests): a few programs are enough to cover the splits
        return 3
    return _multiprocessors(device) * per_sm


def _big(*tensors: torch.Tensor) -> bool:
    """Whether a kernel that indexes these tensors needs int64 offsets: up to numel + a row, plus rows past the end
    of the split, in the largest of them (a padded h or g_h has more than x)."""
    return any(t.numel() + 2 * t.shape[-1] >= 2**31 for t in tensors)


def _split(n_rows: int, programs: int, rows_step: int) -> tuple[int, int]:
    """Rows per program (a multiple of rows_step) and the number of programs that covers n_rows."""
    per = triton.cdiv(triton.cdiv(n_rows, programs), rows_step) * rows_step
    return per, triton.cdiv(n_rows, per)


def add_ln_fwd(x_prev, branch, bias, weight, ln_bias, eps: float, out_dtype: torch.dtype, pad: int = 0, **launch):
    cfg = FWD | launch
    C = x_prev.shape[-1]
    N = x_prev.numel() // C
    x = torch.empty(x_prev.shape, dtype=torch.float32, device=x_prev.device)
    h = torch.empty((*x_prev.shape[:-1], C + pad), dtype=out_dtype, device=x_prev.device)
    mean = torch.empty(x_prev.shape[:-1], dtype=torch.float32, device=x_prev.device)
    rstd = torch.empty_like(mean)
    per, n_progs = _split(N, _programs(x_prev.device, cfg["programs_per_sm"]), cfg["rows"])
    _add_ln_fwd_kernel[(n_progs,)](
        x_prev.contiguous(), branch.contiguous(), bias, weight, ln_bias, x, h, mean, rstd, N, C, eps, per, pad,
        BLOCK_PAD=triton.next_power_of_2(max(pad, 1)), BLOCK_C=triton.next_power_of_2(C), ROWS=cfg["rows"], STAGES=cfg["stages"], BIG=_big(x, h), num_warps=cfg["warps"],
    )
    return x, h, mean, rstd


def add_ln_bwd(g_h, g_x, x, mean, rstd, weight, low_dtype: torch.dtype, **launch):
    C = x.shape[-1]
    N = x.numel() // C
    cfg = BWD | {"programs_per_sm": 2 if N <= BWD_FEW_ROWS else 8} | launch
    dx = torch.empty(x.shape, dtype=torch.float32, device=x.device)
    dx_low = torch.empty(x.shape, dtype=low_dtype, device=x.device)
    per, n_progs = _split(N, _programs(x.device, cfg["programs_per_sm"]), cfg["rows"])
    part = torch.empty((3, n_progs, C), dtype=torch.float32, device=x.device)
    _add_ln_bwd_kernel[(n_progs,)](
        g_h.contiguous(), g_x.contiguous() if g_x is not None else dx, x, mean, rstd, weight, dx, dx_low, part,
        N, C, per, n_progs, g_h.shape[-1] - C, HAS_GX=g_x is not None, BLOCK_C=triton.next_power_of_2(C), ROWS=cfg["rows"],
        STAGES=cfg["stages"], BIG=_big(x, g_h), num_warps=cfg["warps"],
    )
    return dx, dx_low, part.sum(dim=1)  # one sum for the three: (3, C)


def head_cross_entropy(h, weight, targets, vocab: int, **launch):
    """(mean loss, its gradient with respect to the logits): logits = h @ weight^T in one matmul (weight padded to
    `stride` rows, the first `vocab` real), then _ce_rows_kernel turns the logits into their gradient in place."""
    cfg = CE | launch
    M = h.shape[0]
    logits = matmul(h, weight, False, True)  # (M, stride): the one logit-sized buffer, returned as the gradient
    loss = torch.empty(M, dtype=torch.float32, device=h.device)
    grid = (min(M, _programs(h.device, cfg["programs_per_sm"])),)
    _ce_rows_kernel[grid](logits, targets, loss, M, vocab, logits.shape[1], 1.0 / M, BLOCK=cfg["block"], num_warps=cfg["warps"])
    return loss.mean(), logits
