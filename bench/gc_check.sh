#!/usr/bin/env bash
# Issue 49: does Python's garbage collector set the host's pace, which moves gradcp_bf16's step time from one process
# to the next? One GPU: ROUNDS rounds of each profile with the collector as Python leaves it (auto), frozen after the
# first step as the engine does (freeze) and disabled (off), each run
# its own process (bench/gc_run.py), in turn. Rows in $OUT/gc/gc.jsonl. Carries polars as .gpu-wheels/spl.
# usage: [PROFILES=gradcp_bf16 bf16] [ROUNDS=3] [STEPS=60] bash bench/gc_check.sh
set -u
source bench/gpu_setup.sh >/dev/null
out=$OUT/gc; mkdir -p "$out"
python3 -m memlab data prepare --experiment gpt2s --device cuda >/dev/null
python3 -m memlab run --profile gradcp_bf16 --experiment gpt2s --set train.steps=5 --set train.eval_every=0 --runs-dir /tmp/gc-warm >/dev/null 2>&1
for r in $(seq "${ROUNDS:-3}"); do
  for p in ${PROFILES:-gradcp_bf16 bf16}; do
    for m in ${MODES:-auto freeze off}; do
      python3 bench/gc_run.py "$m" -- --profile "$p" --experiment gpt2s --set train.steps="${STEPS:-60}" --set train.eval_every=0 \
        --runs-dir /tmp/gc-runs 2>/dev/null | tail -1 | sed "s/^{/{\"round\": $r, \"profile\": \"$p\", /" | tee -a "$out/gc.jsonl"
    done
  done
done
