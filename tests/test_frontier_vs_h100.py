"""The estimator against the issue-19 H100 runs (bench/results/frontier-h100/, committed with their commands).

Only the predictions are computed here (bench/frontier_check.py re-estimates each run from its own run.json), so
a change to memlab.core.estimate that drifts from these measurements fails on a CPU. Issue 19's bar: every new
technique's estimate within 10% of the measured peak.
"""

from __future__ import annotations

import pytest
from bench_helpers import ISSUE_19_PROFILES, bench_module

# (part, profile) of runs the estimator misses by more than 10%, with the error when last checked. Parts g and g2 were
# measured before memlab.core.compile_budget_model was written and kept from its author (held out): budgets 0 and
# 0.25 within 1.4% on both shapes, 0.75 not: the traced partition keeps the bf16 logits there (+1.7 GiB on the
# seed shape), the H100's did not (its 0.75 peaked as its 0.5).
KNOWN_MISSES = {("g", "compile_budget@budget=0.75"): 46.8, ("g2", "compile_budget@budget=0.75"): 39.8}
BUDGET_SWEEP = ("compile_budget@budget=0", "compile_budget@budget=0.25", "compile_budget@budget=0.5",
                "compile_budget@budget=0.75", "compile_budget@budget=1")


@pytest.fixture(scope="module")
def checked():
    mod = bench_module("frontier_check")
    return mod.checked(mod.rows())


def test_every_new_technique_has_a_finished_h100_run_to_check(checked):
    assert {r["profile"].split("@")[0] for r in checked} >= ISSUE_19_PROFILES


def test_predicted_peaks_are_within_ten_percent_of_the_h100(checked):
    off = [(r["part"], r["profile"], round(r["error_pct"], 1)) for r in checked
           if abs(r["error_pct"]) > 10 and (r["part"], r["profile"]) not in KNOWN_MISSES]
    assert len(checked) >= 40 and not off


def test_every_point_of_the_compiler_budget_sweep_is_within_ten_percent(checked):
    """gpt2s at micro-batch 16 under budgets 0 .. 1 (part c; a2 ran the first three again). The measured shape is not
    monotone: budget 0 peaks about as high as no budget (the backward recomputes the whole forward before its first
    gradient), 0.25 lowest. The traced model follows it; a linear interpolation missed by up to -66%."""
    points = {r["profile"]: r for r in checked if r["part"] == "c" and r["profile"] in BUDGET_SWEEP}
    assert set(points) == set(BUDGET_SWEEP)
    off = [(r["part"], r["profile"], round(r["error_pct"], 1)) for r in checked
           if r["experiment"] == "gpt2s" and r["profile"] in BUDGET_SWEEP and abs(r["error_pct"]) > 10]
    assert not off
    predicted = {name: points[name]["predicted"] for name in BUDGET_SWEEP}
    assert min(predicted, key=predicted.get) == "compile_budget@budget=0.25"
    assert predicted["compile_budget@budget=0"] > 0.95 * predicted["compile_budget@budget=1"]


def test_the_held_out_budget_points_below_three_quarters_are_within_two_percent(checked):
    """The seed shape and bigvocab at budgets 0 and 0.25 (parts g, g2: measured before the model was written and
    kept from its author), and bigvocab at 0.5 (part f3, whose figure its author knew; the study's seed-shape run
    is checked by the study's own report)."""
    held = [r for r in checked if r["part"] in ("g", "g2", "f3") and r["profile"].startswith("compile_budget@")
            and (r["part"], r["profile"]) not in KNOWN_MISSES]
    assert len(held) == 5 and all(abs(r["error_pct"]) < 2 for r in held), [(r["part"], r["profile"], r["error_pct"]) for r in held]


@pytest.mark.xfail(strict=True, reason="compile_budget at 0.75 on the held-out shapes: the traced partition keeps the logits")
def test_the_known_misses_are_within_ten_percent(checked):
    misses = [r for r in checked if (r["part"], r["profile"]) in KNOWN_MISSES]
    assert len(misses) == len(KNOWN_MISSES) and all(abs(r["error_pct"]) <= 10 for r in misses)
