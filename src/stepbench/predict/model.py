"""A measured step scaled to another GPU, class by class (docs/predict.md).

Each kernel class takes the time it took on the source GPU, times the ratio of the resource
that bounds it, source over target: the same achieved fraction of peak on both GPUs.

matmul, attention       dense tensor peak for the setup's matmul dtype (bf16, fp16, fp8, tf32)
elementwise, reduction,
optimizer               DRAM bandwidth
communication           NVLink (else the host link) bandwidth
transfer                host link (PCIe) bandwidth

A kernel does not get shorter than the shortest kernel of the source's step (launch and tail
latency, measured there): each kernel class keeps that floor per kernel, unscaled. The host's
time is not scaled: the GPU's predicted time and the host's meet as the longer of the two. A
source step whose GPU waited (idle more than HOST_BOUND_SHARE of the step) was bound by the
host, whose time per step is then the source's step time; otherwise the host kept up and its
time is unknown below that (taken as none). The interval's high end adds the source's idle
time on top, as if the waiting did not overlap the target's longer kernels.

Two corrections use what a record made by this stepbench holds: memory-bound classes
(elementwise, reduction) are multiplied by predict/memory.py's L2 factor (their kernels' working
sets against each GPU's L2 and L2 bandwidth, constants in calibration.toml), and the matmul class
by `wave_factor` (each recorded GEMM's output tiles over each GPU's SMs in whole waves).

Uncertainty per class (UNCERTAINTY) is stated, not fitted: each class's interval is its time
times 1 -/+ its share, summed (the classes' errors taken as moving together). Where the target
has a larger L2 than the source and the record has no kernel bins for the L2 model, memory-bound
kernels may read more from L2 than from DRAM: the low end allows up to L2_GAIN_MAX of their time
to go. A class whose bounding figure the
target lacks (fp8 on a GPU without FP8 tensor cores) has no basis: no prediction, said so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from stepbench.predict import memory
from stepbench.predict.gpus import Gpu
from stepbench.predict.source import Measured

# Relative uncertainty of each class's scaled time (a stated prior, not fitted: vendor peaks
# are reached to different fractions on different GPUs and clocks; attention kernels differ by
# backend between architectures; memory-bound kernels by cache sizes and access patterns).
UNCERTAINTY = {"matmul": 0.15, "attention": 0.25, "elementwise": 0.20, "reduction": 0.20,
               "optimizer": 0.20, "communication": 0.5, "transfer": 0.5}
MEMORY_CLASSES = ("elementwise", "reduction", "optimizer")
TENSOR_CLASSES = ("matmul", "attention")
# The low end's allowance for a target L2 larger than the source's (prior, not fitted).
L2_GAIN_MAX = 0.3
# The output tile of a GEMM kernel for wave quantization (a prior: cuBLAS picks 128 to 256 per
# side on these shapes; not fitted).
GEMM_TILE = 128
# A source step whose GPU was idle for more than this share of it was waiting on the host: the
# report's line (report/findings/speed.py HOST_BOUND, GPU busy under 85%). Profiled plain steps
# of llama-468m on one H200 ran 94-96% busy, compiled or not; at 5%, compile+sdpa's 5.4% idle
# (h200-2026-12-04-profile-matrix) kept its whole H200 step on every GPU: 67.7 ms on a B200,
# where eager+sdpa was predicted at 47.2 ms, with a zero-width interval.
HOST_BOUND_SHARE = 0.15
# Memory the CUDA context and the allocator's slack take beyond the step's peak reserved
# memory (GB): a prior from the H200 (nvidia-smi's total against torch's total_memory).
CONTEXT_GB = 1.0

# A setup's precision -> the tensor peak its matrix products run at. fp32 runs on CUDA cores
# (torch's default matmul precision), a figure the table does not hold: no basis.
MATMUL_DTYPE = {"bf16": "bf16", "fp16": "fp16", "autocast-bf16": "bf16", "mixed-bf16": "bf16",
                "float8": "fp8", "fp32": "fp32"}
# Attention kernels compute in the activations' dtype: bf16 under float8 linear layers.
ATTENTION_DTYPE = {**MATMUL_DTYPE, "float8": "bf16"}


@dataclass
class Prediction:
    """One setup on one target GPU."""

    gpu: str
    setup: str
    source: Measured
    step_ms: float | None = None
    step_ms_low: float | None = None
    step_ms_high: float | None = None
    classes_ms: dict = field(default_factory=dict)
    gpu_ms: float | None = None         # the target's kernels, summed
    host_ms: float | None = None        # the host's time per step (0: kept up on the source)
    fits: bool | None = None
    memory_needed_gb: float | None = None
    memory_usable_gb: float | None = None
    price_per_hour: float | None = None
    no_basis: str | None = None         # why nothing was predicted
    l2_model: bool = False              # memory-bound classes scaled by predict/memory.py

    @property
    def tokens_per_s(self) -> float | None:
        if self.step_ms is None or not self.source.tokens_per_step or not self.fits:
            return None
        return self.source.tokens_per_step / (self.step_ms / 1000)

    @property
    def tokens_per_dollar(self) -> float | None:
        if self.tokens_per_s is None or self.price_per_hour is None:
            return None
        return self.tokens_per_s * 3600 / self.price_per_hour

    def as_dict(self) -> dict:
        return {"gpu": self.gpu, "setup": self.setup, "predicted": True,
                "step_ms": self.step_ms, "step_ms_low": self.step_ms_low,
                "step_ms_high": self.step_ms_high, "fits": self.fits,
                "tokens_per_s": self.tokens_per_s, "tokens_per_dollar": self.tokens_per_dollar,
                "price_per_hour": self.price_per_hour,
                "memory_needed_gb": self.memory_needed_gb,
                "memory_usable_gb": self.memory_usable_gb, "classes_ms": self.classes_ms,
                "gpu_ms": self.gpu_ms, "host_ms": self.host_ms, "no_basis": self.no_basis,
                "source_gpu": self.source.gpu, "source_step_ms": self.source.step_ms,
                "source_torch": self.source.torch, "model": self.source.model,
                "batch": self.source.batch, "seq": self.source.seq}

    def csv_dict(self) -> dict:
        return {k: v for k, v in self.as_dict().items() if k != "classes_ms"}


CSV_KEYS = ["gpu", "setup", "predicted", "step_ms", "step_ms_low", "step_ms_high", "fits",
            "tokens_per_s", "tokens_per_dollar", "price_per_hour", "memory_needed_gb",
            "memory_usable_gb", "gpu_ms", "host_ms", "no_basis", "source_gpu",
            "source_step_ms", "source_torch", "model", "batch", "seq"]


def measured_rates(step: Measured, target: Gpu) -> tuple[float, float] | None:
    """The source's matmul rate measured in its run and the target's published one
    (gpus.toml `measured`), for a step whose matrix products run in bf16; else None (and on
    the GPU it was measured on, whose own figures scale by 1)."""
    if MATMUL_DTYPE.get(step.dtype) != "bf16" or step.gpu == target.name:
        return None
    src, tgt = step.matmul_tflops_measured, target.measured.get("bf16_matmul_tflops")
    return (src, tgt) if src and tgt else None


def bound_ratio(cls: str, source: Gpu, target: Gpu, dtype: str,
                rates: tuple[float, float] | None = None) -> tuple[float | None, str]:
    """Source over target of the figure that bounds `cls`; None and the figure's name where
    either GPU lacks it. `rates`: measured bf16 matmul rates (source, target) that replace
    the datasheet peaks for the tensor classes, both in bf16 (measured_rates)."""
    if cls in TENSOR_CLASSES:
        kinds = MATMUL_DTYPE if cls == "matmul" else ATTENTION_DTYPE
        if rates and kinds.get(dtype) == "bf16":
            return rates[0] / rates[1], "measured bf16 matmul rate"
        figure = f"{kinds.get(dtype, dtype)}_tflops"
    elif cls == "communication":
        figure = "nvlink_gbs" if source.get("nvlink_gbs") and target.get("nvlink_gbs") \
            else "pcie_gbs"
    elif cls == "transfer":
        figure = "pcie_gbs"
    else:
        figure = "memory_bandwidth_gbs"
    a, b = source.get(figure), target.get(figure)
    return (a / b if a and b else None), figure


def wave_share(tiles: int, sms: float) -> float:
    """The share of the SMs' slots a GEMM of `tiles` output tiles fills over its waves."""
    waves = math.ceil(tiles / sms)
    return tiles / (waves * sms)


def wave_factor(gemms: list | None, source: Gpu, target: Gpu) -> float:
    """The factor the matmul class's peak-scaled time is multiplied by for wave quantization:
    each recorded GEMM's output tiles (GEMM_TILE square) fill the source's and the target's SMs
    in whole waves, weighted by the GEMMs' time; 1 without shapes or SM counts."""
    s_sms, t_sms = source.get("sms"), target.get("sms")
    shaped = [g for g in gemms or [] if "m" in g and g.get("ms")]
    if not (s_sms and t_sms and shaped):
        return 1.0
    total = weighted = 0.0
    for g in shaped:
        per_call = (math.ceil(g["m"] / GEMM_TILE) * math.ceil(g["n"] / GEMM_TILE)
                    * g.get("batch", 1))
        weighted += g["ms"] * wave_share(per_call, s_sms) / wave_share(per_call, t_sms)
        total += g["ms"]
    return weighted / total


def _lacking(figure: str, source: Gpu, target: Gpu) -> str:
    names = dict.fromkeys(g.name for g in (source, target) if not g.get(figure))
    return " and ".join(names)


def memory_fit(source: Measured, target: Gpu) -> tuple[bool | None, float | None, float | None]:
    """Whether the step's peak reserved memory (else its peak allocated) plus CONTEXT_GB fits
    the target's memory; the GB needed and usable."""
    peak = source.peak_reserved_gb or source.peak_memory_gb
    if peak is None or target.memory_bytes is None:
        return None, None, None
    needed = peak + CONTEXT_GB
    usable = target.memory_bytes / 1e9
    return needed <= usable, needed, usable


def predict(source: Measured, src_gpu: Gpu, target: Gpu, price: float | None = None
            ) -> Prediction:
    """`source` (measured on `src_gpu`) on `target`."""
    p = Prediction(gpu=target.name, setup=source.setup, source=source, price_per_hour=price)
    p.fits, p.memory_needed_gb, p.memory_usable_gb = memory_fit(source, target)
    classes = {k: v for k, v in (source.classes_ms or {}).items() if v > 0}
    floor = source.kernel_floor_ms or 0.0
    counts = source.class_kernels or {}
    l2_src, l2_tgt = src_gpu.get("l2_mb"), target.get("l2_mb")
    l2_gain = (L2_GAIN_MAX * (1 - l2_src / l2_tgt) if l2_src and l2_tgt and l2_tgt > l2_src
               else 0.0)
    l2 = memory.l2_factors(source.memory_kernels, src_gpu, target)
    p.l2_model = bool(l2)
    waves = wave_factor(source.gemms, src_gpu, target)
    rates = measured_rates(source, target)
    low = high = mid = 0.0
    for cls, ms in classes.items():
        ratio, figure = bound_ratio(cls, src_gpu, target, source.dtype, rates)
        if ratio is None:
            p.no_basis = (f"{cls} on {target.name} has no basis: the GPU table has no "
                          f"{figure} for {_lacking(figure, src_gpu, target)}")
            continue
        ratio *= l2.get(cls, 1.0) * (waves if cls == "matmul" else 1.0)
        # Each kernel's latency floor is kept unscaled.
        fixed = min(floor * counts.get(cls, 0), ms)
        scaled = fixed + (ms - fixed) * ratio
        p.classes_ms[cls] = scaled
        u = UNCERTAINTY.get(cls, 0.5)
        mid += scaled
        high += scaled * (1 + u)
        # The low end's L2 allowance only where the L2 model did not already act on the class.
        gain = l2_gain if cls in MEMORY_CLASSES and cls not in l2 else 0.0
        low += scaled * (1 - u - gain)
    if p.no_basis:
        p.classes_ms = {}
        return p
    idle = source.idle_ms or 0.0
    host_bound = source.step_ms and idle > HOST_BOUND_SHARE * source.step_ms
    host = source.step_ms if host_bound else 0.0
    p.gpu_ms, p.host_ms = mid, host
    p.step_ms = max(mid, host)
    p.step_ms_low = max(low, host)
    p.step_ms_high = max(high + idle, host)
    return p
