"""Prediction, one seam: a training step's peak memory on a card, and the largest micro-batch and longest sequence
that fit, before anything runs. `memlab estimate`, find-batch's first probe, the study's predicted max batch and
the engine's recorded estimate all come through here.

    predict(experiment, profile, micro_batch, card) -> Prediction   (prediction.py: methods trace | analytic)
    max_batch(...) / predicted_max_batch(...) -> the one micro-batch to plan for (maxbatch.py)
    max_seq_len(...)                          -> the longest sequence at a micro-batch (maxbatch.py)
    card_for(gpu_memory) -> Card              (card.py)
    valid_for(...) -> ValidFor                (calibration.py: what is calibrated, as data keyed by versions)

Behind it: analytic.py (the GPT formula, an upper bound), fake.py (the step on fake tensors, MemTracker),
trace.py + allocator.py (CUDA's caching allocator replayed over the step's allocations), inductor.py (a compiled
step's buffers, from Inductor's wrapper code), standins.py and cuda_temporaries.py (what fake tensors cannot run),
search.py (grow, then bisect). docs/estimator.md says how accurate each is and where.
"""

from memlab.core.predict.calibration import ValidFor, valid_for
from memlab.core.predict.card import Card, card_for
from memlab.core.predict.maxbatch import (REPLAY_MARGIN, MaxBatch, longest_sequence, max_batch, max_seq_len,
                                         predicted_max_batch)
from memlab.core.predict.prediction import METHODS, Prediction, predict

__all__ = ["METHODS", "REPLAY_MARGIN", "Card", "MaxBatch", "Prediction", "ValidFor", "card_for", "max_batch",
           "longest_sequence", "max_seq_len", "predict", "predicted_max_batch", "valid_for"]
