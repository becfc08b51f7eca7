"""A deep model's trace made from 5 blocks (trace.deep_trace) against the trace at its own depth (fake_trace).

    python bench/deepen_check.py [EXPERIMENT:PROFILE:MICRO_BATCH[:N_LAYER] ...]

Each case: whether it was made (or refused, and the full trace used), the seconds of each, the number of events, and
the allocator replay's allocated and reserved peaks both ways (plain and expandable segments as the profile runs).
"""

import dataclasses
import sys
import time

from memlab.core.config import load_experiment, load_profile
from memlab.core.predict import analytic, deepen, trace
from memlab.core.predict.allocator import replay
from memlab.core.techniques import allocator

DEFAULT = ["gpt2s:bf16:4", "gpt2s:gradcp_bf16:4", "llama-tiny:lora:2:12", "llama-tiny:lora_gradcp:2:12"]


def case(spec: str) -> None:
    name, profile_name, micro, *depth = spec.split(":")
    e, p = load_experiment(name), load_profile(profile_name)
    if depth:
        e = dataclasses.replace(e, model=dataclasses.replace(e.model, n_layer=int(depth[0])))
    vocab, _ = analytic.vocab_for(e)
    trace.deep_trace(e, p, vocab_size=vocab, micro_batch=int(micro))  # what a process makes once, made before both
    t0 = time.time()
    deep = trace.deep_trace(e, p, vocab_size=vocab, micro_batch=int(micro))
    t1 = time.time()
    full = trace.fake_trace(e, p, vocab_size=vocab, micro_batch=int(micro))
    t2 = time.time()
    expandable = allocator.expandable(p)
    if deep is None:
        print(f"{spec}: not made ({t1 - t0:.1f} s: {deepen.refusal[0] or 'not tried'}), full {t2 - t1:.1f} s", flush=True)
        return
    a, b = replay(deep, expandable=expandable), replay(full, expandable=expandable)
    same = (a.peak_allocated, a.peak_reserved) == (b.peak_allocated, b.peak_reserved)
    made = [(ev[2], ev[3]) for ev in deep if ev[0] == "alloc"]
    traced = [(ev[2], ev[3]) for ev in full if ev[0] == "alloc"]
    sizes = made == traced
    if not sizes:
        at = next((i for i, (a, b) in enumerate(zip(made, traced)) if a != b), min(len(made), len(traced)))
        print(f"  first allocation to differ: #{at} of {len(made)} / {len(traced)}: {made[at:at + 3]} / {traced[at:at + 3]}")
    print(f"{spec}: {'SAME' if same else 'DIFFERENT'} peaks, allocation sizes {'same' if sizes else 'differ'}; "
          f"made {t1 - t0:.1f} s, traced {t2 - t1:.1f} s; events {len(deep)} / {len(full)}; "
          f"allocated {a.peak_allocated} / {b.peak_allocated}, reserved {a.peak_reserved} / {b.peak_reserved}", flush=True)


for spec in sys.argv[1:] or DEFAULT:
    try:
        case(spec)
    except Exception as e:  # noqa: BLE001 (a profile fake tensors cannot run here: say so, go on)
        print(f"{spec}: not traced ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})", flush=True)
