#!/usr/bin/env bash
# On one GPU, in one call: stepbench's default matrix (one command, timed whole), then the post's
# own script (seed_train.py, not part of this repository) for the same four setups, each in a fresh
# process with a fresh, empty inductor/Triton cache, as stepbench gives each compiled setup.
#
#   OUT=results-dir SEED=path/to/seed_train.py bash benchmarks/gpu_matrix_vs_seed.sh
#
# Writes OUT/stepbench.jsonl, OUT/seed.jsonl, OUT/walltimes.txt, OUT/env.txt and the logs.
# benchmarks/compare_seed.py turns the two .jsonl files into the ratio table.
set -uo pipefail
out=${OUT:?set OUT to a folder}; seed=${SEED:?set SEED to the post script}
mkdir -p "$out"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv >"$out/env.txt"
python3 -c "import sys, torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, 'python', sys.version.split()[0])" >>"$out/env.txt"
quiet() { grep -v -e "TensorFloat32" -e "torch.set_float32_matmul_precision" -e "^ *warnings.warn" ; }

t0=$(date +%s)
PYTHONPATH=src python3 -m stepbench run --out "$out/stepbench.jsonl" --timeout 400 "$@" 2>&1 | quiet | tee "$out/stepbench.log"
t1=$(date +%s)
echo "stepbench_matrix_wall_s $((t1 - t0))" >>"$out/walltimes.txt"

for attn in sdpa eager; do
  for mode in eager compile; do
    cache=$(mktemp -d)
    s0=$(date +%s)
    TORCHINDUCTOR_CACHE_DIR=$cache/inductor TRITON_CACHE_DIR=$cache/triton timeout 400 \
      python3 "$seed" "$mode" "$attn" >>"$out/seed.jsonl" 2>>"$out/seed.log"
    echo "seed_${mode}_${attn}_wall_s $(($(date +%s) - s0))" >>"$out/walltimes.txt"
    rm -rf "$cache"
  done
done
echo "seed_total_wall_s $(($(date +%s) - t1))" >>"$out/walltimes.txt"
cat "$out/walltimes.txt" "$out/seed.jsonl"

# Resume must find every setup done also when NVML is off (STEPBENCH_NVML=0): the parent then
# names the GPU through torch in a short-lived process, as the setup's process does.
STEPBENCH_NVML=0 PYTHONPATH=src python3 -m stepbench run --out "$out/stepbench.jsonl" --timeout 400 \
  --format json >"$out/resume-nvml-off.json" 2>"$out/resume-nvml-off.log"
echo "resume_without_nvml_skipped $(grep -c 'already in the results file' "$out/resume-nvml-off.log")" >>"$out/walltimes.txt"
cat "$out/walltimes.txt"
