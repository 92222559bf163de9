#!/usr/bin/env bash
# Issue 35's ResNet-50 goals on one H200, as one job that outlives a ten-minute call: started
# under setsid by one call, collected by the next on the same warm machine (one host, one lease).
#   1. `stepbench tune --budget 7m` on ResNet-50 (examples/resnet.py:make), then its winner
#      measured again beside a grid of eager and compiled setups (two processes each, warm from
#      the tune's cache; benchmarks/gpu_tune_check.sh, tune_check.py), until DEADLINE_S;
#   2. the default matrix on ResNet-50 (`stepbench run --model examples/resnet.py:make --batch
#      128`, no other flag), a user's first command.
#
#   JOB=/root/job setsid bash benchmarks/gpu_chain_resnet_tune.sh &
# JOB/done appears when everything has ended; JOB/steps.txt has each step's exit and seconds.
set -uo pipefail
job=${JOB:?set JOB to a folder}
mkdir -p "$job"
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
step() { local name=$1; shift; local t=$SECONDS; "$@"; echo "$name exit $? $((SECONDS - t)) s" >>"$job/steps.txt"; }
step tune env OUT="$job/resnet-tune" MODEL=examples/resnet.py:make DEADLINE_S="${DEADLINE_S:-660}" \
  REFS="${REFS:-compile:sdpa:256,compile:sdpa:128,eager:sdpa:256,compile:sdpa:64}" \
  bash benchmarks/gpu_tune_check.sh
mkdir -p "$job/default"
step default-resnet timeout "${DEFAULT_S:-200}" python3 -m stepbench run --model examples/resnet.py:make \
  --batch 128 --out "$job/default/resnet.jsonl" >"$job/default/resnet.txt" 2>"$job/default/resnet.log"
touch "$job/done"
