"""Print a stored tune again: the table of what it tried and its verdict, from the object
`stepbench tune --format json` printed (results/h200-2026-12-01-tune-*.json), as the tune
printed it (`--format table`, the README's example) or in Markdown (section g).

    PYTHONPATH=src python benchmarks/tune_table.py results/h200-2026-12-01-tune-468m.json [--format markdown]
"""

from __future__ import annotations

import argparse
import json

from stepbench.search.tune import TuneResult, render


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("json", type=argparse.FileType(), help="a tune's --format json output")
    parser.add_argument("--format", choices=["table", "markdown"], default="table")
    args = parser.parse_args(argv)
    with args.json as f:
        result = TuneResult.from_dict(json.load(f))
    print(render(result, args.format), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
