#!/usr/bin/env bash
# Issue 19: the compiler budget's held-out misses at 0.75 (bench/results/frontier-h100 parts g, g2). On the GPU
# machine's torch: what the partitioner saves, traced as memlab.core.predict.inductor does (CPU graph) and on the
# real CUDA step (bench/budget_partition_check.py), and the model's whole trace of each held-out shape at 0.75.
# usage: bash bench/budget_release_check.sh OUT_DIR
set -u
out=${1:?output folder}; mkdir -p "$out"
for case in "seed 0.75" "bigvocab 0.75" "seed 0.5" "gpt2s 0.75"; do
  set -- $case
  python3 bench/budget_partition_check.py --shape "$1" --budget "$2" --json "$out/partitions.jsonl" >> "$out/partitions.txt" 2>&1
done
for key in '{"n_layer": 4, "n_head": 8, "d_model": 256, "d_ff": 1024, "vocab": 50304, "seq_len": 256, "dropout": 0.1, "budget": 0.75, "batch": 64}' \
           '{"n_layer": 6, "n_head": 12, "d_model": 768, "d_ff": 3072, "vocab": 128256, "seq_len": 1024, "dropout": 0.0, "budget": 0.75, "batch": 24}'; do
  echo "$key $(python3 -m memlab.core.predict.inductor "$key" 2>>"$out/traces.err")" >> "$out/traces.txt"
done
echo "torch $(python3 -c 'import torch; print(torch.__version__)')" >> "$out/traces.txt"
