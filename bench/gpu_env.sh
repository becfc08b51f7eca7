# Source on the GPU machine (bash): installs memlab from this tree and puts the carried wheels on PYTHONPATH.
# The GPU image has torch but lacks polars/textual/datasets/flash-attn: bench/README.md says how they are carried.
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
if [ -f /root/gw/pythonpath ]; then
  export PYTHONPATH=$(cat /root/gw/pythonpath):$PWD
elif [ -d .gpu-wheels/p1 ] && [ ! -d /tmp/site ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .gpu-wheels/p1/*.whl
fi
[ -d /tmp/site ] && export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo "memlab install failed"
# torchao (for adamw8bit) is not on the image either: carry its wheel in .whl/ (bench/README.md)
if [ ! -d /tmp/ao ] && ls .whl/torchao-*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/ao .whl/torchao-*.whl
fi
[ -d /tmp/ao ] && export PYTHONPATH=${PYTHONPATH:-}:/tmp/ao
true
