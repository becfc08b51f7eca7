"""A quantized base's build on the GPU (issue 47): what the GPU holds while a QLoRA step is built (the bf16 model
on the GPU, each target layer then quantized by techniques.finetune._quantize), and how long it takes. One JSON
line: build seconds, the GPU's peak allocated and reserved during the build, what stays allocated and reserved after
it, the host's peak RSS. `--replay` (any machine): the same figures from the predictor's fake trace of the build,
replayed through memlab's allocator model up to the steps. bench/results/qlora-build-h200/ sets the two side by side.

    python3 bench/qlora_build.py --experiment llama-8b --profile qlora_gradcp            # on the GPU
    python3 bench/qlora_build.py --experiment llama-8b --profile qlora_gradcp --replay   # the prediction
"""

from __future__ import annotations

import argparse
import json
import resource
import time

import torch

from memlab.core.techniques import build_step
from memlab.core.config import load_experiment, load_profile
from memlab.core.predict.analytic import vocab_for
from memlab.core.techniques import check_techniques


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--experiment", default="llama-8b")
    ap.add_argument("--profile", default="qlora_gradcp")
    ap.add_argument("--replay", action="store_true", help="the predictor's replay of the build instead (no GPU needed)")
    args = ap.parse_args()
    e, p = load_experiment(args.experiment), load_profile(args.profile)
    if args.replay:
        return replayed_build(e, p)
    device = torch.device("cuda")
    check_techniques(e, p, device)
    torch.cuda.init()
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    step = build_step(e, p, device, vocab_for(e)[0])
    torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    stats = torch.cuda.memory_stats()
    print(json.dumps({
        "experiment": args.experiment, "profile": args.profile, "seconds": round(seconds, 1),
        "peak_allocated": stats["allocated_bytes.all.peak"], "peak_reserved": stats["reserved_bytes.all.peak"],
        "allocated_after": stats["allocated_bytes.all.current"], "reserved_after": stats["reserved_bytes.all.current"],
        "host_peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "trainable": step.applied.get("trainable_params"), "finetune": step.applied.get("finetune"),
        "torch": torch.__version__, "gpu": torch.cuda.get_device_name()}), flush=True)


def replayed_build(e, p) -> None:
    from memlab.core.predict.allocator import STEPS, Allocator, replayed
    from memlab.core.techniques.accumulation import single
    from memlab.core.predict.trace import step_trace

    t0 = time.perf_counter()
    events = step_trace(e, single(p), vocab_size=vocab_for(e)[0], micro_batch=1)  # the build does not depend on it
    model = Allocator()
    for event in events[:next(i for i, ev in enumerate(events) if ev[0] == STEPS)]:
        replayed(model, event)
    print(json.dumps({"experiment": e.name, "profile": p.name, "replayed": True, "trace_seconds": round(time.perf_counter() - t0, 1),
                      "peak_allocated": model.peak_allocated, "peak_reserved": model.peak_reserved,
                      "allocated_after": model.allocated, "reserved_after": model.reserved, "torch": torch.__version__}), flush=True)


if __name__ == "__main__":
    main()
