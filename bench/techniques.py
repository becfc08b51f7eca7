"""Issue 4 on one GPU: every attention kernel checked against an fp32 reference, then every built-in profile
trained on the GPU default experiment, then a long-context comparison. Every failure is a row, never a crash.

  1. kernel checks (one child process): for random q, k, v in bf16 at a few shapes, each kernel's output and
     gradients against eager attention computed in fp32 on the upcast inputs, ||x - ref|| / ||ref|| < 1e-2,
     causal and windowed (W=128); with forward and forward+backward times. -> <out>/kernel_checks.parquet
  2. the profile matrix: every built-in profile on gpt2s (12L/768/T=1024) at one effective batch (--batch-size,
     the profile's accumulation as it says), each in its own child (`memlab run`, a fresh CUDA context).
  3. long context: long8k (6L/512/T=8192): bf16 (SDPA) vs flash vs window (flash, W=512), then flex (W=512).
  -> <out>/techniques.parquet (one row per run: its summary, status and message), <out>/techniques.txt (tables)

Runs go in priority order: the issue's profiles, the long-context bf16 / flash / window, the compile-heavy ones
(fastest, compile), then any other built-in profile and flex on long8k. A time budget (--budget-s) bounds the whole: a run that would not end
within it is recorded as `skipped` (the end prints the --only that runs them), and a run still going --grace-s
after it is stopped (SIGINT: it keeps what it had). Each run costs ~10-15 s of process start, CUDA set-up and
first step on top of its steps. FA4's on-disk kernel cache is turned on for the children (--no-fa4-cache: off).
Usage, on the GPU machine:

    python3 bench/techniques.py --out $OUT --runs-dir /tmp/tech-runs            # everything, < 9 min on an H100
    python3 bench/techniques.py --only checks                                   # just the kernel checks
    python3 bench/techniques.py --only matrix,flash,window,bf16 --steps 30      # parts and/or profiles
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path
from memlab.core.units import gib_number

# The parent never touches CUDA: kernel checks and runs happen in children, so each has the GPU to itself and
# the device-wide (NVML) figures of a run hold no one else's memory.

PARTS = ("checks", "matrix", "long")
LONG_RUNS = [  # (label, profile, extra overrides); the last one is an extra, run after the compile-heavy ones
    ("bf16", "bf16", []),
    ("flash", "flash", []),
    ("window", "window", []),
    ("flex_window512", "flex", ["attention.window=512"]),
]
LONG_REQUIRED = ("bf16", "flash", "window")
# The issue's profiles, in the order they run (the priority when the budget is short); any other built-in profile
# runs after them. Compile-heavy ones (a minute or more of Inductor, cold) come after the long-context runs.
REQUIRED = ("baseline tf32 bf16 fp16 flash window gradcp gradcp_bf16 flash_gradcp selective act_offload accum "
            "adafactor adamw8bit optim_offload chunked_ce leanest").split()
COMPILE_HEAVY = ("fastest", "compile")  # fastest first: compile then reuses much of its Inductor cache
EXPECTED_S = {"light": 22.0, "heavy": 60.0}  # not started with less budget left (H100: fastest ~67 s cold, +grace)
CHECK_SHAPES = "4x12x1024x64,1x8x8192x64"  # B x nh x T x hs: gpt2s's attention, and long8k's at batch 1
TOL = 1e-2


def log(msg: str, sink: list[str] | None = None) -> None:
    print(msg, flush=True)
    if sink is not None:
        sink.append(msg)


# ================================================================================================ 1. kernel checks


def run_checks(out: Path, shapes: str, window: int, reps: int) -> None:
    """Runs in a child process (`--_checks`): writes <out>/kernel_checks.parquet and .json, row by row."""
    import torch

    from memlab.core.attention import build_attention
    from memlab.core.attention.eager import EagerAttention
    from memlab.core.attention.sdpa import SDPAAttention
    from memlab.core.config import AttentionConfig

    dev = torch.device("cuda")
    torch.backends.cuda.matmul.allow_tf32 = False  # the reference is true fp32
    torch.backends.cudnn.allow_tf32 = False
    rows: list[dict] = []

    def kernels(W: int):
        yield "eager", lambda: EagerAttention(W)
        for backend in ("flash", "cudnn", "efficient"):
            yield f"sdpa:{backend}", (lambda b=backend: SDPAAttention(b)) if not W else None
        yield "flash", lambda: build_attention(AttentionConfig(kernel="flash", window=W), dev, torch.bfloat16)
        yield "flex", lambda: build_attention(AttentionConfig(kernel="flex", window=W), dev, torch.bfloat16)

    def rel(a, b) -> float:
        return ((a.float() - b).norm() / b.norm().clamp_min(1e-30)).item()

    def timed(fn) -> float:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        times = []
        for _ in range(reps):
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        return sorted(times)[len(times) // 2]

    for shape in shapes.split(","):
        B, nh, T, hs = (int(x) for x in shape.lower().split("x"))
        g = torch.Generator(device=dev).manual_seed(0)
        q, k, v, dout = (torch.randn(B, nh, T, hs, device=dev, dtype=torch.bfloat16, generator=g) for _ in range(4))
        for W in (0, window):
            # fp32 reference on the upcast bf16 inputs: the same numbers the kernels see, computed exactly
            q32, k32, v32 = (t.float().requires_grad_() for t in (q, k, v))
            ref = EagerAttention(W)(q32, k32, v32)
            ref_grads = torch.autograd.grad(ref, (q32, k32, v32), dout.float())
            ref = ref.detach()
            del q32, k32, v32
            for name, make in kernels(W):
                row = {"shape": shape, "B": B, "n_head": nh, "seq_len": T, "head_dim": hs, "window": W, "kernel": name, "ran": None,
                       "status": None, "message": "", "rel_err_out": None, "rel_err_dq": None, "rel_err_dk": None, "rel_err_dv": None,
                       "max_rel_err": None, "first_call_s": None, "fwd_ms": None, "fwd_bwd_ms": None}
                rows.append(row)
                if make is None:
                    row.update(status="unsupported", message="cannot window (refused at build: use flash or flex)")
                    continue
                try:
                    kern = make()
                    qq, kk, vv = (t.clone().requires_grad_() for t in (q, k, v))
                    t0 = time.perf_counter()
                    o = kern(qq, kk, vv)
                    grads = torch.autograd.grad(o, (qq, kk, vv), dout)
                    torch.cuda.synchronize()
                    row["first_call_s"] = time.perf_counter() - t0  # includes a JIT / compile on first use
                    row["ran"] = kern.name
                    errs = [rel(o, ref)] + [rel(a, b) for a, b in zip(grads, ref_grads)]
                    row.update(rel_err_out=errs[0], rel_err_dq=errs[1], rel_err_dk=errs[2], rel_err_dv=errs[3], max_rel_err=max(errs))
                    row["status"] = "ok" if max(errs) < TOL else "MISMATCH"

                    def fwd():
                        with torch.no_grad():
                            kern(q, k, v)

                    def fwd_bwd():
                        torch.autograd.grad(kern(qq, kk, vv), (qq, kk, vv), dout)

                    row["fwd_ms"], row["fwd_bwd_ms"] = timed(fwd), timed(fwd_bwd)
                    del o, grads
                except Exception as e:  # noqa: BLE001 (a kernel that fails is a row)
                    row.update(status="error", message=f"{e.__class__.__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300])
                torch.cuda.empty_cache()
                print(_check_line(row), flush=True)
                _write_rows(out / "kernel_checks", rows)
            del ref, ref_grads


def _check_line(r: dict) -> str:
    f = lambda x, spec: "-" if x is None else format(x, spec)  # noqa: E731
    return (f"{r['shape']:>16} W={r['window']:<4} {r['kernel']:<11} {str(r['ran'] or '-'):<30} {r['status']:<11} "
            f"max_rel_err={f(r['max_rel_err'], '.2e')} fwd={f(r['fwd_ms'], '.3f')}ms fwd+bwd={f(r['fwd_bwd_ms'], '.3f')}ms "
            f"first={f(r['first_call_s'], '.1f')}s {r['message']}")


# ================================================================================================ output


def _write_rows(stem: Path, rows: list[dict]) -> None:
    """Parquet through pyarrow (polars may be missing on the GPU image); JSON beside it, always readable."""
    stem.parent.mkdir(parents=True, exist_ok=True)
    tmp = stem.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(rows, default=str, indent=1))
    tmp.replace(stem.with_suffix(".json"))
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq

        cols = sorted({k for r in rows for k in r}, key=lambda k: next(i for i, r in enumerate(rows) if k in r))
        arrays = {}
        for c in cols:
            values = [r.get(c) for r in rows]
            try:
                arrays[c] = pa.array(values)
            except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError):
                arrays[c] = pa.array([None if v is None else (json.dumps(v, default=str) if isinstance(v, (dict, list)) else str(v)) for v in values])
            if pa.types.is_struct(arrays[c].type) or pa.types.is_list(arrays[c].type) or pa.types.is_null(arrays[c].type):
                arrays[c] = pa.array([None if v is None else json.dumps(v, default=str) for v in values], type=pa.string())
        tmpq = stem.with_suffix(".parquet.tmp")
        pq.write_table(pa.table(arrays), tmpq)
        tmpq.replace(stem.with_suffix(".parquet"))
    except Exception as e:  # noqa: BLE001
        print(f"(could not write {stem}.parquet: {e.__class__.__name__}: {e}; the .json has the rows)", flush=True)


TABLE_COLS = [  # (header, key, format)
    ("section", "section", "s"), ("run", "label", "s"), ("status", "status", "s"), ("kernel", "attention_kernel", "s"),
    ("mb", "micro_batch", "d"), ("alloc GiB", "peak_alloc_bytes", "gib"), ("resv GiB", "peak_reserved_bytes", "gib"),
    ("nvml GiB", "peak_nvml_bytes", "gib"), ("step ms", "step_ms_median", ".1f"), ("tok/s", "tokens_per_s", ",.0f"),
    ("mfu", "mfu", ".3f"), ("compile s", "compile_s", ".1f"), ("1st step s", "time_to_first_step_s", ".1f"),
    ("val loss", "val_loss", ".3f"), ("wall s", "wall_s", ".0f"), ("message", "message", "s"),
]


def _fmt(value, spec: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    try:
        if spec == "gib":
            return gib_number(value)
        if spec == "s":
            return str(value)
        return format(value, spec)
    except (TypeError, ValueError):
        return str(value)


def render(rows: list[dict]) -> str:
    cells = [[h for h, _, _ in TABLE_COLS]]
    for r in rows:
        line = [_fmt(r.get(k), spec) for _, k, spec in TABLE_COLS]
        line[-1] = line[-1][:70]
        cells.append(line)
    widths = [max(len(row[i]) for row in cells) for i in range(len(TABLE_COLS))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in cells)


# ================================================================================================ 2 and 3. runs


class Budget:
    def __init__(self, seconds: float):
        self.t0 = time.monotonic()
        self.seconds = seconds

    def left(self) -> float:
        return self.seconds - (time.monotonic() - self.t0)


def run_one(section: str, label: str, profile: str, experiment: str, overrides: list[str], runs_dir: Path, budget: Budget,
            child_timeout: float, expected_s: float, grace_s: float) -> dict:
    from memlab.core.supervisor import ChildRun, ChildSpec

    row = {"section": section, "label": label, "profile": profile, "experiment": experiment, "overrides": " ".join(overrides)}
    left = budget.left()
    if left < expected_s:
        row.update(status="skipped", message=f"time budget: {max(0, left):.0f} s left, a run like this takes ~{expected_s:.0f} s")
        return row
    timeout = min(child_timeout, left + grace_s)  # a run that outlives the budget is stopped (it keeps what it had)
    t0 = time.monotonic()
    try:
        child = ChildRun(ChildSpec(profile, experiment=experiment, device="cuda", runs_dir=str(runs_dir), overrides=overrides))
        timer = threading.Timer(timeout, lambda: child.cancel(grace_s=15))
        timer.daemon = True
        timer.start()
        try:
            res = child.wait()
        finally:
            timer.cancel()
        row.update(res.summary or {})
        row.update(section=section, label=label, status=res.status, run_dir=res.run_dir, returncode=res.returncode)
        message = res.message or ""
        if child.cancelled:
            message = f"stopped after {timeout:.0f} s (time limit); " + message
        if res.status not in ("finished",) and not message and res.stderr_tail:
            message = res.stderr_tail.strip().splitlines()[-1]
        row["message"] = message.strip()[:500]
    except Exception as e:  # noqa: BLE001
        row.update(status="bench-error", message=f"{e.__class__.__name__}: {e}"[:500])
    row["wall_s"] = time.monotonic() - t0
    return row


def preflight(section: str, label: str, profile: str, experiment: str, overrides: list[str]) -> dict | None:
    """A run memlab would refuse for a missing optional package, found here by memlab's own code without a child
    (a child spends ~15 s starting CUDA only to say so). None: start the child."""
    try:
        from memlab.core.config import apply_overrides, load_experiment, load_profile

        e, p = load_experiment(experiment), load_profile(profile)
        apply_overrides(e, p, overrides)
        if p.optimizer.name != "adamw8bit" or p.optimizer.offload:
            return None
        import torch

        from memlab.core.errors import MemlabError
        from memlab.core.techniques.optimizer import build_optimizer

        try:  # device "cuda" is only compared by type here: nothing touches the GPU
            build_optimizer(torch.nn.Linear(2, 2), p.optimizer, e.train, torch.device("cuda"))
        except MemlabError as err:
            return {"section": section, "label": label, "profile": profile, "experiment": experiment, "overrides": " ".join(overrides),
                    "status": "rejected", "message": f"{err} (found before starting a child)", "wall_s": 0.0}
    except Exception:  # noqa: BLE001 (anything unexpected: let the child say it)
        return None
    return None


def prepare_data(experiments: list[str], lines: list[str]) -> None:
    """Tokenize each experiment's corpus once, here, so no child pays for it (and no child's time includes it)."""
    from memlab.core.config import load_experiment
    from memlab.core.data import load_tokens

    seen = set()
    for name in experiments:
        e = load_experiment(name)
        key = json.dumps(e.data.__dict__, sort_keys=True, default=str)
        if key in seen:
            continue
        seen.add(key)
        t0 = time.monotonic()
        try:
            tok = load_tokens(e.data)
            log(f"data for {name}: {len(tok.train):,} train / {len(tok.val):,} val tokens, cache hit {tok.cache_hit}, {time.monotonic() - t0:.1f} s", lines)
        except Exception as e:  # noqa: BLE001
            log(f"data for {name}: FAILED ({e.__class__.__name__}: {e}); the runs will report it", lines)


# ================================================================================================ main


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.environ.get("OUT") or "bench/results", help="where the Parquet, JSON and text tables go")
    ap.add_argument("--runs-dir", default=None, help="where run folders go (default: /tmp/memlab-techniques-<time>)")
    ap.add_argument("--steps", type=int, default=20, help="optimizer steps per run (the first --measure-after are not measured)")
    ap.add_argument("--measure-after", type=int, default=5)
    ap.add_argument("--batch-size", type=int, default=16, help="effective batch of the matrix on gpt2s")
    ap.add_argument("--long-batch-size", type=int, default=0, help="effective batch on long8k (0 = the experiment's)")
    ap.add_argument("--only", default="", help="comma list of parts (checks, matrix, long) and/or profile names")
    ap.add_argument("--budget-s", type=float, default=505.0, help="no run starts that would not end within this many seconds")
    ap.add_argument("--grace-s", type=float, default=25.0, help="a run still going this long after the budget is stopped")
    ap.add_argument("--no-fa4-cache", action="store_true", help="let every child JIT flash-attn-4's kernels afresh")
    ap.add_argument("--child-timeout-s", type=float, default=180.0, help="most seconds one run may take")
    ap.add_argument("--check-shapes", default=CHECK_SHAPES, help="B x nh x T x hs, comma separated")
    ap.add_argument("--check-window", type=int, default=128)
    ap.add_argument("--check-reps", type=int, default=5)
    ap.add_argument("--_checks", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    if args._checks:
        run_checks(out, args.check_shapes, args.check_window, args.check_reps)
        return 0

    from memlab.core.attention.flash import installed
    from memlab.core.config import builtin_names

    budget = Budget(args.budget_s)
    lines: list[str] = []
    if not args.no_fa4_cache:
        # FA4 JIT-compiles its kernels in every process (~8 s) unless its on-disk cache is on: the kernel checks
        # compile them once and every flash run after loads them (time to first step then excludes the JIT).
        os.environ.setdefault("FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED", "1")
    only = [x.strip() for x in args.only.split(",") if x.strip()]
    parts = [p for p in only if p in PARTS] or list(PARTS)
    profiles_all = builtin_names("profile")
    unknown = [x for x in only if x not in PARTS and x not in profiles_all]
    if unknown:
        log(f"--only: unknown {', '.join(unknown)}; parts: {', '.join(PARTS)}; profiles: {', '.join(profiles_all)}")
        return 2
    chosen = [p for p in only if p in profiles_all]
    runs_dir = Path(args.runs_dir or f"/tmp/memlab-techniques-{time.strftime('%Y%m%d-%H%M%S')}")
    log(f"memlab techniques bench · parts {', '.join(parts)} · steps {args.steps} · budget {args.budget_s:.0f} s · runs in {runs_dir}", lines)
    have = installed()
    try:
        import torchao  # noqa: F401

        ao = True
    except Exception:  # noqa: BLE001
        ao = False
    log(f"flash-attn-4 {have['fa4'] or 'no'} · flash-attn {have['fa2'] or 'no'} · torchao {'yes' if ao else 'no'}", lines)

    # 1. kernel checks in a child, while this process tokenizes the corpus (CPU work) for the runs
    checks_proc = None
    if "checks" in parts:
        cmd = [sys.executable, __file__, "--_checks", "--out", str(out), "--check-shapes", args.check_shapes,
               "--check-window", str(args.check_window), "--check-reps", str(args.check_reps)]
        checks_log = open(out / "kernel_checks.log", "w")  # noqa: SIM115
        checks_proc = subprocess.Popen(cmd, stdout=checks_log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    if "matrix" in parts or "long" in parts:
        prepare_data(["gpt2s"] + (["long8k"] if "long" in parts else []), lines)
    if checks_proc is not None:
        try:
            checks_proc.wait(timeout=max(30.0, min(300.0, budget.left())))
        except subprocess.TimeoutExpired:
            checks_proc.kill()
            checks_proc.wait()
            log("kernel checks: stopped at their time limit (rows so far are kept)", lines)
        checks_log.close()
        log(f"\n== kernel checks (bf16 vs eager in fp32 on the upcast inputs; ok below {TOL:g}) ==", lines)
        text = (out / "kernel_checks.log").read_text(errors="replace")
        kept = [ln for ln in text.splitlines() if " W=" in ln]
        for ln in kept:
            log(ln, lines)
        if checks_proc.returncode != 0:
            log(f"kernel checks child exited {checks_proc.returncode}; its last lines:", lines)
            for ln in text.splitlines()[-8:]:
                log("  " + ln, lines)
        log(f"[{budget.seconds - budget.left():.0f} s]", lines)

    # 2 and 3: the runs, in an order that puts the minutes of cold Inductor compiles last
    rows: list[dict] = []
    plan: list[tuple[str, str, str, str, list[str]]] = []
    base = [f"train.steps={args.steps}", f"train.measure_after={args.measure_after}", "train.eval_every=0"]
    matrix = [p for p in (chosen or profiles_all) if p in profiles_all] if "matrix" in parts else []
    gpt2s = base + [f"train.batch_size={args.batch_size}"]
    # priority: the issue's light profiles, the long-context runs, the compile-heavy ones, then any other profile
    plan += [("matrix", p, p, "gpt2s", gpt2s) for p in REQUIRED if p in matrix]
    long_base = base + ([f"train.batch_size={args.long_batch_size}"] if args.long_batch_size else [])
    longs = [("long8k", label, p, "long8k", long_base + extra) for label, p, extra in LONG_RUNS
             if "long" in parts and (not chosen or p in chosen)]
    plan += [r for r in longs if r[1] in LONG_REQUIRED]
    plan += [("matrix", p, p, "gpt2s", gpt2s) for p in COMPILE_HEAVY if p in matrix]
    plan += [("matrix", p, p, "gpt2s", gpt2s) for p in matrix if p not in REQUIRED and p not in COMPILE_HEAVY]
    plan += [r for r in longs if r[1] not in LONG_REQUIRED]

    if plan:
        log(f"\n== runs: {len(plan)} ({sum(1 for x in plan if x[0] == 'matrix')} on gpt2s at batch {args.batch_size}, "
            f"{sum(1 for x in plan if x[0] == 'long8k')} on long8k) ==", lines)
    for section, label, profile, experiment, overrides in plan:
        expected = EXPECTED_S["heavy" if profile in COMPILE_HEAVY else "light"]
        row = preflight(section, label, profile, experiment, overrides) or run_one(
            section, label, profile, experiment, overrides, runs_dir, budget, args.child_timeout_s, expected, args.grace_s)
        rows.append(row)
        log(f"[{budget.seconds - budget.left():4.0f} s] {section:<7} {label:<15} {row.get('status', '?'):<9} "
            f"{_fmt(row.get('attention_kernel'), 's'):<32} peak {_fmt(row.get('peak_alloc_bytes'), 'gib')} GiB · "
            f"{_fmt(row.get('step_ms_median'), '.1f')} ms/step · {_fmt(row.get('wall_s'), '.0f')} s  {(row.get('message') or '')[:90]}", lines)
        _write_rows(out / "techniques", rows)

    if rows:
        long_labels = [label for label, _, _ in LONG_RUNS]

        def order(r: dict) -> tuple[int, int]:
            if r["section"] == "long8k":
                return 1, long_labels.index(r["label"])
            return 0, profiles_all.index(r["profile"]) if r["profile"] in profiles_all else 99

        rows.sort(key=order)  # the printed table follows `memlab profiles`, not the order the runs went in
        _write_rows(out / "techniques", rows)
        log("\n== summaries ==", lines)
        log(render(rows), lines)
        skipped = [r for r in rows if r.get("status") == "skipped"]
        if skipped:
            names = sorted({r["profile"] for r in skipped if r["section"] == "matrix"})
            longs = sorted({r["profile"] for r in skipped if r["section"] == "long8k"})
            hint = ",".join((["matrix"] + names if names else []) + (["long"] + longs if longs else []))
            log(f"\nskipped for time: {len(skipped)} run(s); to run them: python3 bench/techniques.py --only {hint}", lines)
    wrote = [f.name for f in (out / "kernel_checks.parquet", out / "techniques.parquet") if f.exists()] + ["techniques.txt"]
    log(f"\ntotal {budget.seconds - budget.left():.0f} s · wrote {', '.join(wrote)} in {out}", lines)
    (out / "techniques.txt").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception:  # noqa: BLE001 (the bench reports; it does not die with a traceback mid-table)
        traceback.print_exc()
        sys.exit(1)
