"""The allocator replay's peaks at given micro-batches, beside the analytic estimate's tensors: what find-batch's
prediction replays (memlab.core.predict.trace.step_peaks, under --gpu-memory's cap as its probes run), to set
against a find-batch log's "peak" and "reserved" at the same batches. On a CPU machine or on the GPU itself (a
compiled step is traced by the local torch release: bench/results/prediction-check/float8-traced/NOTE.md).

    python bench/replay_peaks.py EXPERIMENT PROFILE B1,B2,...
"""

from __future__ import annotations

import sys

from memlab.core.predict import analytic as est
from memlab.core.predict.trace import step_peaks
from memlab.core.config import load_experiment, load_profile

GIB = 2**30

if __name__ == "__main__":
    experiment, profile = load_experiment(sys.argv[1]), load_profile(sys.argv[2])
    vocab, _ = est.vocab_for(experiment)
    for b in map(int, sys.argv[3].split(",")):
        allocated, reserved = step_peaks(experiment, profile, vocab_size=vocab, micro_batch=b, capped=True)
        tensors = est.estimate(experiment, profile, vocab_size=vocab, micro_batch=b).total_bytes
        print(f"{b}: replay alloc {allocated / GIB:.2f} reserved {reserved / GIB:.2f} | analytic {tensors / GIB:.2f}", flush=True)
