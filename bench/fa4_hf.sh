#!/usr/bin/env bash
# Issue 45 on one GPU: memlab's FA4 reaching a transformers model through transformers' attention registry
# (memlab.core.models.hf_attention). Each experiment runs bf16 (SDPA) and flash (FA4 on Hopper) in alternation, same
# seed, data and batch (bench/hf_peer.py: one `memlab run` child a case, fused AdamW); the summary's
# attention_kernel names the kernel that ran, final_loss sets the two kernels' losses side by side.
# usage, with FA4 and polars installed (bench/README.md, "FA4"): bash bench/fa4_hf.sh OUT_DIR
set -u
out=${1:?output folder}; mkdir -p "$out"
python3 -c "import importlib.metadata as m, flash_attn.cute; print('flash-attn-4', m.version('flash-attn-4'))" 2>&1 \
  | tail -1 | tee "$out/fa4.txt"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >> "$out/fa4.txt"
fused=optimizer.fused=true
python3 bench/hf_peer.py --out "$out/llama-1b" --experiment llama-1b --steps 30 --rounds 2 --budget-s 330 \
  --cases "memlab:bf16+$fused,memlab:flash+$fused,memlab:flash_gradcp+$fused" 2>&1 | tail -4
python3 bench/hf_peer.py --out "$out/qwen-1.5b" --experiment qwen-1.5b --steps 30 --rounds 1 --budget-s 150 \
  --cases "memlab:bf16+$fused,memlab:flash+$fused" 2>&1 | tail -4
