#!/usr/bin/env bash
# The issue-18 study on one GPU: the Stack Overflow seed's shape on the built-in corpus, every built-in single-GPU
# profile, as on a 24 GiB card, max-batch searches three at a time (--lanes 3: 3 x 24 GiB fit an 80 GB card; the
# training runs stay one at a time). Resumable: run the same line again until it ends (each call <= $2 seconds).
# Source bench/gpu_setup.sh first: a profile whose extra is missing would be recorded as refused, so the study does
# not start unless every optional package a built-in profile needs imports.
# usage: bash bench/study_h100.sh STUDY_DIR [SECONDS] [memlab study options ...]
set -u
dir=${1:?study folder}; seconds=${2:-540}; shift; [ $# -gt 0 ] && shift
python3 -c "import polars, torchao, bitsandbytes, liger_kernel, cut_cross_entropy, galore_torch" \
  || { echo "study not started: an extra is missing (carry the .gpu-wheels bundles, source bench/gpu_setup.sh)"; exit 3; }
# SIGINT at $2 s: the study cancels its probes in flight and writes its report; killed 120 s later if still running
# (its children then stop themselves: a supervised run watches its parent). Leave the device call 130 s beyond $2.
timeout -k 120 -s INT "$seconds" python3 -m memlab study --recipe seed-so-posts --data stdlib --tokenizer bpe:8192 \
  --profiles all --gpu-memory 24GiB --device cuda --lanes 3 --out "$dir" "$@"
echo "study exit: $?"
