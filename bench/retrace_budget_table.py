"""Trace again every entry of core/compile_budget_traces.py under this torch release and rewrite its two tables (after
a change to memlab.core.predict.inductor: each entry must stay exactly what the module prints): TRACED, what
`python -m memlab.core.predict.inductor KEY` prints, and EVENTS, what it prints with `--events`.

    python3 bench/retrace_budget_table.py [--jobs 2] [--add-cached]

--add-cached first adds the traces of this torch release found in memlab's cache folder (compile-budget-*.json and
compile-events-*.json of this code, tracer_fingerprint: what the estimator's child printed for a shape the tables
lacked, e.g. a new held-out run).
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

TABLE = Path(__file__).resolve().parent.parent / "core" / "compile_budget_traces.py"
# each table's name in the file, the child's flags for it, and how an entry is written (EVENTS holds None: as Python)
TABLES = {"TRACED": ((), json.dumps), "EVENTS": (("--events",), repr)}


def traced(key: str, flags: tuple[str, ...]) -> str:
    from memlab.core.predict.inductor import shape_of

    shape = dataclasses.asdict(shape_of(key))
    done = subprocess.run([sys.executable, "-m", "memlab.core.predict.inductor", *flags, json.dumps(shape)],
                          capture_output=True, text=True, check=True)
    return done.stdout.strip().splitlines()[-1]


def rewritten(text: str, name: str, table: dict, lines: dict[str, str]) -> str:
    """`text` with the dict literal `name` replaced by `table`, each entry as retraced (`lines`: JSON) or as it was."""
    write = TABLES[name][1]
    start = text.index(f"{name}: dict[str, dict] = {{\n")
    end = text.index("\n}\n", start) + len("\n}\n")
    body = "".join(f"    {json.dumps(k)}:\n        {write(json.loads(lines[k]) if k in lines else v)},\n" for k, v in table.items())
    return text[:start] + f"{name}: dict[str, dict] = {{\n" + body + "}\n" + text[end:]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--add-cached", action="store_true")
    args = ap.parse_args()
    from memlab.core.predict import inductor_traces as compile_budget_traces
    from memlab.core.predict.inductor import _BUDGET_CACHE, _EVENTS_CACHE, _read_cache

    release = torch.__version__.split("+")[0]
    text = TABLE.read_text()
    for name, (flags, _) in TABLES.items():
        table = getattr(compile_budget_traces, name)
        if args.add_cached:
            cached = _read_cache(_EVENTS_CACHE if flags else _BUDGET_CACHE)
            table.update({k: v for k, v in cached.items() if k not in table and json.loads(k)["torch"] == release})
        keys = [k for k in table if json.loads(k)["torch"] == release]
        with ThreadPoolExecutor(args.jobs) as pool:
            lines = dict(zip(keys, pool.map(lambda k, f=flags: traced(k, f), keys)))
        text = rewritten(text, name, table, lines)
        changed = [k for k in keys if json.loads(lines[k]) != table[k]]
        print(f"{name}: {len(keys)} retraced under torch {release}, {len(changed)} changed")
        for k in changed:
            print("  changed:", re.sub(r'"torch": "[^"]+", ', "", k))
    TABLE.write_text(text)


if __name__ == "__main__":
    main()
