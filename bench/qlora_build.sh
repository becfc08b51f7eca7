#!/usr/bin/env bash
# Issue 47 on one GPU, after the 4-bit base's host-first build: (1) what the GPU holds while Llama-3.1-8B's
# qlora_gradcp step is built, host first vs the whole bf16 model on the GPU first; (2) Llama-3.2-1B's qlora and
# qlora_gradcp at 2 x 2048 measured (3 steps, as a find-batch probe runs) beside `memlab estimate`'s prediction on this
# machine; (3) Llama-3.1-8B's qlora_gradcp at 7360 tokens (bench/results/fit-8b-h200's case) measured (predicted on a
# CPU afterwards: its estimate's max-batch search under this GPU's memory would take minutes).
# Needs bitsandbytes and polars: carry .gpu-wheels/bnb in one call, then .gpu-wheels/spl in the next (bench/README.md).
# usage: bash bench/qlora_build.sh OUT_DIR
set -u
out=${1:?output folder}; mkdir -p "$out"
source bench/gpu_setup.sh
nvidia-smi --query-gpu=name,serial,driver_version --format=csv,noheader | tee "$out/gpu.txt"
{ timeout 200 python3 bench/qlora_build.py --experiment llama-8b --profile qlora_gradcp
  timeout 120 python3 bench/qlora_build.py --experiment llama-8b --profile qlora_gradcp --whole-on-gpu; } 2>&1 \
  | grep '^{' | tee "$out/build.jsonl"
measure() {  # experiment profile batch seq
  local name=$1_$2_$3x$4
  timeout 240 memlab run --profile "$2" --experiment "$1" --device cuda --steps 3 --runs-dir "$out/runs/$name" \
    --set train.batch_size="$3" --set model.seq_len="$4" --set train.measure_after=1 --set train.eval_every=0 \
    --set data.val_tokens=$(($4 + 1)) 2>&1 | tail -2
  [ "${5:-}" = skip-estimate ] && return  # an 8B search under 139 GiB: minutes of traces; predicted on a CPU instead
  timeout 200 memlab estimate --profile "$2" --experiment "$1" --set train.batch_size="$3" --set model.seq_len="$4" \
    --gpu-memory 139GiB --json > "$out/$name.estimate.json" 2>"$out/$name.estimate.err"; echo "estimate rc $?"
}
measure llama-1b qlora 2 2048
measure llama-1b qlora_gradcp 2 2048
measure llama-8b qlora_gradcp 1 7360 skip-estimate
python3 - "$out" <<'PY'
import glob, json, sys
from memlab.core.runfolder import read_run
out = sys.argv[1]
for info in sorted(glob.glob(f"{out}/runs/*/*/run.json")):
    run, name = read_run(info.rsplit("/", 1)[0]), info.split("/runs/")[1].split("/")[0]
    try:
        est = json.load(open(f"{out}/{name}.estimate.json"))
    except Exception as e:  # the 8B case: predicted on a CPU
        est = {"error": type(e).__name__}
    print(json.dumps({"case": name, "status": run.status,
                      "measured": {k: run.summary.get(k) for k in ("peak_alloc_bytes", "peak_reserved_bytes", "step_ms_median")},
                      "predicted": {k: est.get(k) for k in ("allocated_bytes", "reserved_bytes", "method", "error")}}))
PY
tar czf "$out/runs.tgz" -C "$out" runs && rm -rf "$out/runs"
