#!/usr/bin/env bash
# `memlab fit` on a GPU host without --predicted: its rows are predicted in forked children (memlab/cli/fit_children.py).
# Does a forked child trace there, or fail (CUDA initialized in the parent before a fork) and leave its row to the
# parent ("its child ended with status ...; predicting it here")? Also the README's first command on the GPU.
# Usage (on the device machine, repository root): bash bench/fit_fork_gpu.sh $OUT
set -u
out=${1:?usage: bench/fit_fork_gpu.sh OUT}
mkdir -p "$out"
source bench/gpu_setup.sh > "$out/setup.log" 2>&1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$out/gpu.txt" 2>&1
run() {  # name, then the command
  local name=$1; shift
  local t0=$(date +%s.%N)
  timeout 280 "$@" > "$out/$name.out" 2> "$out/$name.err"
  local rc=$?
  echo "$name rc=$rc wall=$(python3 -c "import time; print(round(time.time() - $t0, 1))")s" >> "$out/summary.txt"
}
export MEMLAB_CACHE=/root/cache_fit
run fit-gpt2s python3 -m memlab fit --experiment gpt2s --gpu-memory 24GiB --format json
run fit-llama-8b python3 -m memlab fit --experiment llama-8b --gpu-memory 24GiB --format json
export MEMLAB_CACHE=/root/cache
run readme-first python3 -m memlab run --profile baseline --steps 30
grep -h "child ended\|at a time" "$out"/*.err >> "$out/summary.txt"
cat "$out/summary.txt"
