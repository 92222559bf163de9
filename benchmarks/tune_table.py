"""Print a stored tune again: the table of what it tried and its verdict, from the object
`stepbench tune --format json` printed (results/h200-2026-12-01-tune-*.json), as the tune
prints it (`--format table`, the example in docs/tune.md; markdown for section g; csv, html).

    PYTHONPATH=src python benchmarks/tune_table.py results/h200-2026-12-01-tune-468m.json \
        [--format markdown]
"""

from __future__ import annotations

import argparse
import json
import sys

from stepbench.report.render import render
from stepbench.report.tune import tune_document
from stepbench.search.tune.results import TuneResult


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("json", type=argparse.FileType(), help="a tune's --format json output")
    parser.add_argument("--format", choices=["table", "markdown", "csv", "html"], default="table")
    args = parser.parse_args(argv)
    with args.json as f:
        result = TuneResult.from_dict(json.load(f))
    sys.stdout.write(render(tune_document(result), args.format))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
