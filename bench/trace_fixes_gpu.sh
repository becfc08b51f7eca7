#!/usr/bin/env bash
# The trace's fixes held out (bench/trace_fixes_heldout.py): each case of its CASES run once by `memlab run` at the
# experiment's own micro-batch on one GPU, 10 steps, peaks into $OUT/peaks-EXPERIMENT/rows.jsonl (bench/hf_peer.py).
# ddp_bf16 and fsdp_bf16 outside torchrun: a process group of one process, as the held-out runs were measured.
# usage (device tool): [EXPERIMENTS='llama-1b'] bash bench/trace_fixes_gpu.sh $OUT
set -u
out=${1:?output folder}
mkdir -p "$out"
source bench/gpu_setup.sh > "$out/setup.log" 2>&1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$out/gpu.txt"
for experiment in ${EXPERIMENTS:-heldout_mid heldout_square llama-1b}; do
  path=bench/experiments/$experiment.toml; [ -f "$path" ] || path=$experiment
  cases=$(python3 -c "import sys; sys.path.insert(0, 'bench'); import trace_fixes_heldout as t; print(','.join(p for e, p in t.CASES if e == '$experiment'))")
  python3 bench/hf_peer.py --out "$out/peaks-$experiment" --experiment "$path" --steps 10 --rounds 1 \
    --cases "$(echo "$cases" | sed 's/\([^,]*\)/memlab:\1/g')" > "$out/peaks-$experiment.log" 2>&1
  tail -n 3 "$out/peaks-$experiment.log"
  # the run folders as one file each (the device tool brings back a few files a call)
  tar czf "$out/peaks-$experiment/runs.tgz" -C "$out/peaks-$experiment" runs && rm -rf "$out/peaks-$experiment/runs"
done
python3 bench/trace_fixes_heldout.py compare --predicted bench/results/trace-heldout-cpu/fixes-predicted.json \
  --rows "$out"/peaks-*/rows.jsonl
