"""Issue 5 on a CPU: the estimator of this checkout against what the H100 measured (tests/data/gpu/estimate-h100/).

The GPU figures are read back from the files `bench/estimate_vs_measured.py` wrote there; only the predictions are
computed here, so a change to memlab/core/estimate.py is checked against the same measurements without a GPU:

  peak       every built-in profile at micro-batch 16 (the fixed runs): predicted vs measured peak_alloc_bytes
  probes     every probe of every find-batch search that fitted: predicted vs measured peak at that batch
  max batch  per search: the largest batch that fitted and the smallest that did not (exact when they are one
             apart; a search stopped by its time budget leaves a bracket), against predict_max_batch at that cap

    python bench/estimate_check.py                       # prints the tables, writes bench/results/estimate-h100/check.md
    python bench/estimate_check.py --results DIR --out -  # another folder; print only
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from memlab.core.units import GIB, gib_number

EXPERIMENT = "gpt2s"
PROBE_LINE = re.compile(r"find-batch (\S+): micro-batch (\d+) (fits|OOM) · peak ([0-9.]+) GiB")
CAP_LINE = re.compile(r"find-batch (\S+) under ([0-9.]+)GiB")


def _estimator():
    from memlab.core.predict import analytic as E
    from memlab.core.config import load_experiment, load_profile

    exp = load_experiment(EXPERIMENT)
    vocab, _ = E.vocab_for(exp)

    def load(profile: str, accumulation: int | None):
        prof = load_profile(profile)
        if accumulation is not None:
            prof.accumulation.steps = accumulation
        return prof

    # accumulation=None: the profile's own (the fixed runs); 1 for the searches, whose probes train without it
    def total(profile: str, batch: int, accumulation: int | None = None) -> int:
        return E.estimate(exp, load(profile, accumulation), vocab_size=vocab, micro_batch=batch).total_bytes

    def max_batch(profile: str, cap: int) -> int:
        # these searches capped the allocator itself at `cap` (before --gpu-memory meant a whole card): the card
        # that leaves the allocator `cap` is `cap` plus the CUDA context
        return E.predict_max_batch(exp, load(profile, 1), vocab_size=vocab, memory_bytes=cap + E.CUDA_CONTEXT_BYTES)

    return total, max_batch


def read_fixed(folder: Path) -> list[dict]:
    import polars as pl

    rows = []
    for f in sorted(folder.glob("*.parquet")):
        df = pl.read_parquet(f)
        if "kind" not in df.columns or "measured_bytes" not in df.columns:
            continue
        for r in df.filter((pl.col("kind") == "fixed") & (pl.col("status") == "finished")).iter_rows(named=True):
            rows.append({"profile": r["profile"], "batch": r["micro_batch"], "measured": r["measured_bytes"], "kernel": r.get("attention_kernel"), "source": f.name})
    return rows


def read_searches(folder: Path) -> dict[tuple[str, int], dict]:
    """(profile, cap bytes) -> {"fits": {batch: peak bytes}, "ooms": set of batches}: each search's probes, from the
    Parquet's `probe_log` (exact bytes) and from the bench's logs (peaks to 0.01 GiB; older runs kept only these)."""
    import json

    import polars as pl

    searches: dict[tuple[str, int], dict] = {}

    def add(name: str, cap: int, batch: int, fits: bool, peak: int | None, source: str) -> None:
        s = searches.setdefault((name, cap), {"fits": {}, "ooms": set(), "source": source})
        if fits:
            s["fits"].setdefault(batch, peak)  # the first reading wins: Parquet (exact) is read before the logs
        else:
            s["ooms"].add(batch)

    for f in sorted(folder.glob("*.parquet")):
        df = pl.read_parquet(f)
        if "probe_log" not in df.columns:
            continue
        for r in df.filter(pl.col("kind") == "find_batch").iter_rows(named=True):
            for probe in json.loads(r["probe_log"] or "[]"):
                add(r["profile"], r["cap_bytes"], probe["batch"], probe["fits"], probe["peak_alloc_bytes"], f.name)
    for f in sorted(folder.glob("*.log")):
        caps: dict[str, int] = {}
        for line in f.read_text(errors="replace").splitlines():
            if m := CAP_LINE.search(line):
                caps[m.group(1)] = int(float(m.group(2)) * GIB)
            elif m := PROBE_LINE.search(line):
                name, batch, outcome, peak = m.group(1), int(m.group(2)), m.group(3), float(m.group(4))
                add(name, caps[name], batch, outcome == "fits", int(peak * GIB), f.name)
    return searches


def pct(pred: float, meas: float) -> float:
    return 100.0 * (pred - meas) / meas


# The H100's measurements live with the tests that read them; the table this writes is the evidence the docs cite.
RESULTS = Path(__file__).resolve().parents[1] / "tests" / "data" / "gpu" / "estimate-h100"
CHECK = Path(__file__).resolve().parent / "results" / "estimate-h100" / "check.md"


def compare(folder: Path = RESULTS) -> dict[str, list[dict]]:
    """Every measured figure beside this checkout's prediction: {"peaks": [...], "max_batches": [...]} with the
    signed error in percent (max batches from a stopped search: the worse end of the bracket)."""
    total, max_batch = _estimator()
    peaks = [r | {"predicted": total(r["profile"], r["batch"]), "kind": "fixed"} for r in read_fixed(folder)]
    searches = read_searches(folder)
    for (name, cap), s in sorted(searches.items()):
        peaks += [{"profile": name, "batch": b, "measured": m, "cap": cap, "kind": "probe", "predicted": total(name, b, accumulation=1)}
                  for b, m in sorted(s["fits"].items())]
    for r in peaks:
        r["error_pct"] = pct(r["predicted"], r["measured"])
    batches = []
    for (name, cap), s in sorted(searches.items()):
        lo = max(s["fits"], default=0)
        hi = min((b for b in s["ooms"] if b > lo), default=None)
        if hi is None:
            continue
        pred = max_batch(name, cap)
        err = pct(pred, lo) if hi - lo == 1 else max(pct(pred, lo), pct(pred, hi - 1), key=abs)
        batches.append({"profile": name, "cap": cap, "largest_fit": lo, "smallest_oom": hi, "predicted": pred, "error_pct": err})
    return {"peaks": peaks, "max_batches": batches}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", default=str(RESULTS))
    ap.add_argument("--out", default=None, help="markdown file to write (default: bench/results/estimate-h100/check.md; - for none)")
    args = ap.parse_args()
    folder = Path(args.results)
    total, max_batch = _estimator()
    lines = [f"# estimator vs H100 measurements ({folder.name})", "", "command: `python bench/estimate_check.py`", ""]
    worst: list[float] = []

    lines += ["## peak at micro-batch 16", "", "| profile | kernel | measured GiB | predicted GiB | error |", "|:--|:--|--:|--:|--:|"]
    for r in sorted(read_fixed(folder), key=lambda r: r["profile"]):
        pred = total(r["profile"], r["batch"])
        err = pct(pred, r["measured"])
        worst.append(abs(err))
        lines.append(f"| {r['profile']} | {r['kernel']} | {gib_number(r['measured'])} | {gib_number(pred)} | {err:+.1f}% |")

    searches = read_searches(folder)
    lines += ["", "## probes that fitted (peak at the probed batch)", "", "| profile | cap GiB | batch | measured GiB | predicted GiB | error |", "|:--|--:|--:|--:|--:|--:|"]
    for (name, cap), s in sorted(searches.items()):
        for b, peak in sorted(s["fits"].items()):
            pred = total(name, b, accumulation=1)
            err = pct(pred, peak)
            worst.append(abs(err))
            lines.append(f"| {name} | {gib_number(cap, 0)} | {b} | {gib_number(peak)} | {gib_number(pred)} | {err:+.1f}% |")

    lines += ["", "## max batch under the cap", "", "| profile | cap GiB | largest fit | smallest OOM | found | predicted | error |", "|:--|--:|--:|--:|--:|--:|--:|"]
    batch_errors: list[float] = []
    for (name, cap), s in sorted(searches.items()):
        lo = max(s["fits"], default=0)
        hi = min((b for b in s["ooms"] if b > lo), default=None)
        pred = max_batch(name, cap)
        exact = hi is not None and hi - lo == 1
        if exact:
            err = pct(pred, lo)
            found, shown = str(lo), f"{err:+.1f}%"
        elif hi is not None:  # a bracket [lo, hi - 1]: the worse of its two ends
            err = max(pct(pred, lo), pct(pred, hi - 1), key=abs)
            found, shown = f"{lo}..{hi - 1} (stopped)", f"{err:+.1f}% at worst"
        else:
            continue
        batch_errors.append(abs(err))
        lines.append(f"| {name} | {gib_number(cap, 0)} | {lo} | {hi} | {found} | {pred} | {shown} |")

    n_peak, n_batch = len(worst), len(batch_errors)
    lines += ["", f"peaks within 10%: {sum(e <= 10 for e in worst)}/{n_peak} (worst {max(worst, default=0):.1f}%) · "
              f"max batches within 10%: {sum(e <= 10 for e in batch_errors)}/{n_batch} (worst {max(batch_errors, default=0):.1f}%)"]
    text = "\n".join(lines) + "\n"
    print(text)
    out = args.out or str(CHECK)
    if out != "-":
        Path(out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
