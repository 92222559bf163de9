#!/usr/bin/env bash
# Issue 26 on two GPUs of one host (nvidia-h200-x2), in one device call of at most 10 minutes:
# DDP, FSDP2 with today's wrapping and with the chosen variants, and torchtitan's FSDP2 recipe,
# eager and compiled, against one-GPU baselines measured in the same call.
#
#   OUT=$OUT bash benchmarks/gpu_fsdp2_x2.sh
#
# The post's model (llama-468m, 4 x 2048 per GPU, SDPA), one process per setup (--repeats 1),
# one inductor cache for the call, one results file, in this order (each group only while the
# deadline leaves room for it):
#   1. the one-GPU baselines: eager and compiled whole, bf16, one per GPU at once (--gpus all)
#   2. --parallel ddp,fsdp2 --nproc 2 with today's wrapping (each record's scaling.efficiency is
#      taken against group 1's record of the same mode, as stepbench's runner does)
#   3. FSDP2 variants: VARIANTS, a ';'-separated list of flag sets (default: "--fsdp-unit 4;
#      --fsdp-unit 24;--fsdp-unit 4 --fsdp-optimizer local", from gpu_fsdp2_one.sh's tables of
#      2026-12-02, benchmarks/README.md section e)
#   4. torchtitan's recipe (benchmarks/torchtitan_fsdp2.py), TT_PRECISIONS (default mixed-bf16,
#      torchtitan's default training), eager and compiled. torchtitan itself is used where it
#      imports: carry its wheels in .whl (see benchmarks/README.md, section e); else the script
#      makes the same calls and says so (table.txt's wrapping column, the line's recipe.source).
# $OUT gets: fsdp2-x$NPROC.jsonl (stepbench's records), torchtitan.jsonl, table.txt
# (benchmarks/fsdp2_table.py), report.md, env.txt, fsdp2-x$NPROC.tar.gz (all of it and the logs).
# NPROC=1 (nvidia-h200): the same at world size 1 (group 2 without DDP), where torchtitan's recipe
# and stepbench's wrapping meet without the link, e.g. VARIANTS="--precision mixed-bf16"
# TT_PRECISIONS="mixed-bf16 bf16": both wrappings at both precisions.
# On a CPU, to check the script: MODEL=llama-tiny DEVICE=cpu SEQ=64 STEPS=3 MODES=eager OUT=...
set -uo pipefail
out=${OUT:?set OUT to a folder}
model=${MODEL:-llama-468m}; device=${DEVICE:-cuda}; seq=${SEQ:-2048}; batch=${BATCH:-4}
steps=${STEPS:-20}; modes=${MODES:-eager,compile}; deadline=${DEADLINE_S:-540}
variants=${VARIANTS:---fsdp-unit 4;--fsdp-unit 24;--fsdp-unit 4 --fsdp-optimizer local}
tt_precisions=${TT_PRECISIONS:-mixed-bf16}; nproc=${NPROC:-2}; name=fsdp2-x$nproc
work=$(mktemp -d /tmp/$name.XXXXXX)
mkdir -p "$out" "$work/logs"
trap 'rm -rf "$work"' EXIT      # what matters is copied to $OUT first
results=$work/$name.jsonl; titan=$work/torchtitan.jsonl
source "$(dirname "$0")/fsdp2_lib.sh"   # quiet, sb, room
{
  nvidia-smi topo -m 2>/dev/null || echo "no GPU"
  nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv 2>/dev/null
  env | grep -E '^(NCCL_|TORCH_SYMM|NVSHMEM_|CUDA_VISIBLE)' | sort
  python3 -c "import sys, torch, transformers; print(sys.version.split()[0], torch.__version__, transformers.__version__)"
  echo "model $model device $device batch $batch seq $seq steps $steps modes $modes processes $nproc"
  echo "variants: $variants; torchtitan precisions: $tt_precisions"
} >"$work/env.txt" 2>&1
tt_path=src
if ls .whl/torchtitan-*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$work/tt-site" .whl/*.whl \
    >>"$work/logs/torchtitan-install.log" 2>&1 && tt_path=src:$work/tt-site
fi
echo "torchtitan's path: $tt_path" >>"$work/env.txt"

pool=(); [[ $device == cuda ]] && pool=(--gpus all)
sb one-gpu --modes "$modes" "${pool[@]}"
parallels=ddp,fsdp2; (( nproc == 1 )) && parallels=fsdp2   # DDP of one process is no wrapping
room 150 "$parallels" && sb "x$nproc" --modes "$modes" --parallel "$parallels" --nproc "$nproc"
IFS=';' read -ra sets <<<"$variants"
for flags in "${sets[@]}"; do
  room 110 "variant $flags" || break
  # shellcheck disable=SC2086
  sb "x$nproc-$(echo $flags | tr -d ' -')" --modes "$modes" --parallel fsdp2 --nproc "$nproc" $flags
done
for precision in $tt_precisions; do
  for mode in ${modes//,/ }; do
    room 80 "torchtitan $precision $mode" || break 2
    PYTHONPATH=$tt_path timeout 300 python3 -m torch.distributed.run --standalone --nproc-per-node "$nproc" \
      benchmarks/torchtitan_fsdp2.py --device "$device" --model "$model" --seq "$seq" --batch "$batch" \
      --steps "$steps" --modes "$mode" --precision "$precision" --out "$titan" --baseline "$results" \
      2>&1 | quiet >>"$work/logs/torchtitan-$precision-$mode.log"
    echo "torchtitan $precision $mode: exit ${PIPESTATUS[0]} at ${SECONDS} s" >>"$work/env.txt"
  done
done

PYTHONPATH=src python3 benchmarks/fsdp2_table.py "$results" "$titan" >"$work/table.txt" 2>&1
PYTHONPATH=src python3 -m stepbench report "$results" --format markdown >"$work/report.md" 2>>"$work/logs/report.log"
grep -h "torchtitan recipe" "$work"/logs/torchtitan-*.log >>"$work/env.txt" 2>/dev/null
echo "wall ${SECONDS} s" >>"$work/env.txt"
cp "$work/table.txt" "$work/report.md" "$work/env.txt" "$out/"
cp "$results" "$titan" "$out/" 2>/dev/null || echo "a results file is missing" >>"$out/env.txt"
tar -czf "$out/$name.tar.gz" -C "$work" --exclude inductor --exclude tt-site .
cat "$out/table.txt"
tail -n 25 "$out/env.txt"
