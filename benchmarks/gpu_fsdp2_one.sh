#!/usr/bin/env bash
# Issue 26 on one GPU (nvidia-h200), in one device call of at most 10 minutes: does FSDP2 at world
# size 1 reproduce the slowdown two GPUs showed, and which wrapping choice matters?
#
#   OUT=$OUT bash benchmarks/gpu_fsdp2_one.sh
#
# The post's model (llama-468m, 4 x 2048, bf16, SDPA), one process per setup (--repeats 1), one
# inductor cache for the call (--compile-cache: FSDP2's layers compile to the graphs the per-layer
# plain setup compiled), into one results file, in this order (each group only while the
# deadline leaves room for it):
#   1. plain (no wrapper): eager, compiled whole, compiled per layer; --profile
#   2. fsdp2 --nproc 1 (torchrun, one process) with today's wrapping, for each of $UNITS (layers
#      per unit, default 1) and $OPTIMIZERS (default local,dtensor: AdamW over the local shards and
#      over the DTensors): eager and compiled (per layer); --profile
#   3. the wrapping variants, compiled, one at a time: --fsdp-reshard off, --fsdp-prefetch on,
#      --precision mixed-bf16, --optimizer foreach
#   4. the same variants eager, if time is left (VARIANTS=0 skips 3 and 4)
# Every process of groups 1 and 2 profiles one more step after its timed ones (run --profile):
# trace (.json.gz) and key_averages table (.txt, top 40 by device time).
# $OUT gets (at most 8 files): fsdp2-one.jsonl (the records), table.txt (benchmarks/fsdp2_table.py),
# report.md (stepbench report), env.txt, and fsdp2-one.tar.gz (all of that, the logs, the traces
# and tables).
# On a CPU, to check the script: MODEL=llama-tiny DEVICE=cpu SEQ=64 STEPS=3 MODES=eager OUT=...
set -uo pipefail
out=${OUT:?set OUT to a folder}
model=${MODEL:-llama-468m}; device=${DEVICE:-cuda}; seq=${SEQ:-2048}; batch=${BATCH:-4}
steps=${STEPS:-20}; modes=${MODES:-eager,compile}; deadline=${DEADLINE_S:-540}
units=${UNITS:-1}; optimizers=${OPTIMIZERS:-local,dtensor}
work=$(mktemp -d /tmp/fsdp2-one.XXXXXX)
mkdir -p "$out" "$work/logs"
trap 'rm -rf "$work"' EXIT      # what matters is copied to $OUT first
results=$work/fsdp2-one.jsonl
source "$(dirname "$0")/fsdp2_lib.sh"   # quiet, sb, room
{
  nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv 2>/dev/null || echo "no GPU"
  python3 -c "import sys, torch, transformers; print(sys.version.split()[0], torch.__version__, transformers.__version__)"
  echo "model $model device $device batch $batch seq $seq steps $steps modes $modes units $units optimizers $optimizers"
} >"$work/env.txt" 2>&1
has_compile=0; [[ ,$modes, == *,compile,* ]] && has_compile=1
scopes=model; (( has_compile )) && scopes=model,layer

sb plain --modes "$modes" --compile-scope "$scopes" --profile "$work/profiles"
room 90 "fsdp2 x1" && sb fsdp2-x1 --modes "$modes" --parallel fsdp2 --nproc 1 \
  --fsdp-unit "$units" --fsdp-optimizer "$optimizers" --profile "$work/profiles"
variant_modes=compile; (( has_compile )) || variant_modes=eager
[[ ${VARIANTS:-1} == 0 ]] && variant_modes=none
for pass in "$variant_modes" eager; do
  [[ $pass == none ]] && break
  for variant in "--fsdp-reshard off" "--fsdp-prefetch on" "--precision mixed-bf16" "--optimizer foreach"; do
    room 70 "$pass $variant" || break 2
    # shellcheck disable=SC2086
    sb "fsdp2-x1-$pass-$(echo $variant | tr -d ' -')" --modes "$pass" --parallel fsdp2 --nproc 1 $variant
  done
  [[ $pass == eager ]] && break
done

PYTHONPATH=src python3 benchmarks/fsdp2_table.py "$results" >"$work/table.txt" 2>&1
PYTHONPATH=src python3 -m stepbench report "$results" --format markdown >"$work/report.md" 2>>"$work/logs/report.log"
echo "wall ${SECONDS} s" >>"$work/env.txt"
cp "$work/table.txt" "$work/report.md" "$work/env.txt" "$out/"; cp "$results" "$out/" 2>/dev/null || echo "no results file" >>"$out/env.txt"
tar -czf "$out/fsdp2-one.tar.gz" -C "$work" --exclude inductor .
ls -la "$out" >>"$out/env.txt"
cat "$out/table.txt"
tail -n 20 "$out/env.txt"
