#!/usr/bin/env bash
# Issue 17 on one GPU: find-batch with expandable segments on (allocator.expandable_segments=true), whose last probe
# flips them off at the batch found, for the allocator model's expandable mode to be checked against (it was written
# after these ran). Three seed-shape searches under 24 GiB at once, then two gpt2s ones under 12 GiB (each process is
# capped, so they share the card without sharing a budget). Source bench/gpu_setup.sh first.
# usage: bash bench/expandable_check.sh OUT_DIR
set -u
out=${1:?output folder}; mkdir -p "$out"
seed=(--set 'data.source="stdlib"' --set 'data.tokenizer="bpe:8192"' --set data.streaming=false --set 'data.split="train"')
search() {  # name experiment profile cap [--set ...]
  local name=$1 e=$2 p=$3 cap=$4; shift 4
  timeout 230 python3 -m memlab find-batch --profile "$p" --experiment "$e" --gpu-memory "$cap" --steps 3 \
    --set allocator.expandable_segments=true "$@" > "$out/$name.log" 2>&1
  echo "== $name: exit $?"; tail -6 "$out/$name.log"
}
search seed_bf16 seed-so-posts bf16 24GiB "${seed[@]}" &
search seed_baseline seed-so-posts baseline 24GiB "${seed[@]}" &
search seed_chunked_ce seed-so-posts chunked_ce 24GiB "${seed[@]}" &
wait
search gpt2s_bf16 gpt2s bf16 12GiB &
search gpt2s_gradcp gpt2s gradcp 12GiB &
search gpt2s_chunked_ce gpt2s chunked_ce 12GiB &
wait
