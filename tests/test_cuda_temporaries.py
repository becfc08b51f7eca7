"""memlab.core.predict.cuda_temporaries: the blocks CUDA kernels allocate and free within one call, against the H100's
allocator history of each op alone (bench/backward_transients.py, committed under
tests/data/gpu/replay-check-h100/transients/), and what they change in the allocator replay."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from memlab.core.attention import backward_kernel
from memlab.core.predict.cuda_temporaries import (
    Sms,
    reduce_staging_bytes,
    sdpa_backward_workspace_bytes,
    sum_staging_bytes,
)

PROBE = Path(__file__).resolve().parent / "data/gpu/replay-check-h100/transients/backward_transients.jsonl"


def _probe() -> list[dict]:
    if not PROBE.is_file():
        pytest.skip("tests/data/gpu is not beside this test (an installed copy)")
    return [json.loads(line) for line in PROBE.read_text().splitlines()]


def test_a_bias_gradients_staging_buffer_is_the_h100s_for_every_linear_it_ran():
    """13 Linear backwards (tokens 4,096 to 32,768; 512 to 4,096 outputs): the staging block the sum's reduce kernel
    allocated, to the byte (its other block, the semaphores, is 4 bytes a column of blocks)."""
    cases: dict[tuple, int] = {}
    for row in _probe():
        m = re.fullmatch(r"linear K(\d+) (\d+)->(\d+)", row["case"])
        if m and "at::native::gpu_reduce_kernel" in row["frames"]:
            key = tuple(map(int, m.groups()))
            cases[key] = max(cases.get(key, 0), row["bytes"])
    assert len(cases) == 13
    for (tokens, _, outputs), measured in cases.items():
        assert sum_staging_bytes((tokens, outputs), [0]) == measured, (tokens, outputs)
        assert sum_staging_bytes((2, tokens // 2, outputs), [0, 1]) == measured  # (B, T, C) folds to (B*T, C)


def test_a_bias_without_gradient_work_to_split_stages_nothing():
    assert reduce_staging_bytes(16, 2048, over_rows=True) == 0  # 16 tokens: each thread sums few values
    assert sum_staging_bytes((16384, 2048), [1]) == 0  # one output a row, 2,048 values each: no split across blocks
    assert sum_staging_bytes((8, 16, 32), [1]) == 0  # neither a leading nor a trailing run: not modelled


def test_the_staging_buffer_follows_the_gpus_sm_count():
    """Fewer SMs, fewer blocks per output where the grid decides (ctas = target grid / grid)."""
    h100 = sum_staging_bytes((16384, 2048), [0])
    assert sum_staging_bytes((16384, 2048), [0], sms=Sms(count=66)) == h100 // 2


@pytest.mark.parametrize("backend,marker", [("CUDNN_ATTENTION", "run_cudnn_SDP_bprop"), ("FLASH_ATTENTION", "flash")])
def test_the_attention_backward_workspace_is_the_h100s(backend, marker):
    """The fp32 transient of cuDNN's backward and flash's dq accumulator, for each shape probed."""
    name = "cudnn" if backend.startswith("CUDNN") else "flash"
    largest: dict[str, int] = {}  # flash also makes its (B, H, T) fp32 softmax sums: the accumulator is the larger
    for row in _probe():
        made_by_kernel = any(marker in f for f in row["frames"])
        not_a_gradient = not {"at::native::contiguous", "at::native::empty_like"} & set(row["frames"])
        if row["freed"] and made_by_kernel and not_a_gradient:
            largest[row["case"]] = max(largest.get(row["case"], 0), row["bytes"])
    checked = 0
    for case, measured in largest.items():
        m = re.fullmatch(r"(?:sdpa|model layout) (\d+)x(\d+)x(\d+)x(\d+) p[\d.]+ " + backend, case)
        if m:
            assert sdpa_backward_workspace_bytes(name, *map(int, m.groups())) == measured, case
            checked += 1
    assert checked >= 5  # head dims 64 and 32, with and without dropout, bare and in the model's layout


@pytest.mark.parametrize("attention,dtype,expect", [
    ({"kernel": "sdpa", "sdpa_backend": "auto"}, "bf16", "cudnn"),
    ({"kernel": "sdpa", "sdpa_backend": "auto"}, "fp32", ""),
    ({"kernel": "sdpa", "sdpa_backend": "flash"}, "bf16", "flash"),
    ({"kernel": "sdpa", "sdpa_backend": "math"}, "bf16", ""),
    ({"kernel": "flash", "sdpa_backend": "auto"}, "bf16", "flash"),
    ({"kernel": "eager", "sdpa_backend": "auto"}, "bf16", ""),
])
def test_the_backend_whose_workspace_counts_is_what_an_h100_runs(attention, dtype, expect):
    from memlab.core.config import Profile

    p = Profile()
    p.attention.kernel, p.attention.sdpa_backend = attention["kernel"], attention["sdpa_backend"]
    p.precision.dtype = dtype
    assert backward_kernel(p) == expect
