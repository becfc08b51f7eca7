"""`memlab fit --measure`: each row's max micro-batch and longest sequence found on this GPU, under --gpu-memory's
cap, by probes as find-batch runs them (memlab.core.batchfind.ChildProbe: a fresh `memlab run` child per probe),
searched from the predicted figure outwards (search.largest_near), so a right prediction costs two probes an axis."""

from __future__ import annotations

from typing import Any, Callable

from memlab.core.batchfind import ChildProbe
from memlab.core.config import Experiment
from memlab.core.predict.fit import Fit
from memlab.core.predict.axis import SEQ_GRANULE, seq_units
from memlab.core.predict.search import LIMIT, largest_near

PROBE_STEPS = 2  # the first step makes the optimizer state; the second is the steady step whose peak counts


def measured_row(experiment_ref: str, profile: str, overrides: list[str], exp: Experiment, row: Fit,
                 cap: int | None, say: Callable[[str], None]) -> dict[str, Any]:
    if row.error:
        return {"measured_max_batch": None, "batch_error": None, "measured_longest_seq": None, "seq_error": None}
    T = exp.model.seq_len

    def batch_fits(b: int) -> bool:
        return _probe(profile, experiment_ref, overrides, T, b, cap, say)

    batch = largest_near(batch_fits, max(1, row.max_batch), LIMIT)
    seq = measured_longest_seq(profile, experiment_ref, overrides, exp, 1, row.longest_seq, cap, say)
    say(f"{profile}: max micro-batch predicted {row.max_batch}, measured {batch}; longest sequence predicted "
        f"{row.longest_seq}, measured {seq}")
    return {"measured_max_batch": batch, "batch_error": _error(row.max_batch, batch),
            "measured_longest_seq": seq, "seq_error": _error(row.longest_seq, seq)}


def measured_longest_seq(profile: str, experiment_ref: str, overrides: list[str], exp: Experiment, micro: int,
                         guess: int, cap: int | None, say: Callable[[str], None]) -> int:
    """The longest sequence (a multiple of SEQ_GRANULE, up to the model's positions) whose probe fits at `micro`,
    searched from `guess` (0: nothing fits)."""
    def fits(n: int) -> bool:
        return _probe(profile, experiment_ref, overrides + [f"model.seq_len={n * SEQ_GRANULE}"], n * SEQ_GRANULE, micro,
                      cap, say)

    return SEQ_GRANULE * largest_near(fits, max(1, guess // SEQ_GRANULE), seq_units(exp))


def _probe(profile: str, experiment_ref: str, overrides: list[str], seq_len: int, b: int, cap: int | None,
           say: Callable[[str], None]) -> bool:
    probe = ChildProbe(profile, experiment_ref, overrides, seq_len=seq_len, steps=PROBE_STEPS, cap_bytes=cap)
    try:
        result = probe(b)
    finally:
        probe.close()
    say(f"  {profile}: micro-batch {b} x {seq_len} tokens: {result.verdict}")
    return result.fits  # a probe that failed for another reason than memory raised ProbeError: one line, exit 2


def _error(predicted: int, measured: int) -> float | None:
    """Predicted against measured, as a share of measured (negative: the prediction is below, the safe side)."""
    return round(predicted / measured - 1, 4) if measured else None
