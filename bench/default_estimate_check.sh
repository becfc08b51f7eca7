#!/usr/bin/env bash
# Issue 46: `memlab estimate` without --gpu-memory (auto = the trace and the allocator replay, on this GPU's whole
# memory) against find-batch on the same GPU, uncapped: the estimate's max_batch must not be above what fits. On an
# H200 (141 GB), a card no figure of the estimator was fitted on. Each profile's estimate is written before any
# search runs. Carries polars as .gpu-wheels/spl.
# usage: [PROFILES="bf16 gradcp_bf16"] [SEARCH_TIMEOUT=240] bash bench/default_estimate_check.sh
set -u
source bench/gpu_setup.sh >/dev/null
out=$OUT/defcheck; mkdir -p "$out"
memlab data prepare --experiment gpt2s >/dev/null 2>&1
profiles=${PROFILES:-bf16 gradcp_bf16}
for p in $profiles; do
  MEMLAB_ANSWERS=off memlab estimate --profile "$p" --json > "$out/estimate-$p.json" 2> "$out/estimate-$p.err"
done
for p in $profiles; do
  timeout "${SEARCH_TIMEOUT:-240}" memlab find-batch --profile "$p" --steps 3 --json > "$out/find-batch-$p.json" 2> "$out/find-batch-$p.log"
  echo "find-batch $p rc $?" >> "$out/find-batch-$p.log"
done
nvidia-smi --query-gpu=name,serial,memory.total,driver_version --format=csv,noheader > "$out/gpu.txt"
python3 - "$out" $profiles <<'PY' | tee "$out/summary.md"
import json, sys
out, profiles = sys.argv[1], sys.argv[2:]
print("| profile | card | estimate max_batch | analytic | replayed | find-batch | estimate <= found |")
print("|---|---|---|---|---|---|---|")
for p in profiles:
    try:
        e = json.load(open(f"{out}/estimate-{p}.json"))
    except Exception as exc:
        print(f"| {p} | estimate failed: {exc} |"); continue
    try:
        f = json.load(open(f"{out}/find-batch-{p}.json"))
        found = f.get("max_batch")
    except Exception as exc:
        found = f"none ({type(exc).__name__})"
    ok = isinstance(found, int) and e["max_batch"] <= found
    print(f"| {p} | {e['memory']} | {e['max_batch']} | {e['analytic_max_batch']} | {e.get('replayed', {}).get('max_batch')} | {found} | {ok} |")
PY
