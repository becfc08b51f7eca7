"""The estimator against the issue-19 H100 runs (bench/results/frontier-h100/, committed with their commands).

Only the predictions are computed here (bench/frontier_check.py re-estimates each run from its own run.json), so
a change to memlab.core.estimate that drifts from these measurements fails on a CPU. Issue 19's bar: every new
technique's estimate within 10% of the measured peak.
"""

from __future__ import annotations

import pytest
from bench_helpers import ISSUE_19_PROFILES, bench_module

# The compiler's activation-memory budget below 0.75: the estimator interpolates the saved activations linearly
# between full recompute and compile's own choice, but the H100's peak is the backward's, where Inductor recomputes
# much of the forward at once (budget 0 peaked at 6.54 GiB, 98% of no budget at all). Not modelled yet.
KNOWN_MISSES = {"compile_budget@budget=0", "compile_budget@budget=0.25", "compile_budget@budget=0.5"}


@pytest.fixture(scope="module")
def checked():
    mod = bench_module("frontier_check")
    return mod.checked(mod.rows())


def test_every_new_technique_has_a_finished_h100_run_to_check(checked):
    assert {r["profile"].split("@")[0] for r in checked} >= ISSUE_19_PROFILES


def test_predicted_peaks_are_within_ten_percent_of_the_h100(checked):
    off = [(r["part"], r["profile"], round(r["error_pct"], 1)) for r in checked
           if abs(r["error_pct"]) > 10 and r["profile"] not in KNOWN_MISSES]
    assert len(checked) >= 40 and not off


@pytest.mark.xfail(strict=True, reason="compile_budget below 0.75: the backward's recompute peak is not modelled")
def test_the_compiler_budget_points_below_three_quarters_are_within_ten_percent(checked):
    off = [(r["profile"], round(r["error_pct"], 1)) for r in checked if r["profile"] in KNOWN_MISSES and abs(r["error_pct"]) > 10]
    assert not off
