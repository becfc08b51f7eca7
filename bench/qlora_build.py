"""A quantized base's build on the GPU (issue 47): what the GPU holds while a QLoRA step is built, and how long the
build takes. memlab builds a 4-bit base on the host and quantizes each layer on its way to the GPU
(techniques.finetune._quantize); `--whole-on-gpu` builds the bf16 model on the GPU first, as memlab did before, for
the comparison. One JSON line: build seconds, the GPU's peak allocated and reserved during the build, what stays
allocated and reserved after it, the host's peak RSS.

    python3 bench/qlora_build.py --experiment llama-8b --profile qlora_gradcp [--whole-on-gpu]
"""

from __future__ import annotations

import argparse
import json
import resource
import time

import torch

from memlab.core import step as train_step
from memlab.core.config import load_experiment, load_profile
from memlab.core.predict.analytic import vocab_for
from memlab.core.techniques import check_techniques, finetune


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--experiment", default="llama-8b")
    ap.add_argument("--profile", default="qlora_gradcp")
    ap.add_argument("--whole-on-gpu", action="store_true", help="build the bf16 model on the GPU, then quantize (before)")
    args = ap.parse_args()
    e, p = load_experiment(args.experiment), load_profile(args.profile)
    device = torch.device("cuda")
    check_techniques(e, p, device)
    if args.whole_on_gpu:
        before = finetune.apply_before_model

        def on_gpu(step):
            before(step)
            step.build_device = None
        finetune.apply_before_model = on_gpu
    torch.cuda.init()
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    step = train_step.build_step(e, p, device, vocab_for(e)[0])
    torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    stats = torch.cuda.memory_stats()
    print(json.dumps({
        "experiment": args.experiment, "profile": args.profile, "build": "whole bf16 model on the GPU first" if args.whole_on_gpu
        else "host first, quantized layer by layer", "seconds": round(seconds, 1),
        "peak_allocated": stats["allocated_bytes.all.peak"], "peak_reserved": stats["reserved_bytes.all.peak"],
        "allocated_after": stats["allocated_bytes.all.current"], "reserved_after": stats["reserved_bytes.all.current"],
        "host_peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "trainable": step.applied.get("trainable_params"), "finetune": step.applied.get("finetune"),
        "torch": torch.__version__, "gpu": torch.cuda.get_device_name()}), flush=True)


if __name__ == "__main__":
    main()
