#!/usr/bin/env bash
# Issue 19 on one GPU: every new technique profile once, short runs (20 steps), on the GPU default experiment
# (gpt2s) and the fused losses on the large-vocabulary one (bigvocab), each beside its baseline at the same batch.
# Cheap runs first, compiled ones last; each run is capped at 60 s and the whole at $2 seconds (what ran is kept).
# usage: bash bench/frontier_h100.sh OUT_DIR [SECONDS]
set -u
out=${1:?output folder}; runs="$out/runs"; mkdir -p "$runs"
deadline=$(( $(date +%s) + ${2:-600} ))
run() {  # experiment profile [--set ...]
  local left=$(( deadline - $(date +%s) )); [ "$left" -le 5 ] && return
  local e=$1 p=$2; shift 2
  echo "== $e $p $* ($(date -u +%T))"
  timeout -s INT $(( left < 60 ? left : 60 )) python3 -m memlab run --profile "$p" --experiment "$e" --device cuda \
    --steps 20 --runs-dir "$runs" "$@" 2>&1 | tail -4
}
run gpt2s bf16
for p in adamw4bit bf16_sr muon paged_adamw8bit galore optim_in_bwd; do run gpt2s $p; done
run gpt2s bf16 --set train.clip=0
run gpt2s act_offload_overlap; run gpt2s act_offload; run gpt2s sac_ops
for p in bf16 chunked_ce liger_ce cce; do run bigvocab $p; done
for p in compile float8 compile_budget; do run gpt2s $p; done
python3 -m memlab table "$runs" --out "$out" 2>&1 | tail -60
