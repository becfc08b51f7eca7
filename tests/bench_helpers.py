"""Helpers for the tests that check memlab against committed GPU measurements (tests/data/gpu/): loading a bench/
script as a module, and the profiles issue 19 added (measured in tests/data/gpu/frontier-h100/, not in the older sets)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"
ISSUE_19_PROFILES = frozenset({
    "compile_budget", "sac_ops", "liger_ce", "cce", "adamw4bit", "bf16_sr", "muon", "paged_adamw8bit", "galore",
    "optim_in_bwd", "float8", "act_offload_overlap",
})
# The fine-tuning profiles: measured on the transformers family's shapes (bench/results/hf-h100), not in the gpt
# estimator's tables at micro-batch 16.
# gradcp_adamw8bit (memlab fit's full-training row on a small card) is gradcp_bf16 and adamw8bit together, each in the
# tables; it is measured where fit uses it (bench/results/fit-h100).
FINETUNE_PROFILES = frozenset({"lora", "lora_gradcp", "lora_fast", "qlora", "qlora_gradcp", "dora", "freeze",
                               "gradcp_adamw8bit"})
# The profiles of the transformers family alone (refused on memlab's GPT, so never in the gpt shapes' tables).
HF_ONLY_PROFILES = frozenset({"liger"})


def bench_module(stem: str) -> ModuleType:
    """bench/<stem>.py as a module; the test is skipped where bench/ is not beside tests/ (an installed copy)."""
    path = BENCH / f"{stem}.py"
    if not path.is_file():
        pytest.skip("bench/ is not beside tests/ (an installed copy)")
    if stem in sys.modules:
        return sys.modules[stem]
    spec = importlib.util.spec_from_file_location(stem, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[stem] = mod  # dataclasses look their module up there; a bench script importing it gets this one
    spec.loader.exec_module(mod)
    return mod
