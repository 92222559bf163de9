"""`stepbench predict RESULTS --gpu "L40S,H100 PCIe"`: a measured setup's step time, fit and
tokens per dollar on GPUs not measured, scaled class by class from its profiled kernels
(docs/predict.md). Reads records and the GPU table only: no torch import, no GPU."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from stepbench.cli.base import add_output, out_is_not
from stepbench.report.render import FORMATS  # the Document's formats, as report renders them


def add(sub) -> None:
    p = sub.add_parser(
        "predict", help="predict step time, fit and tokens per dollar on GPUs not measured",
        description="Scale each setup's profiled step (stepbench run --profile DIR) to other "
                    "GPUs: each kernel class by the figure that bounds it (tensor peak, memory "
                    "bandwidth, interconnect), the host's time kept. A prediction, not a "
                    "measurement.")
    p.add_argument("results", nargs="+", metavar="RESULTS",
                   help="results files (*.jsonl) or folders of them, measured with --profile")
    p.add_argument("--gpu", metavar="NAMES",
                   help='target GPUs, comma-separated ("L40S,H100 PCIe,RTX 5090"; default: '
                        "every GPU of the table)")
    p.add_argument("--price-list", metavar="FILE",
                   help="dollars per hour per GPU (.toml [prices] or .csv gpu,price_per_hour) "
                        "for tokens per dollar")
    p.add_argument("--traces", action="append", metavar="DIR",
                   help="where the profiled steps' traces are, for records without kernel "
                        "classes (default: the folder the record names, STEM-traces or "
                        "STEM-profiles beside the results file)")
    add_output(p, FORMATS)
    p.set_defaults(handler=cmd_predict)


def gpu_names(value: str | None) -> list[str]:
    from stepbench.errors import UserError
    from stepbench.predict import gpus
    from stepbench.settings.report import names as split_names

    if value is None:
        return list(gpus.table())
    names = list(split_names(value))
    if not names:
        raise UserError('--gpu takes GPU names separated by commas, e.g. --gpu "L40S,H100 PCIe"')
    return names


def cmd_predict(args: argparse.Namespace) -> int:
    from stepbench.predict.document import build
    from stepbench.report.render import render, write_output

    out_is_not(args.out, args.price_list, "--price-list")
    warnings = []
    doc = build(args.results, gpu_names(args.gpu), args.price_list, args.traces,
                warn=warnings.append)
    for text in warnings:
        print(f"stepbench predict: {text}", file=sys.stderr)
    text = render(doc, args.format)
    if args.out:
        write_output(text, Path(args.out))
        print(f"stepbench predict: wrote {args.out}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0
