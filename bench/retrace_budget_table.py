"""Trace again every entry of core/predict/inductor_traces.json under this torch release and rewrite its table
(after a change to memlab.core.predict.inductor: each entry must stay exactly what the module prints): EVENTS, what
`python -m memlab.core.predict.inductor KEY` prints, a compiled step's (or block's) events.

    python3 bench/retrace_budget_table.py [--jobs 2] [--add-cached] [--add KEY ...]

--add-cached first adds the traces of this torch release found in memlab's cache folder (compile-events-*.json of
this code, tracer_fingerprint: what the predictor's child printed for a shape the table lacked, e.g. a new held-out
run); --add, the shapes named (keys as the table writes them, the torch release's field left out or not).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

TABLE = Path(__file__).resolve().parent.parent / "core" / "predict" / "inductor_traces.json"


def traced(key: str) -> str:
    from memlab.core.predict.inductor import shape_of

    shape = dataclasses.asdict(shape_of(key))
    done = subprocess.run([sys.executable, "-m", "memlab.core.predict.inductor", json.dumps(shape)],
                          capture_output=True, text=True, check=True)
    return done.stdout.strip().splitlines()[-1]


def written(tables: dict[str, dict]) -> str:
    """The tables as the file holds them: one entry a line, so that a retrace's diff names the entries it changed."""
    parts = []
    for name, table in tables.items():
        body = ",\n".join(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in table.items())
        parts.append(f"{json.dumps(name)}: {{\n{body}\n}}")
    return "{" + ", ".join(parts) + "}\n"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--add-cached", action="store_true")
    ap.add_argument("--add", nargs="*", default=[])
    args = ap.parse_args()
    from memlab.core.predict.inductor import _key, _read_cache, shape_of

    release = torch.__version__.split("+")[0]
    tables = json.loads(TABLE.read_text())
    table = tables["EVENTS"]
    if args.add_cached:
        table.update({k: v for k, v in _read_cache().items() if k not in table and json.loads(k)["torch"] == release})
    table.update({_key(shape_of(k)): None for k in args.add})
    keys = [k for k in table if json.loads(k)["torch"] == release]
    with ThreadPoolExecutor(args.jobs) as pool:
        lines = dict(zip(keys, pool.map(traced, keys)))
    changed = [k for k in keys if json.loads(lines[k]) != table[k]]
    table.update({k: json.loads(line) for k, line in lines.items()})
    print(f"EVENTS: {len(keys)} retraced under torch {release}, {len(changed)} changed or added")
    for k in changed:
        print("  changed:", re.sub(r'"torch": "[^"]+", ', "", k))
    TABLE.write_text(written(tables))


if __name__ == "__main__":
    main()
