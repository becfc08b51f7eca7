#!/usr/bin/env bash
# memlab fit --measure on an H100 (issue 47): the predicted side made first on a CPU machine
# (bench/results/fit-h100/predicted-<experiment>.json, `memlab fit --experiment E --gpu-memory 24GiB --format json`),
# measured here by find-batch's probes. Usage, on the GPU machine from the repo root, with polars, bitsandbytes and
# torchao on PYTHONPATH (bench/README.md):
#   EXPERIMENT=llama-1b PROFILES=lora_gradcp,qlora_gradcp,gradcp_adamw8bit bash bench/fit_h100.sh $OUT
# PREDICTED=path.json takes the predicted side from another file (default bench/results/fit-h100/predicted-E.json).
set -u
out=${1:?output folder}
e=${EXPERIMENT:?} p=${PROFILES:?}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$out/gpu-$e.txt"
python3 -c "import torch, transformers, peft, bitsandbytes, torchao; print(torch.__version__, transformers.__version__, peft.__version__, bitsandbytes.__version__, torchao.__version__)" >> "$out/gpu-$e.txt" 2>&1
python3 -m memlab fit --experiment "$e" --gpu-memory 24GiB --profiles "$p" --measure \
  --predicted "${PREDICTED:-bench/results/fit-h100/predicted-$e.json}" --format markdown --out "$out/fit-$e.parquet" \
  > "$out/fit-$e.md" 2> "$out/fit-$e.log"
echo "rc=$?" >> "$out/fit-$e.log"
