"""`stepbench report` (result files from any number of machines as one table, findings and
plots), `stepbench peak` (the device's matmul rate) and `stepbench prices` (a provider's hourly
prices as a price file)."""

from __future__ import annotations

import argparse
import gc
import json
import sys
from pathlib import Path

from stepbench.cli.base import add_output, out_is_not, output_path
from stepbench.cli.flags import add_settings
from stepbench.errors import UserError
from stepbench.report.render import FORMATS as REPORT_FORMATS  # every format a Document renders
from stepbench.settings.report import ReportSettings


# ---------------------------------------------------------------- report



def add(sub) -> None:
    p = sub.add_parser(
        "report", help="join result files into one table with cost per token, findings, plots",
        description="Join result files from any number of machines into one table (GPU x "
                    "setup) with cost per token and findings written from the numbers.")
    p.add_argument("files", nargs="+", metavar="FILE",
                   help="results files (*.jsonl) or folders of them")
    p.add_argument("--prices", metavar="FILE",
                   help="price list, .toml ([prices] \"GPU name\" = dollars per hour) or .csv "
                        "(gpu,price_per_hour); see docs/report.md")
    p.add_argument("--price", action="append", default=[], metavar="GPU=DOLLARS",
                   help='price of one GPU per hour, repeatable, over the price file: '
                        '--price "NVIDIA H100 PCIe=3.86"')
    p.add_argument("--energy-price", metavar="DOLLARS_PER_KWH",
                   help="price of electricity in dollars per kWh: adds the GPU's energy cost "
                        "per million tokens to the details (records with NVML energy only)")
    add_output(p, REPORT_FORMATS)
    p.add_argument("--plots", metavar="DIR", help="also write the plots as PNG files into DIR")
    p.add_argument("--label", action="append", metavar="NAME",
                   help="a name for each FILE, once per FILE in order: its records keep rows of "
                        "their own, named with it (\"NVIDIA H200 (main)\"), instead of being "
                        "combined with the others' as repeats")
    add_filters(p)
    add_settings(p, ReportSettings)
    p.set_defaults(handler=cmd_report)


def add_filters(p) -> None:
    """--model, --setup, --gpu: which records a report or comparison reads (report/select.py)."""
    p.add_argument("--model", action="append", metavar="NAME",
                   help="keep only these models: names or globs, comma list, repeatable "
                        "(matched without case to the model's label or path: llama-468m, "
                        "'qwen*')")
    p.add_argument("--setup", action="append", metavar="NAME",
                   help="keep only these setups: names or globs, comma list, repeatable "
                        "(compile+sdpa, 'compile*')")
    p.add_argument("--gpu", action="append", metavar="NAME",
                   help="keep only these GPUs: names or globs, comma list, repeatable, with or "
                        "without the leading NVIDIA (H100, '*H100*', 'NVIDIA L40S', cpu)")


def filters_of(args: argparse.Namespace):
    from stepbench.report.select import Filters

    return Filters.parse(args.model, args.setup, args.gpu)


def report_settings(args: argparse.Namespace) -> ReportSettings:
    """The declared settings of `report` (settings/report.py), checked; the GPUs of --predict
    looked up before any file is read (an unknown one: the closest names, exit 2)."""
    from stepbench.settings.declare import read
    from stepbench.settings.origin import Origin

    settings = ReportSettings(**read(ReportSettings, vars(args), Origin()))
    if settings.predict:
        from stepbench.predict import gpus

        for name in settings.predict:
            gpus.lookup(name)
    return settings


def prices_of(args: argparse.Namespace) -> dict[str, float]:
    """Dollars an hour by GPU: --prices FILE, then each --price GPU=DOLLARS over it."""
    from stepbench.report.prices import load_price_file, parse_price_flags

    prices = load_price_file(args.prices) if args.prices else {}
    prices.update(parse_price_flags(list(args.price)))
    return prices


def predicted_section(args: argparse.Namespace, names: tuple[str, ...], prices: dict):
    """`report --predict`'s Document, from the records the report reads (its filters applied),
    at the report's prices; made before the report, so that records without a profile stop it
    before anything else is said."""
    from stepbench.predict.document import build

    filters = filters_of(args)
    # The report has read these files once and said what it skipped; predict reads them again.
    return build(args.files, list(names), prices=prices, keep=filters.apply,
                 price_flag="--prices FILE or --price GPU=DOLLARS")


def add_predictions(doc, predicted) -> None:
    """The predicted section in the report `doc`: its table (notes under it), its rows as
    JSON's `predictions` and as CSV rows with columns of their own."""
    from stepbench.predict.document import report_csv

    doc.tables.extend(predicted.tables)
    doc.extra["predictions"] = [p.as_dict() for p in predicted.rows]
    doc.csv_more.append(report_csv(predicted.rows))


def cmd_report(args: argparse.Namespace) -> int:
    # The report makes its records, rows and findings, tens of thousands of objects that live
    # until it ends: the cyclic garbage collector would walk them again and again and free
    # nothing (a tenth of a 3,200-setup report's time). Off while it runs.
    collecting = gc.isenabled()
    gc.disable()
    try:
        return _report(args)
    finally:
        if collecting:
            gc.enable()


def _report(args: argparse.Namespace) -> int:
    from stepbench.report.document import report_document, warn
    from stepbench.report.render import render, write_output

    settings = report_settings(args)
    out_is_not(args.out, args.prices, "--prices")
    prices = prices_of(args)
    predicted = predicted_section(args, settings.predict, prices) if settings.predict else None
    doc = report_document(args.files, prices=prices, energy_price=args.energy_price,
                          plots=bool(args.plots) or args.format == "html",
                          filters=filters_of(args), labels=args.label)
    if predicted is not None:
        add_predictions(doc, predicted)
    text = render(doc, args.format)
    if args.plots:
        for path in doc.write_plots(Path(args.plots)):
            warn(f"wrote {path}", prefix="")
        if doc.plots_note:
            warn(doc.plots_note, prefix="")
    if args.out:
        write_output(text, Path(args.out))
        warn(f"wrote {args.out}", prefix="")
    else:
        sys.stdout.write(text)
    return 0


# ---------------------------------------------------------------- peak

def add_peak(sub) -> None:
    p = sub.add_parser(
        "peak", help="measure the dense matmul rate of this device and compare it with the "
                     "datasheet peak",
        description="Measure the dense matmul rate (TFLOP/s) of this device on random n x n "
                    "matrices and print it next to the vendor's dense datasheet peak.")
    p.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto",
                   help="where to measure; auto: cuda when available, else cpu "
                        "(default: %(default)s)")
    p.add_argument("--dtype", choices=("bf16", "fp16", "fp32", "tf32"), default="bf16",
                   help="matrix dtype; fp32 uses CUDA cores, tf32 tensor cores on fp32 "
                        "tensors (CUDA only) (default: %(default)s)")
    p.add_argument("--size", type=int, default=None, metavar="N",
                   help="matrix size n (default: 8192 on cuda, 1024 on cpu)")
    p.add_argument("--repeats", type=int, default=None, metavar="R",
                   help="timed repeats; the median is reported (default: 20 on cuda, 5 on cpu)")
    p.add_argument("--sustained", type=float, default=0.0, metavar="SECONDS",
                   help="run products back to back for SECONDS before timing, to measure "
                        "the rate under the GPU's power cap instead of the burst rate at "
                        "full boost clock (CUDA only) (default: %(default)s)")
    p.add_argument("--format", choices=("table", "json"), default="table",
                   help="table for people, json (one object) for scripts (default: %(default)s)")
    p.set_defaults(handler=cmd_peak)


def cmd_peak(args: argparse.Namespace) -> int:
    from stepbench.measure.peaks import measure_peak

    result = measure_peak(args.device, args.dtype, args.size, args.repeats, args.sustained)
    if args.format == "json":
        print(json.dumps(result))
    else:
        from stepbench.report.render import render
        from stepbench.report.document import peak_document

        print(render(peak_document(result), "table"), end="")
    return 0


# ---------------------------------------------------------------- prices

def add_prices(sub) -> None:
    p = sub.add_parser(
        "prices", help="write a provider's hourly GPU prices as a price file for report --prices",
        description="Ask a GPU provider for today's hourly prices of its instance types and "
                    "write them in the price-file format `stepbench report --prices` reads "
                    "(dollars per GPU-hour, the cheapest offer of each GPU type).")
    p.add_argument("--from", dest="provider", required=True, metavar="PROVIDER",
                   help="the provider: runcrate (its API key from the environment: "
                        "RUNCRATE_API_KEY)")
    p.add_argument("--out", type=output_path, metavar="FILE",
                   help="write the TOML price file here (default: stdout)")
    p.set_defaults(handler=cmd_prices)


def cmd_prices(args: argparse.Namespace) -> int:
    from datetime import datetime, timezone

    from stepbench.execute.rent.providers import ProviderError
    from stepbench.execute.rent.rentals import PROVIDERS, price_file, provider
    from stepbench.report.render import write_output

    if args.provider not in PROVIDERS:
        raise UserError(f"--from {args.provider!r}: unknown provider; choose one of: "
                        + ", ".join(PROVIDERS))
    chosen = provider(args.provider)
    try:
        offers = chosen.prices()
    except ProviderError as exc:
        raise UserError(str(exc)) from None
    if not offers:
        raise UserError(f"{args.provider} lists no instance types right now; try again later")
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    text = price_file(offers, args.provider, when)
    if args.out is None:
        sys.stdout.write(text)
        return 0
    write_output(text, args.out)
    count = sum(1 for line in text.splitlines() if line.startswith('"'))
    print(f"wrote {args.out}: {count} GPU types from {args.provider}; use it with stepbench "
          f"report --prices {args.out}", file=sys.stderr)
    return 0
