"""The MLP's GELU inside cuBLASLt's matmul epilogues (CUDA), called through ctypes: the library torch already loaded.

- mm_bias_gelu:  pre = x @ W1^T + b1 and act = gelu_tanh(pre) in one matmul (CUBLASLT_EPILOGUE_GELU_AUX_BIAS: act is
                 the output, pre the auxiliary output kept for backward): no kernel reads pre back to make act
- mm_dgelu:      d = (g @ W2) * gelu_tanh'(pre) in one matmul (CUBLASLT_EPILOGUE_DGELU): the gradient with respect
                 to act is never written nor read back

This is the fusion NVIDIA's Transformer Engine uses for its MLP. cuBLASLt is column-major: a row-major (rows, cols)
tensor is its (cols, rows) matrix, so D^T = A^T B^T is asked for and the row-major results come out as they are.
The epilogue computes the GELU (tanh form, as the model's) and its derivative from the fp32 accumulator, where the
stock graph rounds pre and the gradient of act to the compute dtype first: the same function, rounded once less.
A shape cuBLASLt has no epilogue kernel for runs the PyTorch reference (memlab.core.fused.reference) instead.
"""

from __future__ import annotations

import ctypes
import functools

import torch

from memlab.core.fused import reference

_OP_N, _OP_T = 0, 1
_COMPUTE_32F = 68  # cublasComputeType_t
_DTYPE = {torch.float32: 0, torch.float16: 2, torch.bfloat16: 14}  # cudaDataType_t
_EPILOGUE_GELU_AUX_BIAS, _EPILOGUE_DGELU = 164, 192
# cublasLtMatmulDescAttributes_t
_TRANSA, _TRANSB, _EPILOGUE, _BIAS_POINTER, _AUX_POINTER, _AUX_LD, _AUX_DATA_TYPE = 3, 4, 7, 8, 11, 12, 22
_PREF_MAX_WORKSPACE_BYTES = 1
_WORKSPACE_BYTES = 8 << 20


class _HeuristicResult(ctypes.Structure):
    _fields_ = [("algo", ctypes.c_uint64 * 8), ("workspace_size", ctypes.c_size_t), ("state", ctypes.c_int),
                ("waves", ctypes.c_float), ("reserved", ctypes.c_int * 4)]


_P, _I32, _I64, _U64, _SIZE = ctypes.c_void_p, ctypes.c_int32, ctypes.c_int64, ctypes.c_uint64, ctypes.c_size_t
_SIGNATURES = {  # every argument typed: ctypes would pass a Python int as a 32-bit int
    "cublasLtCreate": [_P],
    "cublasLtMatmulDescCreate": [_P, _I32, _I32],
    "cublasLtMatmulDescSetAttribute": [_P, _I32, _P, _SIZE],
    "cublasLtMatrixLayoutCreate": [_P, _I32, _U64, _U64, _I64],
    "cublasLtMatmulPreferenceCreate": [_P],
    "cublasLtMatmulPreferenceSetAttribute": [_P, _I32, _P, _SIZE],
    "cublasLtMatmulPreferenceDestroy": [_P],
    "cublasLtMatmulAlgoGetHeuristic": [_P, _P, _P, _P, _P, _P, _P, _I32, _P, _P],
    "cublasLtMatmul": [_P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _SIZE, _P],
}


@functools.lru_cache(maxsize=1)
def _lib() -> ctypes.CDLL:
    torch.cuda.current_blas_handle()  # torch loads cuBLAS(Lt) on first use: open that copy, not another
    for name in ("libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so"):
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        for fn, args in _SIGNATURES.items():
            getattr(lib, fn).argtypes, getattr(lib, fn).restype = args, ctypes.c_int
        return lib
    raise OSError("libcublasLt is not loadable: kernels.fused needs the cuBLAS that torch ships with")


def _check(status: int, what: str) -> None:
    if status != 0:
        raise RuntimeError(f"cuBLASLt {what} failed with status {status}")


def _set(desc, attr: int, value) -> None:
    _check(_lib().cublasLtMatmulDescSetAttribute(desc, attr, ctypes.addressof(value), ctypes.sizeof(value)), "set attribute")


def _layout(dtype: torch.dtype, rows: int, cols: int, ld: int) -> ctypes.c_void_p:
    out = ctypes.c_void_p()
    _check(_lib().cublasLtMatrixLayoutCreate(ctypes.addressof(out), _DTYPE[dtype], rows, cols, ld), "layout")
    return out


class _Plan:
    """One matmul shape with one epilogue: descriptors and the algorithm cuBLASLt's heuristic picked, made once.
    a, b, d: (rows, cols, leading dimension) of the column-major operands as stored; bias and aux are the epilogue's
    vector and matrix (0: the epilogue has none), given here because the heuristic reads their alignment."""

    def __init__(self, epilogue: int, trans: tuple[int, int], a: tuple, b: tuple, d: tuple, dtype: torch.dtype, bias: int, aux: int):
        lib = _lib()
        self.desc = ctypes.c_void_p()
        _check(lib.cublasLtMatmulDescCreate(ctypes.addressof(self.desc), _COMPUTE_32F, _DTYPE[torch.float32]), "descriptor")
        _set(self.desc, _TRANSA, ctypes.c_int32(trans[0]))
        _set(self.desc, _TRANSB, ctypes.c_int32(trans[1]))
        _set(self.desc, _EPILOGUE, ctypes.c_uint32(epilogue))
        if aux:
            _set(self.desc, _AUX_LD, ctypes.c_int64(d[0]))
            _set(self.desc, _AUX_DATA_TYPE, ctypes.c_int32(_DTYPE[dtype]))
        self.pointers(bias, aux)
        self.a, self.b, self.d = (_layout(dtype, *shape) for shape in (a, b, d))
        pref = ctypes.c_void_p()
        _check(lib.cublasLtMatmulPreferenceCreate(ctypes.addressof(pref)), "preference")
        ws = ctypes.c_uint64(_WORKSPACE_BYTES)
        _check(lib.cublasLtMatmulPreferenceSetAttribute(pref, _PREF_MAX_WORKSPACE_BYTES, ctypes.addressof(ws), ctypes.sizeof(ws)), "preference")
        self.result, found = _HeuristicResult(), ctypes.c_int(0)
        status = lib.cublasLtMatmulAlgoGetHeuristic(_handle(), self.desc, self.a, self.b, self.d, self.d, pref, 1,
                                                    ctypes.addressof(self.result), ctypes.addressof(found))
        lib.cublasLtMatmulPreferenceDestroy(pref)
        self.ok = status == 0 and found.value > 0

    def pointers(self, bias: int, aux: int) -> None:
        if bias:
            _set(self.desc, _BIAS_POINTER, ctypes.c_void_p(bias))
        if aux:
            _set(self.desc, _AUX_POINTER, ctypes.c_void_p(aux))

    def run(self, a: torch.Tensor, b: torch.Tensor, d: torch.Tensor, bias: torch.Tensor | None = None, aux: torch.Tensor | None = None) -> None:
        self.pointers(0 if bias is None else bias.data_ptr(), 0 if aux is None else aux.data_ptr())
        one, zero = ctypes.c_float(1.0), ctypes.c_float(0.0)
        ws = _workspace(d.device)
        _check(_lib().cublasLtMatmul(
            _handle(), self.desc, ctypes.addressof(one), a.data_ptr(), self.a, b.data_ptr(), self.b, ctypes.addressof(zero),
            d.data_ptr(), self.d, d.data_ptr(), self.d, ctypes.addressof(self.result.algo), ws.data_ptr(), ws.numel(),
            torch.cuda.current_stream(d.device).cuda_stream), "matmul")


@functools.lru_cache(maxsize=None)
def _handle_for(device: int) -> ctypes.c_void_p:
    out = ctypes.c_void_p()
    _check(_lib().cublasLtCreate(ctypes.addressof(out)), "create")
    return out


def _handle() -> ctypes.c_void_p:
    return _handle_for(torch.cuda.current_device())


@functools.lru_cache(maxsize=None)
def _workspace(device: torch.device) -> torch.Tensor:
    return torch.empty(_WORKSPACE_BYTES, dtype=torch.uint8, device=device)


_plans: dict[tuple, _Plan] = {}


def _plan(key: tuple, make) -> _Plan:
    if key not in _plans:
        _plans[key] = make()
    return _plans[key]


def usable(*tensors: torch.Tensor) -> bool:
    """cuBLASLt's epilogue kernels want contiguous rows a multiple of 16 bytes long, starting 16-byte aligned."""
    return all(t.is_cuda and t.dtype in _DTYPE and t.is_contiguous() and (t.shape[-1] * t.element_size()) % 16 == 0
               and t.data_ptr() % 16 == 0 for t in tensors)


def mm_bias_gelu(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(pre, act): x (M, K) @ weight (N, K)^T + bias, and its GELU (tanh), both in x's dtype."""
    (M, K), N = x.shape, weight.shape[0]
    if usable(x, weight, bias):
        pre = torch.empty((M, N), dtype=x.dtype, device=x.device)
        act = torch.empty_like(pre)
        # column-major: act^T (N, M) = W1 (stored (K, N), transposed) @ x^T (K, M), pre^T the auxiliary output
        plan = _plan(("gelu", M, N, K, x.dtype, x.device), lambda: _Plan(
            _EPILOGUE_GELU_AUX_BIAS, (_OP_T, _OP_N), (K, N, K), (K, M, K), (N, M, N), x.dtype, bias.data_ptr(), pre.data_ptr()))
        if plan.ok:
            plan.run(weight, x, act, bias=bias, aux=pre)
            return pre, act
    return reference.mm_bias_gelu(x, weight, bias)


def mm_dgelu(g: torch.Tensor, weight: torch.Tensor, pre: torch.Tensor) -> torch.Tensor:
    """d = (g (M, K) @ weight (K, N)) * gelu_tanh'(pre), in pre's dtype."""
    (M, K), N = g.shape, weight.shape[1]
    if usable(g, weight, pre):
        d = torch.empty_like(pre)
        # column-major: d^T (N, M) = W2 (stored (N, K)) @ g^T (K, M), gelu' from pre^T. cuBLASLt's DGELU_BGRAD would
        # add the bias gradient (d's column sums) but ran 2x slower, and BGRADB in the weight gradient's matmul lost
        # more at 200 x 1024 rows than the sum costs (results/fused-mlp-h100/): the caller sums d
        plan = _plan(("dgelu", M, N, K, g.dtype, g.device), lambda: _Plan(
            _EPILOGUE_DGELU, (_OP_N, _OP_N), (N, K, N), (K, M, K), (N, M, N), g.dtype, 0, pre.data_ptr()))
        if plan.ok:
            plan.run(weight, g, d, aux=pre)
            return d
    return reference.mm_dgelu(g, weight, pre)
