#!/usr/bin/env bash
# On one host with two GPUs (the nvidia-h200-x2 kind), in one device call (about 6-7 minutes):
#
#   OUT=results-dir bash benchmarks/gpu_scaling_x2.sh
#
# 0. how the GPUs are linked (nvidia-smi topo -m), the NCCL variables the machine sets (passed
#    through untouched), versions.
# 1. the default matrix (llama-468m, batch 4 x 2048, eager/compile x sdpa/eager attention) on one
#    GPU (CUDA_VISIBLE_DEVICES=0), one setup at a time, timed whole.
# 2. DDP and FSDP2 of the same model over both GPUs, eager and compiled SDPA, 4 sequences per GPU,
#    into the same results file, so that each record's scaling efficiency is taken against the
#    single-GPU records of step 1.
# 3. the default matrix again with --gpus all (one setup per GPU, longest first), timed whole.
# Each compiled setup starts with an empty inductor cache in every step (stepbench's default).
set -uo pipefail
out=${OUT:?set OUT to a folder}
mkdir -p "$out"
quiet() { grep -v -e "TensorFloat32" -e "torch.set_float32_matmul_precision" -e "^ *warnings.warn" ; }
sb() { PYTHONPATH=src python3 -m stepbench run --no-peak --timeout 300 "$@" 2>&1 | quiet >>"$out/run.log"; }
stamp() { date +%s.%N; }
{
  nvidia-smi topo -m
  nvidia-smi --query-gpu=index,name,pci.bus_id,memory.total,driver_version --format=csv
  env | grep -E '^(NCCL_|TORCH_SYMM|NVSHMEM_|CUDA_VISIBLE)' | sort
  python3 -c "import sys, torch, transformers; print(sys.version.split()[0], torch.__version__, transformers.__version__, 'nccl', torch.cuda.nccl.version())"
  echo "cpus $(nproc)"
} >"$out/env.txt" 2>&1

t0=$(stamp)
CUDA_VISIBLE_DEVICES=0 sb --out "$out/one-gpu.jsonl"
t1=$(stamp)
sb --nproc 2 --parallel ddp,fsdp2 --attn sdpa --out "$out/one-gpu.jsonl"
t2=$(stamp)
sb --gpus all --out "$out/gpus-all.jsonl"
t3=$(stamp)
python3 - "$t0" "$t1" "$t2" "$t3" >>"$out/env.txt" <<'PY'
import sys
t0, t1, t2, t3 = map(float, sys.argv[1:])
print(f"wall one GPU matrix: {t1 - t0:.1f} s")
print(f"wall ddp+fsdp2 (4 jobs of 2 GPUs): {t2 - t1:.1f} s")
print(f"wall --gpus all matrix: {t3 - t2:.1f} s")
print(f"ratio --gpus all / one GPU: {(t3 - t2) / (t1 - t0):.3f}")
PY
tail -n 25 "$out/env.txt"
grep -E ": (ok|OOM|ERROR|TIMEOUT|CRASHED)" "$out/run.log" | tail -n 20
