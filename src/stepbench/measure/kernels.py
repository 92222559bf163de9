"""Where a profiled step's device time goes: its kernels sorted into classes by what bounds them.

The classes, from the kernel's name (torch.profiler's Chrome trace; the same code reads a trace
just written by `profile_step` and one stored long ago):

matmul         GEMMs: cuBLAS (nvjet, sm90_xmma, ampere_*gemm), CUTLASS, inductor's templates
               (triton_tem_), and eager attention's two batched products (bmm)
attention      fused attention kernels: flash, memory-efficient (fmha), cuDNN SDPA and its
               helpers; eager attention has none (its softmax is a reduction, its products
               matmuls)
elementwise    memory-bound pointwise work: ATen's elementwise kernels, copies, fills, cat,
               device-to-device memcpy and memset, inductor's triton_poi_ kernels
reduction      memory-bound reductions: sums, means, norms, softmax, cross-entropy, sorts and
               scans, inductor's triton_red_ and triton_per_ kernels
optimizer      the optimizer's kernels: multi_tensor_apply (foreach, fused Adam/AdamW),
               inductor's triton_for_ (foreach) kernels
communication  NCCL collectives
transfer       copies between host and device (bound by the host link)

Besides the classes: how many kernels each has (`class_kernels`), the shortest kernel
(`shortest_kernel_ms`: launch and tail latency, what no kernel goes below), `busy_s`, the time
at least one kernel ran (the union of the kernels' intervals over every stream), `span_s` from
the first kernel's start to the last one's end, and
`idle_s` = span - busy: how long the GPU waited inside the profiled step. The profiler slows the
host, so this step's idle time is larger than a timed step's (docs/predict.md takes a timed
step's idle time as step_ms minus busy). GEMMs' FLOPs and shapes come from the launching op
where the profiler recorded them (`with_flops`, `record_shapes`); absent otherwise.

No torch import: this runs on stored traces anywhere (`python -m stepbench.measure.kernels
TRACE.json.gz`).
"""

from __future__ import annotations

import functools
import gzip
import json
import sys
from collections import defaultdict
from pathlib import Path

CLASSES = ("matmul", "attention", "elementwise", "reduction", "optimizer", "communication",
           "transfer")
DEVICE_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")

# (class, name fragments), tried in order on the lower-cased kernel name; the first hit wins.
PATTERNS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("communication", ("nccl",)),
    ("optimizer", ("multi_tensor_apply", "fusedoptimizer", "fused_adam", "adamw", "triton_for_")),
    ("attention", ("flash", "fmha", "sdpa", "attention", "cudnn::fusion", "attn")),
    ("transfer", ("memcpy htod", "memcpy dtoh", "memcpy htoh", "memcpy ptod", "memcpy dtop")),
    ("matmul", ("gemm", "nvjet", "cutlass", "xmma", "cublas", "triton_tem_", "wgmma", "gemv",
                "s16816", "s1688", "splitk", "sm90_", "sm80_", "sm100_", "sm120_")),
    ("reduction", ("reduce", "softmax", "norm", "nll_loss", "cross_entropy", "triton_red_",
                   "triton_per_", "radix_sort", "cub::", "scan", "sum_and_scatter",
                   "compute_grad_weight", "argmax", "topk", "welford")),
)
DEFAULT_CLASS = "elementwise"
TOP_MATMULS = 8


@functools.lru_cache(maxsize=4096)
def classify(name: str) -> str:
    """The class of a kernel by its name (PATTERNS); kept per name: a step launches the same
    few hundred kernels thousands of times."""
    low = name.lower()
    for cls, fragments in PATTERNS:
        if any(f in low for f in fragments):
            return cls
    return DEFAULT_CLASS


def read_trace(path: str | Path) -> dict:
    """A Chrome trace (.json or .json.gz) as torch.profiler exports it."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        return json.load(f)


def _union_s(intervals: list[tuple[float, float]]) -> float:
    busy, end = 0.0, None
    for start, stop in sorted(intervals):
        if end is None or start > end:
            busy += stop - start
            end = stop
        elif stop > end:
            busy += stop - end
            end = stop
    return busy


def split(trace: dict) -> dict:
    """The profile fields of one traced step (module docstring); {} where the trace holds no
    device events (a CPU step)."""
    events = trace.get("traceEvents", [])
    ops = {e["args"]["External id"]: e for e in events
           if e.get("cat") == "cpu_op" and "External id" in e.get("args", {})}
    classes = dict.fromkeys(CLASSES, 0.0)
    counts = dict.fromkeys(CLASSES, 0)
    intervals = []
    gemms: dict[str, dict] = defaultdict(lambda: {"ms": 0.0, "calls": 0, "flops": None,
                                                 "shapes": None})
    flops = 0.0
    count = 0
    for e in events:
        if e.get("ph") != "X" or e.get("cat") not in DEVICE_CATEGORIES:
            continue
        dur_us = float(e.get("dur", 0.0))
        start = float(e["ts"])
        intervals.append((start, start + dur_us))
        cls = classify(e.get("name", ""))
        classes[cls] += dur_us / 1000
        counts[cls] += 1
        count += 1
        if cls != "matmul":
            continue
        op = ops.get(e.get("args", {}).get("External id"))
        entry = gemms[e["name"]]
        entry["ms"] += dur_us / 1000
        entry["calls"] += 1
        if op is not None:
            args = op.get("args", {})
            if "flops" in args:
                entry["flops"] = (entry["flops"] or 0.0) + float(args["flops"])
                flops += float(args["flops"])
            if "Input Dims" in args and entry["shapes"] is None:
                entry["shapes"] = args["Input Dims"]
            entry["op"] = op.get("name")
    if not count:
        return {}
    busy_s = _union_s(intervals) / 1e6
    span_s = (max(b for _, b in intervals) - min(a for a, _ in intervals)) / 1e6
    top = sorted(gemms.items(), key=lambda kv: -kv[1]["ms"])[:TOP_MATMULS]
    return {
        "classes_ms": {k: round(v, 4) for k, v in classes.items()},
        "kernels": count,
        "class_kernels": counts,
        "shortest_kernel_ms": min(b - a for a, b in intervals) / 1000,
        "busy_s": busy_s,
        "span_s": span_s,
        "idle_s": max(span_s - busy_s, 0.0),
        "matmul_flops": flops or None,
        "matmuls": [{"kernel": name[:120], **{k: v for k, v in entry.items() if v is not None}}
                    for name, entry in top],
    }


def split_trace(path: str | Path) -> dict:
    """`split` of a stored trace file."""
    return split(read_trace(path))


def main(argv: list[str] | None = None) -> int:
    paths = sys.argv[1:] if argv is None else argv
    if not paths:
        print("usage: python -m stepbench.measure.kernels TRACE.json.gz ...", file=sys.stderr)
        return 2
    out = {str(p): split_trace(p) for p in paths}
    json.dump(out if len(paths) > 1 else out[str(paths[0])], sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
