# Every CUDA-only path of the step, run once on one GPU after a change that moved code (not a measurement):
# the tiny experiment for 6 steps under each profile that takes such a path (fused AdamW, the step inside backward,
# optimizer offload, Muon, Adafactor, compile, the compiler budget, per-op checkpointing's compiled blocks, one CUDA
# graph a step, activation offload, LoRA on a transformers model), then the tests marked requires_cuda.
#   source bench/gpu_setup.sh > OUT/setup.log 2>&1; bash bench/gpu_smoke.sh OUT
out=${1:?usage: bash bench/gpu_smoke.sh OUT}
mkdir -p "$out"
for p in bf16 fused_adamw optim_in_bwd optim_offload muon adafactor compile compile_budget sac_ops fastest act_offload_overlap gradcp_bf16 lora_fast; do
  e=tiny; [ "$p" = lora_fast ] && e=llama-tiny
  if timeout 300 memlab run --experiment $e --profile $p --steps 6 --runs-dir "$out/runs" > "$out/$p.log" 2>&1; then
    echo "$p ok: $(grep -m1 -i 'peak' "$out/$p.log" | cut -c1-120)"
  else
    echo "$p FAILED (rc $?): $(tail -2 "$out/$p.log" | tr '\n' ' ' | cut -c1-300)"
  fi
done
# only the files that hold one: the GPU image has no textual, which the TUI tests import
timeout 400 python3 -m pytest -q -p no:cacheprovider -m requires_cuda $(grep -l requires_cuda tests/test_*.py) 2>&1 | tail -3
