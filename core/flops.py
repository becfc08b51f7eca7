"""FLOPs per token and MFU against a table of dense peaks by GPU model and compute dtype.

FLOPs per trained token = 6 N + 12 L d c (PaLM appendix B; nanoGPT's estimate_mfu):
- 6 N: forward (2 N) and backward (4 N) through every weight matrix. N counts every parameter once except the
  position embeddings (a lookup, no matmul); the tied token embedding counts once, as the LM head's matmul.
- 12 L d c: the two attention matmuls (QK^T and AV), forward and backward. By the usual convention a causal
  model counts the full T x T (c = T), so MFU compares with published figures; a sliding window of W keeps only
  part of the causal triangle, and c is scaled by exactly that fraction.
"""

from __future__ import annotations

# Dense (no sparsity) peak TFLOP/s from the vendors' datasheets: (fp32 CUDA cores, tf32 tensor, bf16/fp16 tensor).
# A GPU not listed has no peak: MFU is null, never a guess.
_PEAKS_TFLOPS: list[tuple[tuple[str, ...], tuple[float, float, float]]] = [
    (("H100", "NVL"), (60.0, 417.5, 835.0)),
    (("H100", "PCIe"), (51.0, 378.0, 756.0)),
    (("H100",), (67.0, 494.7, 989.4)),  # SXM5 (nvidia-smi: "NVIDIA H100 80GB HBM3")
    (("GH200",), (67.0, 494.7, 989.4)),
    (("H200",), (67.0, 494.7, 989.4)),  # same compute as H100 SXM, more memory
    (("A100",), (19.5, 156.0, 312.0)),
]

_DTYPE_COLUMN = {"fp32": 0, "tf32": 1, "bf16": 2, "fp16": 2, "bf16_pure": 2}


def peak_flops(gpu_name: str | None, dtype: str) -> float | None:
    """Dense peak FLOP/s of this GPU for the profile's compute dtype, or None when the GPU is not in the table."""
    if not gpu_name:
        return None
    for keys, peaks in _PEAKS_TFLOPS:
        if all(k.lower() in gpu_name.lower() for k in keys):
            return peaks[_DTYPE_COLUMN[dtype]] * 1e12
    return None


def window_fraction(seq_len: int, window: int) -> float:
    """Share of the causal triangle's (query, key) pairs that a window of W tokens keeps (1.0 without a window)."""
    T = seq_len
    if not window or window >= T:
        return 1.0
    W = window
    kept = W * (W + 1) // 2 + (T - W) * W  # query i sees min(i + 1, W) keys
    return kept / (T * (T + 1) // 2)


def flops_per_token(n_params: int, n_layer: int, d_model: int, seq_len: int, window: int = 0) -> float:
    """Training FLOPs (forward + backward) per token; n_params excludes position embeddings."""
    attention = 12 * n_layer * d_model * seq_len * window_fraction(seq_len, window)
    return 6 * n_params + attention


def mfu(tokens_per_s: float | None, flops_token: float, gpu_name: str | None, dtype: str, n_gpus: int = 1) -> float | None:
    peak = peak_flops(gpu_name, dtype)
    if peak is None or not tokens_per_s:
        return None
    return tokens_per_s * flops_token / (peak * n_gpus)


def mfu_at_bf16_peak(tokens_per_s: float | None, flops_token: float, gpu_name: str | None, n_gpus: int = 1) -> float | None:
    """MFU against one peak for every profile, the GPU's bf16 dense one: an fp32 run's per-dtype MFU divides by the
    (much lower) fp32 peak and so looks better than a bf16 run's that trains faster; this figure compares them."""
    return mfu(tokens_per_s, flops_token, gpu_name, "bf16", n_gpus)
