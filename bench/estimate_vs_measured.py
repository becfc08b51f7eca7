"""Issue 5 on one GPU: the estimator's predicted peak against the measured one, for every built-in profile on the
GPU default experiment, and its predicted max batch against find-batch's, for a subset. One call, < 8 minutes.

  1. every built-in profile on gpt2s at one micro-batch (--batch, default the experiment's 16), each in its own
     child (`memlab run`, a fresh CUDA context), --steps steps, the first --measure-after left out; --parallel
     children at once, each capped at an equal share of the card (MEMLAB_GPU_MEMORY_BYTES: the cap only bounds the
     allocator, it does not change what a step allocates); a profile that runs out of memory under the cap is run
     again alone, uncapped. measured = summary peak_alloc_bytes (max over phases of max_memory_allocated).
  2. `memlab run --memory-snapshot` once (--snapshot), to check the allocator-history breakdown on a real GPU.
  3. find-batch (grow, then bisect; one child per probe) for --find-batch profiles under --find-gpu-memory, while
     the time budget allows; predicted max batch from the same cap.
  -> <out>/estimate_vs_measured.parquet (one row per run), .json (rows + calibration hints), .md (the tables and
     the command line that made them).

The calibration hints are what the lead sends back: per attention kernel, the median of measured - (predicted
without the workspace constant): the WORKSPACE_BYTES to record in memlab/core/estimate.py; per find-batch, the
usable share of the cap (1 - FRAGMENTATION_MARGIN).

Usage on the GPU machine (see bench/gpu_env.sh for the environment):

    python3 bench/estimate_vs_measured.py --out $OUT/estimate                       # everything, < 8 min
    python3 bench/estimate_vs_measured.py --profiles bf16,leanest --find-batch ''   # a quick look
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from memlab.core.units import GIB, gib, gib_number

EXPERIMENT = "gpt2s"
DEVICE = "cuda"
COMPILE_HEAVY = ("compile", "fastest")  # a minute of Inductor each, cold: started first so they overlap the rest


def log(msg: str) -> None:
    print(msg, flush=True)


def family(profile) -> str:
    """The group a workspace constant is measured for: the attention kernel (compile apart)."""
    if profile.compile.enabled:
        return "compile"
    return profile.attention.kernel


def estimate_row(name: str, batch: int, sets: list[str]) -> dict:
    from memlab.core.predict import analytic as E
    from memlab.core.config import apply_overrides, load_experiment, load_profile

    exp, prof = load_experiment(EXPERIMENT), load_profile(name)
    apply_overrides(exp, prof, sets)
    vocab, _ = E.vocab_for(exp)
    est = E.estimate(exp, prof, vocab_size=vocab, micro_batch=batch)
    ws = est.components["workspace"]
    return {
        "family": family(prof),
        "estimate_bytes": est.total_bytes,
        "estimate_no_workspace_bytes": est.total_bytes - ws,
        "estimate_phase": est.peak_phase,
        "estimate_components": json.dumps(est.components),
        "estimate_phases": json.dumps(est.phases),
        "vocab_size": vocab,
    }


def run_fixed(name: str, args, cap: int | None, runs_dir: Path, extra_args: list[str] | None = None) -> dict:
    from memlab.core.gpu_memory import MEMORY_ENV
    from memlab.core.supervisor import ChildRun, ChildSpec

    from memlab.core.config import load_profile

    # every profile at the same micro-batch; a profile with accumulation keeps it (batch = micro x its steps)
    k = load_profile(name).accumulation.steps
    sets = [f"train.batch_size={args.batch * k}", f"train.steps={args.steps}", f"train.measure_after={args.measure_after}", "train.eval_every=0"]
    env = {MEMORY_ENV: str(cap)} if cap else {}
    spec = ChildSpec(profile=name, experiment=EXPERIMENT, device=DEVICE, runs_dir=str(runs_dir), overrides=sets, env=env, extra_args=extra_args or [])
    t0 = time.monotonic()
    child = ChildRun(spec)
    timer = threading.Timer(args.child_timeout_s, child.cancel, kwargs={"grace_s": 10.0})  # a hung child ends as a row
    timer.start()
    try:
        res = child.wait()
    finally:
        timer.cancel()
    s = res.summary or {}
    row = {
        "profile": name, "kind": "snapshot" if extra_args else "fixed", "status": res.status, "message": (res.message or "")[:300],
        "micro_batch": s.get("micro_batch"), "grad_accum": s.get("grad_accum"), "seconds": time.monotonic() - t0,
        "cap_bytes": cap, "attention_kernel": s.get("attention_kernel"), "gpu_name": s.get("gpu_name"),
        "measured_bytes": s.get("peak_alloc_bytes"), "measured_fwd_bytes": s.get("peak_alloc_fwd_bytes"),
        "measured_bwd_bytes": s.get("peak_alloc_bwd_bytes"), "measured_opt_bytes": s.get("peak_alloc_opt_bytes"),
        "reserved_bytes": s.get("peak_reserved_bytes"), "alloc_retries": s.get("alloc_retries"),
        "engine_estimate_bytes": s.get("estimate_peak_bytes"), "run_dir": res.run_dir,
    }
    try:
        row |= estimate_row(name, args.batch, sets)
    except Exception as e:  # noqa: BLE001 (a row, never a crash)
        row["message"] += f" | estimate failed: {e.__class__.__name__}: {e}"
    if row.get("measured_bytes") and row.get("estimate_bytes"):
        row["error_pct"] = 100.0 * (row["estimate_bytes"] - row["measured_bytes"]) / row["measured_bytes"]
    if extra_args and res.run_dir:
        f = Path(res.run_dir) / "memory_breakdown.json"
        row["breakdown"] = f.read_text() if f.is_file() else None
        snap = Path(res.run_dir) / "memory_snapshot.pickle"
        if snap.is_file() and args.out:  # back with the results: the peak's live blocks can be read on a CPU
            import shutil

            shutil.copy(snap, Path(args.out) / f"snapshot_{name}.pickle")
    return row


def run_find(name: str, args, cap: int, budget_end: float) -> dict:
    from memlab.core import batchfind as bf
    from memlab.core.predict import analytic as E
    from memlab.core.config import load_experiment, load_profile

    exp, prof = load_experiment(EXPERIMENT), load_profile(name)
    prof.accumulation.steps = 1  # the probes train without accumulation (ChildProbe's default): predict the same
    vocab, _ = E.vocab_for(exp)
    predicted = E.predict_max_batch(exp, prof, vocab_size=vocab, memory_bytes=cap)  # cap: the card's total (--gpu-memory)
    start = 1
    while start * 2 <= max(1, int(predicted * 0.9)):
        start *= 2
    probe = bf.ChildProbe(name, EXPERIMENT, [], seq_len=exp.model.seq_len, steps=args.probe_steps, cap_bytes=cap, device=DEVICE)
    row = {"profile": name, "kind": "find_batch", "cap_bytes": cap, "predicted_max_batch": predicted, "family": family(prof)}
    t0 = time.monotonic()

    done: list = []  # every probe so far: a search stopped by the budget still leaves its bracket

    def on_probe(r):
        done.append(r)
        log(f"  find-batch {name}: micro-batch {r.batch} {'fits' if r.fits else 'OOM'} · peak {gib(r.peak_alloc_bytes or 0)} · {r.seconds:.1f} s")
        lo = max((p.batch for p in done if p.fits), default=0)
        exact = any(not p.fits and p.batch == lo + 1 for p in done)
        if time.monotonic() > budget_end and not exact:  # an answer already exact is let through
            raise bf.ProbeError("time budget spent")

    def probe_fields(probes, max_batch: int | None) -> dict:
        best = next((p for p in probes if p.fits and p.batch == max_batch), None)
        return {
            "probes": len(probes),
            "probe_log": json.dumps([{"batch": p.batch, "fits": p.fits, "peak_alloc_bytes": p.peak_alloc_bytes,
                                      "peak_reserved_bytes": p.peak_reserved_bytes, "alloc_retries": p.alloc_retries,
                                      "seconds": round(p.seconds, 1)} for p in probes]),
            "measured_bytes": best.peak_alloc_bytes if best else None, "reserved_bytes": best.peak_reserved_bytes if best else None,
            "alloc_retries": best.alloc_retries if best else None,
        }

    try:
        res = bf.search_max_batch(probe, start=start, on_probe=on_probe)
        row |= probe_fields(res.probes, res.max_batch) | {
            "status": "finished", "found_max_batch": res.max_batch, "min_oom": res.min_oom,
            "estimate_at_found_bytes": E.estimate(exp, prof, vocab_size=vocab, micro_batch=res.max_batch).total_bytes,
            "error_pct": 100.0 * (predicted - res.max_batch) / res.max_batch,
        }
    except Exception as e:  # noqa: BLE001
        lo = max((p.batch for p in done if p.fits), default=None)
        hi = min((p.batch for p in done if not p.fits and (lo is None or p.batch > lo)), default=None)
        row |= probe_fields(done, lo) | {"status": "stopped" if done else "error", "message": f"{e.__class__.__name__}: {e}"[:300],
                                         "largest_fit": lo, "min_oom": hi}
    finally:
        probe.close()
    row["seconds"] = time.monotonic() - t0
    return row


def calibration(rows: list[dict]) -> dict:
    """What to record in memlab/core/estimate.py, from these measurements."""
    from memlab.core.predict.analytic import FRAGMENTATION_MARGIN, WORKSPACE_BYTES

    out: dict = {"workspace_bytes_by_family": {}, "current_workspace_bytes": WORKSPACE_BYTES, "current_fragmentation_margin": FRAGMENTATION_MARGIN}
    by: dict[str, list[int]] = {}
    for r in rows:
        if r.get("kind") == "fixed" and r.get("status") == "finished" and r.get("measured_bytes") and r.get("estimate_no_workspace_bytes"):
            by.setdefault(r["family"], []).append(r["measured_bytes"] - r["estimate_no_workspace_bytes"])
    for fam, vals in by.items():
        out["workspace_bytes_by_family"][fam] = {"median": int(statistics.median(vals)), "min": min(vals), "max": max(vals), "n": len(vals)}
    usable = []
    for r in rows:
        if r.get("kind") == "find_batch" and r.get("status") == "finished" and r.get("estimate_at_found_bytes"):
            usable.append(r["estimate_at_found_bytes"] / r["cap_bytes"])
    if usable:
        out["usable_share_of_cap_at_max_batch"] = usable
    return out


def table(rows: list[dict]) -> str:
    lines = ["| profile | kernel | status | micro | measured GiB | estimate GiB | error | peak at (estimate) | fwd / bwd / opt GiB |", "|:--|:--|:--|--:|--:|--:|--:|:--|:--|"]
    for r in rows:
        if r.get("kind") != "fixed":
            continue
        g = lambda k: gib_number(r[k]) if r.get(k) else "—"  # noqa: E731
        err = f"{r['error_pct']:+.1f}%" if r.get("error_pct") is not None else "—"
        lines.append(f"| {r['profile']} | {r.get('attention_kernel') or '—'} | {r['status']} | {r.get('micro_batch') or '—'} | {g('measured_bytes')} | {g('estimate_bytes')} | {err} | {r.get('estimate_phase', '—')} | {g('measured_fwd_bytes')} / {g('measured_bwd_bytes')} / {g('measured_opt_bytes')} |")
    finds = [r for r in rows if r.get("kind") == "find_batch"]
    if finds:
        lines += ["", "| profile | cap GiB | status | found max batch | predicted | error | probes | s |", "|:--|--:|:--|--:|--:|--:|--:|--:|"]
        for r in finds:
            err = f"{r['error_pct']:+.1f}%" if r.get("error_pct") is not None else "—"
            lines.append(f"| {r['profile']} | {gib_number(r['cap_bytes'], 0)} | {r['status']} | {r.get('found_max_batch', '—')} | {r.get('predicted_max_batch', '—')} | {err} | {r.get('probes', '—')} | {r['seconds']:.0f} |")
    return "\n".join(lines)


def main() -> None:
    from memlab.core.config import builtin_names

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "bench-out"), help="folder for the results")
    ap.add_argument("--profiles", default="all", help="comma-separated profiles (default: every built-in)")
    ap.add_argument("--batch", type=int, default=16, help="micro-batch of the fixed-batch runs")
    ap.add_argument("--steps", type=int, default=7)
    ap.add_argument("--measure-after", type=int, default=3)
    ap.add_argument("--parallel", type=int, default=3, help="children at once in part 1 (each capped at 1/N of the card)")
    ap.add_argument("--snapshot", default="bf16", help="profile for one --memory-snapshot run ('' to skip)")
    ap.add_argument("--find-batch", default="bf16,gradcp_bf16", help="profiles for find-batch ('' to skip, 'all' for every built-in)")
    ap.add_argument("--find-parallel", type=int, default=1, help="find-batch searches at once (each child capped at --find-gpu-memory)")
    ap.add_argument("--skip-fixed", action="store_true", help="no fixed-batch runs (find-batch only)")
    ap.add_argument("--find-gpu-memory", default="24GiB", help="the cap find-batch emulates")
    ap.add_argument("--probe-steps", type=int, default=3)
    ap.add_argument("--budget-s", type=float, default=450.0, help="wall-clock budget; find-batch stops when it is spent")
    ap.add_argument("--child-timeout-s", type=float, default=180.0, help="a fixed-batch child still running after this is stopped")
    ap.add_argument("--cpu-check", action="store_true", help=argparse.SUPPRESS)  # plumbing check on a CPU: tiny, no GPU parts
    args = ap.parse_args()
    global EXPERIMENT, DEVICE
    if args.cpu_check:
        from memlab.core.gpu_memory import GpuInfo

        EXPERIMENT, DEVICE = "tiny", "cpu"
        args.snapshot, args.find_batch = "", ""
    t_start = time.monotonic()
    budget_end = t_start + args.budget_s
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    runs_dir = Path(tempfile.mkdtemp(prefix="est-runs-"))
    os.environ.setdefault("FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED", "1")

    from memlab.core.gpu_memory import gpu_info
    from memlab.core.units import parse_size

    gpu = GpuInfo("cpu (check)", 8 * GIB) if args.cpu_check else gpu_info()
    if gpu is None:
        sys.exit("no CUDA GPU visible: this benchmark measures on a GPU")
    log(f"{gpu.name} · {gib(gpu.total_bytes, 1)} · out {out}")
    names = builtin_names("profile") if args.profiles == "all" else [p.strip() for p in args.profiles.split(",") if p.strip()]
    share = int((gpu.total_bytes - args.parallel * 1.5 * GIB) / args.parallel) if args.parallel > 1 and not args.cpu_check else None
    rows: list[dict] = []
    lock = threading.Lock()

    from memlab.core.config import load_profile

    fa4_lock = threading.Lock()  # flash-attn-4 JITs into an on-disk cache: one flash child at a time fills it

    def one(name: str, cap: int | None, extra=None) -> dict:
        if time.monotonic() > budget_end - 30:
            return {"profile": name, "kind": "snapshot" if extra else "fixed", "status": "skipped", "message": "time budget"}
        try:
            flash = load_profile(name).attention.kernel == "flash"
            with fa4_lock if flash else contextlib.nullcontext():
                row = run_fixed(name, args, cap, runs_dir, extra)
        except Exception as e:  # noqa: BLE001
            row = {"profile": name, "kind": "fixed", "status": "error", "message": f"{e.__class__.__name__}: {e}"[:300]}
        err = f"{row['error_pct']:+.1f}%" if row.get("error_pct") is not None else "—"
        with lock:
            log(f"[{time.monotonic() - t_start:5.0f}s] {name}{' (snapshot)' if extra else ''}: {row['status']} · measured {gib(row.get('measured_bytes') or 0)} · estimate {gib(row.get('estimate_bytes') or 0)} · {err} · {row.get('attention_kernel')}"
                + (f" · {row['message'][:120]}" if row["status"] != "finished" and row.get("message") else ""))
        return row

    if not args.skip_fixed:
        # warm the token cache with one run alone, then the rest in parallel
        first = "bf16" if "bf16" in names else names[0]
        rows.append(one(first, None))
        rest = [n for n in names if n != first]
        with ThreadPoolExecutor(max_workers=max(1, args.parallel)) as pool:
            heavy = [n for n in rest if n in COMPILE_HEAVY]
            futures = [pool.submit(one, n, share) for n in heavy]
            if args.snapshot:
                futures.append(pool.submit(one, args.snapshot, share, ["--memory-snapshot"]))
            futures += [pool.submit(one, n, share) for n in rest if n not in COMPILE_HEAVY]
            rows += [f.result() for f in futures]
        # an OOM under the shared cap is run again alone, on the whole card
        for i, r in enumerate(rows):
            if r.get("status") == "oom" and r.get("cap_bytes"):
                rows[i] = one(r["profile"], None)

    cap = parse_size(args.find_gpu_memory)
    finds = names if args.find_batch == "all" else [p.strip() for p in args.find_batch.split(",") if p.strip()]
    finds = [n for n in finds if n in COMPILE_HEAVY] + [n for n in finds if n not in COMPILE_HEAVY]  # the slow ones first

    def find_one(name: str) -> dict:
        if time.monotonic() > budget_end - 60:
            return {"profile": name, "kind": "find_batch", "status": "skipped", "message": "time budget", "cap_bytes": cap, "seconds": 0.0}
        log(f"[{time.monotonic() - t_start:5.0f}s] find-batch {name} under {args.find_gpu_memory}")
        row = run_find(name, args, cap, budget_end)
        log(f"  -> {name}: found {row.get('found_max_batch')} predicted {row.get('predicted_max_batch')} ({row.get('status')}) in {row['seconds']:.0f} s")
        return row

    # the search, not the hardware, is the subject: several capped searches share the card (each stays in its cap)
    with ThreadPoolExecutor(max_workers=max(1, args.find_parallel)) as pool:
        rows += list(pool.map(find_one, finds))

    cal = calibration(rows)
    command = "python3 " + " ".join(shlex.quote(a) for a in sys.argv)
    md = f"# estimate vs measured · {gpu.name}\n\ncommand: `{command}`\n\n" + table(rows) + "\n\ncalibration:\n```json\n" + json.dumps(cal, indent=1) + "\n```\n"
    (out / "estimate_vs_measured.md").write_text(md)
    (out / "estimate_vs_measured.json").write_text(json.dumps({"gpu": gpu.name, "command": command, "rows": rows, "calibration": cal}, indent=1, default=str))
    try:
        import polars as pl

        pl.DataFrame(rows, infer_schema_length=None).write_parquet(out / "estimate_vs_measured.parquet")
    except Exception as e:  # noqa: BLE001 (no polars on the image: JSON and markdown stand)
        log(f"parquet not written ({e.__class__.__name__}: {e})")
    log("\n" + md)
    fixed = [r for r in rows if r.get("kind") == "fixed" and r.get("error_pct") is not None]
    within = sum(abs(r["error_pct"]) <= 10 for r in fixed)
    log(f"{within}/{len(fixed)} profiles within 10% · total {time.monotonic() - t_start:.0f} s")


if __name__ == "__main__":
    main()
