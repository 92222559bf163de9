#!/usr/bin/env bash
# On one GPU, in one call (about 9 minutes): what a four-setup matrix costs beyond its training
# steps, with this stepbench and with the one before the overhead work (issue 8), against the
# post's own script.
#
#   OUT=results-dir SEED=path/to/seed_train.py [BEFORE=path/to/old/src] bash benchmarks/gpu_overhead.sh
#
# 1. cold:  `stepbench run --compile-cache C` with C and stepbench's own caches (matmul peak,
#           FLOP counts) empty: every compiled setup compiles cold, as on a first run.
# 2. warm:  the same command again with --rerun: C, the peak and the FLOP counts are warm, as when
#           a user iterates on a study. Target: 75 s.
# 3. seed:  the post's script (seed_train.py, not in this repository) for the same four setups
#           back to back, sharing one fresh inductor/Triton cache as the four processes of 1 do.
#           Target: 1 no slower than 3.
# 4. before: the stepbench before issue 8 (BEFORE=its src folder), warm from C like 2.
# Every record holds its process's phases (record.phases); benchmarks/phases.py tabulates them.
# Writes OUT/{cold,warm,before}.jsonl, OUT/seed.jsonl, OUT/walltimes.txt, OUT/env.txt, OUT/run.log.
set -uo pipefail
out=${OUT:?set OUT to a folder}; seed=${SEED:?set SEED to the post script}
mkdir -p "$out"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv >"$out/env.txt"
python3 -c "import sys, torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, 'python', sys.version.split()[0])" >>"$out/env.txt"
nproc >>"$out/env.txt"
quiet() { grep -v -e "TensorFloat32" -e "torch.set_float32_matmul_precision" -e "^ *warnings.warn" ; }
work=$(mktemp -d)
export STEPBENCH_CACHE_DIR=$work/stepbench-cache
timed() {   # name, then the command: appends "name_wall_s N.N" to walltimes.txt
  local name=$1; shift
  local t0; t0=$(date +%s.%N)
  "$@" 2>&1 | quiet >>"$out/run.log"
  echo "${name}_wall_s $(python3 -c "print(round($(date +%s.%N) - $t0, 1))")" | tee -a "$out/walltimes.txt"
}
sb() { PYTHONPATH=${SRC:-src} python3 -m stepbench run --timeout 400 --compile-cache "$work/inductor" "$@"; }

timed cold sb --out "$out/cold.jsonl"
timed warm sb --out "$out/warm.jsonl" --rerun

seed_all() {
  for attn in sdpa eager; do
    for mode in eager compile; do
      TORCHINDUCTOR_CACHE_DIR=$work/seed-cache/inductor TRITON_CACHE_DIR=$work/seed-cache/triton \
        timeout 400 python3 "$seed" "$mode" "$attn" >>"$out/seed.jsonl"
    done
  done
}
timed seed seed_all

# The old stepbench needs about 140 s; skipped when less is left of a 10-minute call.
if [ -n "${BEFORE:-}" ] && [ "$SECONDS" -lt "${BEFORE_IF_UNDER_S:-430}" ]; then
  SRC=$BEFORE timed before sb --out "$out/before.jsonl" --rerun
fi
cat "$out/walltimes.txt"
python3 benchmarks/phases.py "$out/cold.jsonl" "$out/warm.jsonl" || true
rm -rf "$work"
