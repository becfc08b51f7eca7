#!/usr/bin/env bash
# Where does gradcp_bf16's run-to-run spread come from? (issue 49: alone on one GPU of a 4x H200 host its median
# step time landed anywhere in 46-65 ms from one process to the next, while bf16's stayed within 0.5%.)
# One GPU (GPU ${GPU:-0}), the rest idle: ROUNDS rounds of three runs each, the CPU placement rotating:
#   free   no affinity (what a lane gets today);
#   slice  the last quarter of the host's vCPUs (what one lane of four would get if lanes split the host);
#   cores  one vCPU on each of 4 physical cores (no SMT sibling shared).
# Each run: the summary's median step, forward, backward and optimizer milliseconds (CUDA events), the process's
# user + system CPU seconds and wall seconds; the GPU's SM clock and power sampled every 0.5 s beside it; host_ms_median
# where the run recorded one (only commit 628b3b7 did; reverted, bench/results/lanes-h200x4/NOTE.md says why).
# Carries polars as .gpu-wheels/spl (bench/README.md).
# usage: [PROFILE=gradcp_bf16] [ROUNDS=3] [STEPS=60] [GPU=3] [TAG=jitter] bash bench/gradcp_jitter.sh
set -u
source bench/gpu_setup.sh >/dev/null
profile=${PROFILE:-gradcp_bf16}; rounds=${ROUNDS:-3}; steps=${STEPS:-60}; gpu=${GPU:-0}
out=$OUT/${TAG:-jitter}; mkdir -p "$out"; export MEMLAB_CACHE=/tmp/jt-cache CUDA_VISIBLE_DEVICES=$gpu
lscpu -p=CPU,CORE,SOCKET,NODE | grep -v '^#' > "$out/cpus.csv"
n=$(wc -l < "$out/cpus.csv")
slice=$(awk -F, -v n="$n" 'NR > n - n/4 {printf "%s%s", sep, $1; sep=","}' "$out/cpus.csv")
cores=$(awk -F, '!seen[$2]++ {print $1}' "$out/cpus.csv" | tail -4 | paste -sd,)
echo "vCPUs $n; slice $slice; cores $cores" | tee "$out/placements.txt"
python3 -m memlab data prepare --experiment gpt2s --device cuda >/dev/null
python3 -m memlab run --profile "$profile" --experiment gpt2s --set train.steps=5 --set train.eval_every=0 --runs-dir /tmp/jt-warm >/dev/null 2>&1
one() {  # $1 = free|slice|cores
  local pin=() smi
  [ "$1" = slice ] && pin=(taskset -c "$slice")
  [ "$1" = cores ] && pin=(taskset -c "$cores")
  nvidia-smi -i "$gpu" --query-gpu=clocks.sm,power.draw --format=csv,noheader,nounits -lms 500 > "/tmp/jt-smi-$1" & smi=$!
  /usr/bin/time -f "%U %S %e" -o "/tmp/jt-time-$1" "${pin[@]}" python3 -m memlab run --profile "$profile" \
    --experiment gpt2s --set train.steps="$steps" --set train.eval_every=0 --runs-dir "/tmp/jt-$1" >/dev/null 2>&1
  kill "$smi"
  python3 - "$1" "/tmp/jt-$1" "/tmp/jt-time-$1" "/tmp/jt-smi-$1" >> "$out/runs.jsonl" <<'PY'
import json, sys, pathlib, statistics, pyarrow.parquet as pq
where, runs = sys.argv[1], sorted(pathlib.Path(sys.argv[2]).glob("*/summary.parquet"))
row = pq.read_table(runs[-1]).to_pylist()[0]
user, system, wall = (float(x) for x in open(sys.argv[3]).read().split()[-3:])
smi = [line.split(",") for line in open(sys.argv[4]) if "," in line]
clock = [float(s[0]) for s in smi if s[0].strip().replace(".", "").isdigit()]
keys = ("step_ms_median", "step_ms_p90", "fwd_ms_median", "bwd_ms_median", "opt_ms_median", "host_ms_median", "peak_alloc_bytes")
print(json.dumps({"where": where, **{k: row.get(k) for k in keys}, "cpu_s": user + system, "wall_s": wall,
                  "sm_mhz_median": statistics.median(clock) if clock else None,
                  "sm_mhz_min": min(clock) if clock else None, "run": runs[-1].parent.name}))
PY
}
for r in $(seq "$rounds"); do
  for where in free slice cores; do one "$where"; tail -1 "$out/runs.jsonl"; done
done
python3 - "$out/runs.jsonl" <<'PY' | tee "$out/summary.txt"
import json, sys, statistics
rows = [json.loads(l) for l in open(sys.argv[1])]
for where in ("free", "slice", "cores"):
    got = [r for r in rows if r["where"] == where]
    ms = [r["step_ms_median"] for r in got]
    print(f"{where}: step median {statistics.median(ms):.2f} ms, runs " + ", ".join(f"{m:.2f}" for m in ms)
          + " | bwd " + ", ".join(f"{r['bwd_ms_median']:.2f}" for r in got)
          + " | host " + ", ".join(f"{r['host_ms_median']:.2f}" if r.get("host_ms_median") else "-" for r in got)
          + " | cpu_s/wall_s " + ", ".join(f"{r['cpu_s']:.0f}/{r['wall_s']:.0f}" for r in got))
PY
