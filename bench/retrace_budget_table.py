"""Trace again every entry of core/compile_budget_traces.py under this torch release and rewrite the table (after a
change to memlab.core.compile_budget_model: each entry must stay exactly what the module prints).

    python3 bench/retrace_budget_table.py [--jobs 2] [--add-cached]

--add-cached first adds the traces of this torch release found in memlab's cache folder (compile-budget.json: what
the estimator's child printed for a shape the table lacked, e.g. a new held-out run), then retraces every entry.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

TABLE = Path(__file__).resolve().parent.parent / "core" / "compile_budget_traces.py"


def traced(key: str) -> str:
    shape = {k: v for k, v in json.loads(key).items() if k != "torch"}
    done = subprocess.run([sys.executable, "-m", "memlab.core.compile_budget_model", json.dumps(shape)],
                          capture_output=True, text=True, check=True)
    return done.stdout.strip().splitlines()[-1]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--add-cached", action="store_true")
    args = ap.parse_args()
    from memlab.core.compile_budget_model import _read_cache
    from memlab.core.compile_budget_traces import TRACED

    release = torch.__version__.split("+")[0]
    if args.add_cached:
        TRACED.update({k: v for k, v in _read_cache().items() if k not in TRACED and json.loads(k)["torch"] == release})
    jobs = args.jobs
    keys = [k for k in TRACED if json.loads(k)["torch"] == release]
    with ThreadPoolExecutor(jobs) as pool:
        lines = dict(zip(keys, pool.map(traced, keys)))
    text = TABLE.read_text()
    head = text[: text.index("TRACED: dict[str, dict] = {")]
    body = "".join(f"    {json.dumps(k)}:\n        {lines.get(k) or json.dumps(v)},\n" for k, v in TRACED.items())
    TABLE.write_text(head + "TRACED: dict[str, dict] = {\n" + body + "}\n")
    changed = [k for k in keys if json.loads(lines[k]) != TRACED[k]]
    print(f"{len(keys)} retraced under torch {release}, {len(changed)} changed")
    for k in changed:
        print("  changed:", re.sub(r'"torch": "[^"]+", ', "", k))


if __name__ == "__main__":
    main()
