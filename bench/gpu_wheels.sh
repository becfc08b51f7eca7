#!/usr/bin/env bash
# Build offline wheel bundles for a CUDA host that has PyTorch but no network and no memlab deps.
# Target: CPython 3.12, manylinux x86_64, CUDA 13 (change PY/EXTRA below for another host).
# Output: <repo>/.gpu-wheels/p1 .. pN, each under 56 MiB, wheels over that size split into chunks.
# The last part holds install.sh, which rebuilds split wheels and installs everything with
#   bash install.sh /tmp/gpu-site      -> prints the PYTHONPATH to export.
# Usage: bash bench/gpu_wheels.sh [extra requirement ...]     (run from the repo root)
set -euo pipefail
root=$(git rev-parse --show-toplevel)
out=$root/.gpu-wheels
mkdir -p "$(git rev-parse --git-path info)"
grep -qxF '/.gpu-wheels/' "$root/.git/info/exclude" 2>/dev/null || echo '/.gpu-wheels/' >> "$root/.git/info/exclude"
stage=$(mktemp -d)
PY=3.12
plat=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64
      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64)
# What the GPU image lacks (it already has torch, numpy, pyarrow, pandas, rich, typer, tokenizers,
# huggingface-hub, fsspec, xxhash, einops, nvidia-ml-py, psutil, pytest).
reqs=(
  polars polars-runtime-32
  textual mdit-py-plugins linkify-it-py uc-micro-py
  datasets dill multiprocess
  flash-attn-4==4.0.0b36 quack-kernels apache-tvm-ffi torch-c-dlpack-ext
  nvidia-cutlass-dsl==4.8.1 nvidia-cutlass-dsl-libs-base==4.8.1 nvidia-cutlass-dsl-libs-core==4.8.1
  nvidia-cutlass-dsl-libs-cu13==4.8.1
  "$@"
)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version $PY --implementation cp \
  "${plat[@]}" -d "$stage" "${reqs[@]}"
rm -rf "$out"; mkdir -p "$out"
limit=$((56 * 1024 * 1024)); chunk=40M
for w in "$stage"/*.whl; do
  if (( $(stat -c %s "$w") > limit )); then
    (cd "$stage" && split -b $chunk "$w" "$(basename "$w").chunk.")
    rm "$w"
  fi
done
# first-fit decreasing: each file into the first part with room for it
declare -a used=()
for f in $(ls -S "$stage"); do
  sz=$(stat -c %s "$stage/$f"); k=0
  while (( k < ${#used[@]} )) && (( used[k] + sz > limit )); do k=$((k + 1)); done
  (( k == ${#used[@]} )) && used[k]=0
  mkdir -p "$out/p$((k + 1))"; mv "$stage/$f" "$out/p$((k + 1))/"; used[k]=$((used[k] + sz))
done
part=${#used[@]}
cat > "$out/p$part/install.sh" <<'INSTALL'
#!/usr/bin/env bash
# Reassemble split wheels found beside this script or in /root/gw, then install them into $1.
set -euo pipefail
target=${1:-/tmp/gpu-site}; src=/root/gw
mkdir -p "$src"; cp -n "$(dirname "$0")"/* "$src"/ 2>/dev/null || true
cd "$src"
for first in *.chunk.aa; do
  [ -e "$first" ] || continue
  name=${first%.chunk.aa}; cat "$name".chunk.* > "$name"; rm -f "$name".chunk.*
done
rm -rf "$target"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$target" "$src"/*.whl
pp=$target
[ -d "$target/nvidia_cutlass_dsl/dsl_packages" ] && pp=$pp:$target/nvidia_cutlass_dsl/dsl_packages
echo "$pp" > "$src/pythonpath"
echo "export PYTHONPATH=$pp:\${PYTHONPATH:-}"
INSTALL
chmod +x "$out/p$part/install.sh"
rm -rf "$stage"
du -sh "$out"/p* | sed "s|$root/||"
echo "parts: $part. Carry p1..p$((part-1)) one per call (each: mkdir -p /root/gw && cp .gpu-wheels/pK/* /root/gw/),"
echo "then p$part with: bash .gpu-wheels/p$part/install.sh && export PYTHONPATH=\$(cat /root/gw/pythonpath)"
