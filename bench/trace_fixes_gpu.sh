#!/usr/bin/env bash
# The trace's fixes held out (bench/trace_fixes_heldout.py): each case of its SETS[SET] run once by `memlab run` at the
# experiment's own micro-batch on one GPU, 10 steps, peaks into peaks-EXPERIMENT/rows.jsonl (bench/hf_peer.py), all
# in $OUT/set-SET.tgz (the device tool brings back a few files a call), and the comparison printed.
# ddp_bf16 and fsdp_bf16 outside torchrun: a process group of one process, as the held-out runs were measured.
# usage (device tool): [SET=2] [EXPERIMENTS='llama-1b'] bash bench/trace_fixes_gpu.sh $OUT
set -u
out=${1:?output folder}; set_=${SET:-1}
work=/tmp/trace-fixes-$set_; mkdir -p "$out" "$work"
trap 'tar czf "$out/set-$set_.tgz" -C "$work" .' EXIT
source bench/gpu_setup.sh > "$work/setup.log" 2>&1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$work/gpu.txt"
sets() { python3 -c "import sys; sys.path.insert(0, 'bench'); import trace_fixes_heldout as t; $1"; }
for experiment in ${EXPERIMENTS:-$(sets "print(' '.join(dict.fromkeys(e for e, _ in t.SETS['$set_'])))")}; do
  path=bench/experiments/$experiment.toml; [ -f "$path" ] || path=$experiment
  cases=$(sets "print(','.join('memlab:' + p for e, p in t.SETS['$set_'] if e == '$experiment'))")
  python3 bench/hf_peer.py --out "$work/peaks-$experiment" --experiment "$path" --steps 10 --rounds 1 \
    --cases "$cases" > "$work/peaks-$experiment.log" 2>&1
  tail -n 3 "$work/peaks-$experiment.log"
done
python3 bench/trace_fixes_heldout.py compare --predicted "bench/results/trace-heldout-cpu/$(sets "print(t.PREDICTED['$set_'])")" \
  --rows "$work"/peaks-*/rows.jsonl | tee "$work/compare.md"
