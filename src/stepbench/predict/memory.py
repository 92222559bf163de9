"""Memory-bound kernels against the L2 cache: how much faster a target runs them than its DRAM
bandwidth alone says (docs/predict.md, "Memory-bound kernels and L2").

A kernel moving W bytes takes max(DRAM bytes / DRAM bandwidth, W / L2 bandwidth) / efficiency,
where the DRAM bytes are W less the inputs the L2 still holds from the kernel before (its hit
share of the inputs: whole up to `l2_full_hit_share` of the L2, none beyond the whole L2). The
L2 bandwidth is `l2_gbs_per_sm` times the SM count. A kernel's W comes from its recorded
shapes, else from its time on the source GPU through the same formula. The ratio of the two
times, per duration bin of the record's `memory_kernels` and weighted by their time, is the
factor a class's DRAM-scaled time is multiplied by. The constants are the source GPU's
(calibration.toml: measured on our H200, or a first estimate that says so).
"""

from __future__ import annotations

import tomllib
from functools import cache
from importlib import resources

from stepbench.predict.gpus import Gpu


@cache
def constants() -> dict:
    text = resources.files("stepbench.predict").joinpath("calibration.toml").read_text(
        encoding="utf-8")
    return tomllib.loads(text)["memory"]


def hit_share(inputs: float, l2_bytes: float, full: float) -> float:
    """The share of a kernel's input bytes still in an L2 of `l2_bytes`."""
    if inputs <= full * l2_bytes:
        return 1.0
    if inputs >= l2_bytes:
        return 0.0
    return (l2_bytes - inputs) / ((1 - full) * l2_bytes)


def kernel_s(size: float, gpu: Gpu, c: dict) -> float | None:
    """Seconds a kernel moving `size` bytes takes on `gpu`; None without its figures."""
    bw, l2, sms = gpu.get("memory_bandwidth_gbs"), gpu.get("l2_mb"), gpu.get("sms")
    if not (bw and l2 and sms):
        return None
    inputs = c["read_share"] * size
    dram = size - inputs * hit_share(inputs, l2 * 2**20, c["l2_full_hit_share"])
    return max(dram / (bw * 1e9), size / (c["l2_gbs_per_sm"] * sms * 1e9)) / c["dram_efficiency"]


def size_of(seconds: float, gpu: Gpu, c: dict) -> float:
    """The bytes a kernel of `seconds` on `gpu` moved (kernel_s inverted by bisection: its
    time grows with the bytes)."""
    lo, hi = 0.0, seconds * gpu.get("memory_bandwidth_gbs") * 1e9 * 64
    for _ in range(60):
        mid = (lo + hi) / 2
        if kernel_s(mid, gpu, c) < seconds:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def l2_factors(bins: list[dict] | None, source: Gpu, target: Gpu) -> dict[str, float]:
    """class -> the factor its DRAM-scaled time is multiplied by on `target`: the bins' time
    on the target over their DRAM-only scaling, weighted by time; {} where either GPU lacks a
    figure or the record has no bins."""
    c = constants()
    if not bins or kernel_s(1.0, source, c) is None or kernel_s(1.0, target, c) is None:
        return {}
    ratio = source.get("memory_bandwidth_gbs") / target.get("memory_bandwidth_gbs")
    weighted: dict[str, list[float]] = {}
    for b in bins:
        seconds = b["us"] * 1e-6
        size = b.get("bytes") or size_of(seconds, source, c)
        scaled = kernel_s(size, target, c) / kernel_s(size, source, c)
        acc = weighted.setdefault(b["class"], [0.0, 0.0])
        acc[0] += b["ms"] * scaled / ratio
        acc[1] += b["ms"]
    return {cls: a / t for cls, (a, t) in weighted.items() if t > 0}
