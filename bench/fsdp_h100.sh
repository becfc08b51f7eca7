#!/usr/bin/env bash
# Issue 49: FSDP2 against DDP at equal batch on 2 GPUs of one host, the knobs that decide FSDP's pace one at a time.
#
#   CASES='units compile' bash bench/fsdp_h100.sh   (nvidia-h100-x2 or -x4, polars carried as bench/README.md says;
#                                                    each list 3-5 min)
#
# gpt2s at the GPU default batch per GPU (16 x 1024) and Llama-3.2-1B's shape (2 x 2048 per GPU); each case built
# and timed as the engine runs it, the whole list twice over (interleaved): bench/fsdp_speed.py.
set -u
source bench/gpu_env.sh   # keeps NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT/fsdp"
export MEMLAB_CACHE=${MEMLAB_CACHE:-/root/cache}
{
  nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv
  nvidia-smi topo -m | head -6
  python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
  python3 -m memlab data prepare --experiment gpt2s 2>&1 | tail -2
  # CASES: a file of bench/fsdp_cases/ (knobs.txt: the first pass; units.txt: FSDP units of several blocks; compile.txt)
  for c in ${CASES:-knobs}; do
    r=${ROUNDS:-2}; [ "$c" = compile ] && r=1   # compile's builds take a minute each: one round
    CUDA_VISIBLE_DEVICES=0,1 timeout ${FSDP_LIMIT_S:-480} torchrun --standalone --nproc_per_node 2 bench/fsdp_speed.py \
      --cases bench/fsdp_cases/$c.txt --out "$OUT/fsdp/$c" --steps ${STEPS:-15} --rounds $r 2>&1 | grep -E '^\{|Error|error'
  done
} 2>&1 | tee "$OUT/fsdp/fsdp_h100.log"
