"""kernels.fused's matmuls through cuBLASLt (CUDA), called through ctypes: the library torch already loaded.

- matmul:        op(a) @ op(b) (+ bias in the epilogue), a plain matmul with its algorithm chosen by timing
- mm_bias_gelu:  pre = x @ W1^T + b1 and act = gelu_tanh(pre) in one matmul (CUBLASLT_EPILOGUE_GELU_AUX_BIAS: act is
                 the output, pre the auxiliary output kept for backward): no kernel reads pre back to make act
- mm_dgelu:      d = (g @ W2) * gelu_tanh'(pre) in one matmul (CUBLASLT_EPILOGUE_DGELU): the gradient with respect
                 to act is never written nor read back

Every matmul's algorithm is chosen once per shape by timing: cuBLASLt's heuristic offers up to 8 candidates for a
workspace of 8 MiB and for one of 32 MiB, and its first choice was up to a third slower than the best of them on
gpt2s's matmuls at 200 x 1024 rows on an H100. Each candidate (and, for a plain matmul, torch's
own call) runs on the real operands at the plan's first use, the fastest is kept and remembered on this machine
(memlab.core.fused.algo_choices: a later process takes it untimed); a first use inside a CUDA graph's capture takes
the heuristic's first choice untimed. The GELU epilogues are the fusion NVIDIA's Transformer Engine
uses for its MLP.

cuBLASLt is column-major: a row-major (rows, cols) tensor is its (cols, rows) matrix, so D^T = B^T A^T is asked
for and the row-major result comes out as it is.

The epilogue computes the GELU (tanh form, as the model's) and its derivative from the fp32 accumulator, where the
stock graph rounds pre and the gradient of act to the compute dtype first: the same function, rounded once less.
A shape cuBLASLt has no epilogue kernel for runs the PyTorch reference (memlab.core.fused.reference) instead.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path
from typing import Callable

import torch

from memlab.core.fused import algo_choices, reference

_OP_N, _OP_T = 0, 1
_COMPUTE_32F = 68  # cublasComputeType_t
_DTYPE = {torch.float32: 0, torch.float16: 2, torch.bfloat16: 14}  # cudaDataType_t
_EPILOGUE_DEFAULT, _EPILOGUE_BIAS, _EPILOGUE_GELU_AUX_BIAS, _EPILOGUE_DGELU = 1, 4, 164, 192
# cublasLtMatmulDescAttributes_t
_TRANSA, _TRANSB, _EPILOGUE, _BIAS_POINTER, _AUX_POINTER, _AUX_LD, _AUX_DATA_TYPE = 3, 4, 7, 8, 11, 12, 22
_PREF_MAX_WORKSPACE_BYTES = 1
_PREFERRED_WORKSPACES = (8 << 20, 32 << 20)  # the heuristic is asked under each: its candidates differ
_WORKSPACE_BYTES = max(_PREFERRED_WORKSPACES)  # one buffer a device, made at the first matmul; the estimator's
# fitted workspace figure covers it (the peaks measured on an H100 did not grow with it)
_CANDIDATES = 8  # per preference: as many as cuBLASLt 13's heuristic returns for these shapes


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


def _heuristic(desc, layouts: tuple, workspace: int) -> list[_HeuristicResult]:
    """cuBLASLt's candidate algorithms for a matmul, best guess first, needing at most `workspace` bytes."""
    lib, (a, b, d) = _lib(), layouts
    pref = ctypes.c_void_p()
    _check(lib.cublasLtMatmulPreferenceCreate(ctypes.addressof(pref)), "preference")
    ws = ctypes.c_uint64(workspace)
    _check(lib.cublasLtMatmulPreferenceSetAttribute(pref, _PREF_MAX_WORKSPACE_BYTES, ctypes.addressof(ws), ctypes.sizeof(ws)), "preference")
    results, found = (_HeuristicResult * _CANDIDATES)(), ctypes.c_int(0)
    status = lib.cublasLtMatmulAlgoGetHeuristic(_handle(), desc, a, b, d, d, pref, _CANDIDATES, ctypes.addressof(results), ctypes.addressof(found))
    lib.cublasLtMatmulPreferenceDestroy(pref)
    return list(results[: found.value]) if status == 0 else []


class _Plan:
    """One matmul shape with one epilogue: its descriptors and candidate algorithms, made once, and the one chosen.
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
        unique: dict[bytes, _HeuristicResult] = {}
        for workspace in _PREFERRED_WORKSPACES:
            for result in _heuristic(self.desc, (self.a, self.b, self.d), workspace):
                unique.setdefault(bytes(result.algo), result)
        self.candidates = list(unique.values())
        self.ok = bool(self.candidates)
        self.choice: int | None = None  # the chosen call's index (timed or remembered); len(candidates): torch's

    def pointers(self, bias: int, aux: int) -> None:
        if bias:
            _set(self.desc, _BIAS_POINTER, ctypes.c_void_p(bias))
        if aux:
            _set(self.desc, _AUX_POINTER, ctypes.c_void_p(aux))

    def run(self, a: torch.Tensor, b: torch.Tensor, d: torch.Tensor, bias: torch.Tensor | None = None,
            aux: torch.Tensor | None = None, algo: int = 0) -> None:
        self.pointers(0 if bias is None else bias.data_ptr(), 0 if aux is None else aux.data_ptr())
        one, zero = ctypes.c_float(1.0), ctypes.c_float(0.0)
        ws = _workspace(d.device)
        _check(_lib().cublasLtMatmul(
            _handle(), self.desc, ctypes.addressof(one), a.data_ptr(), self.a, b.data_ptr(), self.b, ctypes.addressof(zero),
            d.data_ptr(), self.d, d.data_ptr(), self.d, ctypes.addressof(self.candidates[algo].algo), ws.data_ptr(), ws.numel(),
            torch.cuda.current_stream(d.device).cuda_stream), "matmul")

    def call(self, key: str, calls: list[Callable[[], None]], names: list[str]) -> None:
        """Run the chosen one of `calls` (the candidates in order, then any alternative, each named in `names`):
        chosen first from the choices remembered on this machine, else by timing each on these operands; inside a
        CUDA graph's capture, unchosen, the heuristic's first."""
        if self.choice is None:
            if torch.cuda.is_current_stream_capturing():
                return calls[0]()
            self.choice = _choose(key, calls, names)
        calls[self.choice]()


def _choose(key: str, calls: list[Callable[[], None]], names: list[str]) -> int:
    """The remembered choice for `key` where it is still a candidate, else the fastest by timing, remembered."""
    path = _choices_path()
    known = algo_choices.load(path).get(key)
    if known in names:
        return names.index(known)
    index = _fastest(calls)
    algo_choices.remember(path, key, names[index])
    return index


@functools.lru_cache(maxsize=None)
def _choices_path_for(device: int) -> Path:
    lib = _lib()
    lib.cublasLtGetVersion.restype, lib.cublasLtGetVersion.argtypes = ctypes.c_size_t, []
    return algo_choices.choices_path(torch.cuda.get_device_name(device), lib.cublasLtGetVersion())


def _choices_path() -> Path:
    return _choices_path_for(torch.cuda.current_device())


def _fastest(calls: list[Callable[[], None]], rounds: int = 3, burst_ms: float = 10.0) -> int:
    """The index of the fastest call. Each is timed in bursts of back-to-back calls lasting about burst_ms (long
    enough for the clock to settle where a training step would hold it, not only the first call's), `rounds`
    times, interleaved so that a clock still moving favours no one; its best burst counts. The calls must be
    repeatable: each writes the same output."""
    best = [float("inf")] * len(calls)
    reps = [1] * len(calls)
    for r in range(rounds):
        for i, call in enumerate(calls):
            call()  # warm: its kernel loaded and its operands' cache state as in the timed calls
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(reps[i]):
                call()
            end.record()
            end.synchronize()
            per_call = start.elapsed_time(end) / reps[i]
            if r == 0:  # the first round sizes the bursts; a burst of one call is no measure, so it is not kept
                reps[i] = max(3, min(64, round(burst_ms / max(per_call, 1e-3))))
            else:
                best[i] = min(best[i], per_call)
    return best.index(min(best))


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
    """cuBLASLt's kernels want contiguous rows a multiple of 16 bytes long, starting 16-byte aligned."""
    return all(t.is_cuda and t.dtype in _DTYPE and t.is_contiguous() and (t.shape[-1] * t.element_size()) % 16 == 0
               and t.data_ptr() % 16 == 0 for t in tensors)


def _operand(t: torch.Tensor, transpose: bool, cols: int | None = None) -> tuple[int, tuple]:
    """cuBLASLt's op and column-major (rows, cols, ld) for the row-major matrix t as stored (its leading `cols`
    columns where given), transposed if asked: a row-major (r, c) tensor is the column-major (c, r) one, so it is
    op(t)^T that the stored layout gives as is."""
    r, c = t.shape
    return (_OP_T if transpose else _OP_N), (cols or c, r, c)


def _run(epilogue: int, a: torch.Tensor, b: torch.Tensor, ta: bool, tb: bool, d: torch.Tensor, bias=None, aux=None,
         alternative: Callable[[], None] | None = None) -> bool:
    """d (M, N) = op(a) (M, K) @ op(b) (K, N), row-major, with `epilogue`, through the plan for this shape; False
    where cuBLASLt has no algorithm for it. Column-major, that is d^T = op(b)^T op(a)^T: cuBLASLt's A is b. An
    untransposed a wider than K gives its leading K columns; d may be the leading columns of a wider output."""
    M, N = d.shape
    K = b.shape[1] if tb else b.shape[0]
    (op_a, la), (op_b, lb) = _operand(b, tb), _operand(a, ta, None if ta or a.shape[1] == K else K)
    shape = (epilogue, op_a, la, op_b, lb, d.dtype, bias is not None, aux is not None)
    if d.stride(0) != N:  # keys as before for the outputs that had them (choices remembered)
        shape += (d.stride(0),)
    plan = _plan((shape, d.device), lambda: _Plan(epilogue, (op_a, op_b), la, lb, (N, M, d.stride(0)), d.dtype,
                                    0 if bias is None else bias.data_ptr(), 0 if aux is None else aux.data_ptr()))
    if not plan.ok:
        return False
    calls = [functools.partial(plan.run, b, a, d, bias, aux, i) for i in range(len(plan.candidates))]
    names = [bytes(c.algo).hex() for c in plan.candidates]
    if alternative is not None:
        calls, names = calls + [alternative], names + ["torch"]
    plan.call(repr(shape).replace(" ", ""), calls, names)  # remembered per GPU model, not per device
    return True


def matmul(a: torch.Tensor, b: torch.Tensor, transpose_a: bool, transpose_b: bool, bias: torch.Tensor | None = None,
           pad_out: int = 0) -> torch.Tensor:
    """op(a) @ op(b) (+ bias, added in the epilogue), in a's dtype, then pad_out zero columns; op transposes where
    asked. An untransposed a may be wider than op(b)'s rows: its leading columns are used."""
    y = b.t() if transpose_b else b
    x = a.t() if transpose_a else a[:, : y.shape[0]]
    tensors = (a, b) if bias is None else (a, b, bias)
    if usable(*tensors) and all(t.dtype == a.dtype for t in tensors):  # the epilogue reads the bias in a's dtype
        out = torch.empty((x.shape[0], y.shape[1] + pad_out), dtype=a.dtype, device=a.device)
        d = out[:, : y.shape[1]]  # the product's columns; cuBLASLt writes them at out's row length
        if pad_out:
            out[:, y.shape[1]:].zero_()

        def torch_own() -> None:  # torch's call is a candidate too: no shape runs slower than it did before
            torch.mm(x, y, out=d) if bias is None else torch.addmm(bias, x, y, out=d)

        alternative = None if pad_out else torch_own  # torch's out= wants a contiguous output
        if usable(out) and _run(_EPILOGUE_DEFAULT if bias is None else _EPILOGUE_BIAS, a, b, transpose_a, transpose_b, d,
                                bias=bias, alternative=alternative):
            return out
    return reference.matmul(a, b, transpose_a, transpose_b, bias, pad_out)


def mm_bias_gelu(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(pre, act): x (M, K) @ weight (N, K)^T + bias, and its GELU (tanh), both in x's dtype. x may be wider than K
    (a ones column): its leading K columns are used."""
    if usable(x, weight, bias):
        pre = torch.empty((x.shape[0], weight.shape[0]), dtype=x.dtype, device=x.device)
        act = torch.empty_like(pre)  # the output; pre is the auxiliary output kept for backward
        if _run(_EPILOGUE_GELU_AUX_BIAS, x, weight, False, True, act, bias=bias, aux=pre):
            return pre, act
    return reference.mm_bias_gelu(x, weight, bias)


def mm_dgelu(g: torch.Tensor, weight: torch.Tensor, pre: torch.Tensor) -> torch.Tensor:
    """d = (g (M, K) @ weight (K, N)) * gelu_tanh'(pre), in pre's dtype."""
    if usable(g, weight, pre):
        d = torch.empty_like(pre)
        # cuBLASLt's DGELU_BGRAD would add the bias gradient (d's column sums) but ran 2-3x slower, and BGRADB in
        # the weight gradient's matmul lost more than the sum costs (measured on an H100): the caller sums d
        if _run(_EPILOGUE_DGELU, g, weight, False, False, d, aux=pre):
            return d
    return reference.mm_dgelu(g, weight, pre)
