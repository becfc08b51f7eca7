#!/usr/bin/env bash
# Issue 45 on one H100, in three calls made one right after another (bench/README.md: polars and Liger carried):
#   bash bench/issue45_h100.sh checks        the liger profile on Llama-3.2-1B's and Qwen2.5-1.5B's shapes beside
#                                            liger_ce and bf16; sac_ops against gradcp_bf16 and bf16 on the GPU
#                                            experiments not measured before (bigvocab, long8k, the seeds' shapes on
#                                            the built-in corpus)                                      (~9 min)
#   bash bench/issue45_h100.sh study SECONDS the llama-1b study under 24 GiB; resumable: run it again until it ends
set -u
source bench/gpu_env.sh
export MEMLAB_CACHE=/root/cache
OUT=${OUT:-/tmp/out}; W=/root/w; mkdir -p "$OUT" "$W"
peer() { timeout "$1" python3 bench/hf_peer.py --rounds 1 --steps 15 "${@:2}" 2>&1 | tail -3; }
case "${1:-checks}" in
checks)
  python3 -c "import polars, liger_kernel" || { echo "polars or liger_kernel missing: carry them"; exit 3; }
  python3 -m memlab data prepare --experiment gpt2s 2>&1 | tail -1
  peer 180 --out "$W/liger-llama-1b" --experiment llama-1b --cases memlab:liger,memlab:liger_ce,memlab:bf16
  peer 60 --out "$W/sac-bigvocab" --experiment bigvocab --cases memlab:sac_ops,memlab:gradcp_bf16,memlab:bf16
  peer 70 --out "$W/sac-long8k" --experiment long8k --cases memlab:sac_ops,memlab:gradcp_bf16,memlab:bf16
  SEEDS="--data stdlib --tokenizer bpe:8192"   # the seeds' corpora are on the Hub: their shapes, on the built-in corpus
  peer 60 --out "$W/sac-seed-plwiki" --experiment seed-plwiki --run-args "$SEEDS" --cases memlab:sac_ops,memlab:gradcp_bf16,memlab:bf16
  peer 50 --out "$W/sac-seed-shopping" --experiment seed-shopping --run-args "$SEEDS" \
    --cases memlab:sac_ops+model.vocab_size=10048,memlab:gradcp_bf16+model.vocab_size=10048,memlab:bf16+model.vocab_size=10048
  peer 50 --out "$W/sac-seed-so-posts" --experiment seed-so-posts --run-args "$SEEDS" \
    --cases memlab:sac_ops+model.vocab_size=50304,memlab:gradcp_bf16+model.vocab_size=50304,memlab:bf16+model.vocab_size=50304
  peer 90 --out "$W/liger-qwen-1.5b" --experiment qwen-1.5b --cases memlab:liger,memlab:bf16
  for d in "$W"/liger-* "$W"/sac-*; do echo "## $(basename "$d")"; echo; cat "$d"/table.md 2>/dev/null; echo; done > "$OUT/issue45-checks.md"
  cat "$W"/*/rows.jsonl > "$OUT/issue45-checks.jsonl" 2>/dev/null
  cat "$OUT/issue45-checks.md" ;;
study)
  timeout -k 90 -s INT "${2:-480}" python3 -m memlab study --experiment llama-1b --profiles bf16,gradcp_bf16,chunked_ce,liger,sac_ops \
    --gpu-memory 24GiB --device cuda --lanes 3 --out /root/study 2>&1 | tail -40
  echo "study exit: $?"
  mkdir -p "$OUT/study"; cp /root/study/report.md /root/study/study.json /root/study/comparison.parquet "$OUT/study/" 2>/dev/null
  ls /root/study ;;
esac
