#!/usr/bin/env bash
# Issue 17 on one GPU: does the batch find-batch finds under --gpu-memory 24GiB keep the whole process (NVML's
# per-process figure: context, workspaces, allocator) under 24 GiB? find-batch (with its expandable_segments probe),
# then a training run at that batch under the same cap. The seed-so-posts shape on the built-in corpus.
# usage: bash bench/cap_check.sh OUT_DIR [PROFILE]
set -u
out=${1:?output folder}; p=${2:-bf16}; mkdir -p "$out"
sets=(--set 'data.source="stdlib"' --set 'data.tokenizer="bpe:8192"' --set data.streaming=false --set 'data.split="train"')
memlab find-batch --profile "$p" --experiment seed-so-posts --gpu-memory 24GiB "${sets[@]}" 2>&1 | tee "$out/find_batch_$p.txt" | tail -25
# one search (a second, for --json, would repeat its expandable_segments probe): the batch from its report's line
b=$(sed -n 's/^max micro-batch: \([0-9]*\).*/\1/p' "$out/find_batch_$p.txt")
[ -n "$b" ] || { echo "find-batch found no batch (see $out/find_batch_$p.txt)"; exit 1; }
echo "== training at the found batch $b under the 24 GiB cap"
MEMLAB_GPU_MEMORY_BYTES=$((24 * 1024**3)) MEMLAB_NVML_PER_PROCESS=1 memlab run --profile "$p" --experiment seed-so-posts \
  --device cuda --runs-dir "$out/runs" "${sets[@]}" --set train.batch_size="$b" 2>&1 | tail -6
python3 - "$out" <<'PY'
import glob, sys
import polars as pl
cap = 24 * 2**30
for f in glob.glob(sys.argv[1] + "/runs/*/summary.parquet"):
    d = pl.read_parquet(f).to_dicts()[0]
    for label, key in (("this process (NVML per-process)", "peak_nvml_process_bytes"), ("the device (NVML used)", "peak_nvml_bytes")):
        v = d.get(key)
        if v is None:
            print(f"{label}: not listed by NVML")
            continue
        print(f"{d['profile']} batch {d['batch_size']}: {label} peak {v / 2**30:.2f} GiB against the 24 GiB card: "
              f"{'under' if v <= cap else 'OVER'} by {abs(cap - v) / 2**30:.2f} GiB")
    print(f"reserved peak {d['peak_reserved_bytes'] / 2**30:.2f} GiB, allocator budget {(d['allocator_budget_bytes'] or 0) / 2**30:.2f} GiB, status {d['status']}")
PY
python3 - <<'PY' 2>&1  # what NVML's device figure holds besides processes (the driver's reserve), for the record
import pynvml
pynvml.nvmlInit()
h = pynvml.nvmlDeviceGetHandleByIndex(0)
v1 = pynvml.nvmlDeviceGetMemoryInfo(h)
print(f"NVML v1 (idle, no process): total {v1.total / 2**30:.3f} used {v1.used / 2**30:.3f} GiB")
try:
    v2 = pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)
    print(f"NVML v2: total {v2.total / 2**30:.3f} reserved {v2.reserved / 2**30:.3f} used {v2.used / 2**30:.3f} GiB")
except Exception as e:
    print(f"NVML v2 not available: {e}")
PY
