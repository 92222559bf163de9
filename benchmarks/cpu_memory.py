"""Why one CPU setup's resident peak memory varied between processes, and what does not vary.

Runs one setup's step (built and stepped by stepbench.measure.step, as a setup's process does)
in several processes per condition: torch threads (1 or 2), a busy loop on every CPU or not, and
the start (forked from a process that imported torch first, as the process server does, or a
fresh process), and glibc's arenas (MALLOC_ARENA_MAX=1, or its default). Each process reports
- `rss_growth_gb`: the peak resident memory over 10 timed steps above the resident memory before
  the build (what stepbench recorded as a CPU's peak memory before issue 23),
- its parts: the growth of anonymous memory (RssAnon) and of file pages (RssFile),
- `heap_mb`: the size of glibc's heaps after the steps (malloc_info, every arena),
- `tensors_gb`: the step's tensors (step.CpuMemory.tensors_peak, what it records now).

    PYTHONPATH=src python benchmarks/cpu_memory.py --out benchmarks/results/cpu-DATE-memory.jsonl
    python benchmarks/cpu_memory.py --summary benchmarks/results/cpu-DATE-memory.jsonl

With --floor: the floor that `run` refuses a CPU setup by (measure/footprint.py) against the
tensors' peak of a few setups, each in a fresh process (compiled ones compile cold).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

CONDITIONS = [  # (threads, busy, start, glibc's arenas: None = its default, 8 per CPU)
    (2, False, "fork", None), (2, True, "fork", None), (2, True, "fresh", None),
    (1, False, "fork", None), (1, True, "fork", None), (2, True, "fork", 1)]


def status() -> dict:
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmHWM", "VmRSS", "RssAnon", "RssFile"):
                out[key] = int(value.split()[0]) / 1024
    return out


def heap_mb() -> float:
    """glibc's heaps (every arena's current size, malloc_info) in MB."""
    libc = ctypes.CDLL("libc.so.6")
    libc.fopen.restype = ctypes.c_void_p
    with tempfile.NamedTemporaryFile(suffix=".xml") as f:
        handle = libc.fopen(f.name.encode(), b"w")
        libc.malloc_info(0, ctypes.c_void_p(handle))
        libc.fclose(ctypes.c_void_p(handle))
        text = open(f.name).read()
    heaps = text.split("</heap>")[:-1]
    return sum(int(m) for heap in heaps
               for m in re.findall(r'<system type="current" size="(\d+)"', heap)) / 2**20


def one(seq: int, threads: int) -> dict:
    """In the measuring process: build, 3 steps, reset the resident peak, 10 steps, read."""
    import torch

    from stepbench.measure import models, step
    from stepbench.setup import Setup

    torch.set_num_threads(threads)
    setup = Setup.from_dict({"model": "llama-tiny", "mode": "eager", "attn": "sdpa", "batch": 4,
                             "seq": seq, "dtype": "bf16", "device": "cpu"})
    models.import_modeling(setup.model, seq)   # as a setup's process does before it measures
    before = status()
    memory = step.CpuMemory()
    model, run, tokens, optimizer = step.build(setup, torch.device("cpu"))
    for _ in range(3):
        run()
    memory.reset()
    for _ in range(10):
        run()
    after = status()
    rss = memory.peaks()
    result = {"rss_growth_gb": round(rss["peak_memory_gb"], 4),
              "anon_growth_mb": round(after["RssAnon"] - before["RssAnon"], 1),
              "file_growth_mb": round(after["RssFile"] - before["RssFile"], 1),
              "heap_mb": round(heap_mb(), 1), "load_1m": os.getloadavg()[0]}
    tensors = memory.tensors_peak(run, step.held_tensors(model, optimizer, tokens))
    return {**result, "tensors_gb": round(tensors["peak_memory_gb"], 4)}


CHILD = """
import json, os, sys
sys.path.insert(0, {bench!r})
import cpu_memory
seq, threads, start = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
if start == "fork":  # what the process server imports before it forks
    import torch  # noqa: F401
    from stepbench.measure import models, step  # noqa: F401
    models.import_modeling("llama-tiny", seq)
if start == "fork":
    torch.set_num_threads(1)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.write(write, json.dumps(cpu_memory.one(seq, threads)).encode())
        os._exit(0)
    os.close(write)
    print(os.read(read, 65536).decode())
    os.waitpid(pid, 0)
else:
    print(json.dumps(cpu_memory.one(seq, threads)))
"""


# The floor of measure/footprint.py against the tensors a step needed: (mode, attn, seq, dtype).
FLOOR_SETUPS = [("eager", "sdpa", 64, "bf16"), ("eager", "sdpa", 256, "bf16"),
                ("eager", "sdpa", 1024, "bf16"), ("eager", "sdpa", 2048, "bf16"),
                ("eager", "eager", 256, "bf16"), ("eager", "eager", 1024, "bf16"),
                ("eager", "sdpa", 256, "fp32"), ("compile", "sdpa", 256, "bf16"),
                ("compile", "sdpa", 1024, "bf16"), ("compile", "eager", 512, "bf16")]

FLOOR_CHILD = """
import json, sys
import torch
from stepbench.measure import footprint, step
from stepbench.setup import Setup
mode, attn, seq, dtype = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
setup = Setup.from_dict({"model": "llama-tiny", "mode": mode, "attn": attn, "batch": 4,
                         "seq": seq, "dtype": dtype, "device": "cpu"})
model, run, tokens, optimizer = step.build(setup, torch.device("cpu"))
for _ in range(3):
    run()
peak = step.CpuMemory.tensors_peak(run, step.held_tensors(model, optimizer, tokens))
floor = footprint.estimate(setup)
print(json.dumps({"mode": mode, "attn": attn, "seq": seq, "dtype": dtype, "batch": 4,
                  "tensors_gb": peak["peak_memory_gb"], "floor_gb": floor.total / 1e9,
                  "floor_parts_gb": {k: v / 1e9 for k, v in floor.parts.items()}}))
"""


def floor(args) -> None:
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=tempfile.mkdtemp(prefix="inductor-"))
    with open(args.out, "a") as out:
        for mode, attn, seq, dtype in FLOOR_SETUPS:
            text = subprocess.run([sys.executable, "-c", FLOOR_CHILD, mode, attn, str(seq), dtype],
                                  env=env, capture_output=True, text=True, check=True).stdout
            out.write(text.strip().splitlines()[-1] + "\n")
            out.flush()
            print(text.strip().splitlines()[-1], file=sys.stderr)


def floor_summary(path: str) -> None:
    print("| setup | batch x seq | precision | tensors (GB) | floor (GB) | floor / tensors |")
    print("| --- | --- | --- | ---: | ---: | ---: |")
    for line in open(path):
        r = json.loads(line)
        print(f"| {r['mode']}+{r['attn']} | {r['batch']} x {r['seq']} | {r['dtype']} | "
              f"{r['tensors_gb']:.4f} | {r['floor_gb']:.4f} | {r['floor_gb'] / r['tensors_gb']:.2f} |")


def measure(args) -> None:
    bench = os.path.dirname(os.path.abspath(__file__))
    with open(args.out, "a") as out:
        for index, (threads, busy, start, arenas) in enumerate(CONDITIONS):
            if args.conditions and index not in args.conditions:
                continue
            env = dict(os.environ, OMP_NUM_THREADS="2",
                       **({"MALLOC_ARENA_MAX": str(arenas)} if arenas else {}))
            loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
                     for _ in (os.sched_getaffinity(0) if busy else ())]
            try:
                for i in range(args.processes):
                    text = subprocess.run([sys.executable, "-c", CHILD.format(bench=bench),
                                           str(args.seq), str(threads), start], env=env,
                                          capture_output=True, text=True, check=True).stdout
                    result = {"threads": threads, "busy": busy, "start": start,
                              "arenas": arenas, "seq": args.seq, "process": i,
                              **json.loads(text)}
                    out.write(json.dumps(result) + "\n")
                    out.flush()
                    print(result, file=sys.stderr)
            finally:
                for loop in loops:
                    loop.kill()
                    loop.wait()


def summary(path: str) -> None:
    rows: dict[tuple, list[dict]] = {}
    for line in open(path):
        r = json.loads(line)
        rows.setdefault((r["threads"], r["busy"], r["start"], r.get("arenas")), []).append(r)
    print("| threads | busy loop | start | arenas | processes | resident growth (GB) "
          "| anon growth (MB) | file growth (MB) | glibc heaps (MB) | tensors (GB) |")
    print("| ---: | --- | --- | --- | ---: | --- | --- | --- | --- | --- |")

    def span(values, fmt):
        lo, hi = fmt.format(min(values)), fmt.format(max(values))
        return lo if lo == hi else f"{lo}-{hi}"

    for (threads, busy, start, arenas), group in rows.items():
        print(f"| {threads} | {'yes' if busy else 'no'} | {start} | {arenas or 'default'} | "
              f"{len(group)} | "
              f"{span([r['rss_growth_gb'] for r in group], '{:.3f}')} | "
              f"{span([r['anon_growth_mb'] for r in group], '{:.0f}')} | "
              f"{span([r['file_growth_mb'] for r in group], '{:.0f}')} | "
              f"{span([r['heap_mb'] for r in group], '{:.0f}')} | "
              f"{span([r['tensors_gb'] for r in group], '{:.4f}')} |")
    loads = [r["load_1m"] for group in rows.values() for r in group]
    print(f"\nload average (1 min) at the processes' ends: median {statistics.median(loads):.1f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="append one JSON line per process here")
    parser.add_argument("--summary", metavar="FILE", help="print the table of a file")
    parser.add_argument("--processes", type=int, default=3)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--conditions", type=lambda t: [int(i) for i in t.split(",")],
                        help="run only these of CONDITIONS (indices, comma-separated)")
    parser.add_argument("--floor", action="store_true",
                        help="measure the floor of measure/footprint.py against the tensors' peak "
                             "of FLOOR_SETUPS instead (with --summary: print that table)")
    args = parser.parse_args()
    if args.summary:
        (floor_summary if args.floor else summary)(args.summary)
    else:
        (floor if args.floor else measure)(args)
