"""Command line: every command's flags; each handler parses its settings, calls and prints.

A UserError becomes one line on stderr and exit code 2 (or the error's own `exit_code`), a
warning one line too (errors.show_warnings); Ctrl-C
exits 130, SIGTERM and SIGHUP 128 + their number, after the running setups were stopped. Every
other exception is a bug and keeps its traceback. Heavy modules (torch, the report) are imported
inside the handlers, so `--help` and `report` start fast. The axis flags come from the registry
(axes.py), the other settings from their declarations (stepbench.settings; cli/flags.py).
"""

from __future__ import annotations

from stepbench import __version__
from stepbench.cli import compare, predict, report, run, tune
from stepbench.cli.base import EXIT_INTERRUPTED, EXIT_USER_ERROR, Parser, forget_caught_interrupt, say
from stepbench.errors import UserError, show_warnings


def build_parser() -> Parser:
    parser = Parser(
        prog="stepbench",
        description="Benchmark a model's training step in several setups (eager or torch.compile, "
                    "attention kernels, batch sizes), each in its own process.")
    parser.add_argument("--version", action="version", version=f"stepbench {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    run.add(sub)
    tune.add(sub)
    report.add(sub)
    compare.add(sub)
    report.add_peak(sub)
    report.add_prices(sub)
    predict.add(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    show_warnings(args.command)
    from stepbench.execute.runner import Stopped

    try:
        return args.handler(args)
    except UserError as exc:
        say(args.command, f"error: {exc}")
        return getattr(exc, "exit_code", EXIT_USER_ERROR)
    except Stopped as exc:
        say(args.command, f"stopped by {exc}")
        return 128 + exc.signum
    except KeyboardInterrupt:
        say(args.command, "interrupted")
        return EXIT_INTERRUPTED
    finally:
        forget_caught_interrupt()


__all__ = ["build_parser", "main"]
