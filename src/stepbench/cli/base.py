"""What every command shares: the argument parser's one-line errors, exit codes (docs/cli.md), and
the line a command ends with when a signal stops it or none of its setups ran ok."""

from __future__ import annotations

import argparse
import sys

EXIT_OK = 0
EXIT_FAILED = 1         # no setup ok, a host failed, no tune winner, results file not written
EXIT_USER_ERROR = 2
EXIT_INTERRUPTED = 130  # Ctrl-C; SIGTERM and SIGHUP exit with 128 + their number


class Parser(argparse.ArgumentParser):
    """argparse, with its errors on one line: the problem and where the choices are, without the
    usage block (eight lines for `run`) that buries them."""

    def error(self, message: str):
        self.exit(EXIT_USER_ERROR, f"{self.prog}: error: {message}; see {self.prog} --help\n")


def given(args: argparse.Namespace) -> dict:
    """The flags as settings keys (argparse's dest), None for those not given."""
    return {k: v for k, v in vars(args).items() if k not in ("handler", "command")}


def output_path(value: str):
    """The type of report's, compare's, predict's and prices' --out: a results file is refused
    as the flag is read, before anything is read, computed or fetched (writing over it would
    lose its records; report/render.py's write_output refuses it too, for the API)."""
    from pathlib import Path

    from stepbench.record_checks import written_over

    path = Path(value)
    problem = written_over(path)
    if problem:
        raise argparse.ArgumentTypeError(problem)
    return path


def add_output(p: argparse.ArgumentParser, formats) -> None:
    """--format (one of `formats`, the table by default) and --out PATH: how report, compare and
    predict write what they make."""
    p.add_argument("--format", choices=formats, default="table",
                   help="output format (default: table)")
    p.add_argument("--out", type=output_path, metavar="PATH",
                   help="write the output here instead of stdout")


def out_is_not(out, given, flag: str) -> None:
    """A UserError where --out `out` is the file `flag` reads (`given`, a price list): writing
    the output there would replace what the command reads."""
    import os

    from stepbench.errors import UserError

    if out is None or given is None:
        return
    try:
        same = os.path.samefile(out, given)
    except OSError:     # either does not exist (yet): not the same file
        return
    if same:
        raise UserError(f"--out {out} is the file {flag} reads; writing there would replace "
                        "it: pass --out a new file")


def say(command: str, text: str) -> None:
    print(f"stepbench {command}: {text}", file=sys.stderr)


def report_hint(out) -> None:
    """A run's or tune's last lines, on stderr (stdout holds the table or the JSON): where the
    results are, and the command that reports them."""
    import shlex
    from pathlib import Path

    html = Path(out).with_suffix(".html")
    print(f"results: {out}", file=sys.stderr)
    print(f"report, with findings and plots: stepbench report {shlex.quote(str(out))} --format "
          f"html --out {shlex.quote(str(html))}", file=sys.stderr)


def stopped(command: str, exc: KeyboardInterrupt, what: str) -> int:
    """One line for a command stopped by Ctrl-C (KeyboardInterrupt) or SIGTERM / SIGHUP
    (Stopped, raised by the runner), saying `what` was kept; the exit code: 130, or 128 + the
    signal."""
    from stepbench.execute.runner import Stopped

    how = f"stopped by {exc}" if isinstance(exc, Stopped) else "interrupted"
    say(command, f"{how}; {what}; run the same command again to resume")
    return 128 + exc.signum if isinstance(exc, Stopped) else EXIT_INTERRUPTED


def forget_caught_interrupt() -> None:
    """Let a command that caught Ctrl-C end with the exit code it chose.

    CPython 3.11 marks a KeyboardInterrupt as never caught when it leaves an exec() or eval() of a
    string (code that dataclasses, namedtuple and scipy's lazy imports run), even where a caller
    catches it later; `python -m stepbench` then ends by killing itself with SIGINT (-2 to its
    parent) in place of 130. Each exec of a string clears that mark first, so one that ends
    normally leaves it cleared; an interrupt that does leave main() is marked again by CPython."""
    exec("pass")


def outcome(command: str, records, run_id: str, out) -> int:
    """The exit code of a command that ran setups: 0 when one of `records` (this plan's, old and
    new) is ok, or when none was run now (`run_id`'s: everything was in the results file `out`);
    else 1, with one line that counts the statuses."""
    from collections import Counter

    if any(r.ok for r in records) or not any(r.run_id == run_id for r in records):
        return EXIT_OK
    counts = Counter(r.status for r in records)
    say(command, "no setup ran ok (" + ", ".join(f"{n} {status}" for status, n in
                                                counts.most_common()) + f"); their errors are in {out}")
    return EXIT_FAILED
