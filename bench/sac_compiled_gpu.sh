#!/usr/bin/env bash
# sac_ops as the engine runs it on a GPU (each block compiled under the per-op policy), its max batch held out:
# find-batch's searches, after the predictions in bench/results/prediction-check/sac-compiled/predicted-*.md were
# written on a CPU and committed. Part a: five GPT shapes under 24 GiB, at once; part b: the deep and seeds' shapes
# under 24 GiB beside Llama-3.2-1B (seq 512, fused AdamW) under 40 GiB, sac_ops and gradcp_bf16. Part c, the second
# held-out set (heldout2-predicted-*.md): gpt2s, bigvocab and heldout_long under 24 GiB beside Qwen2.5-1.5B (seq 512)
# and Llama-3.2-1B (seq 1024) under 48 GiB, one at a time.
# usage (device tool): bash bench/sac_compiled_gpu.sh $OUT a|b|c
set -u
out=${1:?output folder}; part=${2:?a or b}
mkdir -p "$out"
source bench/gpu_setup.sh > "$out/setup-$part.log" 2>&1
nvidia-smi --query-gpu=name,driver_version --format=csv > "$out/gpu.txt"
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" >> "$out/gpu.txt"
E=bench/experiments
export SEARCH_TIMEOUT=${SEARCH_TIMEOUT:-540}
case $part in
  a) bash bench/heldout_parallel_findbatch.sh "$out/a" 5 $E/heldout_wide.toml:sac_ops $E/heldout_mid.toml:sac_ops \
       $E/heldout_fat.toml:sac_ops $E/heldout_square.toml:sac_ops $E/heldout_logits.toml:sac_ops > "$out/a.log" 2>&1 ;;
  b) bash bench/heldout_parallel_findbatch.sh "$out/b24" 2 $E/heldout_deep.toml:sac_ops $E/seed_shape.toml:sac_ops > "$out/b24.log" 2>&1 &
     GPU_MEMORY=40GiB bash bench/heldout_parallel_findbatch.sh "$out/b40" 2 llama-1b:sac_ops:model.seq_len=512,optimizer.fused=true \
       llama-1b:gradcp_bf16:model.seq_len=512,optimizer.fused=true > "$out/b40.log" 2>&1
     wait ;;
  c) bash bench/heldout_parallel_findbatch.sh "$out/c24" 3 gpt2s:sac_ops bigvocab:sac_ops $E/heldout_long.toml:sac_ops > "$out/c24.log" 2>&1 &
     SEARCH_TIMEOUT=270 GPU_MEMORY=48GiB bash bench/heldout_parallel_findbatch.sh "$out/c48" 1 qwen-1.5b:sac_ops:model.seq_len=512,optimizer.fused=true \
       llama-1b:sac_ops:model.seq_len=1024,optimizer.fused=true > "$out/c48.log" 2>&1
     wait ;;
esac
tail -n 30 "$out"/*.log
