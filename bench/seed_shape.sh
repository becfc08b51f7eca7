#!/usr/bin/env bash
# Issue 16: every built-in single-process profile on a seed-shaped experiment (bench/experiments/seed_shape.toml:
# dropout 0.1, so flash/window meet FA4's missing dropout), one child each through `memlab sweep`, then the table.
# Usage (on the GPU machine, after bench/gpu_env.sh): bash bench/seed_shape.sh OUT RUNS PROFILE[,PROFILE...] [EXPERIMENT]
# (EXPERIMENT: another experiment file, e.g. the estimator's held-out shapes bench/experiments/heldout_*.toml;
# SWEEP_SECONDS=N stops the sweep with SIGINT after N seconds, keeping the runs that finished)
set -uo pipefail
out=$1 runs=$2 profiles=$3 experiment=${4:-bench/experiments/seed_shape.toml}
mkdir -p "$out"
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; python3 -c "import torch; print('torch', torch.__version__)"; } >> "$out/env.txt"
${SWEEP_SECONDS:+timeout -s INT $SWEEP_SECONDS} python3 -m memlab sweep --profiles "$profiles" --experiment "$experiment" --device cuda --runs-dir "$runs" 2>&1 | tee -a "$out/sweep.log" | grep -v "^step "
python3 -m memlab table "$runs" --format markdown > "$out/table.md" 2>> "$out/sweep.log"
python3 -m memlab table "$runs" --format parquet > "$out/table.parquet" 2>> "$out/sweep.log"
mkdir -p "$out/runs" && for d in "$runs"/*/; do n=$(basename "$d"); mkdir -p "$out/runs/$n"; cp "$d"/run.json "$d"/summary.parquet "$out/runs/$n/" 2>/dev/null; done
cat "$out/table.md"
