"""Replay an allocation trace through memlab's model of the CUDA caching allocator (memlab.core.predict.allocator): the
memory the allocator would reserve.

Two traces:
- a real one, from `memlab run --memory-snapshot` on a GPU (the run folder's memory_snapshot.pickle): the model's
  reserved peak is set beside the allocator's own (its segment events), which tells how well the model follows
  the allocator when the trace is exact;
- a fake-tensor one, on this machine: one training step of a profile at a micro-batch, on fake tensors (no memory,
  no GPU; memlab's `estimate --method fake` machinery), with what a GPU step allocates and a CPU's does not added
  (below); `--device-kernels` leaves this machine's own SDPA and dropout in.

    python bench/allocator_replay.py runs/<run>/memory_snapshot.pickle [--cap 24GiB] [--expandable]
    python bench/allocator_replay.py --fake seed-so-posts bf16 64 [--set data.tokenizer="bpe:8192"] [--cap 23.26GiB]
    python bench/allocator_replay.py --against-h100     # the table below, from the committed runs
    python bench/allocator_replay.py --against-h100 --standins   # the profiles memlab.core.predict.standins covers
    python3 bench/allocator_replay.py --against-cuda    # on a GPU: the model beside this torch's own allocator

Against the GPU (`python bench/allocator_replay.py --against-h100`, 2026-11-26 13:05 UTC, on a CPU machine: fake traces, each
beside the committed H100 run of the same profile, experiment and micro-batch, then the max micro-batch replayed
under the allocator budget the H100's find-batch searched under; tests/test_allocator_model.py checks some of them).
Nothing in the model was fitted to these: its constants are the allocator's. What the fake trace adds to a CPU's
fake step, each found by setting a real H100 trace beside it (bench/replay_check.sh,
tests/data/gpu/replay-check-h100/) or in PyTorch's source, none a fitted size: SDPA and dropout as CUDA's fused
kernels save them (no T x T; a bool mask), the two cuBLAS workspaces (32 MiB each on Hopper, kept for the process:
the backward's landed in the first step's freed logits segment on the seed shape, which is what made it fragment
31%), the fp32 temporary of CUDA's softmax backward (gpt2s gradcp), and the blocks kernels allocate and free inside
one call (memlab.core.predict.cuda_temporaries: a bias gradient's reduce staging buffer, cuDNN's and flash's backward
workspaces; tests/data/gpu/replay-check-h100/transients/). Before them the seed shape's SDPA-with-dropout profiles
replayed 129 for find-batch's 102, and gpt2s gradcp 48 for 40.

| experiment, profile, micro-batch | allocated: replay / H100 GiB | reserved: replay / H100 GiB | H100 run |
|:--|--:|--:|:--|
| gpt2s bf16 16 | 7.91 / 7.91 (-0.0%) | 8.53 / 8.53 (+0.0%) | frontier-h100/a/runs/20261125-111237-bf16-cbd0 |
| gpt2s gradcp_bf16 16 | 3.24 / 3.24 (-0.1%) | 3.71 / 3.71 (-0.1%) | frontier-h100/a/runs/20261125-111604-gradcp_bf16-8ba0 |
| gpt2s chunked_ce 16 | 6.89 / 6.89 (-0.0%) | 7.21 / 7.21 (+0.0%) | frontier-h100/b/runs/20261125-114949-chunked_ce-9133 |
| gpt2s selective 16 | 7.01 / 7.01 (-0.0%) | 7.18 / 7.18 (-0.0%) | frontier-h100/a/runs/20261125-111618-selective-43de |
| bigvocab bf16 24 | 41.06 / 41.06 (-0.0%) | 45.92 / 45.92 (-0.0%) | frontier-h100/b/runs/20261125-115115-bf16-3c7a |
| bigvocab chunked_ce 24 | 12.18 / 12.18 (-0.0%) | 13.63 / 13.63 (-0.0%) | frontier-h100/b/runs/20261125-115137-chunked_ce-497b |
| seed-so-posts baseline 64 | 11.65 / 11.65 (-0.0%) | 14.66 / 14.66 (+0.0%) | replay-check-h100/runs/seed_baseline/20261125-153923-baseline-38cf |
| seed-so-posts gradcp 64 | 9.55 / 9.55 (-0.0%) | 9.85 / 9.85 (-0.0%) | study-so-posts-h100/runs/20261125-095940-gradcp-ac9a |
| seed-so-posts bf16 64 | 10.11 / 10.11 (-0.0%) | 14.65 / 14.65 (+0.0%) | replay-check-h100/runs/seed_bf16/20261125-153835-bf16-dc4b |
| seed-so-posts fp16 64 | 10.11 / 10.11 (-0.0%) | 14.65 / 14.65 (+0.0%) | study-so-posts-h100/runs/20261125-095909-fp16-0ddb |
| seed-so-posts chunked_ce 64 | 3.27 / 3.27 (-0.0%) | 4.29 / 4.29 (+0.0%) | study-so-posts-h100/runs/20261125-095647-chunked_ce-b17c |

| experiment, profile | allocator budget GiB | max micro-batch: replay / find-batch on the GPU |
|:--|--:|--:|
| gpt2s bf16 | 12.00 | 24 / 24 (+0.0%) |
| gpt2s baseline | 12.00 | 8 / 8 (+0.0%) |
| gpt2s chunked_ce | 12.00 | 29 / 30 (-3.3%) |
| gpt2s selective | 12.00 | 27 / 27 (+0.0%) |
| gpt2s gradcp_bf16 | 12.00 | 68 / 68 (+0.0%) |
| gpt2s gradcp | 12.00 | 40 / 40 (+0.0%) |
| gpt2s gradcp_every2 | 12.00 | 35 / 35 (+0.0%) |
| gpt2s fp16 | 12.00 | 24 / 24 (+0.0%) |
| gpt2s flash_gradcp | 12.00 | 68 / 68 (+0.0%) |
| gpt2s fused_adamw | 12.00 | 24 / 24 (+0.0%) |
| seed-so-posts baseline | 23.26 | 101 / 102 (-1.0%) |
| seed-so-posts gradcp | 23.26 | 152 / 153 (-0.7%) |
| seed-so-posts gradcp_bf16 | 23.26 | 135 / 135 (+0.0%) |
| seed-so-posts bf16 | 23.26 | 102 / 102 (+0.0%) |
| seed-so-posts selective | 23.26 | 102 / 103 (-1.0%) |
| seed-so-posts chunked_ce | 23.26 | 1854 / 1961 (-5.5%) |
| seed-so-posts bf16 (expandable) | 23.26 | 102 / 102 (+0.0%) |
| seed-so-posts baseline (expandable) | 23.28 | 102 / 101 (+1.0%) |
| seed-so-posts chunked_ce (expandable) | 23.26 | 1916 / 1916 (+0.0%) |
| gpt2s bf16 (expandable) | 11.26 | 23 / 23 (+0.0%) |
| gpt2s chunked_ce (expandable) | 11.26 | 29 / 29 (+0.0%) |
| gpt2s gradcp (expandable) | 11.28 | 32 / 32 (+0.0%) |
| heldout_deep.toml bf16 | 23.26 | 39 / 39 (+0.0%) |
| heldout_deep.toml chunked_ce | 23.26 | 41 / 41 (+0.0%) |
| heldout_long.toml bf16 | 23.26 | 15 / 15 (+0.0%) |
| heldout_long.toml gradcp_bf16 | 23.26 | 21 / 21 (+0.0%) |
| heldout_deep.toml compile | 23.26 | 43 / 42 (+2.4%) |
| heldout_long.toml compile | 23.26 | 26 / 26 (+0.0%) |
| heldout_long.toml compile_budget | 23.26 | 32 / 32 (+0.0%) |

Since 2026-11-26 12:00 UTC the fake trace sums a tensor's two gradients in place, as autograd's engine does on the
GPU (a dispatch mode made every such sum a new block: allocation_trace._engine_accumulates_in_place), and makes
dropout's mask before its output, as CUDA's kernel does; and a search's replay starts with what the memory cap's
own measurement allocates before the model (a matrix, its square, the main thread's cuBLAS workspace:
allocation_trace._memory_cap_measurement), as find-batch's probes run under --gpu-memory (the gpt2s searches under
12 GiB above predate that measurement and replay without it). All three were found on complete H100 traces of
find-batch-like runs (bench/replay_check.sh probe:..., `tests/data/gpu/replay-check-h100/`): the fat held-out shape's
gradcp_every2 reserves 1.78 GiB more at 101 than at 100, and the mid shape's reserved 20.42 GiB at 27 under the cap
and 22.18 without it; the fake traces now give both to the hundredth (tests/test_allocator_model.py). Every reserved
figure above is within 0.1% of the H100's; of the max batches, seed baseline moved to 101 (was 102), seed gradcp to
152 (151), seed chunked_ce to 1854 (1788) and, with expandable segments, to 1916 (1903), find-batch's. Since 13:00
UTC best fit breaks a tie between equal free blocks toward the newer large segment (allocator_model's note: the
driver's addresses); that moved deep chunked_ce to 41 and long compile_budget to 32, find-batch's (42 and 33
before), and no other row.

The replayed max micro-batch is a fit without an allocator retry, as find-batch counts one (batchfind.clean_fit).
On the sixteen H100 searches, on which the trace's missing allocations were found (not held out), it is never above
find-batch's and within 5.5% (14 within 1%; gpt2s chunked_ce 29 for 30 since the kernels' temporaries, seed chunked_ce 1854 for 1961). Held out
from the allocator model: the six searches with expandable segments (tests/data/gpu/expandable-check-h200/, an
H200; the expandable mode was written from the allocator's source without them) and the four on the deep and long shapes (estimate-heldout-h100/frontier/find-batch/): within 1%,
one of them one batch above find-batch's at the budget the GPU measured (seed-so-posts baseline with expandable
segments, 102 for 101: the GPU's 102 needed one retry, the replay's none; deep chunked_ce was 42 for 41 until best
fit's ties went to the newer segment). The
compiled steps' replay (compile_budget_model.step_events) was checked on the seed shape and gpt2s while it was
written (398 / 430 for 400 / 432, 42 for 42: not held out), then against three searches it had not seen (deep
compile, long compile and compile_budget, estimate-heldout-h100/frontier/find-batch/): 43 for 42, 26 for 26, 33
for 32 (32 since best fit's ties go to the newer segment). `memlab estimate --method fake` takes the CUDA context as its constant 1.22 GiB, not the 0.72-0.74 the GPU
measured, and there answers 100, 41, 41, 25 and 32 for the five cases one above: never above find-batch's. Before a replayed fit had to be retry-free in the default mode too, the deep shape's bf16
and chunked_ce replayed 40 and 43. Near the boundary the replayed fit
is not monotone in the batch (gradcp_every2 fits 35 and 37, not 36 or 38), so a plain bisection's answer depends on
where it starts (37 from 35). The search (memlab.core.predict.axis) therefore confirms that the batch below its
answer fits too, and searches on below one that does not: 35, find-batch's answer. The real allocator follows the same policy, so
find-batch's bisection, which assumes a monotone fit, may meet the same. Not modelled: compiled steps (Inductor
plans its own buffers), several streams.

`--standins` (2026-11-26): offload, the CUDA-only optimizers, the fused linear cross-entropies and bf16_pure replay
through memlab.core.predict.standins (sizes from the libraries' source; seed-so-posts and gpt2s/bigvocab seen while
it was written, deep and long held out). Reserved at the measured batch, with the kernels' own temporaries
(memlab.core.predict.cuda_temporaries, found on the long shape's liger_ce and cce traces: not held out there): within 1%
everywhere but deep act_offload +3.2%, long cce -1.6% and bigvocab liger_ce +5.5% (before those temporaries
liger_ce and cce were 10% low on the long shape, leanest 12.9% and 4.5% low on the long and deep shapes). Max
micro-batch, searched: act_offload 136 / 136, act_offload_overlap 133 / 132, leanest 5108 / 5140, adamw8bit
102 / 102, bf16_sr 103 / 103, liger_ce 2048 / 2048, cce 2120 / 2120, adamw4bit 102 / 108, optim_offload and
paged_adamw8bit 102 / 114; gpt2s under 12 GiB adamw8bit and optim_offload 26 / 26, leanest 164 / 148 (over, cause
not found). Held-out searches after the temporaries (bench/results/prediction-check/heldout-2/, an H100, a 24 GiB
card): long leanest 78 / 78, cce 32 / 32, liger_ce with expandable segments 31 / 31; deep liger_ce 42 / 41 (over),
leanest 306 / 307, bf16 with expandable segments 38 / 38.
"""

from __future__ import annotations

import argparse
import functools
import pickle
from pathlib import Path

from memlab.core.predict.trace import fake_trace as _trace_of
from memlab.core.predict.allocator import OutOfMemory, replay

GIB = 2**30


def fake_trace(experiment_name: str, profile_name: str, micro_batch: int, overrides: list[str],
               gpu_kernels: bool = True, compiled: bool = False) -> list[tuple]:
    """memlab.core.predict.trace.fake_trace for a built-in experiment and profile, as memlab run resolves them; with
    `compiled`, the trace the predictor replays (step_trace: a compiled step's own graphs where it reads them)."""
    import torch

    from memlab.core.predict.trace import step_trace

    from memlab.cli.options import resolve
    from memlab.core.predict.analytic import vocab_for

    device = "cuda" if torch.cuda.is_available() else "cpu"
    experiment, profile = resolve(experiment_name, profile_name, device, overrides)
    if compiled:
        return step_trace(experiment, profile, vocab_size=vocab_for(experiment)[0], micro_batch=micro_batch, capped=False)
    return _trace_of(experiment, profile, vocab_size=vocab_for(experiment)[0], micro_batch=micro_batch,
                     gpu_kernels=gpu_kernels)


def snapshot_trace(snapshot: dict, device: int = 0) -> tuple[list[tuple], int]:
    """A real trace, from `memlab run --memory-snapshot` on a GPU: the (alloc / free) events of one device's trace, and the allocator's own reserved peak over it (segment
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


RESULTS = Path(__file__).resolve().parents[1] / "tests" / "data" / "gpu"  # the GPU runs and logs these checks read
SEED_DATA = ['data.tokenizer="bpe:8192"', 'data.source="stdlib"']  # the seed study's corpus and tokenizer
AGAINST_H100 = [("gpt2s", p, 16, []) for p in ("bf16", "gradcp_bf16", "chunked_ce", "selective")] + \
    [("bigvocab", p, 24, []) for p in ("bf16", "chunked_ce")] + \
    [("seed-so-posts", p, 64, SEED_DATA) for p in ("baseline", "gradcp", "bf16", "fp16", "chunked_ce")]
# The profiles the replay covers through memlab.core.predict.standins (offload, the CUDA-only optimizers, the fused
# linear cross-entropies, bf16_pure), beside every committed run of them; the deep and long shapes held out.
STANDIN_PROFILES = ("act_offload", "act_offload_overlap", "optim_offload", "leanest", "adamw8bit", "adamw4bit",
                    "paged_adamw8bit", "bf16_sr", "liger_ce", "cce")
HELD_OUT_SHAPES = [(f"bench/experiments/heldout_{e}.toml", b) for e, b in (("deep", 8), ("long", 2))]
AGAINST_H100_STANDINS = [("seed-so-posts", p, 64, SEED_DATA) for p in STANDIN_PROFILES] + \
    [("gpt2s", p, 16, []) for p in STANDIN_PROFILES] + [("bigvocab", p, 24, []) for p in STANDIN_PROFILES] + \
    [(e, p, b, []) for e, b in HELD_OUT_SHAPES for p in STANDIN_PROFILES]
# gpt2s act_offload_overlap ran three times as memlab.core.offload changed (frontier-h100/a, a2, c): the last is
# today's code (record_stream gone: the first reserved 7.57 GiB for 2.86 allocated)
RUN_CHOICE = {("gpt2s", "act_offload_overlap", 16): "frontier-h100/c/runs/20261125-120227-act_offload_overlap-3bc8"}


def h100_run(experiment: str, profile: str, micro_batch: int) -> dict | None:
    """The summary of the first finished committed run (tests/data/gpu/) of this profile, experiment and micro-batch
    (RUN_CHOICE's where it names one); an experiment file is named by its stem, as run.json names it."""
    name = Path(experiment).stem if experiment.endswith(".toml") else experiment
    chosen = RUN_CHOICE.get((name, profile, micro_batch))
    if chosen:
        return next(iter(_finished_runs(chosen).values()), None)
    return _finished_runs().get((name, profile, micro_batch))


@functools.cache
def _finished_runs(under: str = "") -> dict[tuple[str, str, int], dict]:
    """Every finished committed run's summary (under one folder of tests/data/gpu/, else all) by (experiment, profile,
    micro-batch), the first in path order: read once, not once a case."""
    import json

    import polars as pl

    found: dict[tuple[str, str, int], dict] = {}
    for path in sorted((RESULTS / under).glob("**/summary.parquet")):
        summary = pl.read_parquet(path).to_dicts()[0]
        if summary["status"] != "finished":
            continue
        run = json.loads((path.parent / "run.json").read_text())
        key = (run["experiment"]["name"], summary["profile"], summary["micro_batch"])
        found.setdefault(key, summary | {"path": str(path.parent.relative_to(RESULTS))})
    return found


def against_h100(cases: list[tuple] = AGAINST_H100, skip_missing: bool = False) -> None:
    print("| experiment, profile, micro-batch | allocated: replay / H100 GiB | reserved: replay / H100 GiB | H100 run |")
    print("|:--|--:|--:|:--|")
    for experiment, profile, b, sets in cases:
        run = h100_run(experiment, profile, b)
        label = f"{Path(experiment).stem if experiment.endswith('.toml') else experiment} {profile} {b}"
        if run is None:
            if not skip_missing:
                print(f"| {label} | no committed run | | |")
            continue
        model = replay(fake_trace(experiment, profile, b, sets))
        alloc, reserved = run["peak_alloc_bytes"], run["peak_reserved_bytes"]
        print(f"| {label} | {model.peak_allocated / GIB:.2f} / {alloc / GIB:.2f} ({model.peak_allocated / alloc - 1:+.1%}) | "
              f"{model.peak_reserved / GIB:.2f} / {reserved / GIB:.2f} ({model.peak_reserved / reserved - 1:+.1%}) | {run['path']} |")


# The H100's find-batch answers: gpt2s under an allocator cap of 12 GiB (estimate-h100/find_batch_12gib*.parquet,
# the cap then applied to the allocator alone), the seed study's under a 24 GiB card (study-so-posts-h100/study.json,
# measured again on 2026-11-26 with find-batch's rule on allocator retries, under today's cap: the card less the
# driver's reserve and what the probe measures outside the allocator, 22.79 GiB in find-batch's probes on that shape,
# prediction-check/seed-recheck.txt; the figures before, 23.26 GiB, counted retried probes as fits).
SEED_BUDGET = int(22.79 * GIB)
MAX_BATCH_CASES = [("gpt2s", p, [], 12 * GIB, "estimate-h100") for p in
                   ("bf16", "baseline", "chunked_ce", "selective", "gradcp_bf16", "gradcp", "gradcp_every2", "fp16", "flash_gradcp", "fused_adamw")] + \
    [("seed-so-posts", p, SEED_DATA, SEED_BUDGET, "study-so-posts-h100") for p in ("baseline", "gradcp", "gradcp_bf16", "bf16", "selective", "chunked_ce")]
STANDIN_MAX_BATCH_CASES = [("gpt2s", p, [], 12 * GIB, "estimate-h100") for p in ("leanest", "adamw8bit", "optim_offload")] + \
    [("seed-so-posts", p, SEED_DATA, SEED_BUDGET, "study-so-posts-h100") for p in STANDIN_PROFILES]
# Held out from the allocator model (measured after it was written, on an H200, find-batch's own logs): with expandable
# segments on, the seed shape under 24 GiB and gpt2s under 12 GiB (expandable-check-h200/, bench/expandable_check.sh),
# written without them; with them off, the deep and long shapes under 24 GiB (estimate-heldout-h100/frontier/find-batch/).
EXPANDABLE = ["allocator.expandable_segments=true"]
HELD_OUT_CASES = [("seed-so-posts", p, SEED_DATA + EXPANDABLE, f"expandable-check-h200/seed_{p}.log") for p in ("bf16", "baseline", "chunked_ce")] + \
    [("gpt2s", p, EXPANDABLE, f"expandable-check-h200/gpt2s_{p}.log") for p in ("bf16", "chunked_ce", "gradcp")] + \
    [(f"bench/experiments/heldout_{e}.toml", p, [], f"estimate-heldout-h100/frontier/find-batch/{e}_{p}.log")
     for e, p in (("deep", "bf16"), ("deep", "chunked_ce"), ("long", "bf16"), ("long", "gradcp_bf16"),
                  ("deep", "compile"), ("long", "compile"), ("long", "compile_budget"))]


def logged_search(log: str) -> tuple[int, int]:
    """find-batch's answer and the allocator budget it searched under, from its log."""
    import re

    text = (RESULTS / log).read_text()
    found = int(re.search(r"^max micro-batch: (\d+)", text, re.M)[1])
    budget = float(re.search(r"allocator budget ([\d.]+) GiB", text)[1])
    return found, int(budget * GIB)


def found_max_batch(experiment: str, profile: str, where: str) -> int | None:
    import json

    import polars as pl

    if where == "estimate-h100":
        for path in sorted((RESULTS / where).glob("find_batch_12gib*.parquet")):
            rows = pl.read_parquet(path).filter(pl.col("profile") == profile).to_dicts()
            if rows:
                return rows[0]["found_max_batch"]
        return None
    item = json.loads((RESULTS / where / "study.json").read_text())["items"].get(f"max/{profile}") or {}
    return item.get("max_batch")


def max_batch_against_h100(standins: bool = False) -> None:
    from memlab.cli.options import resolve
    from memlab.core.predict import axis, card as cards
    from memlab.core.predict.analytic import vocab_for

    print("| experiment, profile | allocator budget GiB | max micro-batch: replay / find-batch on the GPU |")
    print("|:--|--:|--:|")
    # gpt2s's 12 GiB searches (estimate-h100) capped the allocator alone, before find-batch's probes measured the
    # card through NVML: no measurement ran before their models (allocation_trace._memory_cap_measurement); later ones did
    if standins:
        cases = [(e, p, sets, budget, found_max_batch(e, p, where), where != "estimate-h100")
                 for e, p, sets, budget, where in STANDIN_MAX_BATCH_CASES]
    else:
        cases = [(e, p, sets, budget, found_max_batch(e, p, where), where != "estimate-h100")
                 for e, p, sets, budget, where in MAX_BATCH_CASES]
        cases += [(e, p, sets, *reversed(logged_search(log)), True) for e, p, sets, log in HELD_OUT_CASES]
    for experiment, profile, sets, budget, found, capped in cases:
        exp, prof = resolve(experiment, profile, "cpu", sets)
        card = cards.Card(budget + cards.context_bytes_here(), None, "", capped=capped)
        replayed = axis.batches(exp, prof, vocab_for(exp)[0], card, margin=0).largest(found or 16, 1 << 20)
        versus = f"{replayed} / {found} ({replayed / found - 1:+.1%})" if found else f"{replayed} / —"
        mode = " (expandable)" if prof.allocator.expandable_segments else ""
        print(f"| {experiment.split('/')[-1]} {profile}{mode} | {budget / GIB:.2f} | {versus} |")


MIB = 2**20


def random_trace(seed: int, keep: int | None = None) -> list[tuple]:
    """Tensors of 512 B to 300 MiB (a third small, a quarter 1-10 MiB) allocated and freed at random; with `keep`, no
    more than `keep` live at once (a bounded working set: long runs under a cap, with retries)."""
    import random

    r = random.Random(seed if keep is None else 1000 + seed)
    live: list[int] = []
    events: list[tuple] = []
    for _ in range(300 if keep is None else 400):
        if (keep is not None and len(live) > keep) or (live and r.random() < (0.45 if keep is None else 0.4)):
            events.append(("free", live.pop(r.randrange(len(live))), 0))
            continue
        kind = r.random()
        top = 300 * MIB if keep is None else 200 * MIB
        small, mid = (0.3, 0.55) if keep is None else (0.3, 0.5)
        size = r.randint(1, MIB) if kind < small else r.randint(MIB + 1, 10 * MIB) if kind < mid else r.randint(10 * MIB, top)
        live.append(len(events))
        events.append(("alloc", len(events), size))
    return events


def hand_traces() -> dict[str, tuple[list[tuple], int | None]]:
    """The hand-made traces of tests/test_allocator_model.py's expandable tests, with their caps."""
    a, f = "alloc", "free"
    return {
        "hole": ([(a, "x", 100 * MIB), (f, "x", 0), (a, "a", 40 * MIB), (a, "b", 40 * MIB), (f, "a", 0), (a, "c", 50 * MIB)], None),
        "pages": ([(a, "s", 100), (a, "big", 21 * MIB), (a, "mid", 15 * MIB)], None),
        "prefer_mid": ([(a, "a", 30 * MIB), (a, "b", 10 * MIB), (a, "c", 15 * MIB), (f, "a", 0), (a, "d", 4 * MIB), (a, "e", 30 * MIB)], None),
        "unmap_retry": ([(a, "x", 100 * MIB), (f, "x", 0), (a, "a", 10 * MIB), (a, "b", 95 * MIB)], 120 * MIB),
        "retry_gap": ([(a, "x", 60 * MIB), (a, "y", 30 * MIB), (f, "x", 0), (a, "z", 70 * MIB)], 120 * MIB),
    }


def stepwise(events: list[tuple], cap: int | None, expandable: bool) -> dict:
    """The model's reserved bytes after each event, its retries, and the event it ran out of memory at."""
    from memlab.core.predict.allocator import Allocator, ExpandableAllocator

    model = ExpandableAllocator(cap) if expandable else Allocator(cap)
    reserved: list[int] = []
    for i, (action, ident, nbytes) in enumerate(events):
        try:
            model.malloc(ident, nbytes) if action == "alloc" else model.free(ident)
        except OutOfMemory:
            return {"reserved": reserved, "oom_at": i, "retries": model.retries}
        reserved.append(model.reserved)
    return {"reserved": reserved, "oom_at": None, "retries": model.retries}


def cuda_stepwise(job_file: str) -> None:
    """--cuda-child: the same, from this process's own CUDA caching allocator (its settings come from the env)."""
    import json

    import torch

    job = json.loads(Path(job_file).read_text())
    if job["fraction"] is not None:
        torch.cuda.set_per_process_memory_fraction(job["fraction"])
    live, reserved, oom_at = {}, [], None
    for i, (action, ident, nbytes) in enumerate(job["events"]):
        try:
            if action == "alloc":
                live[ident] = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
            else:
                del live[ident]
        except torch.OutOfMemoryError:
            oom_at = i
            break
        reserved.append(torch.cuda.memory_stats()["reserved_bytes.all.current"])
    print(json.dumps({"reserved": reserved, "oom_at": oom_at, "retries": torch.cuda.memory_stats()["num_alloc_retries"]}))


def against_cuda() -> None:
    """Every trace in each mode, with and without caps, in a fresh process each (the allocator reads its settings
    once): the model's step-by-step figures beside the allocator's."""
    import torch

    total = torch.cuda.mem_get_info()[1]
    cases = [(name, events, cap, expandable) for name, (events, cap) in hand_traces().items() for expandable in (False, True)]
    for keep, fractions in ((None, (0.7, 0.45)), (10, (0.9, 0.75, 0.6))):
        for seed in range(8):
            events = random_trace(seed, keep)
            for expandable in (False, True):
                peak = max(stepwise(events, None, expandable)["reserved"])
                caps = ([None] if keep is None else []) + [int(peak * f) // MIB * MIB for f in fractions]
                cases += [(f"random{seed}" + ("" if keep is None else f" keep {keep}"), events, cap, expandable) for cap in caps]
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name()}")
    same = sum(_compare_on_cuda(*case, total) for case in cases)
    print(f"{same} of {len(cases)} traces: the model's reserved bytes after every event, retries and out-of-memory point are the allocator's")


def _compare_on_cuda(name: str, events: list[tuple], cap: int | None, expandable: bool, total: int) -> bool:
    import json
    import os
    import subprocess
    import sys
    import tempfile

    fraction = cap / total if cap else None
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump({"events": events, "fraction": fraction}, f)
    env = dict(os.environ, PYTORCH_CUDA_ALLOC_CONF=f"expandable_segments:{expandable}")
    out = subprocess.run([sys.executable, __file__, "--cuda-child", f.name], env=env, capture_output=True, text=True, check=True)
    os.unlink(f.name)
    real = json.loads(out.stdout.strip().splitlines()[-1])
    model = stepwise(events, int(fraction * total) if cap else None, expandable)  # the allocator's own rounding of the cap
    differ = next((i for i, (x, y) in enumerate(zip(real["reserved"], model["reserved"])) if x != y), None)
    print(f"{name}, expandable segments {'on' if expandable else 'off'}, cap {f'{cap // MIB} MiB' if cap else 'none'}: "
          f"{'same' if real == model else 'DIFFERENT'} · allocator {real['retries']} retries, out of memory at {real['oom_at']} · "
          f"model {model['retries']}, {model['oom_at']}" + (f" · reserved first differs after event {differ}" if differ is not None else ""))
    return real == model


def main() -> None:
    from memlab.core.units import parse_size

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("snapshot", nargs="?", help="a memory_snapshot.pickle from memlab run --memory-snapshot")
    ap.add_argument("--fake", nargs=3, metavar=("EXPERIMENT", "PROFILE", "MICRO_BATCH"), help="trace one step on fake tensors here")
    ap.add_argument("--set", action="append", default=[], help="an experiment override, as memlab's --set")
    ap.add_argument("--device-kernels", action="store_true", help="--fake: this machine's own SDPA and dropout, not the fused kernels' tensors (on a CPU the math path: it saves T x T)")
    ap.add_argument("--cap", help="the allocator's budget, e.g. 23.26GiB: the model then releases free segments and may run out")
    ap.add_argument("--compiled", action="store_true", help="--fake: the trace the predictor replays (a compiled step's own graphs)")
    ap.add_argument("--dump", help="also write the trace as JSON lines (action, id, bytes, where), to set two traces side by side")
    ap.add_argument("--expandable", action="store_true", help="replay with expandable segments (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True)")
    ap.add_argument("--against-h100", action="store_true", help="replay fake traces of the committed H100 runs' cases and print the table")
    ap.add_argument("--against-cuda", action="store_true", help="on a GPU: the model beside this torch's allocator on hand-made and random traces")
    ap.add_argument("--standins", action="store_true", help="with --against-h100: the profiles memlab.core.predict.standins covers, instead")
    ap.add_argument("--cuda-child", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.cuda_child:
        return cuda_stepwise(a.cuda_child)
    if a.against_cuda:
        return against_cuda()
    if a.against_h100:
        against_h100(AGAINST_H100_STANDINS, skip_missing=True) if a.standins else against_h100()
        print()
        return max_batch_against_h100(a.standins)
    if (a.snapshot is None) == (a.fake is None):
        ap.error("give a snapshot file or --fake EXPERIMENT PROFILE MICRO_BATCH")
    real = None
    if a.snapshot:
        with open(a.snapshot, "rb") as f:
            events, real = snapshot_trace(pickle.load(f))  # a file memlab wrote: the user's own
    else:
        events = fake_trace(a.fake[0], a.fake[1], int(a.fake[2]), a.set, gpu_kernels=not a.device_kernels,
                            compiled=a.compiled)
    if a.dump:
        import json

        with open(a.dump, "w", encoding="utf-8") as f:
            f.writelines(json.dumps({"action": e[0], "id": str(e[1]), "bytes": e[2], "where": e[3]}) + "\n" for e in events)
    cap = parse_size(a.cap, "--cap") if a.cap else None
    try:
        model = replay(events, cap, expandable=a.expandable)
    except OutOfMemory as e:
        print(f"out of memory in the model: {e}")
        raise SystemExit(1) from None
    frag = 1 - model.peak_allocated / model.peak_reserved if model.peak_reserved else 0.0
    print(f"{len(events):,} events · allocated peak {model.peak_allocated / GIB:.2f} GiB · model reserved peak "
          f"{model.peak_reserved / GIB:.2f} GiB (fragmentation {frag:.1%}, {model.retries} retries)"
          + (f" · the allocator's own reserved peak {real / GIB:.2f} GiB" if real is not None else ""))


if __name__ == "__main__":
    main()
