"""Write the committed gain table tune values its candidates by (src/stepbench/search/
committed_gains.json, a data file shipped in the package) from the H200 results in
benchmarks/results (search/gains.py, COMMITTED_FILES): every pair of setups of one model,
sequence and GPU that differ in one searched axis, both ways. tests/test_tune.py checks that the
shipped file is what these files give now.

    PYTHONPATH=src python benchmarks/gain_table.py [--print]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from stepbench.search.gains import COMMITTED_DATA, committed_observations, to_data

HERE = Path(__file__).resolve().parent
TARGET = HERE.parent / "src" / "stepbench" / "search" / COMMITTED_DATA


def source() -> str:
    """The data file's text, from the committed results."""
    return to_data(committed_observations(HERE / "results"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--print", action="store_true", help="print the file, write nothing")
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
