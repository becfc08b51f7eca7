#!/usr/bin/env bash
# Is a host-bound profile faster when other processes keep the host's CPUs busy? (issue 49: on a 4x H200 host
# gradcp_bf16 ran faster beside three busy GPUs than alone.) One GPU: ROUNDS rounds, each a run of PROFILE alone and
# a run beside SPIN pure-Python busy loops (no GPU work), the order alternating; each run's median step time and
# peak allocated bytes from its summary. Carries polars as .gpu-wheels/spl (bench/README.md).
# usage: [PROFILE=gradcp_bf16] [ROUNDS=5] [SPIN=3] bash bench/host_busy_check.sh
set -u
source bench/gpu_setup.sh >/dev/null
profile=${PROFILE:-gradcp_bf16}; rounds=${ROUNDS:-5}; spin=${SPIN:-3}
out=$OUT/host-busy; mkdir -p "$out"; export MEMLAB_CACHE=/tmp/hb-cache
python3 -m memlab data prepare --experiment gpt2s --device cuda >/dev/null
python3 -m memlab run --profile "$profile" --experiment gpt2s --set train.steps=5 --set train.eval_every=0 --runs-dir /tmp/hb-warm >/dev/null 2>&1
one() {  # $1 = alone|busy
  local pids=()
  if [ "$1" = busy ]; then for _ in $(seq "$spin"); do python3 -c "while True: pass" & pids+=($!); done; fi
  python3 -m memlab run --profile "$profile" --experiment gpt2s --set train.steps=60 --set train.eval_every=0 --runs-dir "/tmp/hb-$1" >/dev/null 2>&1
  [ ${#pids[@]} -gt 0 ] && kill "${pids[@]}"
  python3 - "$1" "/tmp/hb-$1" >> "$out/runs.jsonl" <<'PY'
import json, sys, pathlib, pyarrow.parquet as pq
where, runs = sys.argv[1], sorted(pathlib.Path(sys.argv[2]).glob("*/summary.parquet"))
row = pq.read_table(runs[-1]).to_pylist()[0]
print(json.dumps({"where": where, "step_ms_median": row.get("step_ms_median"), "peak_alloc_bytes": row.get("peak_alloc_bytes"), "run": str(runs[-1].parent.name)}))
PY
}
for r in $(seq "$rounds"); do
  if [ $((r % 2)) = 1 ]; then one alone; one busy; else one busy; one alone; fi
  tail -2 "$out/runs.jsonl"
done
python3 - "$out/runs.jsonl" <<'PY' | tee "$out/summary.txt"
import json, sys, statistics
rows = [json.loads(l) for l in open(sys.argv[1])]
for where in ("alone", "busy"):
    ms = [r["step_ms_median"] for r in rows if r["where"] == where]
    print(f"{where}: median {statistics.median(ms):.2f} ms over {len(ms)} runs: " + ", ".join(f"{m:.2f}" for m in ms))
PY
nproc; nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader
