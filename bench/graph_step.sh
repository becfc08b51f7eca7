#!/usr/bin/env bash
# Issue 17 on the GPU: cuda_graph.enabled in memlab's engine, then the speed at equal batch (bench/fastest.py).
#   bash bench/graph_step.sh OUT engine   `fastest` with and without its CUDA graph, 30 steps each through `memlab run`
#                                         (memory, speed, loss side by side), then the equal-batch rounds at batch 16
#   bash bench/graph_step.sh OUT max      the equal-batch rounds at the largest batch both the loop and memlab fit
#   bash bench/graph_step.sh OUT rivals   one round of the profiles that could be faster than `fastest` (compile,
#                                         compile_budget, float8, cce) at batch 16 and the largest batch both fit;
#                                         RIVALS, BATCHES and RIVAL_ROUNDS set other profiles, batches and rounds
#   bash bench/graph_step.sh OUT seed     the seeds' shape (4 x 256, seq 256, a 50k head, dropout 0.1) at batch 64, where
#                                         the host sets the pace; and find-batch of bf16 with and without a graph
#   bash bench/graph_step.sh OUT accum    `fastest` with and without its graph at accumulation 2 and a validation every 10
#                                         steps: the per-step losses side by side (a graph must not change the sums)
# after `source bench/gpu_setup.sh` (polars must import: the engine writes Parquet).
set -u
OUT=$1; PART=$2; mkdir -p "$OUT"
ROUNDS=${ROUNDS:-3}
summ() {  # one line per run folder: what the comparison needs
python3 - "$@" <<'PY'
import sys, glob, polars as pl
for d in sys.argv[1:]:
    for f in sorted(glob.glob(f"{d}/*/summary.parquet")):
        r = pl.read_parquet(f).row(0, named=True)
        keys = ("profile", "status", "cuda_graph", "batch_size", "peak_alloc_fwd_bytes", "peak_alloc_bwd_bytes", "peak_alloc_opt_bytes",
                "peak_alloc_bytes", "peak_reserved_bytes", "peak_nvml_process_bytes", "step_ms_median", "tokens_per_s", "tokens_per_s_wall", "val_loss")
        print({k: r.get(k) for k in keys}, flush=True)
PY
}
EQ=${EQ-"fastest,cuda_graph.enabled=false;compile"}
case $PART in
engine)
  for g in true false; do
    memlab run --profile fastest --set cuda_graph.enabled=$g --steps 30 --runs-dir "$OUT/runs-$g" > "$OUT/run-$g.log" 2>&1
    echo "memlab run fastest cuda_graph=$g: rc $?"; tail -3 "$OUT/run-$g.log"
  done
  summ "$OUT/runs-true" "$OUT/runs-false" | tee "$OUT/engine.txt"
  python3 bench/fastest.py --out "$OUT/eq16" --rounds "$ROUNDS" --steps 30 --skip ref_eager,ref_compiled,memlab,meters,ttfs \
    --equal-batches 16 --equal-profiles "$EQ" 2>&1 | grep -v -i warn > "$OUT/eq16.log"; tail -8 "$OUT/eq16.log";;
max)
  python3 bench/fastest.py --out "$OUT/eqmax" --rounds "$ROUNDS" --steps 20 --skip ref_eager,ref_compiled,memlab,meters,ttfs \
    --equal-batches max --max-candidates "${CANDIDATES:-176,160,144}" --equal-profiles "$EQ" 2>&1 | grep -v -i warn > "$OUT/eqmax.log"; tail -8 "$OUT/eqmax.log";;
rivals)
  python3 bench/fastest.py --out "$OUT/rivals" --rounds "${RIVAL_ROUNDS:-1}" --steps 20 --skip ref_eager,ref_compiled,memlab,meters,ttfs \
    --equal-batches "${BATCHES:-16,max}" --max-candidates "${CANDIDATES:-200,192,184,176}" \
    --equal-profiles "${RIVALS:-compile;compile_budget;float8;cce}" 2>&1 | grep -v -i warn > "$OUT/rivals.log"; tail -24 "$OUT/rivals.log";;
seed)
  python3 bench/fastest.py --out "$OUT/seed" --experiment bench/experiments/seed_shape.toml --rounds "$ROUNDS" --steps 40 \
    --skip ref_eager,ref_compiled,memlab,meters,ttfs --equal-batches 64 --equal-profiles "$EQ;bf16;bf16,cuda_graph.enabled=true" \
    2>&1 | grep -v -i warn > "$OUT/seed.log"; tail -8 "$OUT/seed.log"
  for g in false true; do
    memlab find-batch --profile bf16 --set cuda_graph.enabled=$g --gpu-memory 12GiB --steps 4 --experiment gpt2s --refresh > "$OUT/find-batch-$g.log" 2>&1
    echo "find-batch bf16 cuda_graph=$g: rc $?"; tail -4 "$OUT/find-batch-$g.log"
  done;;
accum)
  for g in true false; do
    memlab run --profile fastest --set cuda_graph.enabled=$g --set accumulation.steps=2 --set train.eval_every=10 --steps 30 \
      --runs-dir "$OUT/accum-$g" > "$OUT/accum-$g.log" 2>&1
    echo "memlab run fastest accumulation 2, eval every 10, cuda_graph=$g: rc $?"; tail -3 "$OUT/accum-$g.log"
  done
  summ "$OUT/accum-true" "$OUT/accum-false" | tee "$OUT/accum.txt"
  python3 - "$OUT" <<'PY' | tee -a "$OUT/accum.txt"
import sys, glob, polars as pl
out = sys.argv[1]
steps = {g: pl.read_parquet(glob.glob(f"{out}/accum-{g}/*/steps.parquet")[0]) for g in ("true", "false")}
both = steps["true"].select("step", pl.col("loss").alias("graphed")).join(
    steps["false"].select("step", pl.col("loss").alias("launched")), on="step")
print(both.with_columns((pl.col("graphed") - pl.col("launched")).abs().alias("diff")))
print("largest |loss difference|:", both.select((pl.col("graphed") - pl.col("launched")).abs().max()).item())
PY
  ;;
esac
