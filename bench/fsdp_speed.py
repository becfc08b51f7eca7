"""Where FSDP2's step time goes against DDP's, at equal batch (issue 49): one torchrun process group, many builds.

    torchrun --standalone --nproc_per_node 2 bench/fsdp_speed.py --out DIR [--cases FILE] [--steps 15] [--rounds 2]

Each case is `experiment|profile|set,set,...` (a line of --cases; bench/fsdp_cases/ holds the lists run). Every rank builds the
step as the engine builds it (memlab.core.distributed.setup, then build_step) and runs it as the engine's loop does
(phase meters, the loss all-reduced and read a step late), on random tokens:
3 warm-up steps, then `--steps` steps between two device synchronizes; the step time is the slowest rank's. Then
two steps under torch.profiler on rank 0: the compute stream's busy time (the union of its non-NCCL kernels), the NCCL kernels' time,
the host's busy time, and the ops with the most host and device time. Rows land in DIR/fsdp_speed.jsonl as they
come (rank 0), the report in DIR/fsdp_speed.md is rewritten after each case.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist

from memlab.core import distributed
from memlab.core.config import apply_overrides, load_experiment, load_profile
from memlab.core.engine import prepare
from memlab.core.meters import PhaseMeter
from memlab.core.techniques import build_step

# The first pass: gpt2s at the GPU default batch per GPU (16 x 1024) and Llama-3.2-1B (2 x 2048), each knob alone
DEFAULT_CASES = Path(__file__).parent / "fsdp_cases" / "knobs.txt"


def random_batches(step, vocab: int, n: int, seq: int, device) -> list:
    g = torch.Generator().manual_seed(dist.get_rank())
    shape = (step.micro_batch, seq)
    return [[(torch.randint(0, vocab, shape, generator=g).to(device), torch.randint(0, vocab, shape, generator=g).to(device))]
            for _ in range(n)]


CUDA = torch.cuda.is_available()  # False: a smoke test of the script on a CPU host (gloo), nothing to read


def sync() -> None:
    if CUDA:
        torch.cuda.synchronize()


def slowest(x: float) -> float:
    t = torch.tensor([x], device="cuda" if CUDA else "cpu")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def engine_steps(step, batches: list) -> list:
    """The engine's loop (memlab.core.engine._train_loop) without the loader: phase meters, the loss all-reduced and
    read one step late. Returns the steps' records (phase times from CUDA events)."""
    meter, records = PhaseMeter(step.device), []
    for i, mb in enumerate(batches):
        meter.start_step(i)
        result = step.run(mb, meter)
        records.append(meter.finish_step(step.dist.reduce_loss(result.loss_sum), result.grad_norm))
    records.append(meter.flush())
    return [r for r in records if r is not None]


class GcClock:
    """Python's garbage collections during the timed steps, through gc.callbacks: how many, and their wall time."""

    def __init__(self):
        self.count, self.seconds, self._t0 = 0, 0.0, 0.0

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
        else:
            self.count += 1
            self.seconds += time.perf_counter() - self._t0

    def __enter__(self):
        gc.callbacks.append(self)
        return self

    def __exit__(self, *exc):
        gc.callbacks.remove(self)


def gc_mode(mode: str) -> None:
    """Before the timed steps: `auto` leaves Python's collector as it is; `freeze` collects, then moves every object
    alive (the model, the libraries) to the permanent generation, so later collections skip them."""
    if mode == "freeze":
        gc.collect()
        gc.freeze()
    elif mode != "auto":
        raise SystemExit(f"gc={mode}: use auto or freeze")


def timed_steps(step, batches: list) -> tuple[float, dict[str, float], int, dict]:
    """The slowest rank's wall ms a step; this rank's median phase times (CUDA events) and its step peak; the slowest
    rank's garbage collections a step."""
    sync()
    dist.barrier()
    t0 = time.perf_counter()
    with GcClock() as collected:
        records = engine_steps(step, batches)
    sync()
    phases = {}
    for phase in ("fwd", "bwd", "opt"):
        times = sorted(getattr(r, f"{phase}_ms") or 0.0 for r in records)
        phases[f"{phase}_ms"] = times[len(times) // 2] if times else 0.0
    # the meters reset the peak at each phase: the step's peak is the largest phase peak they recorded
    peak = max((v or 0 for r in records for v in r.peak.values()), default=0)
    gcs = {"gc_per_step": slowest(collected.count / len(batches)), "gc_ms_per_step": slowest(collected.seconds * 1000 / len(batches))}
    return slowest((time.perf_counter() - t0) / len(batches) * 1000), phases, peak, gcs


def _union_ms(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, -1.0
    for a, b in sorted(intervals):
        if b > end:
            total += b - max(a, end)
            end = b
    return total / 1000


def profiled(step, batches: list) -> dict:
    """Two steps under torch.profiler (rank 0 records; the others run the same steps)."""
    if dist.get_rank() != 0:
        engine_steps(step, batches)
        sync()
        return {}
    acts = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if CUDA else [])
    with torch.profiler.profile(activities=acts) as prof:
        t0 = time.perf_counter()
        engine_steps(step, batches)
        sync()
        wall = (time.perf_counter() - t0) * 1000 / len(batches)
    n = len(batches)
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA and e.time_range.elapsed_us() > 0]
    nccl = [e for e in kernels if "nccl" in e.name.lower()]
    compute = [e for e in kernels if "nccl" not in e.name.lower()]
    events = prof.key_averages()
    labelled: dict[str, float] = {}  # FSDP2's and the optimizer's record_function ranges, inclusive host time
    for e in events:
        if e.key.startswith(("FSDP::", "Optimizer.", "DistributedDataParallel", "aten::_foreach_norm")):
            name = e.key.split(" (")[0]
            labelled[name] = labelled.get(name, 0.0) + e.cpu_time_total / 1000 / n
    host_top = sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)[:8]
    dev_top = sorted(events, key=lambda e: e.self_device_time_total, reverse=True)[:8]
    return {
        "profiled_wall_ms": wall,
        "compute_busy_ms": _union_ms([(e.time_range.start, e.time_range.end) for e in compute]) / n,
        "nccl_ms": sum(e.time_range.elapsed_us() for e in nccl) / 1000 / n,
        "host_busy_ms": sum(e.self_cpu_time_total for e in events) / 1000 / n,
        "host_top": [(e.key[:50], round(e.self_cpu_time_total / 1000 / n, 2)) for e in host_top],
        "host_labelled": sorted(((k, round(v, 2)) for k, v in labelled.items()), key=lambda kv: -kv[1])[:12],
        "device_top": [(e.key[:50], round(e.self_device_time_total / 1000 / n, 2)) for e in dev_top],
    }


def run_case(line: str, steps: int) -> dict:
    experiment, profile, sets = (line.split("|") + [""])[:3]
    e, p = load_experiment(experiment), load_profile(profile)
    # gc=MODE among the sets is the bench's own (gc_mode), not a profile field
    mode = next((s.split("=", 1)[1] for s in sets.split(",") if s.startswith("gc=")), "auto")
    apply_overrides(e, p, [s for s in sets.split(",") if s and not s.startswith("gc=")])
    device = torch.device("cuda", torch.cuda.current_device()) if CUDA else torch.device("cpu")
    prepared = prepare(e, p, device, dist.get_world_size())
    dctx = distributed.setup(p, device)
    torch.manual_seed(0)
    step = build_step(e, p, device, prepared.vocab_size, dist=dctx)
    desc = step.applied.get("distributed") if isinstance(step.applied, dict) else None
    data = random_batches(step, min(prepared.vocab_size, 8192), 3 + steps + 2, e.model.seq_len, device)
    engine_steps(step, data[:3])
    gc_mode(mode)
    step_ms, phases, peak_bytes, gcs = timed_steps(step, data[3:3 + steps])
    gc.unfreeze()
    peak = slowest(peak_bytes / 2**30)
    row = {"case": line, "experiment": experiment, "profile": profile, "sets": sets, "world": dist.get_world_size(),
           "micro_batch": step.micro_batch, "seq_len": e.model.seq_len, "step_ms": step_ms,
           "tokens_per_s": e.train.batch_size * e.model.seq_len / step_ms * 1000, "peak_alloc_gib": peak,
           "applied": str(desc), "gc": mode, **gcs, **phases, "gpu": torch.cuda.get_device_name() if CUDA else "cpu", "torch": torch.__version__}
    row.update(profiled(step, data[-2:]))
    del step, data
    gc.collect()
    if CUDA:
        torch.cuda.empty_cache()
    return row


def report(rows: list[dict]) -> str:
    lines = ["# FSDP2 against DDP, step by step (bench/fsdp_speed.py)", "",
             "| round | experiment | profile | sets | step ms | tokens/s | x DDP | peak GiB | compute busy ms | NCCL ms | host busy ms | GCs a step | GC ms a step |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    base = {}
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['round']} | {r['case']} | error: {r['error']} | | | | | | | | |")
            continue
        key = (r["round"], r["experiment"], "optimizer.fused=true" in r["sets"], r.get("gc", "auto"))
        if r["profile"].startswith("ddp"):
            base[key] = r["tokens_per_s"]
        ratio = r["tokens_per_s"] / base[key] if key in base else float("nan")
        lines.append(f"| {r['round']} | {r['experiment']} | {r['profile']} | {r['sets']} | {r['step_ms']:.1f} | {r['tokens_per_s']:,.0f} | {ratio:.2f} | "
                     f"{r['peak_alloc_gib']:.2f} | {r.get('compute_busy_ms', 0):.1f} | {r.get('nccl_ms', 0):.1f} | {r.get('host_busy_ms', 0):.1f} | "
                     f"{r.get('gc_per_step', 0):.2f} | {r.get('gc_ms_per_step', 0):.2f} |")
    lines += ["", "x DDP: against the DDP row of the same round, experiment, optimizer implementation and gc mode. GCs: the slowest "
              "rank's garbage collections during the timed steps (gc.callbacks), and their wall time.", ""]
    for r in rows:
        if "host_top" in r and r["round"] == 1:
            lines += [f"## {r['case']}", "", f"phases (CUDA events, median): fwd {r.get('fwd_ms', 0):.1f} ms, bwd {r.get('bwd_ms', 0):.1f}, "
                      f"opt {r.get('opt_ms', 0):.1f}", "", f"host, labelled ranges (inclusive): {r.get('host_labelled')}", "",
                      f"host top (self): {r['host_top']}", "", f"device top: {r['device_top']}", ""]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--cases", default=str(DEFAULT_CASES), help="a file of experiment|profile|sets lines")
    ap.add_argument("--steps", type=int, default=15)
    ap.add_argument("--rounds", type=int, default=2, help="the whole case list this many times over (interleaved)")
    args = ap.parse_args()
    distributed.init_from_env(torch.device("cuda" if CUDA else "cpu"))
    out = Path(args.out)
    lines = [ln for ln in Path(args.cases).read_text().splitlines() if ln.strip()]
    rows: list[dict] = []
    for round_, line in [(r, ln) for r in range(1, args.rounds + 1) for ln in lines]:
        try:
            row = run_case(line, args.steps) | {"round": round_}
        except Exception as exc:  # noqa: BLE001  (one case's failure is its row; the others go on)
            row = {"case": line, "round": round_, "error": f"{type(exc).__name__}: {str(exc)[:200]}"}
            gc.collect()
            if CUDA:
                torch.cuda.empty_cache()
        if dist.get_rank() == 0:
            rows.append(row)
            out.mkdir(parents=True, exist_ok=True)
            with open(out / "fsdp_speed.jsonl", "a") as f:
                f.write(json.dumps(row) + "\n")
            (out / "fsdp_speed.md").write_text(report(rows))
            print(json.dumps({k: v for k, v in row.items() if k not in ("host_top", "device_top")}), flush=True)
    distributed.shutdown()


if __name__ == "__main__":
    os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
    main()
