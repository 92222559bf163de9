#!/usr/bin/env bash
# Issue 35's goal "a user factory adds no more than 1 s per setup to the process's overhead
# against the HF path (same call)", and the GPT example as DDP and FSDP2 jobs of one process.
#
#   OUT=results-dir bash benchmarks/gpu_factory_overhead.sh overhead   # one H200, at most 5 min
#   OUT=results-dir bash benchmarks/gpu_factory_overhead.sh gpt        # one H200, at most 4 min
#   OUT=results-dir DEVICE=cpu bash benchmarks/gpu_factory_overhead.sh overhead gpt   # CPU check
#
# overhead: the post's Llama through the HF path (`--model llama-468m`) and through a factory
#   that builds the same model (benchmarks/configs/llama_factory.py:make), eager+sdpa and
#   compile+sdpa (compile dropped from round 2 where it starts after COMPILE_UNTIL_S seconds; every
#   run ends by OVERHEAD_S, 290 s, after the part's start),
#   interleaved: two rounds, HF then factory, then factory then HF, one process per setup each
#   (two processes per setup and path in all, as --repeats 2), every run with the default process
#   server and one shared inductor cache. benchmarks/factory_overhead_table.py prints each
#   process's wall minus its time in steps, and per setup the two paths' means and difference.
#   Writes OUT/overhead-{hf,factory}-r{1,2}.jsonl, OUT/overhead.md.
# gpt: examples/gpt.py:make (GPT-2 124M) at --batch 8 --seq 1024 (as section m), eager and
#   compiled, one process without a wrapper beside `--nproc 1 --parallel ddp,fsdp2` (torchrun
#   jobs of one rank: the wrappers' own cost without communication), ending by GPT_S (235 s);
#   GPT_MODES=eager leaves the compiled three out (a shorter GPT_S fits them otherwise not).
#   Writes OUT/gpt-nproc1.jsonl, OUT/gpt.md (with TFLOP/s, MFU and where the FLOPs came from).
# Logs: OUT/run.log; the machine: OUT/env.txt. Exits 1 when a run or a table failed (a run
# stopped at its deadline keeps its records and counts as run).
set -uo pipefail
out=${OUT:?set OUT to a folder}
parts=${*:-overhead gpt}
device=${DEVICE:-cuda}
mkdir -p "$out"
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv 2>/dev/null
  python3 -c "import sys, torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, 'python', sys.version.split()[0])"
  echo "cpus $(nproc)"; git rev-parse HEAD 2>/dev/null; } >>"$out/env.txt"
work=$(mktemp -d)
status=0
export STEPBENCH_CACHE_DIR=$work/stepbench-cache
quiet() { grep -v -e "TensorFloat32" -e "torch.set_float32_matmul_precision" -e "^ *warnings.warn" ; }
# Each run ends by its part's deadline (SECONDS): a run stopped there keeps the setups it finished.
sb() {
  local left=$((deadline - SECONDS))
  if [ "$left" -lt 20 ]; then echo "== skipped: ${left}s left" | tee -a "$out/run.log"; return; fi
  timeout "$left" python3 -m stepbench run --compile-cache "$work/inductor" "$@" 2>&1 | quiet >>"$out/run.log"
  local code=${PIPESTATUS[0]}
  # 124: the deadline stopped it (what it finished is kept); 1: no setup ran ok, 2: a usage
  # error, others a traceback: the step failed, whatever tables follow.
  case $code in 0|124) ;; *) echo "== stepbench run exit $code" | tee -a "$out/run.log"; status=1 ;; esac
}

if [ "$device" = cpu ]; then
  hf=llama-tiny; fac=(--param size=tiny); modes=eager
  common=(--device cpu --seq 64 --warmup 1 --steps 2)
  gpt=(--device cpu --seq 32 --batch 2 --precision fp32 --warmup 1 --steps 2 --param n_layer=2
       --param n_embd=32 --param n_head=2 --param vocab_size=128)
else
  hf=llama-468m; fac=(); modes=eager,compile; common=(--timeout 240)
  gpt=(--batch 8 --seq 1024 --timeout 150)
fi

if [[ " $parts " == *" overhead "* ]]; then
  deadline=$((SECONDS + ${OVERHEAD_S:-290})); start=$SECONDS
  for round in 1 2; do
    order="hf factory"; [ "$round" = 2 ] && order="factory hf"
    # Both paths of a round measure the same setups: compile stays in round 2 only if started
    # early enough for two compiled setups (about 40 s each with the cache warm) to fit.
    m=$modes; [ $((SECONDS - start)) -gt "${COMPILE_UNTIL_S:-190}" ] && m=eager
    for path in $order; do
      if [ "$path" = hf ]; then model=(--model "$hf"); else
        model=(--model benchmarks/configs/llama_factory.py:make "${fac[@]}"); fi
      echo "== round $round $path modes $m at ${SECONDS}s" | tee -a "$out/run.log"
      sb "${model[@]}" "${common[@]}" --attn sdpa --modes "$m" --repeats 1 \
        --out "$out/overhead-$path-r$round.jsonl"
    done
  done
  python3 benchmarks/factory_overhead_table.py "$out"/overhead-*.jsonl | tee "$out/overhead.md" || status=1
fi

if [[ " $parts " == *" gpt "* ]]; then
  m=${GPT_MODES:-$modes}; deadline=$((SECONDS + ${GPT_S:-235}))
  echo "== gpt nproc 1 at ${SECONDS}s" | tee -a "$out/run.log"
  sb --model examples/gpt.py:make "${gpt[@]}" --modes "$m" \
    --nproc 1 --parallel none,ddp,fsdp2 --repeats 1 --out "$out/gpt-nproc1.jsonl"
  python3 - "$out/gpt-nproc1.jsonl" <<'PY' | tee "$out/gpt.md"
import json, sys
print("| setup | parallel | status | step ms | tokens/s | peak GB | first step s | loss last | "
      "TFLOP/s | MFU (datasheet) | FLOPs from | wrapping |")
print("|" + " --- |" * 12)
for line in open(sys.argv[1]):
    r = json.loads(line)
    s = r["setup"]
    num = lambda v, f: "-" if v is None else format(v, f)
    print(f"| {s['name']} | {s.get('parallel', 'none')} | {r['status']} | {num(r.get('step_ms'), '.1f')} | "
          f"{num(r.get('tokens_per_s'), ',.0f')} | {num(r.get('peak_memory_gb'), '.2f')} | "
          f"{num(r.get('first_step_s'), '.1f')} | {num(r.get('loss_last'), '.4f')} | "
          f"{num(r.get('achieved_tflops'), '.1f')} | {num(r.get('mfu_datasheet'), '.1%')} | "
          f"{r.get('flops_source') or '-'} | {(r.get('scaling') or {}).get('wrapping', '')} |")
PY
  [ "${PIPESTATUS[0]}" = 0 ] || status=1
fi
echo "total ${SECONDS}s"
rm -rf "$work"
exit $status
