#!/usr/bin/env bash
# The tune replay's grid (issue 22): llama-135m (SmolLM2-135M's shape), seq 2048, on one GPU,
# through the process server with the default repeats, in one call (an ignored cache folder written
# in one call was gone in the next, here). Cells missing from results/h200-2026-12-01-tune-135m.jsonl first;
# the whole command stops after DEADLINE_S (default 470) and keeps what finished.
#
#   OUT=dir bash benchmarks/gpu_grid.sh        # records: OUT/grid.jsonl, log: OUT/grid.log
set -uo pipefail
out=${OUT:?set OUT to a folder}
mkdir -p "$out"
work=$(mktemp -d)
export PYTHONPATH=${SRC:-$PWD/src} PYTHONUNBUFFERED=1 STEPBENCH_CACHE_DIR=$work/stepbench OUT_FILE=$out/grid.jsonl
export COMPILE_CACHE=$work/inductor LOG=$out/grid.log MODEL=${MODEL:-llama-135m}
{ nvidia-smi --query-gpu=name,driver_version --format=csv
  python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
} >"$LOG"
sb() {
  python3 -m stepbench run --model "$MODEL" --timeout 300 --compile-cache "$COMPILE_CACHE" \
    --out "$OUT_FILE" "$@" >>"$LOG" 2>&1
  echo "$* rc $? at $SECONDS s" >>"$LOG"
}
export -f sb
timeout "${DEADLINE_S:-470}" bash -c '
  sb --modes compile --attn sdpa --batch 16,32,8
  sb --modes compile --compile-mode reduce-overhead --attn sdpa --batch 4
  sb --modes eager --attn sdpa --batch 4,8,16,32'
echo "total $SECONDS s" >>"$LOG"
rm -rf "$work"
