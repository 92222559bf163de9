#!/usr/bin/env bash
# Issue 35's GPU goals on one H200, as one job that outlives a ten-minute call: started under
# setsid by one call, collected by the next on the same warm machine (so every number is from
# one host and one lease). In order, each step's files kept in JOB as it ends:
#   1. `stepbench tune --budget 7m` on ResNet-50 (examples/resnet.py:make), then its winner
#      measured again beside a grid of eager and compiled setups at batch 64/128/256, two
#      processes each, warm from the tune's cache (benchmarks/gpu_tune_check.sh, tune_check.py);
#   2. the default matrix (`stepbench run`, no axis flag but --batch) on each example, a user's
#      first command: examples/resnet.py:make --batch 128 and examples/gpt.py:make --batch 8;
#   3. the HF path against the post's script: stepbench's default matrix on llama-468m, then the
#      post's script for the same four setups (benchmarks/gpu_matrix_vs_seed.sh).
#
#   JOB=/root/job SEED=.anchors/seed_train.py setsid bash benchmarks/gpu_chain_workloads_hf.sh &
# JOB/done appears when everything has ended; JOB/steps.txt has each step's exit and seconds.
set -uo pipefail
job=${JOB:?set JOB to a folder}; seed=${SEED:?set SEED to the post script}
mkdir -p "$job"
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
step() { local name=$1; shift; local t=$SECONDS; "$@"; echo "$name exit $? $((SECONDS - t)) s" >>"$job/steps.txt"; }
git_head=$(git rev-parse HEAD 2>/dev/null || echo unknown)
echo "commit (device copy's HEAD, may lag the working tree) $git_head" >"$job/steps.txt"
step tune env OUT="$job/resnet-tune" MODEL=examples/resnet.py:make DEADLINE_S=720 \
  REFS=eager:sdpa:64,eager:sdpa:128,eager:sdpa:256,compile:sdpa:64,compile:sdpa:128,compile:sdpa:256 \
  bash benchmarks/gpu_tune_check.sh
mkdir -p "$job/defaults"
step default-resnet timeout 300 python3 -m stepbench run --model examples/resnet.py:make --batch 128 \
  --out "$job/defaults/resnet.jsonl" >"$job/defaults/resnet.txt" 2>"$job/defaults/resnet.log"
step default-gpt timeout 300 python3 -m stepbench run --model examples/gpt.py:make --batch 8 \
  --out "$job/defaults/gpt.jsonl" >"$job/defaults/gpt.txt" 2>"$job/defaults/gpt.log"
step hf-vs-seed env OUT="$job/hf" SEED="$seed" bash benchmarks/gpu_matrix_vs_seed.sh
touch "$job/done"
