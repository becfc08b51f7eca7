#!/usr/bin/env bash
# Issue 17 on one GPU: the allocator model (bench/allocator_model.py) against the allocator's own trace. Each case is
# a short run with --memory-snapshot; bench/allocator_replay.py then replays its snapshot (the model's reserved peak
# beside the allocator's own) and a fake-tensor trace of the same step made here (on a GPU machine the fake tensors
# are CUDA's), and dumps both traces (what allocated each block) for setting them side by side.
# Cases (named on the command line; the first three by default): the seed shape's bf16 (SDPA with dropout: replayed
# 13% fragmented on a CPU, 31% on the H100), its baseline (eager attention: agrees), gpt2s bf16 (agrees); then the
# profiles the replay reserved too little or too much for through its stand-ins (bench/allocator_replay.py
# --against-h100 --standins): liger_ce, cce and leanest on the T 8192 shape, leanest on gpt2s, liger_ce on the seed
# shape and on bigvocab.
# A case `probe:EXPERIMENT:PROFILE:MICRO_BATCH[:KEY=VALUE]` runs as a find-batch probe does (3 steps, the optimizer state made in
# the first, no evaluation but one window at the end) and replays only the real trace; its fake trace can be made
# on any machine (`python bench/allocator_replay.py --fake ...`, same overrides).
# SEGMENTS=1 also writes every trace event with the allocator's segment events (bench/snapshot_events.py).
# usage: source bench/gpu_setup.sh; bash bench/replay_check.sh OUT_DIR [CASE...]
set -u
out=${1:?output folder}; shift; mkdir -p "$out"
cases=("$@"); [ ${#cases[@]} -gt 0 ] || cases=(seed_bf16 seed_baseline gpt2s_bf16)
seed=(--set 'data.source="stdlib"' --set 'data.tokenizer="bpe:8192"' --set data.streaming=false --set 'data.split="train"')
steps=4 fake=1
check() {  # name experiment profile micro-batch [--set ...]
  local name=$1 e=$2 p=$3 b=$4; shift 4
  echo "== $name: $p on $e at micro-batch $b ($(date -u +%T))"
  timeout 300 memlab run --profile "$p" --experiment "$e" --device cuda --steps $steps --memory-snapshot \
    --runs-dir "$out/runs/$name" "$@" --set train.batch_size="$b" 2>&1 | tail -3
  local snap; snap=$(ls "$out"/runs/"$name"/*/memory_snapshot.pickle 2>/dev/null | head -1)
  [ -n "$snap" ] || { echo "no snapshot for $name"; return; }
  echo -n "real trace: "; python3 bench/allocator_replay.py "$snap" --dump "$out/$name.real.jsonl"
  if [ $fake = 1 ]; then
  echo -n "fake trace: "; python3 bench/allocator_replay.py --fake "$e" "$p" "$b" "$@" --dump "$out/$name.fake.jsonl"
  echo -n "fake trace, this GPU's own SDPA and dropout: "; python3 bench/allocator_replay.py --fake "$e" "$p" "$b" "$@" --device-kernels
  fi
  gzip -f "$out/$name".*.jsonl
  [ -n "${SEGMENTS:-}" ] && python3 bench/snapshot_events.py "$snap" "$out/$name.events.jsonl.gz"  # with the segment events
  rm -f "$snap"  # large; the dumps keep what the comparison needs
}
long=bench/experiments/heldout_long.toml
for c in "${cases[@]}"; do
  case $c in
    seed_bf16) check seed_bf16 seed-so-posts bf16 64 "${seed[@]}";;
    seed_baseline) check seed_baseline seed-so-posts baseline 64 "${seed[@]}";;
    gpt2s_bf16) check gpt2s_bf16 gpt2s bf16 16;;
    long_liger_ce|long_cce|long_leanest) check "$c" $long "${c#long_}" 2;;
    gpt2s_leanest) check gpt2s_leanest gpt2s leanest 16;;
    seed_liger_ce) check seed_liger_ce seed-so-posts liger_ce 64 "${seed[@]}";;
    bigvocab_liger_ce) check bigvocab_liger_ce bigvocab liger_ce 24;;
    probe:*) IFS=: read -r _ e p b kv <<<"$c"
      extra=(); [ -n "$kv" ] && extra=(--set "$kv")
      t=$(python3 -c "from memlab.cli.options import resolve; print(resolve('$e', '$p', 'cpu', [])[0].model.seq_len)")
      steps=3 fake=0 check "$(basename "${e%.toml}")_${p}_$b" "$e" "$p" "$b" --set train.measure_after=1 \
        --set train.eval_every=0 --set data.val_tokens=$((t + 1)) "${extra[@]}";;
    *) echo "unknown case $c";;
  esac
done
