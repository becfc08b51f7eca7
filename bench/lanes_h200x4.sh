#!/usr/bin/env bash
# Issue 49 on a 4-GPU host, one device call: bench/lanes.py with the given arguments (results under $OUT/lanes,
# its printout in $OUT/lanes/stdout.txt), stopped by SIGINT after $LANES_LIMIT_S seconds (default 480); then,
# with DIAG=1, where the seconds of one max-batch probe go ($OUT/diag). Carries polars as .gpu-wheels/spl.
# usage: [DIAG=1] [TOPO=1] [TAG=lanes] [LANES_LIMIT_S=480] bash bench/lanes_h200x4.sh [bench/lanes.py options ...]
set -u
source bench/gpu_setup.sh >/dev/null
nvidia-smi --query-gpu=index,name,serial,clocks.sm --format=csv,noheader
mkdir -p "$OUT/lanes"
if [ "${TOPO:-0}" = 1 ]; then  # which CPUs sit near which GPU: a lane's host work may run on the far socket
  { nproc; lscpu | grep -i -E "numa|socket|model name"; nvidia-smi topo -m; numactl -H; } > "$OUT/lanes/topology.txt" 2>&1
  cat "$OUT/lanes/topology.txt"
fi
timeout -k 60 -s INT "${LANES_LIMIT_S:-480}" python3 bench/lanes.py --out "$OUT/lanes" "$@" 2>&1 | tee "$OUT/lanes/stdout.txt"
cp /tmp/lanes-runs/study-*/report.md "$OUT/lanes/" 2>/dev/null
if [ "${DIAG:-0}" = 1 ]; then
  mkdir -p "$OUT/diag"
  export MEMLAB_CACHE=/tmp/lanes-runs/cache
  { /usr/bin/time -f "python + import torch + CUDA init: %e s" python3 -c "import torch; torch.zeros(1, device='cuda')"
    /usr/bin/time -f "memlab --help: %e s" python3 -m memlab --help >/dev/null
    python3 -X importtime -c "import memlab.core.engine" 2>&1 | sort -t'|' -k2 -n | tail -12
    for i in 1 2; do
      /usr/bin/time -f "a probe-sized run (3 steps at 64 x 256, 4 layers): %e s" python3 -m memlab run --profile bf16 \
        --experiment gpt2s --set model.n_layer=4 --set model.seq_len=256 --set train.steps=3 --set train.measure_after=1 \
        --set train.eval_every=0 --set data.val_tokens=257 --set train.batch_size=64 --runs-dir /tmp/diag-runs 2>&1 | tail -4
    done
  } > "$OUT/diag/probe_seconds.txt" 2>&1
  cat "$OUT/diag/probe_seconds.txt"
fi
# A call brings back at most 8 files: this invocation's folders go back as one archive, its table beside it.
# Several invocations in one call: give each its own TAG.
tag=${TAG:-lanes}
tar czf "$OUT/$tag.tgz" -C "$OUT" lanes $( [ -d "$OUT/diag" ] && echo diag ) && cp "$OUT/lanes/lanes.md" "$OUT/$tag.md" 2>/dev/null
rm -rf "$OUT/lanes" "$OUT/diag"
