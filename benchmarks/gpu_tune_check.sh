#!/usr/bin/env bash
# Issue 22's goal on one GPU, in one call of at most ten minutes: `stepbench tune --budget 7m`,
# then its winner measured again interleaved with the grid's known best setups, warm from the
# tune's inductor cache (benchmarks/tune_check.py), until DEADLINE_S (default 585) seconds.
#
#   OUT=dir MODEL=llama-135m REFS=compile:flex_attention:16,compile:sdpa:16,compile:flex_attention:32,compile:sdpa:32 \
#       bash benchmarks/gpu_tune_check.sh
# Files: OUT/env.txt, tune.json (the tune's JSON), tune.jsonl, tune.log, check.jsonl, check.md.
set -uo pipefail
out=${OUT:?set OUT to a folder}; model=${MODEL:?set MODEL}; refs=${REFS:?set REFS}
mkdir -p "$out"
work=$(mktemp -d)
export PYTHONPATH=${SRC:-$PWD/src} PYTHONUNBUFFERED=1 STEPBENCH_CACHE_DIR=$work/stepbench
{ nvidia-smi --query-gpu=name,driver_version --format=csv
  python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
  nproc; } >"$out/env.txt"
t0=$SECONDS
timeout -s INT "${TUNE_STOP_S:-470}" python3 -m stepbench tune --model "$model" --budget "${BUDGET:-7m}" \
  --compile-cache "$work/inductor" --out "$out/tune.jsonl" --format json >"$out/tune.json" 2>"$out/tune.log"
echo "tune: exit $? after $((SECONDS - t0)) s" >>"$out/env.txt"
t1=$SECONDS
left=$(( ${DEADLINE_S:-585} - SECONDS ))
timeout -s INT "$left" python3 benchmarks/tune_check.py --tune "$out/tune.json" --refs "$refs" \
  --compile-cache "$work/inductor" --out "$out/check.jsonl" >"$out/check.md" 2>>"$out/tune.log"
echo "check: exit $? after $((SECONDS - t1)) s (total $SECONDS s)" >>"$out/env.txt"
cat "$out/env.txt" "$out/check.md"
rm -rf "$work"
