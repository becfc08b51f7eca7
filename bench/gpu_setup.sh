# Source on the GPU machine (bash), in calls made back to back: each call carries one wheel bundle (.gpu-wheels/*/,
# git-ignored, at most 64 MiB a call); its wheels are kept in /root/gws and installed once into /tmp/site, which last
# while the machine stays warm. Then gpu_env.sh (memlab from this tree), the data cache, and which extras import.
mkdir -p /root/gws
for w in .gpu-wheels/*/*.whl; do [ -f "$w" ] && cp -n "$w" /root/gws/; done
new=$(comm -23 <(ls /root/gws/*.whl 2>/dev/null | sort) <(sort /root/gws/.installed 2>/dev/null))
if [ -n "$new" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site $new 2>&1 | grep -v -i warning | tail -3
  echo "$new" >> /root/gws/.installed
fi
source bench/gpu_env.sh
export MEMLAB_CACHE=/root/cache
python3 - <<'PY'
import importlib
found = []
for name in ("polars", "torchao", "bitsandbytes", "liger_kernel", "cut_cross_entropy", "galore_torch", "matplotlib"):
    try:
        importlib.import_module(name)
        found.append(name + " ok")
    except Exception as e:
        found.append(f"{name} MISSING ({type(e).__name__})")
print("extras: " + ", ".join(found))
PY
