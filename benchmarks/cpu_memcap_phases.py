"""Why a capped CPU step's need moved with the machine's load (issue 37, item 4; section j3).

One process builds and steps llama-tiny (eager+sdpa, batch 8 x 256) as a setup's process does,
uncapped, while a thread reads VmData (what RLIMIT_DATA counts) every 0.3 ms; it prints the
highest growth over the data memory after the imports, by phase (build, first step, 2 warm-up,
5 timed steps, the profiler's count of the tensors, the FLOP counter), under glibc's malloc as
configured by MODE: `dyn` (glibc's defaults: the mmap threshold rises to each freed mapped block),
`mmaponly` (mallopt M_MMAP_THRESHOLD 128 KiB), `fixed` (that and M_TRIM_THRESHOLD 128 KiB, then
malloc_trim: what measure/memcap.py does), `fixed-arena1` (that and M_ARENA_MAX 1), `fixed:KB`
(both thresholds at KB KiB); and the mean time of the timed steps (with the sampling thread beside them).

    python3 -c 'while True: pass' &      # the busy loop beside it
    for i in 1 2 3; do for m in dyn mmaponly fixed fixed-arena1; do
        .venv/bin/python benchmarks/cpu_memcap_phases.py $m; done; done > F.jsonl
"""

import ctypes
import json
import sys
import threading
import time

import torch

from stepbench.measure import flops, memcap, models
from stepbench.measure import step as st
from stepbench.setup import Setup

mode = sys.argv[1]
setup = Setup(model="llama-tiny", mode="eager", attn="sdpa", device="cpu", batch=8, seq=256,
              warmup=2, steps=5)
models.import_modeling(setup.model, setup.seq)
libc = ctypes.CDLL(None)
# "fixed:KB": both thresholds at KB KiB instead of 128
threshold = int(mode.split(":")[1]) * 1024 if ":" in mode else 128 * 1024
if mode.startswith("fixed") or mode == "mmaponly":
    libc.mallopt(memcap.M_MMAP_THRESHOLD, threshold)
if mode.startswith("fixed"):
    libc.mallopt(memcap.M_TRIM_THRESHOLD, threshold)
    libc.malloc_trim(0)
if mode == "fixed-arena1":
    libc.mallopt(memcap.M_ARENA_MAX, 1)
base = memcap.status_bytes("VmData")
phase = "build"
highest: dict = {}
stop = False


def sample():
    while not stop:
        grown = memcap.status_bytes("VmData") - base
        highest[phase] = max(highest.get(phase, 0), grown)
        time.sleep(0.0003)


threading.Thread(target=sample, daemon=True).start()
work, step, optimizer = st.build_workload(setup, torch.device("cpu"))
timed_steps = int(sys.argv[2]) if len(sys.argv) > 2 else 5
for phase, n in (("first", 1), ("warmup", 2), ("timed", timed_steps)):
    start = time.perf_counter()
    for _ in range(n):
        step()
timed_step_ms = (time.perf_counter() - start) / timed_steps * 1000
phase = "tensors_peak"
counted = st.CpuMemory.tensors_peak(step, st.held_tensors(work.model, optimizer, work.held()))
phase = "flops"
flops.flop_counter_step(work.model, work.tokens[:1])
phase = "end"
time.sleep(0.01)
stop = True
print(json.dumps({"mode": mode, "timed_step_ms": round(timed_step_ms, 1),
                  "peak_tensors_gb": round(counted.get("peak_memory_gb", 0), 4),
                  **{k: round(v / 1e9, 4) for k, v in highest.items()}}))
