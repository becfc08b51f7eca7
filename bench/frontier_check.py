"""Issue 19 on a CPU: the estimator of this checkout against the H100 runs of tests/data/gpu/frontier-h100/.

Every finished run there (or one stopped after all its training steps, in its final evaluation: its peak is the
training's) is re-estimated from its own run.json (profile and experiment as they ran, its micro-batch)
and set beside its measured peak allocated memory. Runs whose technique's code changed after they ran are listed
as superseded and not checked (the run made after the change is).

    python bench/frontier_check.py              # prints the table, writes bench/results/frontier-h100/check.md
    python bench/frontier_check.py --out -      # print only
    python bench/frontier_check.py --part f3    # the part's runs as NOTE.md lists them
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[1] / "tests" / "data" / "gpu" / "frontier-h100"  # the runs, which tests read too
# (part, profile): run before a change to that technique's code; the part named in the reason ran after it
SUPERSEDED = {
    ("a", "act_offload_overlap"): "ran with record_stream (part c runs the current offload)",
    ("a2", "act_offload_overlap"): "ran before the head throttled (part c runs the current offload)",
    ("b", "cce"): "ran with CCE's filtered backward (part e runs it exact)",
    ("d", "cce"): "ran with CCE's filtered backward (part e runs it exact)",
}


def rows(results: Path = RESULTS) -> list[dict]:
    import polars as pl

    from memlab.core.predict import analytic as E
    from memlab.core.config import experiment_from_dict, profile_from_dict

    out = []
    for run in sorted(results.glob("*/runs/*/run.json")):
        part = run.parent.parent.parent.name
        meta = json.loads(run.read_text())
        summary = pl.read_parquet(run.parent / "summary.parquet").to_dicts()[0]
        row = {"part": part, "run": run.parent.name, "experiment": meta["experiment"]["name"], "profile": _label(summary["profile"], meta),
               "status": summary["status"], "batch": summary["micro_batch"], "measured": summary["peak_alloc_bytes"],
               "superseded": SUPERSEDED.get((part, summary["profile"])),
               "all_steps": summary["steps"] == meta["experiment"]["train"]["steps"]}
        if _counts(row):
            exp, prof = experiment_from_dict(meta["experiment"]), profile_from_dict(meta["profile"])
            vocab, _ = E.vocab_for(exp)
            row["predicted"] = E.estimate(exp, prof, vocab_size=vocab, micro_batch=row["batch"], device="cuda").total_bytes
            row["error_pct"] = 100 * (row["predicted"] - row["measured"]) / row["measured"]
        out.append(row)
    return out


def _label(profile: str, meta: dict) -> str:
    """The profile's name, with the compiler's budget where a --set gave it (a sweep's --vary names it already)."""
    budget = meta["profile"].get("checkpointing", {}).get("budget", 1.0)
    return f"{profile}@budget={budget:g}" if budget < 1 and "@" not in profile else profile


def _counts(row: dict) -> bool:
    """Finished, or interrupted only after its last training step (in the final evaluation)."""
    return row["status"] == "finished" or (row["status"] == "interrupted" and row["all_steps"])


def checked(all_rows: list[dict]) -> list[dict]:
    """The runs the bar applies to: every training step ran, and not superseded."""
    return [r for r in all_rows if _counts(r) and not r["superseded"]]


def markdown(all_rows: list[dict]) -> str:
    gib = 2**30
    lines = ["| part | experiment | profile | batch | measured GiB | predicted GiB | error | note |", "|:--|:--|:--|--:|--:|--:|--:|:--|"]
    for r in all_rows:
        pred = f"{r['predicted'] / gib:.2f}" if "predicted" in r else "—"
        err = f"{r['error_pct']:+.1f}%" if "error_pct" in r else "—"
        note = r["superseded"] or ("" if r["status"] == "finished" else
                                   "stopped in its final evaluation, after every training step" if _counts(r) else f"{r['status']}: not checked")
        measured = "—" if r["measured"] is None else f"{r['measured'] / gib:.2f}"
        lines.append(f"| {r['part']} | {r['experiment']} | {r['profile']} | {r['batch']} | {measured} | {pred} | {err} | {note} |")
    return "\n".join(lines) + "\n"


def part_table(part: str, results: Path = RESULTS) -> str:
    """One part's runs, read from their summary.parquet (NOTE.md's "The runs" section)."""
    import polars as pl

    gib = 2**30
    lines = ["| experiment | profile | status | batch | fwd / bwd / opt GiB | peak GiB | reserved | NVML | step ms | tokens/s | val ppl |",
             "|:--|:--|:--|--:|--:|--:|--:|--:|--:|--:|--:|"]
    for run in sorted((results / part / "runs").glob("*/run.json")):
        r = pl.read_parquet(run.parent / "summary.parquet").to_dicts()[0]
        label = _label(r["profile"], json.loads(run.read_text()))
        g = [("—" if r[k] is None else f"{r[k] / gib:.2f}") for k in
             ("peak_alloc_fwd_bytes", "peak_alloc_bwd_bytes", "peak_alloc_opt_bytes", "peak_alloc_bytes", "peak_reserved_bytes", "peak_nvml_bytes")]
        ms = "—" if r["step_ms_median"] is None else f"{r['step_ms_median']:.1f}"
        tps = "—" if r["tokens_per_s"] is None else f"{r['tokens_per_s']:,.0f}"
        ppl = "—" if r["val_ppl"] is None else f"{r['val_ppl']:,.2f}"
        lines.append(f"| {r['experiment']} | {label} | {r['status']} | {r['micro_batch']} | {g[0]} / {g[1]} / {g[2]} | {g[3]} | {g[4]} | {g[5]} | {ms} | {tps} | {ppl} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" / "frontier-h100" / "check.md"), help="where to write the table; - prints only")
    ap.add_argument("--part", help="print this part's runs instead (NOTE.md's tables)")
    a = ap.parse_args()
    if a.part:
        print(part_table(a.part))
        return
    all_rows = rows()
    text = markdown(all_rows)
    print(text)
    worst = max((abs(r["error_pct"]) for r in checked(all_rows)), default=0.0)
    print(f"{len(checked(all_rows))} runs checked; largest error {worst:.1f}%")
    if a.out != "-":
        Path(a.out).write_text("# The estimator against the H100 runs (python bench/frontier_check.py)\n\n" + text)


if __name__ == "__main__":
    main()
