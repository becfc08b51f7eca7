"""Issue 17: the predicted max micro-batch never above the measured one, and within 10 % of it, on held-out data:
the study bench/results/study-so-posts-h100 (seed-so-posts, H100, --gpu-memory 24GiB, allocator budget
25,060,966,400 B; measured by find-batch, where a probe that needed allocator retries does not fit). Nothing here
was fitted on these numbers (memlab.core.reserved's one constant comes from the gpt2s searches,
bench/results/estimate-h100). Profiles where the prediction does not hold yet are strict xfails naming the
measured figures."""

import pytest

from memlab.core import reserved
from memlab.core.config import apply_overrides, load_experiment, load_profile

BUDGET = 25_060_966_400  # comparison.parquet allocator_budget_bytes
SETS = ['data.split="train"', "data.streaming=false", 'data.source="stdlib"', 'data.tokenizer="bpe:8192"']

# profile: measured max batch (comparison.parquet max_batch)
HOLDS = {"baseline": 102, "tf32": 102, "gradcp": 153, "gradcp_bf16": 135, "flash_gradcp": 135, "optim_offload": 114, "chunked_ce": 1961}

_AUTOCAST = "bf16 autocast: reserved / allocated 1.45 measured at batch 64, 1.16 replayed on fake tensors"
NOT_YET = {  # profile: (measured max batch, why the prediction misses)
    "bf16": (102, _AUTOCAST), "flash": (102, _AUTOCAST), "flex": (102, _AUTOCAST), "fp16": (102, _AUTOCAST),
    "fused_adamw": (102, _AUTOCAST), "window": (102, _AUTOCAST), "selective": (103, _AUTOCAST),
    "gradcp_every2": (104, _AUTOCAST), "adafactor": (114, _AUTOCAST), "accum": (102, _AUTOCAST),
    "adamw8bit": (102, "not replayed on the CPU (bitsandbytes): the fallback ratio 1.34 < 1.46 measured at batch 64"),
    "compile": (400, "not replayed (compiled): the fallback ratio 1.34 < 1.60 measured at batch 64"),
    "fastest": (400, "not replayed (compiled): the fallback ratio 1.34 < 1.60 measured at batch 64"),
    "act_offload": (136, "not replayed on the CPU (offload): the fallback ratio 1.34 predicts 119, 12.5 % under"),
    "leanest": (5140, "not replayed (compiled): the fallback ratio 1.34 predicts 4328 (15.8 % under; 1.14 measured)"),
}


def _predict(name: str) -> int:
    exp, prof = load_experiment("seed-so-posts"), load_profile(name)
    apply_overrides(exp, prof, SETS)
    prof.accumulation.steps = 1  # find-batch probes at accumulation 1 (memlab.core.batchfind.predicted_max_batch)
    return reserved.predict_max_batch(exp, prof, vocab_size=exp.model.vocab_size, budget=BUDGET)[0]


def _params() -> list:
    out = [pytest.param(n, m, id=n) for n, m in HOLDS.items()]
    out += [pytest.param(n, m, id=n, marks=pytest.mark.xfail(strict=True, reason=f"measured {m}: {why}")) for n, (m, why) in NOT_YET.items()]
    return out


@pytest.mark.parametrize(("name", "measured"), _params())
def test_predicted_max_batch_never_overshoots(name: str, measured: int) -> None:
    predicted = _predict(name)
    assert predicted <= measured, f"{name}: predicted {predicted} > measured {measured}"
    assert predicted >= 0.9 * measured, f"{name}: predicted {predicted} more than 10 % under measured {measured}"


def test_allocator_model_reuses_and_splits() -> None:
    from memlab.core import allocsim

    a = allocsim.CachingAllocator()
    a.alloc(1, 100 << 20)  # a 100 MiB segment
    a.free(1)
    a.alloc(2, 40 << 20)  # split from the cached segment
    a.alloc(3, 40 << 20)
    assert a.reserved == 100 << 20 and a.allocated == 80 << 20
    a.alloc(4, 30 << 20)  # 20 MiB left: a new segment
    assert a.reserved == 130 << 20 and a.peak_reserved == a.reserved
    a.free(2), a.free(3)
    a.alloc(5, 90 << 20)  # the freed halves merged with the tail: no new segment
    assert a.reserved == 130 << 20
    e = allocsim.replay([("alloc", 1, 100 << 20), ("free", 1, 0), ("alloc", 2, 150 << 20)], expandable=True)
    assert e.peak_reserved == 150 << 20  # the free tail grew to hold it
