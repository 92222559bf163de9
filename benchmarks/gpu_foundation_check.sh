#!/usr/bin/env bash
# On one GPU: what the foundation change (setup identity, typed record, executor seam) must keep
# and show, in one device call (about 5 minutes).
#
#   OUT=results-dir SEED=path/to/seed_train.py bash benchmarks/gpu_foundation_check.sh
#
# 1. eager+sdpa, the setup whose step time moves most between identical processes: 3 stepbench
#    processes and 3 of the post's script (seed_train.py, not in this repository), so that the
#    two are compared by their medians (benchmarks/compare_seed.py).
# 2. Grouped-query-attention models from benchmarks/configs (SmolLM2-135M and Qwen2.5-0.5B
#    shapes), eager and compiled SDPA: FlopCounterMode's cross-check must be recorded.
# 3. --memory-limit-gb 20 on eager attention (56 GB at batch 4 x 2048): a real CUDA OOM row.
# The default matrix against the post's script runs separately (gpu_matrix_vs_seed.sh).
set -uo pipefail
out=${OUT:?set OUT to a folder}; seed=${SEED:?set SEED to the post script}
mkdir -p "$out"
quiet() { grep -v -e "TensorFloat32" -e "torch.set_float32_matmul_precision" -e "^ *warnings.warn" ; }
sb() { PYTHONPATH=src python3 -m stepbench run --timeout 400 "$@" 2>&1 | quiet >>"$out/check.log"; }

sb --modes eager --attn sdpa --repeats 3 --out "$out/sdpa-repeats.jsonl"
for i in 1 2 3; do timeout 400 python3 "$seed" eager sdpa >>"$out/seed-sdpa.jsonl" 2>>"$out/check.log"; done
for config in smollm2-135m qwen2.5-0.5b; do
  sb --model "benchmarks/configs/$config.json" --attn sdpa --warmup 2 --steps 10 --out "$out/gqa.jsonl"
done
sb --modes eager --attn eager --memory-limit-gb 20 --warmup 1 --steps 3 --out "$out/memory-limit.jsonl"
tail -n 40 "$out/check.log"
