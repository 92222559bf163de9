# Shared by gpu_fsdp2_one.sh and gpu_fsdp2_x2.sh (sourced after they set device, model, seq,
# batch, steps, deadline, work and results): one stepbench run into the results file, and
# whether the call's deadline leaves room for the next group.
quiet() { grep -v -e "TensorFloat32" -e "torch.set_float32_matmul_precision" -e "^ *warnings.warn" ; }
sb() {   # LOG ARGS...: one stepbench run into the results file, its log in $work/logs/LOG.log
  local log=$1; shift
  PYTHONPATH=src python3 -m stepbench run --device "$device" --model "$model" --seq "$seq" \
    --batch "$batch" --steps "$steps" --attn sdpa --repeats 1 --no-peak --timeout 240 \
    --compile-cache "$work/inductor" --out "$results" "$@" 2>&1 | quiet >>"$work/logs/$log.log"
  echo "$log: exit ${PIPESTATUS[0]} at ${SECONDS} s" >>"$work/env.txt"
}
room() {  # SECONDS WHAT: whether the deadline leaves that much; else says WHAT was skipped
  if (( SECONDS + $1 > deadline )); then echo "skipped $2 at ${SECONDS} s" >>"$work/env.txt"; return 1; fi
}
