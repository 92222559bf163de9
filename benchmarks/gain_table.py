"""Write the committed gain table tune values its candidates by (src/stepbench/search/
committed_gains.py) from the H200 results in benchmarks/results (search/gains.py,
COMMITTED_FILES): every pair of setups of one model, sequence and GPU that differ in one
searched axis, both ways. tests/test_tune.py checks that the written table is what these files
give now.

    PYTHONPATH=src python benchmarks/gain_table.py [--print]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from stepbench.search.gains import COMMITTED_FILES, committed_observations

HERE = Path(__file__).resolve().parent
TARGET = HERE.parent / "src" / "stepbench" / "search" / "committed_gains.py"


def source() -> str:
    """The module's text."""
    rows = committed_observations(HERE / "results")
    lines = ['"""The committed gain table (search/gains.py): one observation per entry (change key,',
             "ratio of tokens/s after to before, the setups compared, the files they are in).",
             "Written by benchmarks/gain_table.py from these files of benchmarks/results; do not",
             'edit, run the script again:', *[f"    {name}" for name in COMMITTED_FILES],
             '"""', "# ruff: noqa: E501", "", "OBSERVATIONS = ["]
    for o in rows:
        lines.append(f"    ({o.key!r}, {o.ratio!r},")
        lines.append(f"     {o.what!r},")
        lines.append(f"     {o.where!r}),")
    lines.append("]")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--print", action="store_true", help="print the module, write nothing")
    args = parser.parse_args(argv)
    text = source()
    if args.print:
        sys.stdout.write(text)
    else:
        TARGET.write_text(text)
        print(f"wrote {TARGET} ({text.count(chr(10))} lines)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
