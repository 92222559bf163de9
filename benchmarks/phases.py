"""Where each setup's process spent its wall time, from the records' `phases`, as Markdown tables.

    python benchmarks/phases.py RESULTS.jsonl [MORE.jsonl ...]

One table per file: a row per record (setup and repeat), a column per phase (measure/phases.py,
seconds), the process's wall_s, and a total row. Records written before phases existed show
their wall_s alone. The matrix's own wall time (the command's, with the parent's start-up) is in
the walltimes.txt that benchmarks/gpu_overhead.sh writes beside the results.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
from stepbench.measure.phases import PHASES  # noqa: E402


def table(path: Path) -> str:
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    head = ["setup", *PHASES, "wall_s"]
    lines = [f"### {path.name}", "", "| " + " | ".join(head) + " |",
             "|" + " --- |" * len(head)]
    totals = dict.fromkeys([*PHASES, "wall_s"], 0.0)
    for r in records:
        phases = r.get("phases") or {}
        name = r["setup"]["name"] + (f" #{r['repeat']}" if r.get("repeat") else "")
        if r["status"] != "ok":
            name += f" ({r['status']})"
        cells = [f"{phases[p]:.1f}" if p in phases else "" for p in PHASES]
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {r['wall_s']:.1f} |")
        for p in PHASES:
            totals[p] += phases.get(p, 0.0)
        totals["wall_s"] += r["wall_s"]
    lines.append("| **total** | " + " | ".join(f"{totals[p]:.1f}" for p in PHASES)
                 + f" | {totals['wall_s']:.1f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    print("\n".join(table(Path(p)) for p in argv))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
