#!/usr/bin/env bash
# First look at the GPU: env, one run with events, and the spine's six profiles on the GPU default experiment.
# Usage on the device: bash bench/gpu_smoke.sh   (writes $OUT/smoke.tar.gz and logs)
set -u
source bench/gpu_env.sh
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT/gpu.txt"
python3 -m memlab env | tee -a "$OUT/gpu.txt"
R=/tmp/smoke-runs
python3 -m memlab run --profile bf16 --experiment gpt2s --steps 30 --runs-dir $R 2>&1 | tail -15
python3 -m memlab sweep --profiles baseline,tf32,bf16,fp16,gradcp,gradcp_bf16 --experiment gpt2s --steps 25 --runs-dir $R 2>&1 | tee "$OUT/sweep.log"
tar czf "$OUT/smoke.tar.gz" -C /tmp smoke-runs
