"""The default method (trace: the real step on fake tensors, then the allocator replay) on the gpt family's held-out
GPU runs, beside the analytic formula those runs were held out for (tests/test_estimate_heldout.py: seed, deep and
long shapes, every single-GPU profile, H100 and H200 measurements committed with their commands). Each run is
predicted from its own run.json at its own micro-batch on an 80 GB H100; a trace that takes more than --timeout
seconds is left out (a compiled step whose Inductor trace is not among those made ahead).

    python bench/trace_heldout.py --out bench/results/trace-heldout-cpu/rows.jsonl   # appends a row per run
    python bench/trace_heldout.py --table bench/results/trace-heldout-cpu/rows.jsonl
    python bench/trace_heldout.py --out /tmp/rows.jsonl --only ddp_bf16 window          # some profiles only
    python bench/trace_heldout.py --out /tmp/rows.jsonl --runs tests/data/gpu/frontier-h100/*/runs   # other runs
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent / "tests"


class TimedOut(Exception):
    pass


def _alarm(*_: object) -> None:
    raise TimedOut


def runs_of(folders: list[Path]):
    """(a name for the folder, each run folder in it): the held-out set's, or the folders named."""
    if not folders:
        sys.path.insert(0, str(TESTS))
        import test_estimate_heldout as heldout

        yield from heldout._runs()
    for folder in folders:
        for summary in sorted(folder.glob("*/summary.parquet")):
            yield str(folder), summary.parent


def predict_all(out: Path, timeout: int, only: set[str], folders: list[Path]) -> None:
    import polars as pl

    from memlab.core.config import experiment_from_dict, profile_from_dict
    from memlab.core.predict import Card, predict
    from memlab.core.predict.analytic import peak_for_run, vocab_for

    signal.signal(signal.SIGALRM, _alarm)
    with out.open("a") as rows:
        for shape, run_dir in runs_of(folders):
            info = json.loads((run_dir / "run.json").read_text())
            if only and info["profile"]["name"] not in only:
                continue
            row = pl.read_parquet(run_dir / "summary.parquet").row(0, named=True)
            experiment, profile = experiment_from_dict(info["experiment"]), profile_from_dict(info["profile"])
            vocab, _ = vocab_for(experiment)
            analytic = peak_for_run(experiment, profile, vocab_size=vocab, micro_batch=row["micro_batch"], device="cuda")
            t, traced, why = time.monotonic(), None, ""
            signal.alarm(timeout)
            try:
                traced = predict(experiment, profile, row["micro_batch"], Card(80 * 2**30, "H100", "80 GB H100"),
                                 use_cache=False).allocated_bytes
            except TimedOut:
                why = "timeout"
            except Exception as e:  # noqa: BLE001 (a row says why it has no figure)
                why = f"{type(e).__name__}: {str(e)[:150]}"
            signal.alarm(0)
            rows.write(json.dumps(dict(shape=shape.split(" (")[0], profile=profile.name, run=run_dir.name,
                                       measured=row["peak_alloc_bytes"], analytic=analytic, trace=traced,
                                       s=round(time.monotonic() - t, 1), err=why)) + "\n")
            rows.flush()


def table(path: Path) -> str:
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    lines = ["| shape | profile | measured GiB | analytic | trace | trace s |", "|---|---|---|---|---|---|"]
    rows = [r for r in rows if r["measured"]]  # a run that measured no peak (it failed) has nothing to compare
    for r in rows:
        m = r["measured"]
        off = {k: f"{(r[k] - m) / m:+.2%}" if r[k] else r["err"] or "—" for k in ("analytic", "trace")}
        lines.append(f"| {r['shape']} | {r['profile']} | {m / 2**30:.2f} | {off['analytic']} | {off['trace']} | {r['s']} |")
    known = [r for r in rows if r["trace"]]
    outside = [f"{r['shape']} {r['profile']} {(r['trace'] - r['measured']) / r['measured']:+.1%}" for r in known
               if abs(r["trace"] - r["measured"]) > 0.05 * r["measured"]]
    lines.append(f"\n{len(known)} of {len(rows)} traced; outside 5%: {', '.join(outside) or 'none'}; "
                 f"{sum(r['s'] for r in rows):.0f} s in all")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, help="append a row per held-out run here")
    ap.add_argument("--table", type=Path, help="print the markdown table of these rows")
    ap.add_argument("--timeout", type=int, default=120)
    ap.add_argument("--only", nargs="*", default=[], help="these profiles only")
    ap.add_argument("--runs", type=Path, nargs="*", default=[], help="the runs in these folders instead of the held-out set")
    args = ap.parse_args()
    if args.out:
        predict_all(args.out, args.timeout, set(args.only), args.runs)
    if args.table:
        print(table(args.table))


if __name__ == "__main__":
    main()
