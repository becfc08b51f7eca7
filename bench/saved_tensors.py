"""What autograd keeps for backward, tensor by tensor, in one training forward of a profile (issue 19: where a
technique's activation memory goes, e.g. float8 compiled against compile). Counts every distinct storage that a
saved-tensors pack hook sees (compiled graphs' saves included), grouped by dtype and shape, in MiB.

    python3 bench/saved_tensors.py --profiles compile,float8 --experiment gpt2s --layers 2 --batch 16
"""

from __future__ import annotations

import argparse
from collections import Counter

import torch


def saved_by_profile(profile_name: str, experiment_name: str, layers: int, batch: int) -> Counter:
    from memlab.core.config import apply_overrides, load_experiment, load_profile
    from memlab.core.techniques import build_step
    from memlab.core.techniques import check_techniques

    exp, prof = load_experiment(experiment_name), load_profile(profile_name)
    apply_overrides(exp, prof, [f"model.n_layer={layers}", f"train.batch_size={batch}"])
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    check_techniques(exp, prof, device)
    step = build_step(exp, prof, device, vocab_size=8192)
    x = torch.randint(0, 8192, (batch, exp.model.seq_len), device=device)
    seen: set[int] = set()
    sizes: Counter = Counter()

    def pack(t: torch.Tensor):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in seen and t.device.type == device.type:
            seen.add(ptr)
            sizes[(str(t.dtype).removeprefix("torch."), tuple(t.shape))] += t.untyped_storage().nbytes()
        return t

    for i in range(3):  # the first compiles; the last is counted
        seen.clear()
        sizes.clear()
        with step.autocast(), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss = step.train_model(x, x)
        loss.backward()
        step.optimizer.zero_grad(set_to_none=True)
    return sizes


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--profiles", default="compile,float8")
    ap.add_argument("--experiment", default="gpt2s")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=16)
    a = ap.parse_args()
    for name in a.profiles.split(","):
        sizes = saved_by_profile(name, a.experiment, a.layers, a.batch)
        total = sum(sizes.values())
        print(f"== {name}: {a.experiment}, {a.layers} layers, batch {a.batch}: saved {total / 2**20:.1f} MiB in {len(sizes)} groups")
        for (dtype, shape), n in sorted(sizes.items(), key=lambda kv: -kv[1]):
            print(f"  {n / 2**20:9.1f} MiB  {dtype:14s} {shape}")


if __name__ == "__main__":
    main()
