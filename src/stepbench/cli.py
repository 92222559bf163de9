"""Command line: parse, build a plan, hand it to the runner or the report, map UserError to exit 2.

Each subcommand defines its flags next to its work (run.py, report.py, peak.py)
and sets its handler; this file only dispatches and turns a UserError into one line and exit 2.
"""

from __future__ import annotations

import argparse
import sys

from stepbench import __version__
from stepbench.errors import UserError

EXIT_USER_ERROR = 2
EXIT_INTERRUPTED = 130


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="stepbench",
        description="Benchmark a model's training step in several setups (eager or torch.compile, "
                    "attention kernels, batch sizes), each in its own process.")
    parser.add_argument("--version", action="version", version=f"stepbench {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    from stepbench import peak, report, run

    run.add_parser(sub)
    report.add_parser(sub)
    peak.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.handler(args)
    except UserError as exc:
        print(f"stepbench {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        print(f"stepbench {args.command}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
