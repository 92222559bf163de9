"""Turn benchmarks/gpu_microbench.py's JSON (measured on an H200) into the [memory] table of
src/stepbench/predict/calibration.toml (predict/memory.py's constants):

    PYTHONPATH=src python3 benchmarks/calibrate_predict.py benchmarks/results/h200-DATE-microbench.json

dram_efficiency     the median fraction of the datasheet bandwidth `add` reaches with a working
                    set of 8x the L2 or more
l2_gbs_per_sm       the best `add` bandwidth with a working set from 1 MB to a quarter of the
                    L2, times dram_efficiency (memory.kernel_s divides by it), over the SMs
l2_full_hit_share   the largest inputs-to-L2 ratio at which `add` still reaches 90% of that best
                    bandwidth
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
    adds = [r for r in result["elementwise"] if r["op"] == "add"]
    large = [r["of_datasheet"] for r in adds if r["working_set_mb"] >= 8 * l2]
    if not large:
        raise SystemExit(f"no add with a working set of 8x the L2 ({8 * l2:g} MB) or more: "
                         "run gpu_microbench.py to its largest size")
    eff = statistics.median(large)
    where = (f"benchmarks/results/{name} ({result['gpu']}, torch {result['torch']}, "
             f"{result['measured_at'][:10]}; benchmarks/calibrate_predict.py)")
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
    best = max(r["gbs"] for r in small)
    fits = [r["working_set_mb"] * 2 / 3 / l2 for r in adds
            if r["working_set_mb"] >= 1 and r["gbs"] >= 0.9 * best]
    return {"source": where,
            "dram_efficiency": round(eff, 3),
            "l2_gbs_per_sm": round(best * eff / sms, 1),
            "l2_full_hit_share": round(min(max(fits), 0.95), 3),
            "read_share": 0.6667}


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
