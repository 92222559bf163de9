"""Command line: parse, build a plan, hand it to the runner or the report, map UserError to exit 2.

Each subcommand's work lives in its own module (runner, report, peak); this file only wires
arguments to them, so that a newcomer finds every flag in one place per command.
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

    from stepbench import commands
    commands.add_run_parser(sub)
    for module_name in ("report", "peak"):
        module = _optional_command(module_name)
        if module is not None:
            module.add_parser(sub)
    return parser


def _optional_command(name: str):
    """Commands whose module defines add_parser(subparsers); each sets its own handler."""
    import importlib
    try:
        module = importlib.import_module(f"stepbench.{name}")
    except ModuleNotFoundError as exc:
        if exc.name != f"stepbench.{name}":
            raise
        return None
    return module if hasattr(module, "add_parser") else None


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
