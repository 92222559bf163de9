#!/usr/bin/env bash
# On one H200, in one call (about 6 minutes; at most 8): what issue 36's better model needs.
#
#   OUT=results-dir bash benchmarks/gpu_predict_shapes.sh
#
# 1. benchmarks/gpu_microbench.py (at most 150 s): elementwise bandwidth against the working set
#    (relative to L2) and bf16 GEMM TFLOP/s by shape -> OUT/h200-DATE-microbench.json
# 2. the post's four setups (llama-468m, batch 4 x 2048, bf16; eager/compile x sdpa/eager: run's
#    default matrix), one process each, with --profile: the records now carry the GEMMs' shapes
#    and FLOPs (profile.gemms) -> OUT/h200-DATE-profile-shapes.jsonl and its -traces/ folder
# 3. benchmarks/predict_post.py on that file -> OUT/h200-DATE-profile-shapes-predict-post.txt
# 4. `stepbench report --predict` on 2 (the report's predicted section) -> OUT/...-report.md
# 5. benchmarks/calibrate_predict.py on 1's JSON -> OUT/calibration-memory.toml, the [memory]
#    table of src/stepbench/predict/calibration.toml measured (the file holds first estimates)
# Logs: OUT/run.log, OUT/env.txt. Commit the files under benchmarks/results/ (the traces too),
# and paste OUT/calibration-memory.toml over calibration.toml's [memory] table (docs/predict.md).
set -uo pipefail
out=${OUT:?set OUT to a folder}
mkdir -p "$out"
day=$(date -u +%F)
stem=h200-$day-profile-shapes
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >"$out/env.txt"
python3 -c "import torch, transformers; print(torch.__version__, transformers.__version__)" >>"$out/env.txt"
echo "command: OUT=... bash benchmarks/gpu_predict_shapes.sh ($(git rev-parse --short HEAD 2>/dev/null))" >>"$out/env.txt"
quiet() { grep -v -e "TensorFloat32" -e "set_float32_matmul_precision" -e "^ *warnings.warn" ; }

t0=$SECONDS
PYTHONPATH=src timeout 150 python3 benchmarks/gpu_microbench.py --out "$out/h200-$day-microbench.json" 2>&1 | quiet | tee -a "$out/run.log"
echo "microbench_wall_s $((SECONDS - t0))" | tee -a "$out/run.log"

t0=$SECONDS
PYTHONPATH=src timeout 300 python3 -m stepbench run --model llama-468m --batch 4 --seq 2048 \
  --modes eager,compile --attn sdpa,eager --repeats 1 --timeout 240 \
  --profile "$out/$stem-traces" --out "$out/$stem.jsonl" 2>&1 | quiet | tee -a "$out/run.log" | tail -12
echo "run_wall_s $((SECONDS - t0))" | tee -a "$out/run.log"

PYTHONPATH=src python3 - "$out/$stem.jsonl" <<'PY' | tee -a "$out/run.log"
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line); p = r.get("profile") or {}
    g = p.get("gemms") or []
    print(f"{r['setup']['name']:14s} {r['status']:4s} step {r.get('step_ms') or 0:7.1f} ms  "
          f"gemm shapes {len(g):3d}  matmul TFLOP {(p.get('matmul_flops') or 0) / 1e12:6.2f}  "
          f"matmul ms {(p.get('classes_ms') or {}).get('matmul', 0):6.1f}")
PY
PYTHONPATH=src python3 benchmarks/predict_post.py --results "$out/$stem.jsonl" \
  | tee "$out/$stem-predict-post.txt"
PYTHONPATH=src python3 benchmarks/predict_post.py --results "$out/$stem.jsonl" --json \
  >"$out/$stem-predict-post.json"
PYTHONPATH=src python3 -m stepbench report "$out/$stem.jsonl" --prices benchmarks/prices.toml \
  --predict "RTX 5090,L40S,RTX A6000,H100 PCIe" --format markdown --out "$out/$stem-report.md"
PYTHONPATH=src python3 benchmarks/calibrate_predict.py "$out/h200-$day-microbench.json" | tee "$out/calibration-memory.toml"
