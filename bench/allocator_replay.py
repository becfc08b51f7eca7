"""Replay an allocation trace through bench/allocator_model.py: the memory the CUDA caching allocator would reserve.

Two traces:
- a real one, from `memlab run --memory-snapshot` on a GPU (the run folder's memory_snapshot.pickle): the model's
  reserved peak is set beside the allocator's own (its segment events), which tells how well the model follows
  the allocator when the trace is exact;
- a fake-tensor one, on this machine: one training step of a profile at a micro-batch, on fake tensors (no memory,
  no GPU; memlab's `estimate --method fake` machinery). On a CPU the step runs the CPU's kernels (SDPA's math path
  saves T x T attention, cuDNN's does not), so the trace is not the GPU's: compare it with a real one first.

    python bench/allocator_replay.py runs/<run>/memory_snapshot.pickle [--cap 24GiB]
    python bench/allocator_replay.py --fake seed-so-posts bf16 64 [--set data.tokenizer="bpe:8192"] [--cap 23.26GiB]
    python bench/allocator_replay.py --against-h100     # the table below, from the committed runs

Against the H100 (`python bench/allocator_replay.py --against-h100`, 2026-11-25: fake traces on a CPU machine, each
beside the committed H100 run of the same profile, experiment and micro-batch; tests/test_allocator_model.py checks
five of them):

| experiment, profile, micro-batch | allocated: replay / H100 GiB | reserved: replay / H100 GiB |
|:--|--:|--:|
| gpt2s bf16 16 | 7.85 / 7.91 | 8.50 / 8.53 (-0.4%) |
| gpt2s gradcp_bf16 16 | 3.18 / 3.24 | 3.68 / 3.71 (-0.9%) |
| gpt2s chunked_ce 16 | 6.82 / 6.89 | 7.14 / 7.21 (-1.0%) |
| gpt2s selective 16 | 6.95 / 7.01 | 7.15 / 7.18 (-0.5%) |
| bigvocab bf16 24 | 40.99 / 41.06 | 45.91 / 45.92 (-0.0%) |
| bigvocab chunked_ce 24 | 12.12 / 12.18 | 13.62 / 13.63 (-0.1%) |
| seed-so-posts baseline 64 | 12.07 / 11.65 | 15.07 / 14.66 (+2.8%) |
| seed-so-posts gradcp 64 | 9.50 / 9.55 | 9.95 / 9.85 (+1.0%) |
| seed-so-posts bf16 64 (fp16 the same) | 10.09 / 10.11 | 11.63 / 14.65 (-20.6%) |
| seed-so-posts chunked_ce 64 | 3.26 / 3.27 | 3.57 / 4.29 (-16.7%) |

The misses are SDPA (cuDNN on the H100) with the seed shape's dropout 0.1; eager attention with the same dropout
(baseline) agrees. The tensors agree there too, so the GPU allocates something the fake trace does not (a
transient of the fused kernel's dropout?): replay a real trace of that run (the first mode) to find it.
"""

from __future__ import annotations

import argparse
import pickle
import sys
import weakref
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from allocator_model import OutOfMemory, replay  # noqa: E402

GIB = 2**30


Event = tuple  # (action "alloc" | "free", id, bytes, where: what allocated it, for --dump; "" for a free)


def snapshot_trace(snapshot: dict, device: int = 0) -> tuple[list[Event], int]:
    """The (alloc / free) events of one device's trace, and the allocator's own reserved peak over it (segment
    allocations less segment frees, from the start of the recording)."""
    traces = snapshot.get("device_traces") or []
    events, reserved, peak, serial = [], 0, 0, 0
    live: dict[int, int] = {}  # address -> the id of the allocation there now
    for ev in traces[device] if device < len(traces) else []:
        action, addr, size = ev.get("action"), ev.get("addr"), int(ev.get("size") or 0)
        if action == "alloc":
            serial += 1
            live[addr] = serial
            events.append(("alloc", serial, size, _frame(ev.get("frames") or [])))
        elif action == "free_completed" and addr in live:
            events.append(("free", live.pop(addr), 0, ""))
        elif action in ("segment_alloc", "segment_map"):
            reserved += size
            peak = max(peak, reserved)
        elif action in ("segment_free", "segment_unmap"):
            reserved -= size
    return events, peak


def _frame(frames: list[dict]) -> str:
    """The innermost Python frame of an allocation that is memlab's or torch.nn's: where in the step it happened."""
    for f in frames:
        name = str(f.get("filename", ""))
        if "memlab" in name or "/core/" in name or "torch/nn" in name:
            return f"{Path(name).name}:{f.get('line')} {f.get('name')}"
    return ""


def fake_trace(experiment_name: str, profile_name: str, micro_batch: int, overrides: list[str],
               fused_attention: bool = True) -> list[Event]:
    """Every tensor storage created and freed over a second training step (the first creates the optimizer state),
    on fake tensors on this machine, in order. `fused_attention`: SDPA saves what a fused GPU kernel (cuDNN, flash,
    efficient) saves, its output and its fp32 log-sum-exp, instead of what the CPU's math path saves (the T x T
    probabilities and, under dropout, their mask)."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils._python_dispatch import TorchDispatchMode

    from memlab.core import estimate as E
    from memlab.cli.options import resolve
    from memlab.core.memsnapshot import _fake_runnable
    from memlab.core.step import build_step

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    experiment, profile = resolve(experiment_name, profile_name, device.type, overrides)
    profile = _fake_runnable(experiment, profile, device, [])
    vocab, _ = E.vocab_for(experiment)
    events: list[Event] = []

    class Storages(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.seen: set[int] = set()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is torch.ops.aten._local_scalar_dense.default:  # .item() of a fake tensor: any number will do
                return 1.0 if args[0].dtype.is_floating_point else 1
            out = func(*args, **(kwargs or {}))
            for t in torch.utils._pytree.tree_leaves(out):
                if isinstance(t, torch.Tensor):
                    self._note(t.untyped_storage(), str(func))
            return out

        def _note(self, storage, op: str) -> None:
            key = storage._cdata
            if key in self.seen:
                return
            self.seen.add(key)
            events.append(("alloc", key, storage.nbytes(), op))
            weakref.finalize(storage, self._freed, key)

        def _freed(self, key: int) -> None:
            self.seen.discard(key)
            events.append(("free", key, 0, ""))

    T = experiment.model.seq_len
    fused = _fused_attention_stand_in(torch) if fused_attention else None
    with FakeTensorMode(), Storages(), _patched(torch.nn.functional, "scaled_dot_product_attention", fused):
        step = build_step(experiment, profile, device, vocab, on_device=True)
        step.scaler = None
        batch = lambda: [(torch.randint(0, vocab, (micro_batch, T), device=device), torch.randint(0, vocab, (micro_batch, T), device=device))]  # noqa: E731
        step.run(batch())
        step.run(batch())
    return events


def _fused_attention_stand_in(torch):
    """F.scaled_dot_product_attention as a fused GPU kernel allocates: forward the output and a (B, H, T) fp32
    log-sum-exp, both saved; backward the three input gradients. Dropout is drawn inside the kernel (no mask)."""

    class FusedAttention(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v):
            out = torch.empty_like(q)
            lse = torch.empty(q.shape[:-1], dtype=torch.float32, device=q.device)
            ctx.save_for_backward(q, k, v, out, lse)
            return out

        @staticmethod
        def backward(ctx, grad):
            q, k, v, _, _ = ctx.saved_tensors
            return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)

    def attention(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, **_):
        return FusedAttention.apply(q, k, v)

    return attention


class _patched:
    """Replace module.name by `value` for a with-block (None: leave it)."""

    def __init__(self, module, name: str, value) -> None:
        self.module, self.name, self.value, self.saved = module, name, value, None

    def __enter__(self):
        if self.value is not None:
            self.saved = getattr(self.module, self.name)
            setattr(self.module, self.name, self.value)

    def __exit__(self, *exc):
        if self.value is not None:
            setattr(self.module, self.name, self.saved)


RESULTS = Path(__file__).resolve().parent / "results"
SEED_DATA = ['data.tokenizer="bpe:8192"', 'data.source="stdlib"']  # the seed study's corpus and tokenizer
AGAINST_H100 = [("gpt2s", p, 16, []) for p in ("bf16", "gradcp_bf16", "chunked_ce", "selective")] + \
    [("bigvocab", p, 24, []) for p in ("bf16", "chunked_ce")] + \
    [("seed-so-posts", p, 64, SEED_DATA) for p in ("baseline", "gradcp", "bf16", "fp16", "chunked_ce")]


def h100_run(experiment: str, profile: str, micro_batch: int) -> dict | None:
    """The summary of the first finished committed run (bench/results/) of this profile, experiment and micro-batch."""
    import json

    import polars as pl

    for path in sorted(RESULTS.glob("**/summary.parquet")):
        summary = pl.read_parquet(path).to_dicts()[0]
        run = json.loads((path.parent / "run.json").read_text())
        if (run["experiment"]["name"], summary["profile"], summary["micro_batch"], summary["status"]) == (experiment, profile, micro_batch, "finished"):
            return summary | {"path": str(path.parent.relative_to(RESULTS))}
    return None


def against_h100() -> None:
    print("| experiment, profile, micro-batch | allocated: replay / H100 GiB | reserved: replay / H100 GiB | H100 run |")
    print("|:--|--:|--:|:--|")
    for experiment, profile, b, sets in AGAINST_H100:
        run = h100_run(experiment, profile, b)
        if run is None:
            print(f"| {experiment} {profile} {b} | no committed run | | |")
            continue
        model = replay(fake_trace(experiment, profile, b, sets))
        alloc, reserved = run["peak_alloc_bytes"], run["peak_reserved_bytes"]
        print(f"| {experiment} {profile} {b} | {model.peak_allocated / GIB:.2f} / {alloc / GIB:.2f} | "
              f"{model.peak_reserved / GIB:.2f} / {reserved / GIB:.2f} ({model.peak_reserved / reserved - 1:+.1%}) | {run['path']} |")


def main() -> None:
    from memlab.core.units import parse_size

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("snapshot", nargs="?", help="a memory_snapshot.pickle from memlab run --memory-snapshot")
    ap.add_argument("--fake", nargs=3, metavar=("EXPERIMENT", "PROFILE", "MICRO_BATCH"), help="trace one step on fake tensors here")
    ap.add_argument("--set", action="append", default=[], help="an experiment override, as memlab's --set")
    ap.add_argument("--device-sdpa", action="store_true", help="--fake: this machine's own SDPA, not the fused kernel's tensors (on a CPU the math path: it saves T x T)")
    ap.add_argument("--cap", help="the allocator's budget, e.g. 23.26GiB: the model then releases free segments and may run out")
    ap.add_argument("--dump", help="also write the trace as JSON lines (action, id, bytes, where), to set two traces side by side")
    ap.add_argument("--against-h100", action="store_true", help="replay fake traces of the committed H100 runs' cases and print the table")
    a = ap.parse_args()
    if a.against_h100:
        return against_h100()
    if (a.snapshot is None) == (a.fake is None):
        ap.error("give a snapshot file or --fake EXPERIMENT PROFILE MICRO_BATCH")
    real = None
    if a.snapshot:
        with open(a.snapshot, "rb") as f:
            events, real = snapshot_trace(pickle.load(f))  # a file memlab wrote: the user's own
    else:
        events = fake_trace(a.fake[0], a.fake[1], int(a.fake[2]), a.set, fused_attention=not a.device_sdpa)
    if a.dump:
        import json

        with open(a.dump, "w", encoding="utf-8") as f:
            f.writelines(json.dumps({"action": e[0], "id": str(e[1]), "bytes": e[2], "where": e[3]}) + "\n" for e in events)
    cap = parse_size(a.cap, "--cap") if a.cap else None
    try:
        model = replay(events, cap)
    except OutOfMemory as e:
        print(f"out of memory in the model: {e}")
        raise SystemExit(1) from None
    frag = 1 - model.peak_allocated / model.peak_reserved if model.peak_reserved else 0.0
    print(f"{len(events):,} events · allocated peak {model.peak_allocated / GIB:.2f} GiB · model reserved peak "
          f"{model.peak_reserved / GIB:.2f} GiB (fragmentation {frag:.1%}, {model.retries} retries)"
          + (f" · the allocator's own reserved peak {real / GIB:.2f} GiB" if real is not None else ""))


if __name__ == "__main__":
    main()
