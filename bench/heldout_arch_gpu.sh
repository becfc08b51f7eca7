#!/usr/bin/env bash
# Issue 46 held out on GPT-2 and Gemma-2's layers (bench/heldout_arch.py says what and why): find-batch on one H200,
# each search from the prediction committed in bench/results/heldout-arch-h200/predicted.json to one batch past the
# 10% bar. gpt2: five searches at once under 24 GiB; gemma: two at a time under 48 GiB.
# gpt2-half (after the fixes those searches led to): three searches at once under 16 GiB, from
# predicted-gpt2-half.json.
# usage (device tool): bash bench/heldout_arch_gpu.sh $OUT gpt2|gemma|gpt2-half
set -u
out=${1:?output folder}; shape=${2:?gpt2, gemma or gpt2-half}
mkdir -p "$out"
source bench/gpu_setup.sh > "$out/setup-$shape.log" 2>&1
nvidia-smi --query-gpu=name,driver_version --format=csv > "$out/gpu-$shape.txt"
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" >> "$out/gpu-$shape.txt"
predicted=bench/results/heldout-arch-h200/predicted.json
[ "$shape" = gpt2-half ] && predicted=bench/results/heldout-arch-h200/predicted-gpt2-half.json
cases=$(python3 bench/heldout_arch.py searches --shape "$shape" --predicted "$predicted" 2>/dev/null)
echo "cases: $cases" > "$out/$shape.log"
case $shape in
  gpt2) SEARCH_TIMEOUT=${SEARCH_TIMEOUT:-500} bash bench/heldout_parallel_findbatch.sh "$out/$shape" 5 $cases >> "$out/$shape.log" 2>&1 ;;
  gpt2-half) SEARCH_TIMEOUT=${SEARCH_TIMEOUT:-250} GPU_MEMORY=16GiB bash bench/heldout_parallel_findbatch.sh "$out/$shape" 3 $cases >> "$out/$shape.log" 2>&1 ;;
  gemma) SEARCH_TIMEOUT=${SEARCH_TIMEOUT:-250} GPU_MEMORY=48GiB bash bench/heldout_parallel_findbatch.sh "$out/$shape" 2 $cases >> "$out/$shape.log" 2>&1 ;;
esac
tail -n 40 "$out/$shape.log"
for f in "$out/$shape"/*.log; do echo "== $f"; grep -E "^probe|^max micro-batch|even micro-batch" "$f" | cut -c1-160; done
