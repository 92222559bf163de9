"""`stepbench peak`: how fast this device multiplies matrices, next to its datasheet peak.

MFU against the datasheet tells how far a setup is from a number the GPU never reaches; MFU
against the measured matmul rate tells how far it is from what this GPU, with this driver and
these clocks, actually does. This command measures that rate (the same function the runner uses
for `peak_tflops_measured`) so a user can see both and judge a card before running a matrix.
"""

from __future__ import annotations

import argparse
import json

from stepbench import table
from stepbench.errors import UserError

DEVICES = ("auto", "cuda", "cpu")
PEAK_DTYPES = ("bf16", "fp16", "fp32", "tf32")


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Create the "peak" subcommand on `subparsers`; its handler is `cmd_peak`."""
    parser = subparsers.add_parser(
        "peak", help="measure the dense matmul rate of this device and compare it with the "
                     "datasheet peak",
        description="Measure the dense matmul rate (TFLOP/s) of this device on random n x n "
                    "matrices and print it next to the vendor's dense datasheet peak.")
    parser.add_argument("--device", choices=DEVICES, default="auto",
                        help="where to measure; auto: cuda when available, else cpu "
                             "(default: %(default)s)")
    parser.add_argument("--dtype", choices=PEAK_DTYPES, default="bf16",
                        help="matrix dtype; fp32 uses CUDA cores, tf32 tensor cores on fp32 "
                             "tensors (CUDA only) (default: %(default)s)")
    parser.add_argument("--size", type=int, default=None, metavar="N",
                        help="matrix size n (default: 8192 on cuda, 1024 on cpu)")
    parser.add_argument("--repeats", type=int, default=None, metavar="R",
                        help="timed repeats; the median is reported (default: 20 on cuda, "
                             "5 on cpu)")
    parser.add_argument("--sustained", type=float, default=0.0, metavar="SECONDS",
                        help="run products back to back for SECONDS before timing, to measure "
                             "the rate under the GPU's power cap instead of the burst rate at "
                             "full boost clock (CUDA only) (default: %(default)s)")
    parser.add_argument("--format", choices=("table", "json"), default="table",
                        help="table for people, json (one object) for scripts "
                             "(default: %(default)s)")
    parser.set_defaults(handler=cmd_peak)
    return parser


def cmd_peak(args: argparse.Namespace) -> int:
    """Measure, then print one table row or one JSON object; UserError for impossible requests."""
    result = measure_peak(args.device, args.dtype, args.size, args.repeats, args.sustained)
    if args.format == "json":
        print(json.dumps(result))
    else:
        print(render_peak(result), end="")
    return 0


def measure_peak(device: str = "auto", dtype: str = "bf16", size: int | None = None,
                 repeats: int | None = None, sustained_s: float = 0.0) -> dict:
    """Measure the matmul rate and look up the datasheet peak; returns the JSON object.

    Keys: device ("cuda" or "cpu"), gpu (torch's device name, or "cpu" as in result records),
    cpu (model name on cpu, else null), dtype, size, repeats, sustained_s (0: burst rate),
    measured_tflops, datasheet_tflops
    (null when the GPU or dtype is not in the table), fraction_of_datasheet (null likewise).
    """
    import torch

    resolved = _resolve_device(device, torch)
    if size is not None and size <= 0:
        raise UserError(f"--size must be a positive matrix size, got {size}")
    if repeats is not None and repeats <= 0:
        raise UserError(f"--repeats must be positive, got {repeats}")
    if dtype == "tf32" and resolved == "cpu":
        raise UserError("tf32 is a CUDA tensor-core mode; use --dtype fp32 on cpu")
    if sustained_s < 0 or (sustained_s > 0 and resolved == "cpu"):
        raise UserError(f"--sustained takes seconds >= 0 and works on cuda only, got "
                        f"{sustained_s:g} on {resolved}")
    size = size or (8192 if resolved == "cuda" else 1024)
    repeats = repeats or (20 if resolved == "cuda" else 5)
    from stepbench import flops  # imports torch: only when measuring, not for --help

    measured = flops.measure_matmul_tflops(resolved, dtype, n=size, repeats=repeats,
                                           sustained_s=sustained_s)
    gpu = torch.cuda.get_device_name() if resolved == "cuda" else "cpu"
    datasheet = flops.datasheet_peak(gpu, dtype) if resolved == "cuda" else None
    return {
        "device": resolved,
        "gpu": gpu,
        "cpu": _cpu_name() if resolved == "cpu" else None,
        "dtype": dtype,
        "size": size,
        "repeats": repeats,
        "sustained_s": sustained_s,
        "measured_tflops": measured,
        "datasheet_tflops": datasheet,
        "fraction_of_datasheet": measured / datasheet if datasheet else None,
    }


def render_peak(result: dict) -> str:
    """The human table for one `measure_peak` result."""
    name = result["gpu"] if result["device"] == "cuda" else f"cpu ({result['cpu']})"
    fraction = result["fraction_of_datasheet"]
    row = [name, result["dtype"], str(result["size"]),
           table.num(result["measured_tflops"], _digits(result["measured_tflops"])),
           table.num(result["datasheet_tflops"], 1),
           "-" if fraction is None else f"{fraction:.0%}"]
    n = result["size"]
    when = (f"after {result['sustained_s']:g} s of sustained load (the power-capped rate)"
            if result.get("sustained_s") else "after a short warm-up (the burst rate)")
    notes = [f"measured: median of {result['repeats']} timed {n} x {n} x {n} products on random "
             f"data (2*n^3 FLOPs each), {when}.",
             "datasheet: the vendor's dense peak (no sparsity) for this dtype, "
             "stepbench.flops.DATASHEET_PEAK_TFLOPS; '-' where the GPU or dtype is not listed."]
    return table.render(["device", "dtype", "size", "measured TFLOP/s", "datasheet TFLOP/s",
                         "of datasheet"], [row], "table", footnotes=notes)


def _resolve_device(device: str, torch) -> str:
    cuda = torch.cuda.is_available()
    if device == "auto":
        return "cuda" if cuda else "cpu"
    if device == "cuda" and not cuda:
        raise UserError("CUDA was requested but torch.cuda.is_available() is False; "
                        "use --device cpu")
    if device not in ("cuda", "cpu"):
        raise UserError(f"unknown device {device!r}; choose one of: {', '.join(DEVICES)}")
    return device


def _digits(value: float) -> int:
    # A CPU rate of 0.05 TFLOP/s printed with one decimal would read "0.1" or "0.0".
    return 1 if value >= 10 else 3


def _cpu_name() -> str:
    from stepbench.results import machine_info

    return machine_info("cpu")["cpu"]
