#!/usr/bin/env bash
# The issue-18 study on one GPU: the Stack Overflow seed's shape on the built-in corpus, every built-in single-GPU
# profile, as on a 24 GiB card, max-batch searches three at a time (--lanes 3: 3 x 24 GiB fit an 80 GB card; the
# training runs stay one at a time). Resumable: run the same line again until it ends (each call <= $2 seconds).
# usage: bash bench/study_h100.sh STUDY_DIR [SECONDS]
set -u
dir=${1:?study folder}
timeout -s INT "${2:-540}" python3 -m memlab study --recipe seed-so-posts --data stdlib --tokenizer bpe:8192 \
  --profiles all --gpu-memory 24GiB --device cuda --lanes 3 --out "$dir"
echo "study exit: $?"
