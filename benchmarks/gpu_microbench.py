"""What the predictor needs to know about the source GPU that no datasheet says (issue 36): how
fast a memory-bound kernel runs against its working set's size relative to the L2 cache, and
what fraction of the tensor peak a bf16 GEMM reaches against its shape.

One GPU, about 1-2 minutes, torch only:

    python3 benchmarks/gpu_microbench.py --out OUT/h200-DATE-microbench.json

1. elementwise: `torch.add(x, y, out=z)` and `torch.mul(x, 2.0, out=z)` on bf16 tensors of
   0.25 MB to 1 GB each, the same tensors again and again (as a step's chain of pointwise
   kernels reads what the one before it wrote): bytes moved (2 or 3 tensors) over the kernel's
   time, against the datasheet bandwidth: --bandwidth-gbs, else the GPU table's figure for the
   device (stepbench's predict/gpus.toml; the H200's 4,800 GB/s stood for every card until the
   2026-12-05 H100 run, benchmarks/README.md section l6).
2. gemm: bf16 `torch.mm` (random inputs: zeros run faster) at the shapes a Llama step of the
   post's model launches (8192 tokens, hidden 1024, MLP 4096, vocabulary 32000, forward and both
   backward products), square and tall sweeps, and the shape of the RTX 5090's published rate
   (16384 x 8192 x 1280): achieved TFLOP/s.

Each time is the median over 5 replays of one CUDA graph of `reps` launches, one CUDA event pair
around each replay (graph-free launches from Python timed the host's ~9 us a launch: the
2026-12-05 H200 run, benchmarks/README.md section n3).
The JSON holds the device's SM count and L2 size as torch reports them.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from datetime import datetime, timezone

import torch

MB = 1024 * 1024
# What calibrate_predict.py reads to know the L2 points are kernels, not launches.
METHOD = "cuda graph: median of 5 replays of reps launches, one CUDA event pair each"


def timed_us(fn, reps: int, rounds: int = 5) -> float:
    """Median over `rounds` of the mean time of one of `reps` launches, captured in one CUDA
    graph and replayed: the GPU runs them back to back with no host between them. Launched
    from Python instead, one launch took about 9 us of the host (2026-12-05, H200), so every
    elementwise kernel under 8 MB and every GEMM under 20 us timed the launch, not the kernel."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):       # warm (cuBLAS's workspace, allocations) off the graph
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(reps):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(rounds):
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(begin.elapsed_time(end) * 1000 / reps)
    del graph
    return statistics.median(times)


def sizes_mb(l2_mb: float | None) -> list[float]:
    """The tensor sizes: 0.25 MB to 1 GB doubling, and quarter octaves from a sixteenth of the
    L2 to the whole L2 a tensor, where an add's inputs leave the L2 (calibrate_predict.py's
    l2_full_hit_share lies between two measured sizes: 0.32 and 0.64 of the L2 with doubling
    alone, the 2026-12-05 H100 run)."""
    sizes = {0.25 * 2 ** i for i in range(13)}
    if l2_mb:
        sizes |= {round(l2_mb / 16 * 2 ** (i / 4), 3) for i in range(17)}
    return sorted(sizes)


def elementwise(bandwidth_gbs: float | None, l2_mb: float | None = None) -> list[dict]:
    rows = []
    for size_mb in sizes_mb(l2_mb):
        n = int(size_mb * MB) // 2
        x = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        y = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        z = torch.empty_like(x)
        reps = max(10, min(200, int(2000 / size_mb)))
        for op, fn, tensors in (("add", lambda: torch.add(x, y, out=z), 3),
                                ("mul", lambda: torch.mul(x, 2.0, out=z), 2)):
            us = timed_us(fn, reps)
            moved = tensors * n * 2
            gbs = moved / (us * 1e-6) / 1e9
            rows.append({"op": op, "tensor_mb": size_mb, "working_set_mb": tensors * size_mb,
                         "bytes": moved, "us": round(us, 3), "gbs": round(gbs, 1),
                         "of_datasheet": round(gbs / bandwidth_gbs, 4) if bandwidth_gbs else None})
    return rows


def gemm_shapes() -> list[tuple[int, int, int]]:
    tokens, hidden, mlp, vocab = 8192, 1024, 4096, 32000
    model = set()
    for n, k in ((hidden, hidden), (mlp, hidden), (hidden, mlp), (vocab, hidden)):
        model |= {(tokens, n, k), (tokens, k, n), (k, n, tokens)}   # forward, dgrad, wgrad
    square = {(s, s, s) for s in (256, 512, 1024, 2048, 4096, 8192)}
    tall = {(m, 1024, 1024) for m in (512, 1024, 2048, 4096, 16384, 32768)}
    # The shape of the RTX 5090's published bf16 torch.matmul rate (gpus.toml [measured]): the
    # H200's rate at the same shape, against the record's n=8192 burst the predictor uses.
    published = {(16384, 8192, 1280)}
    return sorted(model | square | tall | published)


def table_bandwidth(name: str) -> float | None:
    """The datasheet DRAM bandwidth of the GPU table (stepbench.predict.gpus) for `name`; None
    where stepbench is not importable or the table lacks the card (each row's `of_datasheet`
    is then None, and calibrate_predict.py needs the table's figure or --bandwidth-gbs)."""
    try:
        from stepbench.predict import gpus
    except ImportError:
        return None
    gpu = gpus.find(name)
    return gpu.get("memory_bandwidth_gbs") if gpu else None


def gemms() -> list[dict]:
    rows = []
    for m, n, k in gemm_shapes():
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
        flops = 2 * m * n * k
        reps = max(5, min(200, int(2e12 / flops)))
        us = timed_us(lambda: torch.mm(a, b), reps)
        rows.append({"m": m, "n": n, "k": k, "flops": flops, "us": round(us, 3),
                     "tflops": round(flops / (us * 1e-6) / 1e12, 1)})
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="the JSON file to write")
    parser.add_argument("--bandwidth-gbs", type=float, default=None,
                        help="the GPU's datasheet DRAM bandwidth (default: the GPU table's)")
    args = parser.parse_args()
    props = torch.cuda.get_device_properties(0)
    l2_mb = getattr(props, "L2_cache_size", 0) / MB or None
    if args.bandwidth_gbs is None:
        args.bandwidth_gbs = table_bandwidth(torch.cuda.get_device_name(0))
    t0 = time.perf_counter()
    result = {"gpu": torch.cuda.get_device_name(0), "sms": props.multi_processor_count,
              "l2_mb": l2_mb,
              "torch": torch.__version__,
              "measured_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "datasheet_bandwidth_gbs": args.bandwidth_gbs,
              "method": METHOD,
              "elementwise": elementwise(args.bandwidth_gbs, l2_mb), "gemm": gemms()}
    result["wall_s"] = round(time.perf_counter() - t0, 1)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"{result['gpu']}: {result['sms']} SMs, L2 {result['l2_mb']} MB, {result['wall_s']} s")
    for row in result["elementwise"]:
        if row["op"] == "add":
            print(f"  add {row['tensor_mb']:>8} MB x3: {row['gbs']:>8.0f} GB/s "
                  f"({row['of_datasheet']:.2f} of datasheet)")
    for row in result["gemm"]:
        print(f"  mm {row['m']:>6} x {row['n']:>6} x {row['k']:>6}: {row['tflops']:>6.0f} TFLOP/s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
