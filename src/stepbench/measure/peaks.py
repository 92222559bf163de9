"""How fast this GPU can multiply matrices: the vendor's datasheet peak and the measured rate.

MFU against the datasheet tells how far a setup is from a number the GPU never reaches; MFU
against the measured matmul rate tells how far it is from what this GPU, with this driver and
these clocks, actually does. Both are kept (`stepbench peak` prints them side by side; a run
measures the rate once and gives every record its mfu_measured).
"""

from __future__ import annotations

import contextlib
import math
import re
import statistics
import time
from datetime import timedelta

import torch

from stepbench.errors import UserError, check_number, out_of_memory
from stepbench.measure.cache import JsonCache, positive_number
from stepbench.measure.machine import cpu_name, gpu_name, resolve_device

# ----------------------------------------------------------------------------------------------
# Peaks: datasheet
# ----------------------------------------------------------------------------------------------

# Dense (no 2:4 sparsity) peak TFLOP/s per GPU and dtype, keyed by the name NVML and
# torch.cuda.get_device_name() report. Source: the vendor's datasheet or architecture
# whitepaper; where the datasheet gives only "with sparsity" figures they are halved.
#   bf16 / fp16: tensor cores, FP32 accumulate (what PyTorch's matmuls use). GeForce cards run
#                FP32 accumulate at half their FP16-accumulate rate, so their entries are the
#                smaller number (RTX 4090: 165.2, not 330.3).
#   tf32:        tensor cores on fp32 tensors (torch.set_float32_matmul_precision("high")).
#   fp32:        CUDA cores, no tensor cores: plain fp32 matmuls under torch's default precision.
# A dtype the GPU has no fast path for is None. Left out on purpose: the A10G (an AWS variant
# with no NVIDIA datasheet; published figures disagree), and any GPU whose number we could not
# tie to a vendor document. A missing GPU gives mfu_datasheet = null, never a guess.
_H100_SXM = {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9}    # H100 whitepaper / datasheet
_H100_PCIE = {"bf16": 756.5, "fp16": 756.5, "tf32": 378.0, "fp32": 51.2}   # datasheet: 1513 / 756 sparse
_HOPPER_NVL = {"bf16": 835.5, "fp16": 835.5, "tf32": 417.5, "fp32": 60.0}  # datasheet: 1671 / 835 sparse
_A100 = {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5}        # A100 datasheet, all forms

DATASHEET_PEAK_TFLOPS: dict[str, dict[str, float | None]] = {
    # Hopper
    "NVIDIA H100 80GB HBM3": _H100_SXM,
    "NVIDIA H100 PCIe": _H100_PCIE,
    "NVIDIA H100 NVL": _HOPPER_NVL,
    "NVIDIA H200": _H100_SXM,            # H200 SXM datasheet: same compute as H100 SXM
    "NVIDIA H200 NVL": _HOPPER_NVL,      # H200 NVL datasheet: 1671 / 835 sparse, FP32 60
    # Blackwell (HGX B200 datasheet, per GPU at 1000 W: BF16 4.5 PF, TF32 2.2 PF sparse; FP32 75)
    "NVIDIA B200": {"bf16": 2250.0, "fp16": 2250.0, "tf32": 1100.0, "fp32": 75.0},
    # Ampere data center
    "NVIDIA A100-SXM4-80GB": _A100,
    "NVIDIA A100-SXM4-40GB": _A100,
    "NVIDIA A100-PCIE-40GB": _A100,
    "NVIDIA A100 80GB PCIe": _A100,
    "NVIDIA A10": {"bf16": 125.0, "fp16": 125.0, "tf32": 62.5, "fp32": 31.2},   # A10 datasheet
    # Ada data center (L40S / L40 / L4 datasheets; the L40 is rated at half the L40S tensor rate)
    "NVIDIA L40S": {"bf16": 362.05, "fp16": 362.05, "tf32": 183.0, "fp32": 91.6},
    "NVIDIA L40": {"bf16": 181.05, "fp16": 181.05, "tf32": 90.5, "fp32": 90.5},
    "NVIDIA L4": {"bf16": 121.0, "fp16": 121.0, "tf32": 60.0, "fp32": 30.3},
    # Workstation (datasheets; FP32 accumulate runs at full rate on these)
    "NVIDIA RTX A6000": {"bf16": 154.8, "fp16": 154.8, "tf32": 77.4, "fp32": 38.7},
    "NVIDIA RTX 6000 Ada Generation": {"bf16": 364.2, "fp16": 364.2, "tf32": 182.1, "fp32": 91.1},
    # GeForce (architecture whitepapers, "with FP32 accumulate" rows)
    "NVIDIA GeForce RTX 3090": {"bf16": 71.0, "fp16": 71.0, "tf32": 35.6, "fp32": 35.6},
    "NVIDIA GeForce RTX 4090": {"bf16": 165.2, "fp16": 165.2, "tf32": 82.6, "fp32": 82.6},
    "NVIDIA GeForce RTX 5090": {"bf16": 209.5, "fp16": 209.5, "tf32": 104.8, "fp32": 104.8},
    # Volta (V100 datasheet): no bf16 or tf32 tensor cores
    "Tesla V100-SXM2-16GB": {"bf16": None, "fp16": 125.0, "tf32": None, "fp32": 15.7},
    "Tesla V100-SXM2-32GB": {"bf16": None, "fp16": 125.0, "tf32": None, "fp32": 15.7},
    "Tesla V100-PCIE-16GB": {"bf16": None, "fp16": 112.0, "tf32": None, "fp32": 14.0},
    "Tesla V100-PCIE-32GB": {"bf16": None, "fp16": 112.0, "tf32": None, "fp32": 14.0},
    "Tesla V100S-PCIE-32GB": {"bf16": None, "fp16": 130.0, "tf32": None, "fp32": 16.4},
}

# Other spellings people type or tools print, for the fuzzy match. Only names that pick one
# entry: "H100" alone is left out because SXM, PCIe and NVL differ by 30%.
_ALIASES: dict[str, str] = {
    "H100 SXM": "NVIDIA H100 80GB HBM3",
    "H100 SXM5": "NVIDIA H100 80GB HBM3",
    "H200 SXM": "NVIDIA H200",
    "A100": "NVIDIA A100-SXM4-80GB",          # every A100 has the same peaks
    "RTX 6000 Ada": "NVIDIA RTX 6000 Ada Generation",
    "V100 SXM2": "Tesla V100-SXM2-16GB",
    "V100 PCIe": "Tesla V100-PCIE-16GB",
    "V100S": "Tesla V100S-PCIE-32GB",
}

# Words that do not tell two entries apart: the vendor, the brand, memory sizes.
_NOISE_TOKENS = {"nvidia", "geforce", "tesla", "generation"}
# Extra words a query may carry beyond an entry's own words and still match it: form factors
# and memory kinds, which the entry's own name may leave out ("NVIDIA H200" vs "H200 SXM 141GB").
_QUALIFIER_TOKENS = {"sxm", "sxm2", "sxm4", "sxm5", "sxm6", "pcie", "hbm2", "hbm2e", "hbm3",
                     "hbm3e", "gddr6", "gddr6x", "gddr7"}

DTYPES = ("bf16", "fp16", "tf32", "fp32")
_DTYPE_NAMES = {"bf16": "bf16", "bfloat16": "bf16", "fp16": "fp16", "float16": "fp16",
                "half": "fp16", "tf32": "tf32", "fp32": "fp32", "float32": "fp32", "float": "fp32"}


def normalize_dtype(dtype: str | torch.dtype) -> str:
    """'bf16', 'fp16', 'tf32' or 'fp32' for a name or torch dtype; ValueError names the choices."""
    name = str(dtype).removeprefix("torch.").lower()
    if name not in _DTYPE_NAMES:
        raise ValueError(f"unknown dtype {dtype!r}; choose one of: {', '.join(DTYPES)}")
    return _DTYPE_NAMES[name]


def _tokens(name: str) -> frozenset[str]:
    words = re.split(r"[^a-z0-9]+", name.lower())
    return frozenset(w for w in words
                     if w and w not in _NOISE_TOKENS and not re.fullmatch(r"\d+gb", w))


_MATCH_KEYS: list[tuple[frozenset[str], str]] = (
    [(_tokens(name), name) for name in DATASHEET_PEAK_TFLOPS]
    + [(_tokens(alias), name) for alias, name in _ALIASES.items()])


def datasheet_entry(gpu_name: str) -> str | None:
    """The DATASHEET_PEAK_TFLOPS key for `gpu_name`, or None when unknown or ambiguous.

    Exact name first. Otherwise the name's words (lower case, split on anything not a letter or
    digit, without "NVIDIA", "GeForce", "Tesla" and memory sizes like "80GB") must contain all the
    words of an entry or alias, and any extra words must be form factors or memory kinds
    ("SXM5", "PCIe", "HBM3"). "h100 pcie" and "NVIDIA H100-SXM5-80GB" match; "NVIDIA GeForce RTX
    4090 D" (a different, smaller chip) and "GH200" do not. The entry with the most words wins;
    a tie between entries with different peaks gives None rather than a guess.
    """
    if gpu_name in DATASHEET_PEAK_TFLOPS:
        return gpu_name
    query = _tokens(gpu_name)
    if not query:
        return None
    candidates = [(len(key), name) for key, name in _MATCH_KEYS
                  if key <= query and (query - key) <= _QUALIFIER_TOKENS]
    if not candidates:
        return None
    best = max(size for size, _ in candidates)
    names = {name for size, name in candidates if size == best}
    peaks = {tuple(sorted(DATASHEET_PEAK_TFLOPS[n].items(), key=lambda kv: kv[0])) for n in names}
    if len(peaks) > 1:
        return None
    return sorted(names)[0]


def datasheet_peak(gpu_name: str | None, dtype: str | torch.dtype) -> float | None:
    """Dense datasheet peak TFLOP/s of `gpu_name` for `dtype` (see DATASHEET_PEAK_TFLOPS).

    None for an unknown GPU, "cpu", or a dtype the GPU has no tensor-core or datasheet figure for.
    """
    if not gpu_name:
        return None
    entry = datasheet_entry(gpu_name)
    if entry is None:
        return None
    return DATASHEET_PEAK_TFLOPS[entry].get(normalize_dtype(dtype))


# ----------------------------------------------------------------------------------------------
# Peaks: measured
# ----------------------------------------------------------------------------------------------

@contextlib.contextmanager
def _float32_matmul_precision(dtype: str):
    # fp32 must mean CUDA cores (to match the datasheet's fp32 row) and tf32 tensor cores,
    # whatever the caller set; restored afterwards. set_float32_matmul_precision is the one API
    # that works with both of torch's TF32 switches (mixing allow_tf32 and fp32_precision raises).
    old = torch.get_float32_matmul_precision()
    if dtype in ("fp32", "tf32"):
        torch.set_float32_matmul_precision("highest" if dtype == "fp32" else "high")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(old)


# The product's size and how many are timed, by device type (measure_matmul_tflops' docstring).
DEFAULT_SIZE = {"cuda": 8192, "cpu": 1024}
DEFAULT_REPEATS = {"cuda": 20, "cpu": 5}

_TORCH_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "tf32": torch.float32,
                 "fp32": torch.float32}


def measure_matmul_tflops(device: str | torch.device = "cuda", dtype: str | torch.dtype = "bf16",
                          n: int | None = None, repeats: int | None = None, *,
                          sustained_s: float = 0.0) -> float:
    """The device's dense matmul rate in TFLOP/s: median over `repeats` timed n x n x n products.

    Random normal inputs, not zeros (zeros run faster on some GPUs). n defaults to 8192 on CUDA
    (1.1 TFLOP per product) and 1024 on CPU; repeats to 20 on CUDA, 5 on CPU.

    On CUDA, by default this is the burst rate at full boost clock: a few warm-up products (cuBLAS
    picks its kernel, clocks leave idle), then each repeat timed between its own pair of CUDA events
    (a repeat is one product, or as many back-to-back products as make 1 ms when n is small), one
    synchronize at the end. At n=8192 that is about 35 ms of load, too short for the power limit to
    act. Under sustained load a GPU settles at its power cap and the rate falls (docs/mfu.md).
    `sustained_s` > 0 runs that many seconds of products before timing and so measures the
    power-capped rate instead. Keep n large on a fast GPU: products launched one by one from Python
    cannot keep a big GPU busy below n of a few thousand. On CPU: one warm-up product, then
    perf_counter around each product.
    """
    dev = torch.device(device)
    dt = normalize_dtype(dtype)
    if dt == "tf32" and dev.type != "cuda":
        raise ValueError("tf32 is a CUDA tensor-core mode; use fp32 on cpu")
    cuda = dev.type == "cuda"
    kind = "cuda" if cuda else "cpu"
    n = n or DEFAULT_SIZE[kind]
    repeats = repeats or DEFAULT_REPEATS[kind]
    if n <= 0 or repeats <= 0 or sustained_s < 0:
        raise ValueError(f"n and repeats must be positive and sustained_s not negative, got "
                         f"n={n}, repeats={repeats}, sustained_s={sustained_s}")
    generator = torch.Generator(device=dev).manual_seed(0)
    a = torch.randn(n, n, device=dev, dtype=_TORCH_DTYPES[dt], generator=generator)
    b = torch.randn(n, n, device=dev, dtype=_TORCH_DTYPES[dt], generator=generator)
    out = torch.empty_like(a)
    flop_per_matmul = 2.0 * n ** 3
    with _float32_matmul_precision(dt):
        if cuda:
            seconds_per_matmul = _median_cuda_seconds(a, b, out, repeats, sustained_s)
        else:
            seconds_per_matmul = _median_cpu_seconds(a, b, out, repeats)
    return flop_per_matmul / seconds_per_matmul / 1e12


def _median_cuda_seconds(a, b, out, repeats: int, sustained_s: float) -> float:
    def products(count: int) -> float:
        """Run `count` products, synchronized; return their host-clock seconds."""
        torch.cuda.synchronize(a.device)
        start = time.perf_counter()
        for _ in range(count):
            torch.mm(a, b, out=out)
        torch.cuda.synchronize(a.device)
        return time.perf_counter() - start

    products(1)                          # cuBLAS handle, workspace and kernel choice
    per_matmul_s = products(3) / 3       # clocks ramp up from idle; also sizes the batch below
    if sustained_s > 0:
        start = time.perf_counter()
        while time.perf_counter() - start < sustained_s:
            products(8)
    # At least 1 ms per timed repeat, so that launch gaps and event resolution do not count for
    # small n; large n time one product per repeat.
    batch = max(1, min(1000, math.ceil(0.001 / max(per_matmul_s, 1e-9))))
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(repeats)]
    for begin, end in events:
        begin.record()
        for _ in range(batch):
            torch.mm(a, b, out=out)
        end.record()
    torch.cuda.synchronize(a.device)
    return statistics.median(begin.elapsed_time(end) / 1e3 / batch for begin, end in events)


def _median_cpu_seconds(a, b, out, repeats: int) -> float:
    torch.mm(a, b, out=out)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        torch.mm(a, b, out=out)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


# A measured rate is kept for a week per GPU model, driver, torch and CUDA version, and dtype: a
# driver or torch upgrade, another GPU or an old entry is measured again (measure/cache.py).
PEAK_CACHE = JsonCache("peaks", max_age=timedelta(days=7))


def peak_cache_key(dtype: str, index: int = 0) -> dict | None:
    """What a cached matmul rate must match: None when the driver cannot be named (NVML off or
    missing), since then a driver upgrade would go unseen."""
    from stepbench.measure import telemetry

    driver = telemetry.gpu_facts(index).get("driver")
    if not driver:
        return None
    return {"gpu": gpu_name("cuda", index), "driver": driver, "torch": torch.__version__,
            "cuda": torch.version.cuda, "dtype": normalize_dtype(dtype), "n": DEFAULT_SIZE["cuda"],
            "repeats": DEFAULT_REPEATS["cuda"]}


def cached_matmul_tflops(dtype: str, index: int = 0,
                         measure: bool = True) -> tuple[float, str] | None:
    """(TFLOP/s, when it was measured) for CUDA device `index`: the cached burst rate when one
    matches this GPU, driver, torch and dtype and is under a week old, else measured now (under a second
    on a big GPU) and cached; without `measure`, None instead. Runs in the setup's own process,
    before its model is built: never beside a timed step."""
    found = PEAK_CACHE.fetch(peak_cache_key(dtype, index),
                             lambda: measure_matmul_tflops(f"cuda:{index}", dtype),
                             valid=positive_number, cached_only=not measure)
    return None if found is None else (float(found[0]), found[1])


# ----------------------------------------------------------------------------------------------
# `stepbench peak`
# ----------------------------------------------------------------------------------------------

def measure_peak(device: str = "auto", dtype: str = "bf16", size: int | None = None,
                 repeats: int | None = None, sustained_s: float = 0.0) -> dict:
    """Measure the matmul rate and look up the datasheet peak; returns the JSON object.

    Keys: device ("cuda" or "cpu"), gpu (machine.gpu_name, "cpu" as in result records),
    cpu (model name on cpu, else null), dtype, size, repeats, sustained_s (0: burst rate),
    measured_tflops, datasheet_tflops
    (null when the GPU or dtype is not in the table), fraction_of_datasheet (null likewise).
    """
    resolved = resolve_device(device)
    for flag, value in (("--size", size), ("--repeats", repeats)):
        if value is not None:
            check_number(value, flag, int, least=1)
    if dtype == "tf32" and resolved == "cpu":
        raise UserError("tf32 is a CUDA tensor-core mode; use --dtype fp32 on cpu")
    if not 0 <= sustained_s < math.inf or (sustained_s > 0 and resolved == "cpu"):
        raise UserError(f"--sustained takes seconds >= 0 and works on cuda only, got "
                        f"{sustained_s:g} on {resolved}")
    size = size or DEFAULT_SIZE[resolved]
    repeats = repeats or DEFAULT_REPEATS[resolved]
    try:
        measured = measure_matmul_tflops(resolved, dtype, n=size, repeats=repeats,
                                         sustained_s=sustained_s)
    except (RuntimeError, MemoryError) as exc:
        if not out_of_memory(exc):
            raise
        raise UserError(f"--size {size}: two {size} x {size} {dtype} matrices and their product "
                        f"do not fit in this {resolved}'s memory; pass a smaller --size "
                        f"(default {DEFAULT_SIZE[resolved]})", kind="bad_value") from None
    gpu = gpu_name(resolved)
    datasheet = datasheet_peak(gpu, dtype) if resolved == "cuda" else None
    return {
        "device": resolved,
        "gpu": gpu,
        "cpu": cpu_name() if resolved == "cpu" else None,
        "dtype": dtype,
        "size": size,
        "repeats": repeats,
        "sustained_s": sustained_s,
        "measured_tflops": measured,
        "datasheet_tflops": datasheet,
        "fraction_of_datasheet": measured / datasheet if datasheet else None,
    }
