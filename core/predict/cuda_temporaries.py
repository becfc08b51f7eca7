"""What CUDA kernels allocate from the caching allocator beyond their outputs, and free before they return: the
blocks a fake step (memlab.core.predict.trace) does not make by itself. Transient, they add nothing to the
allocated peak, but each needs a free block of its size at that moment; on a shape without a large freed block
to land in (no logits segment: liger_ce, cce, leanest) they fragment the reserve.

Each rule is read from the kernel's source and checked against the H100's allocator history of the op alone
(bench/backward_transients.py records it), not fitted to a run's peak:

- the staging buffer of a reduction split across thread blocks (ATen's Reduce.cuh, setReduceConfig and
  ReduceConfig::global_memory_size): a Linear's bias gradient, `grad.sum(0)` over every token, takes 132 MiB at
  16,384 tokens and 2,048 outputs on an H100;
- cuDNN attention's backward workspace (SDPA's default backend on an H100 under torch 2.11): fp32, B x H x T x
  (head_dim + 1), and 256 bytes;
- the flash backward's fp32 dq accumulator (PyTorch's FlashAttention-2 and the flash-attn library's),
  B x round(T, 128) x H x round(head_dim, 32).

No GPU here: an H100 SXM (132 SMs, 2,048 threads an SM), as `memlab estimate` assumes; on a GPU, its own.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from memlab.core.predict.calibration import ASSUMED_GPU, DEVICES

MAX_REDUCE_THREADS = 512  # Reduce.cuh's threads a block, for every dtype but complex128
WARP = 32
MIN_VALUES_PER_THREAD, MAX_VALUES_PER_THREAD = 16, 256


@dataclass(frozen=True)
class Sms:
    """What the reduction's launch configuration reads of the device."""

    count: int = DEVICES[ASSUMED_GPU].sm_count  # no GPU here: the card memlab estimate assumes
    max_threads: int = DEVICES[ASSUMED_GPU].max_threads_per_sm

    @classmethod
    def of_this_device(cls) -> Sms:
        if not torch.cuda.is_available():
            return cls()
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        return cls(props.multi_processor_count, props.max_threads_per_multi_processor)


def _last_pow2(n: int) -> int:
    return max(1, 1 << (max(1, n).bit_length() - 1))


def div_up(a: int, b: int) -> int:
    return -(-a // b)


def reduce_staging_bytes(rows: int, columns: int, over_rows: bool, acc_bytes: int = 4, sms: Sms = Sms()) -> int:
    """Bytes of the global staging buffer a CUDA sum of a contiguous (rows, columns) tensor allocates (0: none),
    reducing over the rows (a bias gradient: one output a column) or over the columns (one output a row).
    Follows setReduceConfig: block shape, the split across warps, then across blocks where each thread would
    still sum >= 256 values and the grid leaves SMs idle. Output vectorized by 4 (aligned, columns % 4 == 0)."""
    if over_rows:  # block.x along the outputs, vectorized by output_vec_size
        outputs, inputs = columns, rows
        vec = 4 if columns % 4 == 0 else 2 if columns % 2 == 0 else 1
        dim0, dim1 = outputs // vec, inputs
    else:  # block.x along the reduced (fastest) dimension
        outputs, inputs, vec = rows, columns, 1
        dim0, dim1 = (inputs // 4 if inputs > 128 else inputs), outputs
    threads = MAX_REDUCE_THREADS // vec
    dim0_pow2 = _last_pow2(dim0) if dim0 < threads else threads
    dim1_pow2 = _last_pow2(dim1) if dim1 < threads else threads
    width = min(dim0_pow2, WARP)
    height = min(dim1_pow2, threads // width)
    width = min(dim0_pow2, threads // height)
    step_input, step_output = (width, 1) if not over_rows else (1, width)
    split_warps = div_up(inputs, step_input) >= min(height * MIN_VALUES_PER_THREAD, MAX_VALUES_PER_THREAD)
    if not split_warps:
        return 0
    step_input *= height
    values_per_thread = div_up(inputs, step_input)
    grid = div_up(outputs // vec, step_output)
    target_grid = sms.count * (sms.max_threads // (width * height))
    if values_per_thread < MAX_VALUES_PER_THREAD or grid > target_grid:
        return 0
    ctas = max(min(div_up(target_grid, grid), div_up(values_per_thread, MIN_VALUES_PER_THREAD)),
               div_up(values_per_thread, MAX_VALUES_PER_THREAD))
    if ctas <= 1:
        return 0
    size = acc_bytes * outputs * ctas
    return size * width * vec if over_rows else size  # no block-x reduce: a slot per lane


def sum_staging_bytes(shape: tuple[int, ...], dims: list[int], dtype_is_double: bool = False, sms: Sms = Sms()) -> int:
    """reduce_staging_bytes for aten.sum.dim_IntList of a contiguous tensor of `shape` over `dims`, where those
    are a leading or a trailing run of dimensions (TensorIterator coalesces each side into one); 0 otherwise."""
    n = len(shape)
    dims = sorted(d % n for d in dims) if dims else list(range(n))
    acc = 8 if dtype_is_double else 4
    if dims == list(range(len(dims))):  # leading: the rows
        rows, columns = math.prod(shape[:len(dims)]), math.prod(shape[len(dims):])
        return reduce_staging_bytes(rows, columns, over_rows=True, acc_bytes=acc, sms=sms) if columns > 1 else \
            reduce_staging_bytes(1, rows, over_rows=False, acc_bytes=acc, sms=sms)
    if dims == list(range(n - len(dims), n)):  # trailing: the columns
        rows, columns = math.prod(shape[:n - len(dims)]), math.prod(shape[n - len(dims):])
        return reduce_staging_bytes(rows, columns, over_rows=False, acc_bytes=acc, sms=sms)
    return 0


def sdpa_backward_workspace_bytes(backend: str, batch: int, heads: int, seq_len: int, head_dim: int) -> int:
    """The fp32 block an attention kernel's backward allocates and frees (0 for a backend not modelled):
    cudnn, B x H x T x (head_dim + 1) and 256 bytes (run_cudnn_SDP_bprop: dq's fp32 accumulator and a softmax
    statistic a row; 32.5 MiB at 2 x 8 x 8192 x 64 on the H100);
    flash, the dq accumulator B x round(T, 128) x H x round(head_dim, 32)."""
    if backend == "cudnn":
        return 4 * batch * heads * seq_len * (head_dim + 1) + 256
    if backend == "flash":
        return 4 * batch * div_up(seq_len, 128) * 128 * heads * div_up(head_dim, 32) * 32
    return 0
