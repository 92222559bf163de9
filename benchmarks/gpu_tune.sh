#!/usr/bin/env bash
# Issue 10's GPU check of `stepbench tune`: the post's model (llama-468m, seq 2048) with a budget
# of 20 minutes, and a small model (llama-135m, SmolLM2-135M's shape, seq 2048) with 8 minutes.
# WHICH: 468m, 135m, or both (two GPUs: one tune on each at once).
# A device call lasts at most 10 minutes: each tune gets SIGINT (as Ctrl-C) at $STOP_S seconds
# and keeps what it measured; the same command resumes it in a later call: copy the committed
# results files to OUT first (their names below).
#     PYTHONPATH=src bash benchmarks/gpu_tune.sh OUT [STOP_S] [WHICH]
# BUDGET_468M and BUDGET_135M (default 20m and 8m) change the budgets: a resumed tune counts its
# stored records' time, so a larger budget on resume buys the search only the difference.
# liger-kernel and torchao travel as wheels (.whl, see the device README), so that the search
# has the fused kernels and float8 to try.
set -u
out=${1:?OUT folder}; stop=${2:-540}; which=${3:-both}
b468=${BUDGET_468M:-20m}; b135=${BUDGET_135M:-8m}
mkdir -p "$out"
nvidia-smi -L > "$out/gpus.txt"
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" >> "$out/gpus.txt"
tune() {   # GPU MODEL BUDGET NAME
  local start=$SECONDS
  CUDA_VISIBLE_DEVICES=$1 timeout -s INT "$stop" python3 -m stepbench tune --model "$2" \
    --budget "$3" --out "$out/$4.jsonl" --format json > "$out/$4.json" 2> "$out/$4.log"
  echo "$4: exit $? after $((SECONDS - start)) s" >> "$out/gpus.txt"
}
case $which in
  both) tune 0 llama-468m "$b468" tune-468m & tune 1 llama-135m "$b135" tune-135m & wait ;;
  468m) tune 0 llama-468m "$b468" tune-468m ;;
  135m) tune 0 llama-135m "$b135" tune-135m ;;
esac
for name in tune-468m tune-135m; do
  [ -f "$out/$name.jsonl" ] || continue
  python3 -m stepbench report "$out/$name.jsonl" --format markdown > "$out/$name-report.md" 2>&1
done
cat "$out/gpus.txt"
