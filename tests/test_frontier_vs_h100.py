"""The estimator against the issue-19 H100 runs (tests/data/gpu/frontier-h100/, committed with their commands).

Only the predictions are computed here (bench/frontier_check.py re-estimates each run from its own run.json), so
a change to memlab.core.predict.analytic that drifts from these measurements fails on a CPU. Issue 19's bar: every new
technique's estimate within 10% of the measured peak.
"""

from __future__ import annotations

import pytest
from bench_helpers import ISSUE_19_PROFILES, bench_module

BUDGET_SWEEP = ("compile_budget@budget=0", "compile_budget@budget=0.25", "compile_budget@budget=0.5",
                "compile_budget@budget=0.75", "compile_budget@budget=1")


@pytest.fixture(scope="module")
def checked():
    mod = bench_module("frontier_check")
    return mod.checked(mod.rows())


def test_every_new_technique_has_a_finished_h100_run_to_check(checked):
    assert {r["profile"].split("@")[0] for r in checked} >= ISSUE_19_PROFILES


def test_predicted_peaks_are_within_ten_percent_of_the_h100(checked):
    off = [(r["part"], r["profile"], round(r["error_pct"], 1)) for r in checked if abs(r["error_pct"]) > 10]
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


def test_the_held_out_budget_points_are_within_two_percent(checked):
    """The seed shape and bigvocab at budgets 0, 0.25 and 0.75 (parts g, g2: measured before the model was written and
    kept from its author), and bigvocab at 0.5 (part f3, whose figure its author knew; the study's seed-shape run
    is checked by the study's own report). The 0.75 points were +46.8% and +39.8% until the trace gave the backward
    AOTAutograd's donated buffers (compile_budget_model._donated: the logits' gradient takes the saved logits' buffer),
    a mechanism found by setting the real CUDA partition beside the traced one (bench/budget_partition_check.py), not
    fitted; but it was looked for because these two points missed, so they are no longer strictly held out."""
    held = [r for r in checked if r["part"] in ("g", "g2", "f3") and r["profile"].startswith("compile_budget@")]
    assert len(held) == 7 and all(abs(r["error_pct"]) < 2 for r in held), [(r["part"], r["profile"], r["error_pct"]) for r in held]
