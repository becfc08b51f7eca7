#!/usr/bin/env bash
# Issue 17's held-out set for the profiles issue 19 added: each of them on the three held-out shapes (the seed shape,
# deep, long), the three sweeps at once on one GPU (memory figures are per process; step times and NVML's device
# figure are shared, so they are not compared). Source bench/gpu_setup.sh first.
# usage: bash bench/heldout_frontier.sh OUT_DIR SECONDS [PROFILES]
set -u
out=${1:?output folder}; secs=${2:?seconds for each sweep}
profiles=${3:-sac_ops,liger_ce,cce,adamw4bit,bf16_sr,muon,paged_adamw8bit,galore,optim_in_bwd,act_offload_overlap,compile_budget,float8}
SWEEP_SECONDS=$secs bash bench/seed_shape.sh "$out/seed" /tmp/ho-seed "$profiles" > "$out/seed.log" 2>&1 &
SWEEP_SECONDS=$secs bash bench/seed_shape.sh "$out/deep" /tmp/ho-deep "$profiles" bench/experiments/heldout_deep.toml > "$out/deep.log" 2>&1 &
SWEEP_SECONDS=$secs bash bench/seed_shape.sh "$out/long" /tmp/ho-long "$profiles" bench/experiments/heldout_long.toml > "$out/long.log" 2>&1 &
wait
for s in seed deep long; do echo "== $s"; tail -n 14 "$out/$s/table.md" | cut -c1-160; done
