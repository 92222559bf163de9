#!/usr/bin/env bash
# `stepbench run --max-batch` for the post's four setups on one GPU (issue 10): llama-468m at
# sequence 2048, eager and torch.compile x sdpa and eager attention, each searched from batch 4.
#
#   OUT=results-dir [SETUPS="eager:sdpa compile:sdpa eager:eager compile:eager"] \
#     [DEADLINE_S=560] [CACHE=/tmp/stepbench-max-batch-inductor] bash benchmarks/gpu_max_batch.sh
#
# (MODEL, SEQ and EXTRA, flags added to every run, let it try out elsewhere: MODEL=llama-tiny
# SEQ=128 EXTRA="--device cpu --memory-limit-gb 1.07 --warmup 2 --steps 2" on a CPU.)
#
# 1. baseline: the plain eager setups at batch 4 (4 warm-up + 20 timed steps) of the attentions
#    in SETUPS, so that the report can compare the compiled setup's largest batch with the
#    post's eager batch 4 (NO_BASELINE=1 skips it).
# 2. one `stepbench run --max-batch` per setup of SETUPS, in that order: probes of 1 warm-up + 2
#    timed steps, each its own process, the compiled ones sharing one inductor cache (CACHE,
#    --compile-cache: every new batch still compiles its own graph, but kernels already built
#    are reused); then the full measurement at the batch found, 4 warm-up + 20 timed steps.
# Everything goes into OUT/max-batch.jsonl. Each command is stopped (SIGTERM: the running setup
# is ended, finished ones are kept) when DEADLINE_S seconds of the script have passed, so one
# device call never runs past its limit; run the script again with the same OUT (and SETUPS
# less what finished) and every search resumes from its stored probes, running only what is
# missing. On an H200 (results/h200-2026-12-01-max-batch.*, benchmarks/README.md section g) the
# four searches took 6-8 probes each, 14-19 s a probe eager and 59-84 s compiled (a shared cache
# still compiles each new batch's graph): eager:sdpa to 36, compile:sdpa to 48, eager:eager to
# 10, compile:eager to 15; about 25 minutes in all with the full measurements, over four calls.
# Writes OUT/max-batch.jsonl, OUT/report.md, OUT/run.log, OUT/env.txt.
set -uo pipefail
out=${OUT:?set OUT to a folder}
setups=${SETUPS:-eager:sdpa compile:sdpa eager:eager compile:eager}
deadline=${DEADLINE_S:-560}
cache=${CACHE:-/tmp/stepbench-max-batch-inductor}
mkdir -p "$out"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >"$out/env.txt"
python3 -c "import sys, torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, 'python', sys.version.split()[0])" >>"$out/env.txt"
quiet() { grep -v -e "TensorFloat32" -e "torch.set_float32_matmul_precision" -e "^ *warnings.warn" ; }
left() { echo $((deadline - SECONDS)); }
sb() {   # stepbench run into the one results file, stopped at the deadline
  if [ "$(left)" -le 20 ]; then echo "deadline reached, skipped: $*" | tee -a "$out/run.log"; return; fi
  timeout -s TERM "$(left)" env PYTHONPATH=${SRC:-src} python3 -m stepbench run \
    --model "${MODEL:-llama-468m}" --seq "${SEQ:-2048}" --timeout 400 ${EXTRA:-} \
    --out "$out/max-batch.jsonl" "$@" 2>&1 \
    | quiet >>"$out/run.log"
}

if [ -z "${NO_BASELINE:-}" ]; then
  attns=$(for setup in $setups; do echo "${setup##*:}"; done | awk '!seen[$0]++' | paste -sd,)
  sb --modes eager --attn "$attns" --batch 4
fi
for setup in $setups; do
  mode=${setup%%:*}; attn=${setup##*:}
  sb --max-batch --modes "$mode" --attn "$attn" --batch 4 --compile-cache "$cache"
done
grep "^stepbench: max-batch" "$out/run.log" | grep -v "from batch" || true
PYTHONPATH=${SRC:-src} python3 -m stepbench report "$out/max-batch.jsonl" --format markdown \
  >"$out/report.md" 2>>"$out/run.log" || true
