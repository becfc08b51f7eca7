"""What a compiled step saves for backward (the partitioned forward graph's outputs after the loss), by dtype and
shape, for Llama-3.2-1B's shape cut to two blocks: as memlab's Inductor reader partitions it (CPU, emulating CUDA:
memlab.core.predict.inductor._partitioned), or with --cuda as torch.compile partitions it on this GPU.

    python3 bench/partition_saved.py [--cuda]
"""

from __future__ import annotations

import collections
import dataclasses
import sys
from typing import Any
from unittest import mock

import torch

from memlab.core.config import apply_overrides, load_experiment, load_profile
from memlab.core.predict import analytic as est, inductor as M


def saved_of(forward: Any) -> collections.Counter:
    outputs = list(forward.graph.nodes)[-1].args[0]
    counts: collections.Counter = collections.Counter()
    for node in outputs[1:]:
        v = getattr(node, "meta", {}).get("val")
        if isinstance(v, torch.Tensor):
            counts[(str(v.dtype), tuple(-1 if isinstance(s, torch.SymInt) else int(s) for s in v.shape))] += 1
    return counts


def on_cuda(shape: Any) -> tuple[Any, Any]:
    """torch.compile's own partition on this GPU: the reader's hook on the partitioner, the model and batch on CUDA."""
    import torch._inductor.compile_fx as compile_fx

    graphs: list[Any] = []
    min_cut = compile_fx.min_cut_rematerialization_partition

    def partition(joint: Any, joint_inputs: Any, **kwargs: Any) -> Any:
        graphs.extend(min_cut(joint, joint_inputs, **kwargs))
        raise M._Partitioned

    model = M._hf(shape).to("cuda")
    x, y = (torch.zeros(shape.batch, shape.seq_len, dtype=torch.long, device="cuda") for _ in range(2))
    for tokens in (x, y):
        torch._dynamo.mark_dynamic(tokens, 0)
    with mock.patch.object(compile_fx, "min_cut_rematerialization_partition", partition), \
         torch.autocast("cuda", dtype=torch.bfloat16):
        try:
            torch.compile(model)(x, y)
        except Exception:
            if not graphs:
                raise
    return graphs[0], graphs[1]


def main() -> None:
    e, p = load_experiment("llama-1b"), load_profile("compile")
    apply_overrides(e, p, ["model.n_layer=2", "optimizer.fused=true", "train.batch_size=2"])
    shape = est.compiled_graph_shape(e, p, est.vocab_for(e)[0])
    print(dataclasses.replace(shape, model=shape.model[:60]))
    forward, _ = on_cuda(shape) if "--cuda" in sys.argv else M._partitioned(shape)
    for key, n in sorted(saved_of(forward).items(), key=lambda kv: str(kv[0])):
        print(n, key)


if __name__ == "__main__":
    main()
