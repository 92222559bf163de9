"""`stepbench compare BEFORE AFTER`: two results files (or folders) of the same setups, before
and after a change, setup by setup; `--fail-above PCT` makes it a check for CI (exit 1)."""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from stepbench.cli.base import add_output
from stepbench.cli.report import REPORT_FORMATS, add_filters, filters_of
from stepbench.errors import UserError

EXIT_FAILED = 1
# --fail-above could not judge: nothing failed, but a setup's steps were disturbed on a side
# (verdict "disturbed"), so a slowdown there could not be told.
EXIT_INCONCLUSIVE = 3


def add(sub) -> None:
    p = sub.add_parser(
        "compare", help="compare two results files setup by setup (before and after a change)",
        description="Match the setups of BEFORE and AFTER (every setting but warm-up and timed "
                    "steps, on the same GPU) and show each one's change in step time and "
                    "tokens/s with its 95% interval, tested against noise as the report "
                    "tests; setups of one side only are listed apart.")
    p.add_argument("before", metavar="BEFORE", help="results file (*.jsonl) or folder of them")
    p.add_argument("after", metavar="AFTER", help="results file (*.jsonl) or folder of them")
    p.add_argument("--label", action="append", metavar="NAME",
                   help="names for the two sides, once per file in order (--label main --label "
                        "pr-42), or before=NAME, after=NAME (default: before, after)")
    p.add_argument("--fail-above", type=float, metavar="PCT",
                   help="exit 1 when a setup is slower by more than PCT percent and outside the "
                        "noise, or ran in BEFORE and fails in AFTER (for CI); exit 3 when none "
                        "does but a setup's steps were disturbed (inconclusive)")
    add_filters(p)
    add_output(p, REPORT_FORMATS)
    p.set_defaults(handler=cmd_compare)


def cmd_compare(args: argparse.Namespace) -> int:
    from stepbench.report.compare import compare_document, parse_labels
    from stepbench.report.render import render, write_output

    if args.fail_above is not None and not 0 <= args.fail_above < math.inf:
        raise UserError(f"--fail-above takes a percentage of 0 or more, got {args.fail_above:g}")
    doc, failed = compare_document([args.before], [args.after], labels=parse_labels(args.label),
                                   filters=filters_of(args), fail_above=args.fail_above)
    text = render(doc, args.format)
    if args.out:
        write_output(text, Path(args.out))
        print(f"stepbench compare: wrote {args.out}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    if failed:
        shown = "; ".join(failed[:5]) + (f"; and {len(failed) - 5} more" if len(failed) > 5 else "")
        print(f"stepbench compare: failed --fail-above {args.fail_above:g}: {len(failed)} "
              f"setup{'s' if len(failed) != 1 else ''} slower by more than "
              f"{args.fail_above:g}% outside the noise or failing now ({shown})", file=sys.stderr)
        return EXIT_FAILED
    unsure = doc.extra.get("inconclusive") or []
    if unsure:
        shown = "; ".join(unsure[:5]) + (f"; and {len(unsure) - 5} more" if len(unsure) > 5 else "")
        print(f"stepbench compare: inconclusive for --fail-above {args.fail_above:g}: "
              f"{len(unsure)} setup{'s' if len(unsure) != 1 else ''} not compared because "
              f"something disturbed their timed steps ({shown}); measure again on a quiet "
              "machine", file=sys.stderr)
        return EXIT_INCONCLUSIVE
    return 0
