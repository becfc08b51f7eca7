"""sac_ops's peaks at the largest micro-batch each GPU search fitted (bench/results/prediction-check/sac-compiled/gpu):
the GPU's allocated and reserved peaks (the search's last fitting probe, under the card's cap) beside the analytic
formula's tensors and the replay of the step's trace (its blocks as compiled graphs), on this machine. The GPT
shapes only (the transformers ones are in bench/results/hf-h100/predicted.md).

    python bench/sac_compiled_peaks.py > bench/results/prediction-check/sac-compiled/peaks.txt
"""

from __future__ import annotations

import re
from pathlib import Path

from memlab.core.config import load_experiment, load_profile
from memlab.core.predict import allocator, trace
from memlab.core.predict import analytic as E

SEARCHES = Path(__file__).parent / "results" / "prediction-check" / "sac-compiled" / "gpu"
EXPERIMENTS = Path(__file__).parent / "experiments"
PROBE = re.compile(r"probe \d+: micro-batch (\d+) fits · peak ([\d.]+) GiB · reserved ([\d.]+) GiB")
GIB = 2**30


def off(predicted: float, measured: float) -> str:
    return f"{predicted:6.2f} ({(predicted - measured) / measured:+.1%})"


def main() -> None:
    for log in sorted(SEARCHES.glob("*/find-batch-*-sac_ops.log")):
        name = log.name[len("find-batch-"):-len("-sac_ops.log")]
        path = EXPERIMENTS / f"{name}.toml"
        experiment, profile = load_experiment(str(path) if path.exists() else name), load_profile("sac_ops")
        vocab, _ = E.vocab_for(experiment)
        b, allocated, reserved = (float(x) for x in list(PROBE.finditer(log.read_text()))[-1].groups())
        b = int(b)
        analytic = E.estimate(experiment, profile, vocab_size=vocab, micro_batch=b).total_bytes / GIB
        r = allocator.replay(trace.step_trace(experiment, profile, vocab_size=vocab, micro_batch=b, capped=True))
        print(f"{name:16s} micro-batch {b:4d}  GPU allocated {allocated:6.2f} reserved {reserved:6.2f} GiB | analytic "
              f"{off(analytic, allocated)} | replayed allocated {off(r.peak_allocated / GIB, allocated)} reserved "
              f"{off(r.peak_reserved / GIB, reserved)}", flush=True)


if __name__ == "__main__":
    main()
