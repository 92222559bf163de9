#!/usr/bin/env bash
# One H200 lease, one setsid job collected over two or three calls (one host, one lease), in the
# order of the issues' priority; a step starts only while DEADLINE_S (default 1400) seconds have
# not passed and its own least time is left:
#   1. the default `stepbench run` (the post's model and four setups, two processes each) with
#      --profile (GEMM shapes for predict, the host lead against the GPU's busy share) and one
#      inductor cache                                                    (issues 35, 36, 37)
#   2. the post's script, the same four setups, one fresh process each, on that cache (the
#      step times do not depend on it; the script's first steps then do)  (issues 35, 37)
#   3. a factory's process overhead against the HF path (gpu_factory_overhead.sh overhead, eager)
#      and examples/gpt.py at --nproc 1 --parallel none,ddp,fsdp2 (... gpt)            (issue 35)
#   4. compiled ResNet-50 against a plain script, pairs round by round (gpu_workloads.py) (35)
#   5. the H200 microbenchmark for predict's L2 constants (gpu_microbench.py)   (issue 36)
#   6. the eager+sdpa wander rounds (gpu_wander.py, WAYS server,script by default: NVML off moved
#      nothing in section l) in all that is left                           (issue 37)
#
#   JOB=/root/job SEED=.anchors/seed_train.py setsid bash benchmarks/gpu_chain_hf_user_wander.sh &
# STEPS (names, in order: hf seed overhead gpt resnet microbench wander by default) runs fewer
# or in another order. JOB/done appears when everything has ended; JOB/steps.txt has each step's exit and seconds.
set -uo pipefail
job=${JOB:?set JOB to a folder}; seed=${SEED:?set SEED to the post script}
deadline=${DEADLINE_S:-1400}
mkdir -p "$job"
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
cache=$job/cache/inductor
quiet() { grep -v -e "TensorFloat32" -e "torch.set_float32_matmul_precision" -e "^ *warnings.warn" ; }
left() { echo $((deadline - SECONDS)); }
step() {   # NAME LEAST_S COMMAND...: run COMMAND if LEAST_S seconds are left, log exit and time
  local name=$1 least=$2; shift 2
  if [ "$(left)" -lt "$least" ]; then echo "$name skipped: $(left) s left, needs $least" >>"$job/steps.txt"; return; fi
  local t=$SECONDS; "$@"; echo "$name exit $? $((SECONDS - t)) s (at ${SECONDS} s)" >>"$job/steps.txt"
}
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
  python3 -c "import sys, torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, 'python', sys.version.split()[0])"
  echo "cpus $(nproc)"; } >"$job/env.txt"

hf() {
  mkdir -p "$job/hf"
  timeout "$(left)" python3 -m stepbench run --compile-cache "$cache" --profile "$job/hf/traces" \
    --timeout 400 --out "$job/hf/stepbench.jsonl" 2>&1 | quiet >"$job/hf/stepbench.log"
}
seed() {
  for attn in sdpa eager; do
    for mode in eager compile; do
      local s0=$SECONDS
      TORCHINDUCTOR_CACHE_DIR=$cache TRITON_CACHE_DIR=$cache/triton timeout 300 \
        python3 "$seed" "$mode" "$attn" >>"$job/hf/seed.jsonl" 2>>"$job/hf/seed.log"
      echo "seed_${mode}_${attn}_wall_s $((SECONDS - s0))" >>"$job/hf/walltimes.txt"
    done
  done
}
run_step() {   # one step by name (STEPS chooses which and in what order)
  case $1 in
    hf) step hf 300 hf ;;
    seed) step seed 150 seed ;;
    overhead) step overhead 100 env OUT="$job/user" OVERHEAD_S=130 COMPILE_UNTIL_S=-1 \
      bash benchmarks/gpu_factory_overhead.sh overhead ;;
    gpt) step gpt-nproc 100 env OUT="$job/user" GPT_MODES=eager GPT_S="${GPT_S:-130}" \
      bash benchmarks/gpu_factory_overhead.sh gpt ;;
    resnet) step resnet-fidelity 120 timeout "$(left)" python3 benchmarks/gpu_workloads.py \
      --out "$job/resnet" --setups resnet:compile --rounds 3 --budget-s "${RESNET_S:-120}" ;;
    microbench) step microbench 60 timeout 100 python3 benchmarks/gpu_microbench.py \
      --out "$job/microbench.json" ;;
    wander) step wander 90 env OUT="$job/wander" SEED="$seed" WAYS="${WAYS:-server,script}" \
      BUDGET_S=$(( $(left) - 40 )) python3 benchmarks/gpu_wander.py ;;
    *) echo "unknown step $1" >>"$job/steps.txt" ;;
  esac
}
for name in ${STEPS:-hf seed overhead gpt resnet microbench wander}; do run_step "$name"; done
touch "$job/done"
