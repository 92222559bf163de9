#!/usr/bin/env bash
# The tune replay's grid (issue 22): llama-135m (SmolLM2-135M's shape), seq 2048, on one GPU,
# measured through the process server with the default repeats, in two calls of under ten
# minutes that share one inductor cache under CACHE (an ignored folder that stays on the device
# machine between two calls made within its idle time).
#
#   PHASE=warm OUT=dir CACHE=.gpucache bash benchmarks/gpu_grid.sh
#     1. the compiled setups' graphs compiled cold, three runs side by side (one step each; their
#        records are thrown away: only the cache is kept);
#     2. eager+sdpa at batch 4, 8, 16, 32 measured (OUT/grid-eager.jsonl).
#   PHASE=measure OUT=dir CACHE=.gpucache bash benchmarks/gpu_grid.sh
#     3. compile + {sdpa, flex_attention} at batch 4, 8, 16, 32 and reduce-overhead + sdpa at 4,
#        measured warm from the cache (OUT/grid-compiled.jsonl).
set -uo pipefail
out=${OUT:?set OUT to a folder}; phase=${PHASE:?set PHASE to warm or measure}
cache=$(realpath -m "${CACHE:?set CACHE to a folder kept between the calls}")
mkdir -p "$out" "$cache"
export PYTHONPATH=${SRC:-$PWD/src} PYTHONUNBUFFERED=1 STEPBENCH_CACHE_DIR=$cache/stepbench
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >>"$out/env.txt"
python3 -c "import sys, torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, 'python', sys.version.split()[0])" >>"$out/env.txt"
sb() { python3 -m stepbench run --model ${MODEL:-llama-135m} ${DRY:-} --timeout 400 --compile-cache "$cache/inductor" "$@"; }
timed() {   # name, then the command: appends "name_wall_s N.N" to walltimes.txt
  local name=$1; shift
  local t0; t0=$(date +%s.%N)
  "$@" >>"$out/$name.log" 2>&1
  local rc=$?
  echo "${name}_wall_s $(python3 -c "print(round($(date +%s.%N) - $t0, 1))") rc $rc" | tee -a "$out/walltimes.txt"
}
if [ "$phase" = warm ]; then
  scratch=$(mktemp -d)
  one() { sb --repeats 1 --warmup 0 --steps 1 --no-peak --modes compile --out "$scratch/$1.jsonl" "${@:2}"; }
  timed compile_sdpa one a --attn sdpa --batch 4,8,16,32 &
  timed compile_flex_small one b --attn flex_attention --batch 4,8 &
  timed compile_flex_large one c --attn flex_attention --batch 32,16 &
  wait
  timed compile_ro one d --attn sdpa --batch 4 --compile-mode reduce-overhead
  cat "$scratch"/*.jsonl >"$out/cold-compiles.jsonl"   # their first_step_s: cold compiles, three at a time
  timed eager sb --modes eager --attn sdpa --batch 4,8,16,32 --out "$out/grid-eager.jsonl"
else
  timed compiled sb --modes compile --attn sdpa,flex_attention --batch 4,8,16,32 \
    --out "$out/grid-compiled.jsonl"
  timed ro sb --modes compile --compile-mode reduce-overhead --attn sdpa --batch 4 \
    --out "$out/grid-compiled.jsonl"
fi
cat "$out/walltimes.txt"
