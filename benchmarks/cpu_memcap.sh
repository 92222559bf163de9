#!/bin/bash
# Issue 37, item 4 (benchmarks/README.md, section j3): --memory-limit-gb on a CPU near a step's
# need, with a busy loop on one of the CPUs beside it. llama-tiny, eager+sdpa, batch 8 x 256,
# 2 warm-up and 5 timed steps, 10 processes per cap and start method; then what the cap costs:
# the same setup uncapped and under a generous cap (1 GB), fresh processes alternating, quiet.
#
#   NEED_SERVER=0.173 NEED_FRESH=0.173 bash benchmarks/cpu_memcap.sh \
#       benchmarks/results/cpu-2core-2026-12-05-memcap
#
# NEED_*: the least cap (GB) under which the setup ran, per start method (a forked process reuses
# what the server freed), bisected beforehand (section j3); the caps are 8% over and under.
# PHASES: which parts to run (default "caps cost").
set -u
stem=$1
sb=${STEPBENCH:-.venv/bin/stepbench}
setup=(--device cpu --model llama-tiny --modes eager --attn sdpa --batch 8 --seq 256)
# The FLOP counter's cache starts empty, so the first process of each run counts (it did before
# the cap was lifted after the timed steps).
export STEPBENCH_CACHE_DIR=$(mktemp -d)
for phase in ${PHASES:-caps cost}; do
  if [ "$phase" = caps ]; then
    python3 -c 'while True: pass' & busy=$!
    for start in server fresh; do
      need=$NEED_SERVER; [ $start = fresh ] && need=$NEED_FRESH
      for cap in $(python3 -c "print(round($need * 1.08, 3), round($need * 0.92, 3))"); do
        rm -rf "$STEPBENCH_CACHE_DIR"/*
        "$sb" run "${setup[@]}" --warmup 2 --steps 5 --repeats 10 --start $start \
          --memory-limit-gb $cap --out "$stem-$cap-$start.jsonl" > /dev/null
        echo "cap $cap $start: exit $?"
      done
    done
    kill $busy
  fi
  if [ "$phase" = cost ]; then
    for round in 1 2 3; do   # one more repeat each round (resume runs only the new one)
      "$sb" run "${setup[@]}" --warmup 3 --steps 10 --repeats $round --start fresh \
        --out "$stem-cost-uncapped.jsonl" > /dev/null
      "$sb" run "${setup[@]}" --warmup 3 --steps 10 --repeats $round --start fresh --memory-limit-gb 1 \
        --out "$stem-cost-capped.jsonl" > /dev/null
      echo "cost round $round: exit $?"
    done
  fi
done
rm -rf "$STEPBENCH_CACHE_DIR"
