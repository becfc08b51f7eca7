#!/usr/bin/env bash
# Issue 46, held out on transformers architectures: on the GPU, first the peaks at each experiment's own batch that
# no run had measured yet (`PEAKS`: hf_peer.py cases), then find-batch under a 24 GiB card (`SEARCHES`: cases as
# heldout_parallel_findbatch.sh takes them, several at once: each probe is capped on its own), then any `FIT` rows
# (`EXPERIMENT:PROFILES` for fit_h100.sh's --measure). Everything lands in one tarball under OUT (the device tool
# brings back only a few files a call), written even when the call's time runs out.
#   PEAKS='llama-1b:memlab:chunked_ce+optimizer.fused=true' SEARCHES='llama-1b:bf16:optimizer.fused=true ...' \
#     PARALLEL=5 SEARCH_TIMEOUT=400 bash bench/heldout_hf.sh $OUT NAME
set -u
out=${1:?output folder}; name=${2:?name of this part}
work=/tmp/heldout-$name; mkdir -p "$work"
trap 'tar czf "$out/$name.tgz" -C "$work" . ; ls -la "$out"' EXIT
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$work/gpu.txt"
python3 -c "import torch, transformers, peft; print(torch.__version__, transformers.__version__, peft.__version__)" >> "$work/gpu.txt" 2>&1
for case in ${PEAKS:-}; do  # EXPERIMENT:memlab:PROFILE[+key=value]
  experiment=${case%%:*}
  echo "== peak $case $(date -u +%T)" >> "$work/peaks.log"
  python3 bench/hf_peer.py --out "$work/peaks-$experiment" --experiment "$experiment" --steps 10 --rounds 1 \
    --cases "${case#*:}" >> "$work/peaks.log" 2>&1
done
if [ -n "${SEARCHES:-}" ]; then
  bash bench/heldout_parallel_findbatch.sh "$work/find-batch" "${PARALLEL:-4}" $SEARCHES > "$work/searches.log" 2>&1
fi
for row in ${FIT:-}; do  # EXPERIMENT:PROFILE,PROFILE
  mkdir -p "$work/fit"
  EXPERIMENT=${row%%:*} PROFILES=${row#*:} bash bench/fit_h100.sh "$work/fit"
done
