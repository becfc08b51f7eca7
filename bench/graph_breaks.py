"""How many graphs torch.compile makes of the step's model as the engine builds it (two blocks of llama-tiny, or of
another experiment), and why it breaks where it does: memlab's Inductor reader reads one graph.

    python3 bench/graph_breaks.py [cpu|cuda] [EXPERIMENT] [--set items ...]
"""

from __future__ import annotations

import sys

import torch

from memlab.core.config import apply_overrides, load_experiment, load_profile
from memlab.core.techniques import build_step


def main() -> None:
    device = torch.device(sys.argv[1] if len(sys.argv) > 1 else "cpu")
    e, p = load_experiment(sys.argv[2] if len(sys.argv) > 2 else "llama-tiny"), load_profile("compile")
    apply_overrides(e, p, ["model.n_layer=2", *sys.argv[3:]])
    p.compile.enabled = False  # the model as built, before torch.compile wraps it: explain compiles it here
    if device.type == "cpu":
        p.precision.dtype = "fp32"
    model = build_step(e, p, device, 512).model
    x = torch.randint(0, 500, (2, e.model.seq_len), device=device)
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
        explained = torch._dynamo.explain(model)(x, torch.roll(x, -1, 1))
    print(f"{type(model).__name__}: {explained.graph_count} graph(s), {explained.graph_break_count} break(s)")
    for b in explained.break_reasons[:5]:
        print(" reason:", str(b.reason)[:300])
        for frame in b.user_stack[-3:]:
            print("   ", frame.filename.split("/")[-1], frame.lineno, frame.line)


if __name__ == "__main__":
    main()
