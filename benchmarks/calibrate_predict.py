"""Turn benchmarks/gpu_microbench.py's JSON (measured on any GPU of the GPU table) into the
[memory] table of src/stepbench/predict/calibration.toml (predict/memory.py's constants):

    PYTHONPATH=src python3 benchmarks/calibrate_predict.py benchmarks/results/h200-DATE-microbench.json

dram_efficiency     the median fraction of the datasheet bandwidth (the GPU table's, else the
                    file's) `add` reaches with a working set of 8x the L2 or more
l2_gbs_per_sm       the L2's throughput: the slope of the `add` times against their bytes with a
                    working set from 1 MB to a quarter of the L2 (l2_line; its intercept is each
                    kernel's fixed time), times dram_efficiency (memory.kernel_s divides by it),
                    over the SMs
l2_full_hit_share   the inputs-to-L2 ratio midway between the largest `add` still within 10% of
                    that line's time and the next one measured (full_hit_share)
read_share          2/3 (an add reads two tensors and writes one), not measured
Where the L2-sized adds timed their launches rather than their kernels (a run before the
microbenchmark timed CUDA graphs: the 2026-12-05 H200 run), only dram_efficiency is taken and the
L2 constants stay calibration.toml's first estimates, as `source` says.
Prints the table; paste it over the file's [memory] table.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

from stepbench.predict import gpus, memory


def calibrate(result: dict, name: str) -> dict:
    # The GPU table's L2 and SMs, which predict/memory.py scales with (the driver may report
    # a different L2 size than the datasheet).
    gpu = gpus.find(result["gpu"])
    l2 = (gpu and gpu.get("l2_mb")) or result["l2_mb"]
    sms = (gpu and gpu.get("sms")) or result["sms"]
    # The datasheet bandwidth: the GPU table's, which the file's may not be (the microbenchmark
    # wrote the H200's 4,800 GB/s for every card before it read the table).
    bandwidth = (gpu and gpu.get("memory_bandwidth_gbs")) or result["datasheet_bandwidth_gbs"]
    if not bandwidth:
        raise SystemExit(f"no datasheet bandwidth for {result['gpu']}: add it to the GPU table "
                         "or run gpu_microbench.py with --bandwidth-gbs")
    adds = [r for r in result["elementwise"] if r["op"] == "add"]
    large = [r["gbs"] / bandwidth for r in adds if r["working_set_mb"] >= 8 * l2]
    if not large:
        raise SystemExit(f"no add with a working set of 8x the L2 ({8 * l2:g} MB) or more: "
                         "run gpu_microbench.py to its largest size")
    eff = statistics.median(large)
    where = (f"benchmarks/results/{name} ({result['gpu']}, torch {result['torch']}, "
             f"{result['measured_at'][:10]}, {bandwidth:g} GB/s datasheet; "
             "benchmarks/calibrate_predict.py)")
    small = [r for r in adds if 1 <= r["working_set_mb"] <= l2 / 4]
    if launch_bound(small):
        # A kernel of a few microseconds timed as fast as the host launched it: the L2 points
        # say nothing about the L2. Only the large kernels' DRAM efficiency is measured.
        first = memory.constants()          # the L2 constants as they stand
        return {"source": f"dram_efficiency measured, {where}; the L2 constants are first "
                          "estimates: that run timed launches, not L2-resident kernels",
                "dram_efficiency": round(eff, 3),
                **{k: first[k] for k in ("l2_gbs_per_sm", "l2_full_hit_share")},
                "read_share": 0.6667}
    fixed_us, gbs = l2_line(small)
    return {"source": where,
            "dram_efficiency": round(eff, 3),
            "l2_gbs_per_sm": round(gbs * eff / sms, 1),
            "l2_full_hit_share": round(min(full_hit_share(adds, l2, fixed_us, gbs), 0.95), 3),
            "read_share": 0.6667}


def full_hit_share(adds: list[dict], l2_mb: float, fixed_us: float, gbs: float) -> float:
    """Where the adds leave the L2: the inputs-to-L2 share (an add's inputs are 2/3 of its
    working set) midway between the largest add still within 10% of the L2 line's time and the
    smallest one beyond it that is not; the largest such add where none beyond it was measured.
    The microbenchmark's sizes double, so the two bracket the point (0.32 and 0.64 on the
    2026-12-05 H100), and the midpoint is the estimate that favours neither end."""
    def share(r):
        return r["working_set_mb"] * 2 / 3 / l2_mb

    inside = [share(r) for r in adds if r["working_set_mb"] >= 1
              and r["us"] <= 1.1 * (fixed_us + r["bytes"] / gbs / 1e3)]
    last = max(inside)
    beyond = [share(r) for r in adds if share(r) > last]
    return (last + min(beyond)) / 2 if beyond else last


def l2_line(adds: list[dict]) -> tuple[float, float]:
    """The least-squares line through the L2-sized adds' times against their bytes: (its
    intercept, each kernel's fixed microseconds; its slope as GB/s, the L2's throughput). The
    model caps a kernel's bytes by the L2's throughput (memory.kernel_s) and charges no fixed time
    a kernel, so the slope is the constant: a rate with the fixed time in it (the 2026-12-05
    H100's best small add, 4.6 TB/s, against a slope of 8.6) fell below the DRAM's own."""
    xs = [r["bytes"] for r in adds]
    ys = [r["us"] for r in adds]
    slope, intercept = statistics.linear_regression(xs, ys)
    return intercept, 1 / slope / 1e3


def launch_bound(adds: list[dict]) -> bool:
    """The L2-sized adds took about the same time whatever their size (within 1.5x over 4x
    the bytes or more): each timed its launch, not its kernel."""
    if len(adds) < 2:
        return True
    first, last = adds[0], adds[-1]
    return (last["bytes"] >= 4 * first["bytes"] and last["us"] < 1.5 * first["us"])


def main(argv: list[str] | None = None) -> int:
    path = Path((argv or sys.argv[1:])[0])
    values = calibrate(json.loads(path.read_text()), path.name)
    print("[memory]")
    for key, value in values.items():
        print(f"{key} = {json.dumps(value)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
