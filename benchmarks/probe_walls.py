"""Each process of a run or a search against its own training: issue 21's probe goal (an eager
probe's wall at most 1.5x its first step, warm-up and timed steps), from the records' `phases`.

    python benchmarks/probe_walls.py RESULTS.jsonl [MORE.jsonl ...]

A row per record in the file's order: the setup and batch, what the search asked it for (`search`:
stage or role), how its process started, its wall, its first step + warm-up + timed steps
("in-step"), their ratio, and the phases a search's measurement before its finals takes from the
per-machine caches only (`peak`, the GPU's matmul rate; `flops`, the FLOP counter's cross-check).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

IN_STEP = ("first_step", "warmup", "timed")


def rows(path: Path) -> list[str]:
    lines = [f"### {path.name}", "",
             "| # | setup | batch | asked for | start | wall s | in-step s | wall / in-step | "
             "peak s | flops s |", "| ---: | --- | ---: | --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    for i, r in enumerate(records, 1):
        phases = r.get("phases") or {}
        in_step = sum(phases.get(p, 0.0) for p in IN_STEP)
        search = r.get("search") or {}
        asked = search.get("stage") or search.get("role") or "-"
        ratio = f"{r['wall_s'] / in_step:.2f}" if in_step else "-"
        status = "" if r["status"] == "ok" else f" ({r['status']})"
        lines.append(
            f"| {i} | {r['setup']['name']}{status} | {r['setup']['batch']} | {asked} | "
            f"{(r.get('placement') or {}).get('start', '-')} | {r['wall_s']:.2f} | {in_step:.2f} | "
            f"{ratio} | {phases.get('peak', 0.0):.2f} | {phases.get('flops', 0.0):.2f} |")
    return lines


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    for name in argv:
        print("\n".join(rows(Path(name))) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
