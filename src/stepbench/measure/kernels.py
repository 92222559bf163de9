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
where the profiler recorded them (`with_flops`, `record_shapes`; `profile_step` turns both on):
`matmul_flops`, and `gemms`, one entry per distinct GEMM (op, input shapes, dtype) with its calls,
FLOPs, M/N/K and time: the device time of the kernels it launched on a GPU, the op's own time
on a CPU (where the trace has no kernels, these are the only fields). A GEMM's shape is what a
prediction needs to tell a large product from one that leaves a bigger GPU's SMs idle.
`memory_kernels`: the memory-bound kernels (elementwise, reduction) binned by duration (quarter
octaves), each bin's kernels, ms and, where the launching op's shapes were recorded, the mean
bytes its tensors hold (inputs, and an output as large as the largest): a kernel's working set
against a target's L2 (predict/model.py).

No torch import: this runs on stored traces anywhere (`python -m stepbench.measure.kernels
TRACE.json.gz`).
"""

from __future__ import annotations

import gzip
import json
import math
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
# The ATen ops that are one GEMM each (the profiler counts FLOPs for these); on a GPU the op that
# launched a matmul kernel counts whatever its name (inductor's extern mm is aten::mm as well).
GEMM_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::addbmm",
            "aten::_addmm_activation", "aten::_scaled_mm", "aten::_int_mm")
MEMORY_CLASSES = ("elementwise", "reduction")
# Bytes per element of the profiler's "Input type" names.
DTYPE_BYTES = {"c10::BFloat16": 2, "c10::Half": 2, "float": 4, "double": 8, "long int": 8,
               "int": 4, "short int": 2, "signed char": 1, "unsigned char": 1, "bool": 1,
               "c10::Float8_e4m3fn": 1, "c10::Float8_e5m2": 1}
# Distinct GEMMs kept, by time (a Llama step has a few dozen; `gemms_left_out` counts the rest).
TOP_GEMMS = 64


def classify(name: str) -> str:
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


def mnk(op: str | None, dims) -> dict:
    """M, N, K of a GEMM op's input dims (and `batch` of a batched product); {} where they do
    not read as one (addmm and baddbmm take the added tensor first)."""
    try:
        a, b = dims[1:3] if op in ("aten::addmm", "aten::_addmm_activation", "aten::baddbmm",
                                   "aten::addbmm") else dims[:2]
        if len(a) == 2 and len(b) == 2 and a[1] == b[0]:
            return {"m": a[0], "n": b[1], "k": a[1]}
        if len(a) == 3 and len(b) == 3 and a[2] == b[1] and a[0] == b[0]:
            return {"batch": a[0], "m": a[1], "n": b[2], "k": a[2]}
    except (TypeError, ValueError, IndexError):
        pass
    return {}


def _flops(args: dict, entry: dict) -> float | None:
    """One GEMM call's FLOPs: the profiler's where its trace holds them, else 2 x M x N x K
    (x batch) from the shapes, what torch.profiler's with_flops counts for these ops (the
    Chrome trace of torch 2.13 leaves its count out)."""
    if "flops" in args:
        return float(args["flops"])
    if "m" in entry:
        return 2.0 * entry.get("batch", 1) * entry["m"] * entry["n"] * entry["k"]
    return None


def tensor_bytes(args: dict) -> float | None:
    """What an op's tensors hold: its inputs, and an output as large as the largest of them;
    None without shapes."""
    dims, types = args.get("Input Dims"), args.get("Input type") or []
    if not dims:
        return None
    sizes = []
    for d, t in zip(dims, types):
        if d and t in DTYPE_BYTES:
            n = 1
            for x in d:
                n *= x
            sizes.append(n * DTYPE_BYTES[t])
    return float(sum(sizes) + max(sizes)) if sizes else None


def memory_bins(items: list[tuple[str, float, float | None]]) -> list[dict]:
    """(class, us, bytes or None) of memory-bound kernels, binned by duration (module
    docstring)."""
    bins: dict[tuple, dict] = {}
    for cls, us, size in items:
        key = (cls, round(4 * math.log2(max(us, 0.25))))
        b = bins.setdefault(key, {"class": cls, "us": round(2 ** (key[1] / 4), 3), "kernels": 0,
                                  "ms": 0.0, "_bytes": 0.0, "_sized": 0})
        b["kernels"] += 1
        b["ms"] += us / 1000
        if size is not None:
            b["_bytes"] += size
            b["_sized"] += 1
    out = []
    for b in sorted(bins.values(), key=lambda b: (b["class"], b["us"])):
        sized, total = b.pop("_sized"), b.pop("_bytes")
        b["ms"] = round(b["ms"], 4)
        if sized:
            b["bytes"] = round(total / sized)
        out.append(b)
    return out


def _gemm_key(op: dict) -> tuple:
    args = op.get("args", {})
    types = args.get("Input type") or []
    return (op.get("name"), json.dumps(args.get("Input Dims")),
            next((t for t in types if t), None))


def gemms(ops: list[tuple[dict, float]]) -> dict:
    """`matmul_flops`, `gemms` (module docstring) and `gemms_left_out` of (op, its ms) pairs,
    each op once; {} where no op carries shapes or FLOPs."""
    table: dict[tuple, dict] = {}
    flops = 0.0
    for op, ms in ops:
        args = op.get("args", {})
        if "Input Dims" not in args and "flops" not in args:
            continue
        key = _gemm_key(op)
        entry = table.get(key)
        if entry is None:
            dims = args.get("Input Dims")
            entry = table[key] = {"op": key[0], "dtype": key[2],
                                  # the tensors' dims (a scalar argument's [] left out)
                                  "shapes": [d for d in dims if d] if dims else None,
                                  **mnk(key[0], args.get("Input Dims")), "calls": 0,
                                  "flops": None, "ms": 0.0}
        entry["calls"] += 1
        entry["ms"] += ms
        op_flops = _flops(args, entry)
        if op_flops is not None:
            entry["flops"] = (entry["flops"] or 0.0) + op_flops
            flops += op_flops
    if not table:
        return {}
    ranked = sorted(table.values(), key=lambda e: -e["ms"])
    for entry in ranked:
        entry["ms"] = round(entry["ms"], 4)
    return {"matmul_flops": flops or None,
            "gemms": [{k: v for k, v in e.items() if v is not None} for e in ranked[:TOP_GEMMS]],
            "gemms_left_out": max(len(ranked) - TOP_GEMMS, 0)}


def cpu_gemms(events: list[dict]) -> dict:
    """`gemms` of a trace without kernels (a CPU step): the GEMM ops and their own time."""
    ops = [(e, float(e.get("dur", 0.0)) / 1000) for e in events
           if e.get("cat") == "cpu_op" and e.get("ph") == "X" and e.get("name") in GEMM_OPS]
    return gemms(ops)


def split(trace: dict) -> dict:
    """The profile fields of one traced step (module docstring); on a trace without device
    events (a CPU step) only its GEMMs', {} without those."""
    events = trace.get("traceEvents", [])
    ops = {e["args"]["External id"]: e for e in events
           if e.get("cat") == "cpu_op" and "External id" in e.get("args", {})}
    classes = dict.fromkeys(CLASSES, 0.0)
    counts = dict.fromkeys(CLASSES, 0)
    intervals = []
    kernels: dict[str, dict] = defaultdict(lambda: {"ms": 0.0, "calls": 0, "flops": None,
                                                   "shapes": None})
    op_ms: dict = defaultdict(float)     # a GEMM op's External id -> its matmul kernels' ms
    memory: list[tuple[str, float, float | None]] = []
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
        op_id = e.get("args", {}).get("External id")
        op = ops.get(op_id)
        if cls in MEMORY_CLASSES:
            memory.append((cls, dur_us, tensor_bytes(op.get("args", {})) if op else None))
        if cls != "matmul":
            continue
        entry = kernels[e["name"]]
        entry["ms"] += dur_us / 1000
        entry["calls"] += 1
        if op is not None:
            args = op.get("args", {})
            # An op's FLOPs count once, on its first matmul kernel (split-K launches two).
            op_flops = (_flops(args, mnk(op.get("name"), args.get("Input Dims")))
                        if op_id not in op_ms else None)
            if op_flops is not None:
                entry["flops"] = (entry["flops"] or 0.0) + op_flops
            if "Input Dims" in args and entry["shapes"] is None:
                entry["shapes"] = args["Input Dims"]
            entry["op"] = op.get("name")
            op_ms[op_id] += dur_us / 1000
    if not count:
        return cpu_gemms(events)
    busy_s = _union_s(intervals) / 1e6
    span_s = (max(b for _, b in intervals) - min(a for a, _ in intervals)) / 1e6
    top = sorted(kernels.items(), key=lambda kv: -kv[1]["ms"])[:TOP_MATMULS]
    shapes = gemms([(ops[i], ms) for i, ms in op_ms.items()])
    return {
        "classes_ms": {k: round(v, 4) for k, v in classes.items()},
        "kernels": count,
        "class_kernels": counts,
        "shortest_kernel_ms": min(b - a for a, b in intervals) / 1000,
        "busy_s": busy_s,
        "span_s": span_s,
        "idle_s": max(span_s - busy_s, 0.0),
        "matmul_flops": shapes.get("matmul_flops"),
        "matmuls": [{"kernel": name[:120], **{k: v for k, v in entry.items() if v is not None}}
                    for name, entry in top],
        **({"gemms": shapes["gemms"], "gemms_left_out": shapes["gemms_left_out"]}
           if shapes else {}),
        "memory_kernels": memory_bins(memory),
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
