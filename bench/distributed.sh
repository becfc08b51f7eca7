#!/usr/bin/env bash
# Issue 9 on 2 GPUs of one host (nvidia-h200-x2): DDP and FSDP2 as memory techniques, per-GPU figures per rank.
#
#   bash bench/distributed.sh            (about 4-6 min; writes $OUT/distributed.txt and $OUT/distributed-runs.tar.gz)
#
# GPU default experiment (gpt2s), 30 steps each:
#   bf16              one GPU, batch 16                                  (the reference)
#   ddp_bf16          2 ranks, global batch 32 = 16 per GPU              } through `memlab sweep --nproc 2`, so the
#   fsdp_bf16         2 ranks, global batch 32 = 16 per GPU              } supervisor path is the one exercised
#   fsdp_gradcp_bf16  2 ranks, global batch 32 = 16 per GPU              }
#   fsdp_bf16 + distributed.cpu_offload=true, 2 ranks (FSDP2 CPUOffloadPolicy)
# Every GPU holds 16 sequences in all of them, so activations are alike and the differences in per-GPU peaks are the
# model state: DDP keeps whole weights + grads + AdamW state on each GPU, FSDP2 half of them each.
set -u
source bench/gpu_env.sh   # keeps NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
R=/tmp/dist-runs; rm -rf "$R"; mkdir -p "$R"
LOG="$OUT/distributed.log"
COMMON=(--experiment gpt2s --steps 30 --runs-dir "$R")
{
  nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv
  python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'gpus', torch.cuda.device_count())"
  env | grep -E '^(NCCL_NVLS_ENABLE|TORCH_SYMM_MEM_DISABLE_MULTICAST|NVSHMEM_DISABLE_NVLS)='
  echo "== single GPU bf16 (also builds the token cache the ranks then share)"
  timeout 240 python3 -m memlab run --profile bf16 "${COMMON[@]}" 2>&1 | tail -12
  echo "== sweep --nproc 2: ddp_bf16, fsdp_bf16, fsdp_gradcp_bf16 at global batch 32"
  timeout 420 python3 -m memlab sweep --profiles ddp_bf16,fsdp_bf16,fsdp_gradcp_bf16 --nproc 2 "${COMMON[@]}" --set train.batch_size=32 2>&1 | grep -E '^\[|sweep:|error|Error' 
  echo "== fsdp_bf16 + distributed.cpu_offload on 2 ranks"
  timeout 240 python3 -m memlab run --nproc 2 --profile fsdp_bf16 "${COMMON[@]}" --set train.batch_size=32 --set distributed.cpu_offload=true 2>&1 | tail -12
} 2>&1 | tee "$LOG"

python3 - "$R" <<'EOF' 2>&1 | tee "$OUT/distributed.txt"
"""Per-GPU peaks per profile: one line per rank (ranks.parquet), the single-GPU run from its summary."""
import json, sys
from pathlib import Path
import polars as pl

G = 2**30
def gib(x):
    return "    —" if x is None else f"{x / G:6.2f}"

print(f"{'profile':<26}{'rank':>5}{'fwd':>8}{'bwd':>8}{'opt':>8}{'peak':>8}{'reserved':>9}{'NVML':>8}{'step ms':>9}{'tok/s (run)':>13}{'est':>8}  status")
for run in sorted(Path(sys.argv[1]).iterdir(), key=lambda p: p.name):
    if not (run / "summary.parquet").exists():
        print(f"{run.name}: no summary"); continue
    s = pl.read_parquet(run / "summary.parquet").row(0, named=True)
    meta = json.loads((run / "run.json").read_text())
    label = s["profile"] + (" +cpu_offload" if (meta.get("profile") or {}).get("distributed", {}).get("cpu_offload") else "")
    rows = pl.read_parquet(run / "ranks.parquet").sort("rank").to_dicts() if (run / "ranks.parquet").exists() else [dict(s, rank=0)]
    for r in rows:
        print(f"{label:<26}{r['rank']:>5}{gib(r['peak_alloc_fwd_bytes']):>8}{gib(r['peak_alloc_bwd_bytes']):>8}{gib(r['peak_alloc_opt_bytes']):>8}"
              f"{gib(r['peak_alloc_bytes']):>8}{gib(r['peak_reserved_bytes']):>9}{gib(r['peak_nvml_bytes']):>8}{(r['step_ms_median'] or 0):>9.1f}"
              f"{(s['tokens_per_s'] or 0):>13,.0f}{gib(s.get('estimate_peak_bytes')):>8}  {r['status']}")
    print(f"{'':<26}  max over ranks: peak {gib(s['peak_alloc_bytes'])} GiB · n_gpus {s['n_gpus']} · batch {s['batch_size']} (micro {s['micro_batch']}) · final loss {s['final_loss']} · {meta.get('distributed', 'none')}")
print("params x bytes: weights+grads (bf16 autocast keeps fp32 params: 4+4) + AdamW 8 = 16 B/param on one GPU; FSDP2 on 2: 8 B/param each")
EOF
tar czf "$OUT/distributed-runs.tar.gz" -C /tmp dist-runs
echo "wrote $OUT/distributed.txt $OUT/distributed.log $OUT/distributed-runs.tar.gz"
