"""Seconds a trace takes with its second step traced and made from the first (issue 47: memlab fit on an 8B model).

    python bench/second_step_speed.py PROFILE [EXPERIMENT]     (default llama-8b)

One trace at micro-batch 1 first (what a process makes once), then micro-batch 2 four times, alternating
trace.SECOND_STEP between "traced" and "synthesized": each line the mode, the seconds, and the replay's allocated and
reserved peaks. (Run as /tmp/t8b.py on 2026-11-28, lora_gradcp: 11.2, 6.7, 11.4, 6.5 s, the same peaks.)
"""

import sys
import time

from memlab.core.config import load_experiment, load_profile
from memlab.core.predict import analytic, trace
from memlab.core.predict.allocator import replay

e = load_experiment(sys.argv[2] if len(sys.argv) > 2 else "llama-8b")
p = load_profile(sys.argv[1])
vocab, _ = analytic.vocab_for(e)
trace.DEEPEN = False  # both ways at the model's depth (deepen.py makes the step from 5 blocks: bench/deepen_check.py)
trace.step_trace(e, p, vocab_size=vocab, micro_batch=1)
for mode in ("traced", "synthesized", "traced", "synthesized"):
    trace.SECOND_STEP = mode
    t0 = time.time()
    events = trace.step_trace(e, p, vocab_size=vocab, micro_batch=2)
    seconds = time.time() - t0
    model = replay(events)
    print(mode, f"{seconds:.1f}s", model.peak_allocated, model.peak_reserved, flush=True)
