"""The estimator against what an H100 measured (bench/results/estimate-h100/, committed with its commands).

The figures are real measurements kept in the repository; only the predictions are computed here, so a change to
memlab.core.estimate that drifts from the hardware fails on a CPU. Issue 5's bar: every peak and every max batch
within 10%.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench" / "estimate_check.py"
# Built-in profiles added since these measurements (issue 19): their peaks are checked against the H100 runs of
# bench/results/frontier-h100/ (tests/test_frontier_vs_h100.py); this file's sets (micro-batch 16 runs and
# find-batch searches under 12 and 16 GiB) do not hold them yet. Each leaves this set when
# bench/estimate_vs_measured.py has measured it.
AWAITING_H100 = {
    "optim_in_bwd", "float8", "compile_budget", "sac_ops", "adamw4bit", "bf16_sr", "muon", "paged_adamw8bit", "galore",
    "liger_ce", "cce", "act_offload_overlap",
}


@pytest.fixture(scope="module")
def comparison():
    if not BENCH.is_file():
        pytest.skip("bench/ is not beside tests/ (an installed copy)")
    spec = importlib.util.spec_from_file_location("estimate_check", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.compare()


def test_every_profile_was_measured_at_micro_batch_16(comparison):
    from memlab.core.config import builtin_names

    measured = {r["profile"] for r in comparison["peaks"] if r["kind"] == "fixed"}
    assert measured == set(builtin_names("profile")) - AWAITING_H100


def test_predicted_peaks_are_within_ten_percent_of_the_h100(comparison):
    off = [(r["profile"], r["batch"], round(r["error_pct"], 1)) for r in comparison["peaks"] if abs(r["error_pct"]) > 10]
    assert len(comparison["peaks"]) >= 60 and not off


def test_every_profile_was_searched_to_one_batch_unit(comparison):
    from memlab.core.config import builtin_names

    exact = {r["profile"] for r in comparison["max_batches"] if r["smallest_oom"] == r["largest_fit"] + 1}
    assert exact == set(builtin_names("profile")) - AWAITING_H100


def test_predicted_max_batches_are_within_ten_percent_of_the_searches(comparison):
    off = [(r["profile"], r["predicted"], r["largest_fit"], round(r["error_pct"], 1)) for r in comparison["max_batches"] if abs(r["error_pct"]) > 10]
    assert len(comparison["max_batches"]) >= 25 and not off
