#!/usr/bin/env bash
# Issue 37's wander study: eager+sdpa (llama-468m, 4 x 2048, bf16) in many processes, three ways
# interleaved round by round in one call, so every way sees the same host over the same minutes:
#   server:   stepbench as it is (the process server forks each measured process)
#   nvml-off: the same with STEPBENCH_NVML=0 (no NVML calls in or around the measured process)
#   script:   the post's own script (seed_train.py, not part of this repository), one fresh
#             process per measurement
# Pinning is not a way here: the H200 guest has 16 vCPUs in one NUMA node and GPU0's CPU affinity
# is 0-15 (FIELD-NOTES.md), so pinning to the GPU's NUMA-local cores is the same as not pinning.
#
#   OUT=dir SEED=path/to/seed_train.py ROUNDS=3 PER=2 bash benchmarks/gpu_wander.sh
#
# Writes OUT/wander-server.jsonl, OUT/wander-nvml-off.jsonl (stepbench records, one per process),
# OUT/wander-script.jsonl (the script's lines, with the round added) and OUT/wander.log.
# benchmarks/wander_table.py turns them into the distributions' table.
set -uo pipefail
out=${OUT:?set OUT to a folder}; seed=${SEED:?set SEED to the post script}
rounds=${ROUNDS:-3}; per=${PER:-2}; tag=${TAG:-a}
mkdir -p "$out"
sb() { PYTHONPATH=src python3 -m stepbench run --model llama-468m --modes eager --attn sdpa \
         --repeats "$per" --rerun --timeout 300 "$@" >>"$out/wander.log" 2>&1; }
for r in $(seq 1 "$rounds"); do
  echo "round $tag$r $(date -u +%T)" >>"$out/wander.log"
  sb --out "$out/wander-server.jsonl"
  STEPBENCH_NVML=0 sb --out "$out/wander-nvml-off.jsonl"
  for i in $(seq 1 "$per"); do
    timeout 300 python3 "$seed" eager sdpa 2>>"$out/wander.log" \
      | sed "s/^{/{\"round\": \"$tag$r\", /" >>"$out/wander-script.jsonl"
  done
done
echo "done $(date -u +%T)" >>"$out/wander.log"
