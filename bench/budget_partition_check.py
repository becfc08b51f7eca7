"""What AOTAutograd's partitioner saves for backward under checkpointing.budget, as memlab.core.predict.inductor
traces it (the CPU graph under CPU autocast) and, on a machine with a GPU, as the real CUDA step makes it (CUDA
autocast, the CUDA SDPA kernel): each saved value's dtype, shape and bytes at the shape's batch, and the total.
Issue 19: at budget 0.75 the traced partition kept the bf16 logits on two held-out shapes where the H100's did not;
this tells whether the torch release or the CPU graph is why.

    python3 bench/budget_partition_check.py --shape seed --budget 0.75 [--device cpu|cuda|both] [--json OUT.jsonl]
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, replace
from unittest import mock

import torch

from memlab.core.predict import inductor as cbm

SHAPES = {  # the held-out shapes of bench/results/frontier-h100 parts g, g2, and gpt2s (part c)
    "seed": cbm.GraphShape(4, 8, 256, 1024, 50304, 256, 0.1, 0.75, 64),
    "bigvocab": cbm.GraphShape(6, 12, 768, 3072, 128256, 1024, 0.0, 0.75, 24),
    "gpt2s": cbm.GraphShape(12, 12, 768, 3072, 8192, 1024, 0.0, 0.75, 16),
}


def saved_values(shape: cbm.GraphShape, device: str) -> list[tuple[str, str, tuple, int]]:
    """The forward graph's saved outputs (name, dtype, shape at the batch hint, bytes), partitioned on `device`."""
    if device == "cpu":
        forward, _ = cbm._partitioned(shape)
    else:
        forward, _ = _partitioned_on_cuda(shape)
    out = []
    for node in list(forward.graph.nodes)[-1].args[0][1:]:
        value = node.meta.get("val") if node is not None else None
        if isinstance(value, torch.Tensor) and node.op != "placeholder":
            dims = tuple(int(d) if not hasattr(d, "node") else d.node.hint for d in value.shape)
            nbytes = value.dtype.itemsize
            for d in dims:
                nbytes *= d
            out.append((node.name, str(value.dtype).removeprefix("torch."), dims, nbytes))
    return out


def _partitioned_on_cuda(shape: cbm.GraphShape):
    """The same as compile_budget_model._partitioned, on the real CUDA device with its own SDPA and autocast."""
    import torch._functorch.config as functorch_config
    import torch._inductor.compile_fx as compile_fx
    import torch.nn.functional as F

    from memlab.core.model import GPT, GPTConfig

    graphs = []
    min_cut = compile_fx.min_cut_rematerialization_partition

    def partition(joint, joint_inputs, **kwargs):
        graphs.extend(min_cut(joint, joint_inputs, **kwargs))
        raise cbm._Partitioned

    def attention(q, k, v, dropout_p=0.0):
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True)

    cfg = GPTConfig(shape.n_layer, shape.n_head, shape.d_model, shape.d_ff, shape.vocab, shape.seq_len, shape.dropout)
    with torch.device("cuda"):
        model = GPT(cfg, attention)
    model.lm_head.weight = model.wte.weight
    x, y = (torch.zeros(shape.batch, shape.seq_len, dtype=torch.long, device="cuda") for _ in range(2))
    for tokens in (x, y):
        torch._dynamo.mark_dynamic(tokens, 0)
    with mock.patch.object(compile_fx, "min_cut_rematerialization_partition", partition), \
         functorch_config.patch(activation_memory_budget=shape.budget), torch.autocast("cuda", dtype=torch.bfloat16):
        try:
            torch.compile(model)(x, y)
        except Exception:  # noqa: BLE001 (Dynamo wraps the stop)
            if not graphs:
                raise
    return graphs[0], graphs[1]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", choices=sorted(SHAPES), required=True)
    ap.add_argument("--budget", type=float, default=0.75)
    ap.add_argument("--device", choices=["cpu", "cuda", "both"], default="both")
    ap.add_argument("--json", help="append one JSON line per device here")
    a = ap.parse_args()
    shape = replace(SHAPES[a.shape], budget=a.budget)
    devices = ["cpu", "cuda"] if a.device == "both" else [a.device]
    if "cuda" in devices and not torch.cuda.is_available():
        devices.remove("cuda")
        print("no CUDA device: the CPU graph alone", file=sys.stderr)
    for device in devices:
        torch._dynamo.reset()
        saved = saved_values(shape, device)
        total = sum(s[3] for s in saved)
        print(f"== {a.shape} budget {a.budget:g} on {device} (torch {torch.__version__}): {len(saved)} saved, "
              f"{total / 2**30:.3f} GiB")
        big = sorted(saved, key=lambda s: -s[3])[:12]
        for name, dtype, dims, nbytes in big:
            print(f"   {name:<28} {dtype:<9} {str(dims):<24} {nbytes / 2**20:10.1f} MiB")
        if a.json:
            with open(a.json, "a") as f:
                f.write(json.dumps({"shape": a.shape, "graph": asdict(shape), "device": device,
                                    "torch": torch.__version__, "saved": saved, "total": total}) + "\n")


if __name__ == "__main__":
    main()
