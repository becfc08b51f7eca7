"""Lanes on a 4-GPU host (issue 49): figures stay the run's own, and a study goes faster.

(a) side: the same profiles (bf16, gradcp_bf16, sac_ops on the GPU default experiment, 60 steps) each run on one GPU
    while the three other GPUs train without pause ("beside"), and alone on that same GPU with the host otherwise
    idle, in 3 rounds whose order alternates. Each profile: the median step times within 3%, the peak allocated
    memory of every run equal. Both rounds go through
    memlab.core.lanes.LaneQueue, what `memlab sweep --gpus` drives; the three neighbours are stopped as Ctrl-C
    stops a sweep once the measured runs have finished (they end `interrupted`, every finished run is kept).
(b) study: `memlab study --gpus 0,1,2,3` of a small study, then the same study with `--gpus 0`, each in its own
    study folder and token/max-batch cache (so neither reuses the other's searches). The 4-lane wall time must be
    at most 0.3x the 1-lane one; the 1-lane study is stopped once it has run `4-lane time / 0.3` (enough to prove
    the bound: its full time can only be longer), so the part costs at most ~4.5x the 4-lane study. Where one device
    call (600 s) cannot hold a part: study4, then study1 (cut) or study1a + study1b (the 1-lane study in two
    invocations on the same machine, the second resuming the first's folder), each its own call, back to back.

Rows land in OUT/lanes.jsonl as they come; OUT/lanes.parquet and OUT/lanes.md are rewritten after each.
Needs only the GPU image's packages plus polars (carried: bench/README.md), as any memlab run there does:

    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .gpu-wheels/pl/*.whl
    source bench/gpu_env.sh && python3 bench/lanes.py --out $OUT/lanes
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

SIDE_PROFILES = "bf16,gradcp_bf16,sac_ops"
STUDY_PROFILES = "bf16,gradcp_bf16,sac_ops,chunked_ce,baseline,selective,gradcp,fused_adamw"
# A small study: gpt2s cut to 4 layers of 256 tokens under an 8 GiB card, so each search's probes take seconds.
STUDY_SETS = ["model.n_layer=4", "model.seq_len=256"]
STEP_TOLERANCE = 0.03
STUDY_BOUND = 0.3


class Results:
    """Rows appended as they land: lanes.jsonl (one JSON object a line), lanes.parquet and lanes.md rewritten."""

    def __init__(self, out: Path):
        self.out, self.rows = out, []

    def add(self, row: dict) -> None:
        self.rows.append(row)
        with open(self.out / "lanes.jsonl", "a") as f:
            f.write(json.dumps(row) + "\n")
        pq.write_table(pa.Table.from_pylist([{k: json.dumps(v) if isinstance(v, (dict, list)) else v for k, v in r.items()}
                                             for r in self.rows]), self.out / "lanes.parquet")
        (self.out / "lanes.md").write_text(self.markdown())
        print(json.dumps(row), flush=True)

    def markdown(self) -> str:
        side = [r for r in self.rows if r["part"] == "side"]
        study = [r for r in self.rows if r["part"] == "study"]
        lines = ["# Lanes on a 4-GPU host (bench/lanes.py)", ""]
        if side:
            lines += ["## (a) alone vs beside three busy GPUs", "",
                      "Median over rounds of each run's median step time; every run's peak allocated bytes (alone, then beside).", "",
                      "| profile | GPU | step ms alone | step ms beside | diff | within 3% | rounds' step ms alone / beside | peaks alone | peaks beside | all equal |",
                      "|---|---|---|---|---|---|---|---|---|---|"]
            for r in side:
                rounds = " / ".join(", ".join(_f(v) for v in r[k]) for k in ("step_ms_alone_rounds", "step_ms_beside_rounds"))
                lines.append(f"| {r['profile']} | {r['gpu_index']} ({r['gpu_name']}) | {_f(r['step_ms_alone'])} | {_f(r['step_ms_beside'])} | "
                             f"{_pct(r['step_diff'])} | {_yes(r['step_ok'])} | {rounds} | {_peaks(r['peak_alloc_alone'])} | "
                             f"{_peaks(r['peak_alloc_beside'])} | {_yes(r['peak_equal'])} |")
                if r.get("error"):
                    lines.append(f"| {r['profile']} | {r['error']} | | | | | | | | |")
        if study:
            lines += ["", "## (b) a whole study on 4 lanes vs 1", "",
                      "| lanes | GPUs | wall s | finished | runs | note |", "|---|---|---|---|---|---|"]
            for r in study:
                lines.append(f"| {r['lanes']} | {r['gpus']} | {r['wall_s']:.1f} | {r['finished']} | {r['runs']} | {r.get('note', '')} |")
            ratio = next((r for r in study if r.get("ratio") is not None), None)
            if ratio:
                lines.append(f"\n4-lane / 1-lane wall time: {ratio['ratio']:.3f} ({'at most' if ratio['bound'] else 'measured'}), "
                             f"needs <= {STUDY_BOUND}: {_yes(ratio['ratio'] <= STUDY_BOUND)}")
                if ratio.get("ratio_estimate") is not None:
                    lines.append(f"(the 1-lane study stopped with {ratio['items_done']}/{ratio['items_total']} items done; "
                                 f"its full time at that pace gives {ratio['ratio_estimate']:.3f}, an estimate)")
        cmd = " ".join(sys.argv)
        return "\n".join(lines + ["", f"Command: `python3 {cmd}`", ""])


def _f(v) -> str:
    return "—" if v is None else f"{v:.2f}"


def _pct(v) -> str:
    return "—" if v is None else f"{v:+.2%}"


def _peaks(values: list) -> str:
    return ", ".join("—" if v is None else str(v) for v in values)


def _yes(v) -> str:
    return "yes" if v else "NO"


def memlab(*args: str) -> list[str]:
    return [sys.executable, "-m", "memlab", *args]


def summary(run_dir: str | None) -> dict:
    if not run_dir or not Path(run_dir, "summary.parquet").exists():
        return {}
    return pq.read_table(Path(run_dir, "summary.parquet")).to_pylist()[0]


# ---------------------------------------------------------------------------------------------- (a) side by side


def side_by_side(args, results: Results) -> None:
    """`args.rounds` rounds, each a beside and an alone pass over the measured profiles on the same GPU, the order
    alternating between rounds (beside first in odd rounds) so neither side always runs on a warmer or cooler host."""
    from memlab.core.lanes import LaneQueue, plan_lanes

    lanes = plan_lanes(None, "cuda")
    if len(lanes) < 4:
        print(f"side: {len(lanes)} GPU(s) visible; this part needs 4", flush=True)
        return
    lanes, profiles = lanes[:4], args.side_profiles.split(",")
    runs: dict[str, dict[str, list]] = {p: {"alone": [], "beside": []} for p in profiles}
    if args.warm_up:  # compile caches (sac_ops compiles its blocks) warm before either side is measured
        warm = LaneQueue([lanes[3]]).run([(p, _spec(args, p, Path(args.runs) / "side" / "warm-up", ["train.steps=5", "train.eval_every=0"]))
                                          for p in profiles])
        print("side: warm-up " + ", ".join(f"{o.key}={o.status}" for o in warm), flush=True)
    for r in range(args.rounds):
        for where in (("beside", "alone") if r % 2 == 0 else ("alone", "beside")):
            t0 = time.monotonic()
            outcomes = _beside(args, lanes, profiles, r) if where == "beside" else _alone(args, lanes[3], profiles, r)
            print(f"side: round {r + 1} {where} {time.monotonic() - t0:.0f} s; "
                  + ", ".join(f"{p}={o.status if o else 'not run'}" for p, o in outcomes.items()), flush=True)
            for p, o in outcomes.items():
                runs[p][where].append(o)
    for p in profiles:
        results.add(_side_row(p, runs[p]["alone"], runs[p]["beside"]))


def _spec(args, profile: str, runs_dir: Path, overrides: list[str]):
    from memlab.core.supervisor import ChildSpec

    runs_dir.mkdir(parents=True, exist_ok=True)
    return ChildSpec(profile=profile, experiment=args.experiment, device=args.device, runs_dir=str(runs_dir), overrides=overrides)


def _measured_sets(args) -> list[str]:
    return [f"train.steps={args.steps}", "train.eval_every=0"]


def _beside(args, lanes, profiles: list[str], r: int) -> dict:
    """Three neighbours train without pause on lanes 0-2 while the fourth lane runs the measured profiles one after
    another; the neighbours are stopped as Ctrl-C stops a sweep once the measured runs have ended (they end
    `interrupted`, every finished run is kept)."""
    from memlab.core.lanes import LaneQueue

    where = Path(args.runs) / "side" / f"beside{r}"
    noise = [(f"noise{i}", _spec(args, "bf16", where, ["train.steps=100000", "train.eval_every=0"])) for i in range(3)]
    measured = [(p, _spec(args, p, where, _measured_sets(args))) for p in profiles]
    ended: dict[str, object] = {}

    def on_result(outcome) -> None:
        if outcome.key in profiles:
            ended[outcome.key] = outcome
            if len(ended) == len(profiles):
                queue.stop(grace_s=10)

    queue = LaneQueue(lanes, on_result=on_result)
    queue.run(noise + measured)  # the neighbours are queued first, so they claim lanes 0-2
    return {p: ended.get(p) for p in profiles}


def _alone(args, lane, profiles: list[str], r: int) -> dict:
    """The measured profiles one after another on `lane`'s GPU with the host otherwise idle."""
    from memlab.core.lanes import LaneQueue

    where = Path(args.runs) / "side" / f"alone{r}"
    outcomes = LaneQueue([lane]).run([(p, _spec(args, p, where, _measured_sets(args))) for p in profiles])
    return {o.key: o for o in outcomes}


def _side_row(profile: str, alone: list, beside: list) -> dict:
    """The median over rounds of each side's median step time; the peaks of every run (equal means all equal)."""
    def figures(outcomes: list) -> tuple[list, list, list]:
        rows = [summary(o.result.run_dir) if o is not None and o.status == "finished" else {} for o in outcomes]
        return ([r.get("step_ms_median") for r in rows], [r.get("peak_alloc_bytes") for r in rows],
                [(r.get("gpu_index"), r.get("gpu_name"), r.get("gpu_serial")) for r in rows])

    (step_a, peak_a, gpu_a), (step_b, peak_b, gpu_b) = figures(alone), figures(beside)
    ok_a, ok_b = [s for s in step_a if s], [s for s in step_b if s]
    ma = float(np.median(ok_a)) if ok_a else None
    mb = float(np.median(ok_b)) if ok_b else None
    diff = (mb - ma) / ma if ma and mb else None
    peaks = peak_a + peak_b
    return {
        "part": "side", "profile": profile, "rounds": len(alone), "gpu_index": gpu_b[0][0] if gpu_b else None,
        "gpu_name": gpu_b[0][1] if gpu_b else None, "gpus": sorted({str(g) for g in gpu_a + gpu_b}),
        "step_ms_alone": ma, "step_ms_beside": mb, "step_diff": diff, "step_ok": diff is not None and abs(diff) <= STEP_TOLERANCE,
        "step_ms_alone_rounds": step_a, "step_ms_beside_rounds": step_b,
        "peak_alloc_alone": peak_a, "peak_alloc_beside": peak_b,
        "peak_equal": None not in peaks and len(set(peaks)) == 1,
        "error": None if len(ok_a) == len(alone) and len(ok_b) == len(beside) else
        f"runs not finished: alone {[o.status if o else None for o in alone]}, beside {[o.status if o else None for o in beside]}",
    }


# ---------------------------------------------------------------------------------------------- (b) a study


def study_wall(args, results: Results, cache: Path, left_s: float, parts: list[str]) -> None:
    """The 4-lane study, then the 1-lane one for at most 4-lane / 0.3 (or what the budget leaves). A 1-lane study
    stopped at t proves 4-lane / 1-lane <= T4 / t; its full time is also estimated from the share of items done.
    Part study4 runs only the first, part study1 only the second (given --four-wall-s): one call each where one
    call's time limit cannot hold both."""
    if "study1a" in parts or "study1b" in parts:
        row = _one_lane_in_two(args, cache, left_s, "a" if "study1a" in parts else "b")
        _chain(args, first_wall_s=row.get("net_s"))
        results.add(row)
        return
    if "study1" in parts:
        four = {"wall_s": args.four_wall_s}
    else:
        four = _study(args, "0,1,2,3", cache, limit_s=min(args.study_limit_s, left_s / (1 if "study4" in parts else 4.5)))
        results.add(four)
        _chain(args, four_wall_s=four["wall_s"])
        if four.get("stopped") or "study4" in parts:
            return
        left_s -= four["wall_s"]
    limit = min(four["wall_s"] / STUDY_BOUND * 1.02, left_s - 30)
    one = _study(args, "0", cache, limit_s=limit)
    one["four_wall_s"], one["ratio"] = four["wall_s"], four["wall_s"] / one["wall_s"]
    one["bound"] = bool(one.get("stopped"))  # stopped: its full time is longer, so the ratio is an upper bound
    if one["bound"] and one["items_done"]:
        one["ratio_estimate"] = four["wall_s"] / (one["wall_s"] * one["items_total"] / one["items_done"])
    results.add(one)


def _gpu_serials() -> str:
    if not shutil.which("nvidia-smi"):
        return ""
    out = subprocess.run(["nvidia-smi", "--query-gpu=serial", "--format=csv,noheader"], capture_output=True, text=True)
    return ",".join(out.stdout.split()) if out.returncode == 0 else ""


def _chain(args, **figures) -> None:
    """Parts study4, study1a and study1b in calls back to back on one machine (its /tmp stays): each leaves its
    figure in RUNS/chain.json with the GPUs' serials, so the next needs no figure typed in from the call before."""
    path = Path(args.runs) / "chain.json"
    state = json.loads(path.read_text()) if path.exists() else {}
    state.update({k: v for k, v in figures.items() if v is not None}, serials=_gpu_serials())
    path.write_text(json.dumps(state))


def _from_chain(args) -> None:
    """--four-wall-s and --first-wall-s, where not given, from the earlier parts on this machine (same serials)."""
    path = Path(args.runs) / "chain.json"
    if not path.exists():
        return
    state = json.loads(path.read_text())
    if state.get("serials") != _gpu_serials():
        sys.exit(f"{path} was left by other GPUs ({state.get('serials')}): not this machine's chain")
    args.four_wall_s = args.four_wall_s or state.get("four_wall_s")
    args.first_wall_s = state.get("first_wall_s") if args.first_wall_s is None else args.first_wall_s
    args.chain_serials = state["serials"]


def _one_lane_in_two(args, cache: Path, left_s: float, half: str) -> dict:
    """The 1-lane study where one device call cannot hold it: part study1a runs it on the first half of the
    profiles; part study1b (the next call, the same machine: its /tmp stays) resumes that folder with every profile,
    which adds the rest. The 1-lane time is a's wall less its report (after its last item) plus b's less its
    start-up (before its first item): what one invocation would not have spent twice, taken off both sides, so the
    sum is if anything short of one invocation's time and the ratio errs high."""
    names = args.study_profiles.split(",")
    if half == "a":
        row = _study(args, "0", cache, limit_s=left_s - 30, profiles=",".join(names[:len(names) // 2]), tag="1lane-a")
        row["net_s"] = row["wall_s"] - row["tail_s"]
        return row
    row = _study(args, "0", cache, limit_s=left_s - 30, fresh=False, tag="1lane-b")
    net = args.first_wall_s + row["wall_s"] - row["head_s"]
    row.update(note=f"two invocations: {args.first_wall_s:.1f} s (a, less its report) + {row['wall_s']:.1f} s "
                    f"less {row['head_s']:.1f} s of start-up (b resumed a's folder with every profile)",
               wall_s=net, four_wall_s=args.four_wall_s, ratio=args.four_wall_s / net, bound=bool(row["stopped"]),
               serials=getattr(args, "chain_serials", ""))
    return row


def _study(args, gpus: str, base_cache: Path, limit_s: float, profiles: str | None = None, fresh: bool = True,
           tag: str | None = None) -> dict:
    """One `memlab study` with its own folder and its own copy of the token cache (no max-batch answers); not
    `fresh`: the folder and cache of the last 1-lane study, resumed."""
    folder = "4lanes" if "," in gpus else "1lane"
    tag = tag or folder
    out, cache = Path(args.runs) / f"study-{folder}", Path(args.runs) / f"cache-{folder}"
    if fresh:
        shutil.rmtree(out, ignore_errors=True)
        shutil.rmtree(cache, ignore_errors=True)
        shutil.copytree(base_cache, cache, ignore=shutil.ignore_patterns("max_batch.json", "*.lock"))
    cmd = memlab("study", "--out", str(out), "--profiles", profiles or args.study_profiles, "--experiment", args.experiment,
                 "--gpu-memory", args.study_gpu_memory, "--steps", str(args.study_steps), "--device", args.device,
                 *(("--gpus", gpus) if args.device == "cuda" else ()),  # cpu: one CPU lane, to try the parts on a laptop
                 *[a for s in args.study_set for a in ("--set", s)])
    log = Path(args.out) / f"study-{tag}.log"
    wall, stopped, rc = _timed(cmd, {**os.environ, "MEMLAB_CACHE": str(cache)}, limit_s, log)
    head_s, last_end_s = _item_span(log)
    state = json.loads((out / "study.json").read_text()) if (out / "study.json").exists() else {"items": {}}
    runs = [i for i in state["items"].values() if i["kind"] != "max"]
    final = ("finished", "rejected", "oom", "nan", "measured", "predicted", "does not fit")  # core.study.state.FINAL
    lanes_used = sorted({i.get("lane", "") for i in state["items"].values()} - {""})
    return {"part": "study", "lanes": 4 if "," in gpus else 1, "gpus": gpus, "wall_s": wall, "stopped": stopped,
            "finished": sum(i["status"] == "finished" for i in runs), "runs": len(runs), "rc": rc,
            "lanes_used": lanes_used, "command": " ".join(cmd[2:]),
            "items_done": sum(i["status"] in final for i in state["items"].values()), "items_total": len(state["items"]),
            "head_s": head_s, "tail_s": wall - last_end_s if last_end_s is not None else 0.0, "serials": _gpu_serials(),
            "note": f"stopped at {wall:.0f} s (its full time is longer)" if stopped else ""}


def _item_span(log: Path) -> tuple[float, float | None]:
    """(second of the first item's start, second of the last item's end) in a stamped study log: an item's start
    line says how many items are left (core.study.execute.Progress.start), its end line does not."""
    starts, ends = [], []
    for line in log.read_text().splitlines():
        stamp, _, text = line.partition("] ")
        if text.startswith(("[max ", "[common ", "[at_max ")):
            (starts if "item(s) left" in text else ends).append(float(stamp.strip("[ s")))
    return (starts[0] if starts else 0.0), (ends[-1] if ends else None)


def _timed(cmd: list[str], env: dict, limit_s: float, log_path: Path) -> tuple[float, bool, int]:
    """(wall seconds, stopped, exit status) of `cmd`, stopped by SIGINT (as Ctrl-C) at `limit_s`: the wall time is
    taken at the stop, so a stopped command's full time is known to be longer."""
    with open(log_path, "w") as log:
        t0 = time.monotonic()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, start_new_session=True, text=True)
        stamp = threading.Thread(target=_stamped, args=(proc.stdout, log, t0), daemon=True)  # when each line came: the schedule
        stamp.start()
        try:
            proc.wait(timeout=limit_s)
            wall = time.monotonic() - t0
            stamp.join(timeout=10)
            return wall, False, proc.returncode
        except subprocess.TimeoutExpired:
            wall = time.monotonic() - t0
            proc.send_signal(signal.SIGINT)  # the study stops and keeps what it finished
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGINT)  # a second one quits at once
                proc.wait(timeout=30)
            stamp.join(timeout=10)
            return wall, True, proc.returncode


def _stamped(lines, log, t0: float) -> None:
    for line in lines:
        log.write(f"[{time.monotonic() - t0:6.1f} s] {line}")
        log.flush()


def prepare_cache(args) -> Path:
    """The token cache the runs share, tokenized once before any timing."""
    cache = Path(args.runs) / "cache"
    env = {**os.environ, "MEMLAB_CACHE": str(cache)}
    subprocess.run(memlab("data", "prepare", "--experiment", args.experiment, "--device", args.device), env=env, check=True)
    os.environ["MEMLAB_CACHE"] = str(cache)
    return cache


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="where lanes.jsonl, lanes.parquet, lanes.md and the study logs go")
    ap.add_argument("--runs", default="/tmp/lanes-runs", help="run folders, studies and caches (not copied back)")
    ap.add_argument("--part", default="side,study", help="side, study (study4 then study1) or both (comma-separated)")
    ap.add_argument("--four-wall-s", type=float, default=None,
                    help="parts study1, study1b: the 4-lane study's wall time (default: part study4's, left on this machine)")
    ap.add_argument("--first-wall-s", type=float, default=None,
                    help="part study1b: part study1a's net_s (default: the one part study1a left on this machine)")
    ap.add_argument("--experiment", default="gpt2s")
    ap.add_argument("--device", default="cuda", help="the children's; cpu (with MEMLAB_FAKE_GPU_COUNT=4) only to try part side on a laptop")
    ap.add_argument("--steps", type=int, default=60, help="steps of each measured run in part side")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of part side, each a beside and an alone pass, the order alternating")
    ap.add_argument("--warm-up", action=argparse.BooleanOptionalAction, default=True,
                    help="run each profile of part side once, unmeasured, before the rounds (warms the compile caches)")
    ap.add_argument("--side-profiles", default=SIDE_PROFILES)
    ap.add_argument("--study-profiles", default=STUDY_PROFILES)
    ap.add_argument("--study-set", action="append", default=None, help=f"--set items of the study (default: {' '.join(STUDY_SETS)})")
    ap.add_argument("--study-gpu-memory", default="8GiB")
    ap.add_argument("--study-steps", type=int, default=20)
    ap.add_argument("--study-limit-s", type=float, default=150, help="the 4-lane study is stopped after this (the 1-lane one after 4-lane / 0.3)")
    ap.add_argument("--budget-s", type=float, default=480, help="the whole script's time: part study gets what part side left")
    args = ap.parse_args()
    args.study_set = args.study_set if args.study_set is not None else STUDY_SETS
    if {"study1", "study1b"} & set(args.part.split(",")):
        _from_chain(args)
    if {"study1", "study1b"} & set(args.part.split(",")) and not args.four_wall_s:
        ap.error("--part study1 and study1b need --four-wall-s (the 4-lane study's wall time)")
    if "study1b" in args.part.split(",") and args.first_wall_s is None:
        ap.error("--part study1b needs --first-wall-s (part study1a's net_s)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = Results(out)
    t0 = time.monotonic()
    cache = prepare_cache(args)
    print(f"token cache ready in {time.monotonic() - t0:.0f} s", flush=True)
    parts = args.part.split(",")
    if "side" in parts:
        side_by_side(args, results)
    if {"study", "study4", "study1", "study1a", "study1b"} & set(parts):
        study_wall(args, results, cache, args.budget_s - (time.monotonic() - t0), parts)
    print(f"done in {time.monotonic() - t0:.0f} s: {out / 'lanes.md'}", flush=True)


if __name__ == "__main__":
    main()
