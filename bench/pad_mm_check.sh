# Whether Inductor's shape padding is what holds one more bf16 logits-sized buffer in transformers' GPT-2 compiled
# (vocabulary 50,257: not a multiple of 8): the same run at micro-batch 34 (no cap: the peak is what is read) with shape padding on
# (the default) and off. usage (device tool): bash bench/pad_mm_check.sh $OUT
out=${1:?output folder}; mkdir -p "$out"
source bench/gpu_setup.sh > "$out/setup.log" 2>&1
for pad in on off; do
  sets=(--set model.source=gpt2 --set model.seq_len=1024)
  if [ $pad = off ]; then export TORCHINDUCTOR_SHAPE_PADDING=0; else unset TORCHINDUCTOR_SHAPE_PADDING; fi
  timeout 240 memlab run --experiment llama-1b --profile compile "${sets[@]}" --batch-size 34 --steps 4 \
    --runs-dir "$out/runs-$pad" > "$out/$pad.log" 2>&1
  echo "shape padding $pad: rc $?"; grep -E 'peak|step 4/4' "$out/$pad.log" | tail -3 | cut -c1-200
  grep -iE "error|memory" "$out/$pad.log" | head -3
done
python3 - "$out" <<'PY'
import glob, sys
import pyarrow.parquet as pq
for path in sorted(glob.glob(f"{sys.argv[1]}/runs-*/*/summary.parquet")):
    row = pq.read_table(path).to_pylist()[0]
    print(path.split("/")[-3], {k: round(v / 2**30, 2) for k, v in row.items() if k.startswith("peak_") and isinstance(v, (int, float)) and v})
PY
