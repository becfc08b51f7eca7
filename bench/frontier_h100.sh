#!/usr/bin/env bash
# Issue 19 on one GPU, in parts that fit one device call each (every part runs its own bf16 beside the rest, so each
# comparison is on one machine, one clock). Short runs (20 steps) on the GPU default experiment (gpt2s) and the fused
# losses on the large-vocabulary one (bigvocab); part `optim` trains the optimizers for one token budget.
#   a:     new gpt2s profiles needing at most torchao, then the compiled ones (Inductor's cache warmed first, in
#          parallel, by throwaway runs: compile time is not step time) and the compiler-budget sweep
#   a2:    the rerun after part a (the overlapped offload without record_stream, float8 to the end, the compiler-budget
#          sweep beside the points it is plotted with), and what float8 and compile save for backward
#   c:     the frontier plot's points on one machine: bf16, the two offloads (overlap: the device tensors held until
#          their copies are waited for, no record_stream), gradcp_bf16, selective, sac_ops, compile and the whole
#          compiler-budget sweep, Inductor's cache warmed first
#   d:     cce beside bf16 on bigvocab (part b's time ran out before it)
#   e:     the fused losses again after cce was made exact (filter_eps=None): bf16, liger_ce, cce on bigvocab and
#          bf16, cce on gpt2s
#   f1/f2: every new profile on bigvocab beside its bf16 (issue 19's table on the large-vocabulary experiment too):
#          f1 the eager ones, f2 the compiled ones (each compiling in its own run) and the fused losses; f3 what
#          f2's deadline cut (float8's evaluation, compile_budget)
#   g/g2:  compile_budget at 0, 0.25 and 0.75 on the seed shape (g) and on bigvocab (g2): held out from its model
#   b:     bitsandbytes / GaLore / the fused losses on gpt2s, and bf16, chunked_ce, liger_ce, cce on bigvocab
#   optim: bench/experiments/optim_budget.toml (600 steps x 16 x 1024 tokens) for each optimizer profile ($4: a
#          comma-separated subset, to finish a sweep a call's time cut short)
# Each run is capped at 240 s and the whole part at $3 seconds; what ran is kept. Source bench/gpu_setup.sh first.
# usage: bash bench/frontier_h100.sh OUT_DIR PART [SECONDS] [PROFILES]
set -u
out=${1:?output folder}; part=${2:?a, a2, b, c, d, e, f1, f2, f3, g, g2 or optim}; runs="$out/runs"; mkdir -p "$runs"
deadline=$(( $(date +%s) + ${3:-560} ))
left() { echo $(( deadline - $(date +%s) )); }
run() {  # experiment profile [memlab run options ...]
  local l; l=$(left); [ "$l" -le 10 ] && { echo "== skipped (time): $*"; return; }
  local e=$1 p=$2; shift 2
  echo "== $e $p $* ($(date -u +%T))"
  timeout -s INT $(( l < 240 ? l : 240 )) python3 -m memlab run --profile "$p" --experiment "$e" --device cuda \
    --steps 20 --runs-dir "$runs" "$@" 2>&1 | tail -3
}
warm() { warm_on gpt2s "$@"; }
warm_on() {  # compile each case once in parallel, in throwaway folders, so the timed runs find Inductor's cache warm
  local e=$1; shift
  echo "== warming Inductor's cache on $e: $* ($(date -u +%T))"
  local i=0 pids=()
  for case in "$@"; do
    IFS=: read -r p extra <<< "$case"
    timeout 300 python3 -m memlab run --profile "$p" --experiment "$e" --device cuda --steps 8 \
      --runs-dir /tmp/warm-runs ${extra:+--set $extra} > "/tmp/warm-$i.log" 2>&1 & pids+=($!); i=$((i+1))
  done
  wait "${pids[@]}"; echo "== warm done ($(date -u +%T))"; tail -n1 /tmp/warm-*.log
}
SEED=(--set 'data.source="stdlib"' --set 'data.tokenizer="bpe:8192"' --set data.streaming=false --set 'data.split="train"')
BUDGETS=(0 0.25 0.5 0.75 1)  # the compiler's activation-memory budgets swept
BUDGET_CASES=("${BUDGETS[@]/#/compile_budget:checkpointing.budget=}")  # warm()'s cases for them
budget_sweep() {  # the sweep, with what is left of the part's time
  local l; l=$(left); [ "$l" -gt 30 ] || return
  local IFS=,
  timeout -s INT "$l" python3 -m memlab sweep --profiles compile_budget --vary "checkpointing.budget=${BUDGETS[*]}" \
    --experiment gpt2s --device cuda --steps 20 --runs-dir "$runs" 2>&1 | tail -8
}
case $part in
  a)
    warm compile float8 adamw4bit "${BUDGET_CASES[@]}"
    run gpt2s bf16; run gpt2s bf16 --set train.clip=0
    for p in bf16_sr muon optim_in_bwd adamw4bit act_offload act_offload_overlap gradcp_bf16 selective sac_ops compile float8; do
      run gpt2s $p
    done
    budget_sweep ;;
  a2)
    python3 bench/saved_tensors.py --profiles compile,float8 --experiment gpt2s --layers 2 --batch 16 > "$out/saved_tensors.txt" 2>&1 &
    warm compile float8 "${BUDGET_CASES[@]}"
    wait
    for p in bf16 act_offload act_offload_overlap gradcp_bf16 selective sac_ops compile float8; do run gpt2s $p; done
    budget_sweep ;;
  c)
    warm compile "${BUDGET_CASES[@]}"
    for p in bf16 act_offload act_offload_overlap gradcp_bf16 selective sac_ops compile; do run gpt2s $p; done
    budget_sweep ;;
  d)
    for p in bf16 cce; do run bigvocab $p; done ;;
  e)
    for p in bf16 liger_ce cce; do run bigvocab $p; done
    for p in bf16 cce; do run gpt2s $p; done ;;
  f1)
    for p in bf16 bf16_sr muon adamw4bit paged_adamw8bit galore act_offload act_offload_overlap sac_ops; do run bigvocab $p; done
    run bigvocab bf16 --set train.clip=0; run bigvocab optim_in_bwd ;;
  f2)
    # no warming here: three compiled bigvocab runs at once would not fit one 80 GB card
    for p in bf16 compile float8 compile_budget liger_ce cce; do run bigvocab $p; done ;;
  f3)
    # what f2's deadline cut: float8 to the end of its evaluation, compile_budget; beside their bf16 and compile
    for p in bf16 compile_budget float8 compile; do run bigvocab $p; done ;;
  g)
    # the compiler's budget below 1 on shapes its model was not built on (held out): the seed shape on the
    # built-in corpus at its batch 64
    for b in 0 0.25 0.75; do run seed-so-posts compile_budget --set checkpointing.budget=$b "${SEED[@]}"; done ;;
  g2)
    for b in 0 0.25 0.75; do run bigvocab compile_budget --set checkpointing.budget=$b; done ;;
  b)
    run gpt2s bf16
    for p in paged_adamw8bit galore chunked_ce liger_ce cce; do run gpt2s $p; done
    for p in bf16 chunked_ce liger_ce cce; do run bigvocab $p; done ;;
  optim)
    l=$(left); timeout -s INT "$l" python3 -m memlab sweep --profiles "${4:-bf16,adamw4bit,bf16_sr,muon,paged_adamw8bit,galore}" \
      --experiment bench/experiments/optim_budget.toml --device cuda --runs-dir "$runs" 2>&1 | tail -12 ;;
  *) echo "unknown part $part: a, a2, b, c, d, e, f1, f2, f3, g, g2 or optim"; exit 2 ;;
esac
python3 -m memlab table "$runs" --out "$out" 2>&1 | tail -40
