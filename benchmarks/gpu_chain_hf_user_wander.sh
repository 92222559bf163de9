#!/usr/bin/env bash
# One H200 lease, one setsid job collected over three calls (one host, one lease); a step starts
# only while DEADLINE_S (default 1420: calls of ~560, ~570 and ~290 s) seconds have not
# passed and its own least time is left. The steps, by name (STEPS chooses which and in what
# order; the default is the 2026-12-05 plan, benchmarks/README.md section m3):
#   microbench  the graph-timed microbenchmark for predict's L2 constants (gpu_microbench.py)  (36)
#   wander      the eager+sdpa wander rounds (gpu_wander.py, WAYS server,script), WANDER_S
#               (default 740: 20 rounds of ~36 s) or what is left; every PROFILE_EVERY-th (10th) round profiled (37)
#   gpt         examples/gpt.py at --nproc 1 --parallel none,ddp,fsdp2, eager (gpu_factory_overhead.sh gpt)
#   tune        a short `stepbench tune` of the default model, budgets TUNE_BUDGETS ("2m 3m")
#               in turn on one results file (a resumed tune spends only the difference) until a
#               host-bound setup's launch-cutting candidates were all measured (its JSON's
#               host_bound): the host-bound rule shown, at the smaller budget that shows it
#   hf          the default `stepbench run` (the post's model, four setups, two processes each),
#               one inductor cache (HF_ARGS: more flags, e.g. --profile DIR)   (issues 35, 37)
#   seed        the post's script (SEED), the same four setups, one fresh process each  (35, 37)
#   overhead    a factory's process overhead against the HF path (gpu_factory_overhead.sh)  (35)
#   resnet      compiled ResNet-50 against a plain script (gpu_workloads.py)             (35)
#
#   JOB=/root/job SEED=.anchors/seed_train.py setsid bash benchmarks/gpu_chain_hf_user_wander.sh &
#
# REHEARSE=1 runs the same steps, the same commands and the same files on this machine's CPU at
# tiny sizes (llama-tiny, short budgets, few steps) so that a bug in the chain shows here rather
# than in a lease; SEED defaults to benchmarks/seed_standin.py then (a stand-in with the post's
# script's command line and JSON line), and what needs CUDA says "skipped: needs CUDA".
# JOB/done appears when everything has ended; JOB/steps.txt has each step's exit and seconds.
set -uo pipefail
job=${JOB:?set JOB to a folder}
rehearse=${REHEARSE:-0}
if [ "$rehearse" = 1 ]; then seed=${SEED:-benchmarks/seed_standin.py}; else seed=${SEED:?set SEED to the post script}; fi
seed=$(realpath -m "$seed")    # steps run from other folders (gpu_wander.py's script in ROOT)
deadline=${DEADLINE_S:-1420}
steps=${STEPS:-microbench wander gpt tune hf seed}
mkdir -p "$job"
job=$(realpath "$job")
known=" microbench wander gpt tune hf seed overhead resnet "
for name in $steps; do   # a misspelt step would be found only when its turn came in the lease
  [[ "$known" == *" $name "* ]] || { echo "STEPS: unknown step '$name'; choose from:$known" | tee -a "$job/steps.txt" >&2; exit 2; }
done
if [[ " $steps " == *" seed "* || " $steps " == *" wander "* ]] && [ ! -f "$seed" ]; then
  echo "SEED $seed is no file; copy the post's script there" | tee -a "$job/steps.txt" >&2; exit 2
fi
# The chain's own copy: a device call that does not carry SEED's ignored folder removes it from
# the working tree while the chain runs (the 2026-12-05 H100 lease lost the script's side of 30
# wander rounds and the seed step so).
if [ -f "$seed" ]; then cp "$seed" "$job/seed_script.py"; seed=$job/seed_script.py; fi
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
cache=$job/cache/inductor
quiet() { grep -v -e "TensorFloat32" -e "torch.set_float32_matmul_precision" -e "^ *warnings.warn" ; }
left() { echo $((deadline - SECONDS)); }
# What a command's `timeout` may take: at most $1 s and what is left, at least 1 (`timeout 0`
# would be no limit at all).
cap() { local s; s=$(left); [ "$s" -gt "$1" ] && s=$1; [ "$s" -lt 1 ] && s=1; echo "$s"; }
say() { echo "$*" >>"$job/steps.txt"; }
step() {   # NAME LEAST_S COMMAND...: run COMMAND if LEAST_S seconds are left, log exit and time
  local name=$1 least=$2; shift 2
  if [ "$(left)" -lt "$least" ]; then say "$name skipped: $(left) s left, needs $least"; return; fi
  local t=$SECONDS; "$@"; say "$name exit $? $((SECONDS - t)) s (at ${SECONDS} s)"
}
has_cuda() { python3 -c "import sys, torch; sys.exit(not torch.cuda.is_available())" 2>/dev/null; }
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv 2>/dev/null || echo "no nvidia-smi"
  python3 -c "import sys, torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, 'python', sys.version.split()[0])"
  echo "cpus $(nproc)"; } >"$job/env.txt"
say "chain: STEPS='$steps' DEADLINE_S=$deadline REHEARSE=$rehearse SEED=$seed commit $(git rev-parse --short HEAD 2>/dev/null)"

# The sizes: the lease's, or the rehearsal's (the same flags' tiny values, on the CPU).
if [ "$rehearse" = 1 ]; then
  tiny=(--device cpu --model llama-tiny --seq 64 --warmup 1 --steps 3)
  hf_args=("${tiny[@]}" --repeats 1 --timeout 240); tune_args=("${tiny[@]}" --timeout 240)
  export SEQ=64                                 # the stand-in's and gpu_wander.py's sequence
  wander_env=(DEVICE=cpu MODEL=llama-tiny EXTRA="--warmup 1 --steps 3")
  user_env=(DEVICE=cpu); wander_s=${WANDER_S:-100}; budgets=${TUNE_BUDGETS:-30s 45s}
else
  hf_args=(--timeout 400); tune_args=(); wander_env=(); user_env=()
  wander_s=${WANDER_S:-740}; budgets=${TUNE_BUDGETS:-2m 3m}
fi
# shellcheck disable=SC2206
hf_args+=(${HF_ARGS:-})

hf() {
  mkdir -p "$job/hf"
  timeout "$(cap 900)" python3 -m stepbench run --compile-cache "$cache" "${hf_args[@]}" \
    --out "$job/hf/stepbench.jsonl" 2>&1 | quiet >"$job/hf/stepbench.log"
}
seed() {
  for attn in sdpa eager; do
    for mode in eager compile; do
      local s0=$SECONDS
      TORCHINDUCTOR_CACHE_DIR=$cache TRITON_CACHE_DIR=$cache/triton timeout "$(cap 300)" \
        python3 "$seed" "$mode" "$attn" >>"$job/hf/seed.jsonl" 2>>"$job/hf/seed.log"
      echo "seed_${mode}_${attn}_wall_s $((SECONDS - s0))" >>"$job/hf/walltimes.txt"
    done
  done
  python3 benchmarks/compare_seed.py "$job/hf/stepbench.jsonl" "$job/hf/seed.jsonl" >"$job/hf/compare.md" || return
  # A step that measured nothing does not say exit 0: four setups, four lines.
  [ "$(grep -c . "$job/hf/seed.jsonl" 2>/dev/null)" -eq 4 ] || { tail -3 "$job/hf/seed.log" >&2; return 1; }
}
tune() {   # the budgets in turn on one results file, until the host-bound rule shows
  mkdir -p "$job/tune"
  local budget
  for budget in $budgets; do
    [ "$(left)" -lt 60 ] && { say "tune: --budget $budget not started, $(left) s left"; return 0; }
    timeout "$(cap 900)" python3 -m stepbench tune "${tune_args[@]}" --budget "$budget" --compile-cache "$cache" \
      --out "$job/tune/tune.jsonl" --format json >"$job/tune/tune-$budget.json" \
      2>>"$job/tune/tune.log" || return
    # Shown: a host-bound setup, and every candidate that cuts its launches measured.
    python3 - "$job/tune/tune-$budget.json" "$budget" >>"$job/steps.txt" <<'PY' && return 0
import json, sys
tune = json.load(open(sys.argv[1]))
ran = [f"{t['setup']['name']} batch {t['setup']['batch']} " for t in tune["tried"]]
for entry in tune.get("host_bound") or []:
    done = [c for c in entry["candidates"] if any(c.startswith(r) for r in ran)]
    print(f"tune --budget {sys.argv[2]}: {entry['setup']} host-bound, {len(done)} of "
          f"{len(entry['candidates'])} launch-cutting candidates measured ({'; '.join(done)})")
    if done == entry["candidates"]:
        sys.exit(0)
if not tune.get("host_bound"):
    print(f"tune --budget {sys.argv[2]}: no host-bound setup")
sys.exit(1)
PY
  done
  has_cuda || say "tune's host-bound rule skipped: needs CUDA (a CPU's records carry no host lead)"
}
run_step() {   # one step by name
  case $1 in
    hf) step hf 200 hf ;;
    seed) step seed 150 seed ;;
    overhead) step overhead 100 env OUT="$job/user" "${user_env[@]}" OVERHEAD_S=130 \
      COMPILE_UNTIL_S=-1 bash benchmarks/gpu_factory_overhead.sh overhead ;;
    gpt) step gpt-nproc 90 env OUT="$job/user" "${user_env[@]}" GPT_MODES=eager \
      GPT_S="${GPT_S:-100}" bash benchmarks/gpu_factory_overhead.sh gpt ;;
    resnet) if has_cuda; then step resnet-fidelity 120 timeout "$(cap 900)" python3 \
        benchmarks/gpu_workloads.py --out "$job/resnet" --setups resnet:compile --rounds 3 \
        --budget-s "${RESNET_S:-120}"; else say "resnet-fidelity skipped: needs CUDA"; fi ;;
    microbench) if has_cuda; then step microbench 60 timeout "$(cap 100)" python3 \
        benchmarks/gpu_microbench.py --out "$job/microbench.json"
      else say "microbench skipped: needs CUDA (CUDA graphs, CUDA events)"; fi ;;
    tune) step tune 150 tune ;;
    wander) local budget=$(( $(left) - 40 )); [ "$budget" -gt "$wander_s" ] && budget=$wander_s
      step wander 90 env OUT="$job/wander" SEED="$seed" WAYS="${WAYS:-server,script}" \
        PROFILE_EVERY="${PROFILE_EVERY:-10}" \
        "${wander_env[@]}" BUDGET_S="$budget" python3 benchmarks/gpu_wander.py ;;
  esac
}
for name in $steps; do run_step "$name"; done
touch "$job/done"
