#!/usr/bin/env bash
# Issue 17: find-batch under a 24 GiB card on the held-out shapes, for profiles whose max batch the replay had not
# been checked against there (predictions made first, on a CPU: bench/results/prediction-check/heldout-2/predicted.md),
# then the kernels' own backward blocks (bench/backward_transients.py).
# usage: source bench/gpu_setup.sh; bash bench/heldout_findbatch.sh OUT
set -u
out=${1:?output folder}; mkdir -p "$out"
long=bench/experiments/heldout_long.toml; deep=bench/experiments/heldout_deep.toml
search() {  # name experiment profile [--set ...]
  local name=$1 e=$2 p=$3; shift 3
  echo "== $name ($(date -u +%T))"
  timeout 240 memlab find-batch --profile "$p" --experiment "$e" --gpu-memory 24GiB --steps 3 "$@" > "$out/find-batch-$name.log" 2>&1
  echo "rc $?"; grep -E "max micro-batch|estimator predicted|with expandable|memory:" "$out/find-batch-$name.log"
}
python3 bench/backward_transients.py --out "$out" > "$out/backward_transients.log" 2>&1; echo "transients rc $?"
search long-leanest $long leanest
search long-cce $long cce
search deep-liger_ce $deep liger_ce
search deep-leanest $deep leanest
search deep-adamw8bit $deep adamw8bit
search deep-bf16-expandable $deep bf16 --set allocator.expandable_segments=true
search long-liger_ce-expandable $long liger_ce --set allocator.expandable_segments=true
