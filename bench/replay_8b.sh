#!/usr/bin/env bash
# Issue 47 on one GPU: the allocator's own trace of Llama-3.1-8B's fine-tuning steps at the long sequences memlab fit
# predicted (bench/results/fit-h100: lora_gradcp 2688 predicted for 3072 measured, qlora_gradcp 7424 for 7360). Each
# case runs as a find-batch probe does (3 steps, the optimizer state made in the first, no evaluation but one window
# at the end), uncapped, with --memory-snapshot; bench/allocator_replay.py replays the snapshot (the model's reserve
# beside the allocator's own) and dumps the trace, to set beside the fake trace made on a CPU (same command, --fake).
# usage: bash bench/replay_8b.sh OUT_DIR PROFILE:SEQ [PROFILE:SEQ ...]
set -u
out=${1:?output folder}; shift; mkdir -p "$out"
for c in "$@"; do
  p=${c%%:*} t=${c##*:} name=llama-8b_${c%%:*}_${c##*:}
  echo "== $name ($(date -u +%T))"
  timeout 240 memlab run --profile "$p" --experiment llama-8b --device cuda --steps 3 --memory-snapshot \
    --runs-dir "$out/runs/$name" --set train.batch_size=1 --set model.seq_len="$t" --set train.measure_after=1 \
    --set train.eval_every=0 --set data.val_tokens=$((t + 1)) 2>&1 | tail -3
  snap=$(ls "$out"/runs/"$name"/*/memory_snapshot.pickle 2>/dev/null | head -1)
  [ -n "$snap" ] || { echo "no snapshot for $name"; continue; }
  echo -n "real trace: "; python3 bench/allocator_replay.py "$snap" --dump "$out/$name.real.jsonl"
  gzip -f "$out/$name.real.jsonl"; rm -f "$snap"
done
