#!/usr/bin/env bash
# Issue 17: find-batch under a 24 GiB card on held-out shapes, several searches side by side on one GPU. Each probe
# is its own process, capped to the emulated card through NVML's per-process figure, so searches sharing the GPU do
# not change each other's budget (3 x 24 GiB fit an 80 GB H100). Cases are written as for bench/predict_first.py,
# which writes the predictions first, on a CPU. Each experiment's corpus is tokenized once before the searches
# start, so they do not race for the token cache. A case ending in @START-MAX searches from START (the prediction) up
# to MAX (the batch above which the prediction would be more than 10% low): its first two probes then decide both
# claims, and a search the timeout (SEARCH_TIMEOUT, default 500 s) cuts off still bounds the answer.
# KEY=VALUE,KEY=VALUE: several --set items; GPU_MEMORY: the card (default 24GiB).
# usage: source bench/gpu_setup.sh; bash bench/heldout_parallel_findbatch.sh OUT PARALLEL EXPERIMENT:PROFILE[:KEY=VALUE[,...]] ...
set -u -o pipefail
out=${1:?output folder}; parallel=${2:?searches at once}; shift 2
mkdir -p "$out"
for experiment in $(printf '%s\n' "$@" | cut -d: -f1 | sort -u); do
  # into this script's own output, not a file of its own: the device tool brings back only so many files a call
  memlab data prepare --experiment "$experiment" 2>&1 | tail -2 || echo "data prepare failed: $experiment"
done
search() {  # EXPERIMENT:PROFILE[:KEY=VALUE][@START-MAX]
  local case=${1%@*} span=${1##*@} range=() experiment rest set=() name
  [[ $1 == *@* ]] && range=(--start "${span%-*}" --max "${span#*-}")
  experiment=${case%%:*} rest=${case#*:}
  local profile=${rest%%:*}
  if [[ $rest == *:* ]]; then local item; IFS=, read -ra items <<< "${rest#*:}"; for item in "${items[@]}"; do set+=(--set "$item"); done; fi
  name=$(basename "$experiment" .toml)-${rest//[:=,]/-}
  name=${name//allocator.expandable_segments-true/expandable}
  echo "== $name start $(date -u +%T) ${range[*]}"
  timeout "${SEARCH_TIMEOUT:-500}" memlab find-batch --profile "$profile" --experiment "$experiment" --gpu-memory "${GPU_MEMORY:-24GiB}" --steps 3 "${set[@]}" "${range[@]}" > "$out/find-batch-$name.log" 2>&1
  echo "== $name rc $? end $(date -u +%T)"
}
export -f search; export out
printf '%s\n' "$@" | xargs -P "$parallel" -I{} bash -c 'search "$@"' _ {}
for f in "$out"/find-batch-*.log; do echo "-- $f"; grep -E "max micro-batch|estimator predicted|with expandable|memory:|retries" "$f"; done
