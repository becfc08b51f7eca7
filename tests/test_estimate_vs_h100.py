"""The estimator against what an H100 measured (tests/data/gpu/estimate-h100/, committed with its commands).

The figures are real measurements kept in the repository; only the predictions are computed here, so a change to
memlab.core.predict.analytic that drifts from the hardware fails on a CPU. Issue 5's bar: every peak and every max batch
within 10%.
"""

from __future__ import annotations

import pytest
from bench_helpers import FINETUNE_PROFILES, HF_ONLY_PROFILES, ISSUE_19_PROFILES, bench_module

# The profiles issue 19 added: their peaks are checked against the H100 runs of tests/data/gpu/frontier-h100/
# (tests/test_frontier_vs_h100.py); this file's sets (micro-batch 16 runs and find-batch searches under 12 and
# 16 GiB) do not hold them yet. Each leaves this set when bench/estimate_vs_measured.py has measured it.
AWAITING_H100 = ISSUE_19_PROFILES | FINETUNE_PROFILES
NOT_GPT = HF_ONLY_PROFILES  # refused on the gpt shapes these tables hold


@pytest.fixture(scope="module")
def comparison():
    return bench_module("estimate_check").compare()


def test_every_profile_was_measured_at_micro_batch_16(comparison):
    from memlab.core.config import builtin_names

    measured = {r["profile"] for r in comparison["peaks"] if r["kind"] == "fixed"}
    assert measured == set(builtin_names("profile")) - AWAITING_H100 - NOT_GPT


def test_predicted_peaks_are_within_ten_percent_of_the_h100(comparison):
    off = [(r["profile"], r["batch"], round(r["error_pct"], 1)) for r in comparison["peaks"] if abs(r["error_pct"]) > 10]
    assert len(comparison["peaks"]) >= 60 and not off


def test_every_profile_was_searched_to_one_batch_unit(comparison):
    from memlab.core.config import builtin_names

    exact = {r["profile"] for r in comparison["max_batches"] if r["smallest_oom"] == r["largest_fit"] + 1}
    assert exact == set(builtin_names("profile")) - AWAITING_H100 - NOT_GPT


def test_predicted_max_batches_are_within_ten_percent_of_the_searches(comparison):
    off = [(r["profile"], r["predicted"], r["largest_fit"], round(r["error_pct"], 1)) for r in comparison["max_batches"] if abs(r["error_pct"]) > 10]
    assert len(comparison["max_batches"]) >= 25 and not off
