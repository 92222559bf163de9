"""One setup's processes by how they started (`gpu_start.sh` MODE=modes): is a slow process the
start method's doing, or the between-process wander both methods share (issue 21)?

    python benchmarks/start_modes.py FRESH.jsonl SERVER.jsonl [SEED.jsonl]

A row per round (the files hold one process per round, in order): each process's mean timed
step (ms; the post's script times the mean too) and peak memory; then, per start method, the
median, lowest and highest process and the median's ratio to the fresh processes' median.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path


def read(path: str | None) -> list[dict]:
    if not path:
        return []
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def peak(record: dict) -> float:
    return record.get("peak_memory_gb", record.get("peak_gb", 0.0))


def table(methods: dict[str, list[dict]]) -> list[str]:
    names = [name for name, records in methods.items() if records]
    lines = ["| round | " + " | ".join(f"{n} step ms, peak GB" for n in names) + " |",
             "| ---: |" + " ---: |" * len(names)]
    for i in range(max(len(methods[n]) for n in names)):
        cells = [f"{methods[n][i]['step_ms']:.2f}, {peak(methods[n][i]):.2f}"
                 if i < len(methods[n]) else "-" for n in names]
        lines.append(f"| {i + 1} | " + " | ".join(cells) + " |")
    base = statistics.median(r["step_ms"] for r in methods["fresh"])
    lines += ["", "| start | processes | median ms | lowest ms | highest ms | median / fresh's |",
              "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for n in names:
        steps = [r["step_ms"] for r in methods[n]]
        lines.append(f"| {n} | {len(steps)} | {statistics.median(steps):.2f} | {min(steps):.2f} | "
                     f"{max(steps):.2f} | {statistics.median(steps) / base:.3f} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("fresh")
    parser.add_argument("server")
    parser.add_argument("seed", nargs="?")
    args = parser.parse_args(argv)
    methods = {"fresh": read(args.fresh), "server": read(args.server),
               "post's script": read(args.seed)}
    if not methods["fresh"]:
        parser.error(f"{args.fresh} holds no records: give the fresh processes' results file")
    kinds = {(r.get("setup", r).get("mode"), r.get("setup", r).get("attn"))
             for records in methods.values() for r in records}
    if len(kinds) > 1:
        parser.error(f"the files hold {len(kinds)} setups; this compares one setup's processes")
    print("\n".join(table(methods)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
