"""Every event of a `memlab run --memory-snapshot` pickle's allocator trace, frames left out, as gzipped JSON lines
(action, addr, size, stream): the allocator's own segment events beside the allocations, to find where the
allocator model (memlab.core.predict.allocator) first reserves differently from the allocator on a real trace.

    python3 bench/snapshot_events.py runs/<run>/memory_snapshot.pickle OUT.jsonl.gz
"""

from __future__ import annotations

import gzip
import json
import pickle
import sys

if __name__ == "__main__":
    with open(sys.argv[1], "rb") as f:
        snapshot = pickle.load(f)  # a file memlab wrote: the user's own
    with gzip.open(sys.argv[2], "wt", encoding="utf-8") as out:
        for ev in (snapshot.get("device_traces") or [[]])[0]:
            out.write(json.dumps({k: ev.get(k) for k in ("action", "addr", "size", "stream")}) + "\n")
