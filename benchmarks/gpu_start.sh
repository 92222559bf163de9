#!/usr/bin/env bash
# How a setup's process starts (`run --start server|fresh`), on one GPU, in two calls of under ten
# minutes each. Every command's wall (start to exit) goes to OUT/walltimes.txt; ratios are taken
# within one call (hosts differ: see benchmarks/README.md, section h).
#
#   MODE=warm OUT=dir SEED=path/to/seed_train.py bash benchmarks/gpu_start.sh
#     1. warm-up: the default matrix once with a shared inductor cache C (compiles it cold, fills
#        stepbench's peak and FLOP caches);
#     2. fresh:  the default matrix, --start fresh --repeats 1, warm from C;
#     3. server: the same with --start server;
#     4. seed:   the post's script (not in this repository) for the same four setups, warm from C
#        (skipped without SEED);
#     5. default: the default matrix with the default repeats and --start server, warm from C
#        (skipped when the call has too little time left).
#     Before them, nvml_thread_probe.py --answered (what the server's inductor import starts) goes
#     to env.txt.
#   MODE=cold OUT=dir bash benchmarks/gpu_start.sh
#     1. fresh, 2. server: the default matrix with --repeats 1, each with its own empty caches (no
#        shared inductor cache: every compiled setup compiles cold, stepbench's caches empty);
#     3. tune: a short eager tune (--start server), for its probes' walls against their steps.
#   MODE=probes OUT=dir bash benchmarks/gpu_start.sh
#     an eager tune of llama-468m, then of llama-135m, each with empty caches of its own (the
#     first probe finds no matmul peak or FLOP count cached); `probe_walls.py` prints each
#     process's wall against its first step, warm-up and timed steps.
#   MODE=modes OUT=dir SEED=path/to/seed_train.py bash benchmarks/gpu_start.sh
#     eager+sdpa alone, ROUNDS (default 4) rounds of: a --start fresh process, a --start server
#     process (the order alternates by round), the post's script; `compare_starts.py
#     --processes` prints every process's step time by start method (is the slow mode the start
#     method's?).
set -uo pipefail
out=${OUT:?set OUT to a folder}; mode=${MODE:?set MODE to warm, cold, probes or modes}
mkdir -p "$out"
export PYTHONPATH=${SRC:-$PWD/src} PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv >"$out/env.txt"
python3 -c "import sys, torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, 'python', sys.version.split()[0])" >>"$out/env.txt"
nproc >>"$out/env.txt"
[ "$mode" = warm ] && python3 benchmarks/nvml_thread_probe.py --answered 1 >>"$out/env.txt" 2>&1
quiet() { grep -v -e "TensorFloat32" -e "torch.set_float32_matmul_precision" -e "^ *warnings.warn" ; }
work=$(mktemp -d)
timed() {   # name, then the command: appends "name_wall_s N.N" to walltimes.txt
  local name=$1; shift
  local t0; t0=$(date +%s.%N)
  "$@" 2>&1 | quiet >>"$out/run.log"
  echo "${name}_wall_s $(python3 -c "print(round($(date +%s.%N) - $t0, 1))")" | tee -a "$out/walltimes.txt"
}
left() { echo $(( ${DEADLINE_S:-570} - SECONDS )); }

if [ "$mode" = warm ]; then
  seed=${SEED:-}
  export STEPBENCH_CACHE_DIR=$work/stepbench-cache
  sb() { python3 -m stepbench run --timeout 300 --compile-cache "$work/inductor" "$@"; }
  timed warmup sb --start server --repeats 1 --out "$out/warmup.jsonl"
  timed fresh sb --start fresh --repeats 1 --out "$out/warm-fresh.jsonl"
  timed server sb --start server --repeats 1 --out "$out/warm-server.jsonl"
  seed_all() {
    for attn in sdpa eager; do
      for m in eager compile; do
        TORCHINDUCTOR_CACHE_DIR=$work/inductor TRITON_CACHE_DIR=$work/inductor/triton \
          timeout 300 python3 "$seed" "$m" "$attn" >>"$out/warm-seed.jsonl"
      done
    done
  }
  [ -n "$seed" ] && timed seed seed_all
  if [ "$(left)" -gt 100 ]; then
    timed default sb --start server --out "$out/warm-default.jsonl"
  fi
elif [ "$mode" = probes ]; then
  for model in llama-468m llama-135m; do
    STEPBENCH_CACHE_DIR=$work/$model-cache timed "tune_$model" python3 -m stepbench tune \
      --model "$model" --budget "${PROBE_BUDGET:-100}s" --modes eager --attn sdpa,eager \
      --compile-cache "$work/$model-inductor" --out "$out/probes-$model.jsonl"
  done
elif [ "$mode" = modes ]; then
  export STEPBENCH_CACHE_DIR=$work/stepbench-cache
  one() { python3 -m stepbench run --timeout 300 --modes eager --attn sdpa --repeats 1 \
    --start "$1" --out "$out/modes-$1-$2.jsonl"; }   # a file per process: one file would resume
  seed_one() { timeout 300 python3 "$SEED" eager sdpa >>"$out/modes-seed.jsonl"; }
  for round in $(seq "${ROUNDS:-4}"); do
    if [ $((round % 2)) = 1 ]; then order="fresh server"; else order="server fresh"; fi
    for start in $order; do timed "${start}_$round" one "$start" "$round"; done
    [ -n "${SEED:-}" ] && timed "seed_$round" seed_one
  done
  for start in fresh server; do   # one file per start method, in round order (8 files come back)
    cat "$out"/modes-"$start"-*.jsonl >"$out/modes-$start.jsonl" && rm "$out"/modes-"$start"-*.jsonl
  done
else
  for start in fresh server; do
    STEPBENCH_CACHE_DIR=$work/$start-cache timed "cold_$start" python3 -m stepbench run \
      --timeout 300 --start "$start" --repeats 1 --out "$out/cold-$start.jsonl"
  done
  if [ "$(left)" -gt 90 ]; then
    STEPBENCH_CACHE_DIR=$work/tune-cache timed tune python3 -m stepbench tune --budget \
      "$(( $(left) - 30 ))s" --modes eager --attn sdpa,eager --compile-cache "$work/tune-inductor" \
      --out "$out/tune.jsonl"
  fi
fi
cat "$out/walltimes.txt"
rm -rf "$work"
