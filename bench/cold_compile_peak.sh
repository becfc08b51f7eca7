#!/usr/bin/env bash
# Is a compiled profile's peak allocated memory the same with a cold and a warm Inductor cache? (lanes NOTE.md: the
# first sac_ops run on a fresh machine peaked 393,216 bytes below every later one.) Three runs of one profile on one
# GPU: cold (a fresh cache folder), warm (the same folder again), cold (another fresh folder).
#   bash bench/cold_compile_peak.sh [PROFILE]     (GPU; polars carried as bench/README.md says)
set -u
source bench/gpu_env.sh
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT/cold"
export MEMLAB_CACHE=${MEMLAB_CACHE:-/root/cache}
P=${1:-sac_ops}
python3 -m memlab data prepare --experiment gpt2s >/dev/null 2>&1
for run in cold:/tmp/ind-a warm:/tmp/ind-a cold:/tmp/ind-b; do
  kind=${run%%:*}; dir=${run#*:}
  TORCHINDUCTOR_CACHE_DIR=$dir python3 -m memlab run --profile $P --experiment gpt2s --set train.steps=60 \
    --set train.eval_every=0 --runs-dir "/tmp/cold/runs-$kind-$(basename $dir)" >/dev/null 2>&1
  python3 - "/tmp/cold/runs-$kind-$(basename $dir)" "$kind" "$dir" <<'PY' | tee -a "$OUT/cold/peaks.txt"
import sys, glob, pyarrow.parquet as pq
run = sorted(glob.glob(sys.argv[1] + "/*/summary.parquet"))[-1]
s = pq.read_table(run).to_pylist()[0]
print(f"{sys.argv[2]:5s} cache {sys.argv[3]}: status {s['status']}, peak_alloc_bytes {s['peak_alloc_bytes']}, step_ms_median {s['step_ms_median']:.2f}")
PY
done
