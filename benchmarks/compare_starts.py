"""Section h's tables: a setup's process started fresh against one forked by the process server
(issue 21), from the records of one call (`gpu_start.sh`), and the post's script where given.

    python benchmarks/compare_starts.py FRESH.jsonl SERVER.jsonl [SEED.jsonl] [--processes]

Per setup: the mean of the timed steps (ms) of each (the script times the mean too), their ratio,
peak memory, first step, and the process's wall and its time outside the first step, warm-up and
timed steps (`phases`).

--processes: the files hold one setup's processes, one per round (`gpu_start.sh` MODE=modes): is
a slow process the start method's doing, or the between-process wander both methods share? A row
per round (each process's mean timed step and peak memory), then per start method the median,
lowest and highest process and the median's ratio to the fresh processes' median.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

STEPS = ("first_step", "warmup", "timed")


def read(path: str | None) -> list[dict]:
    if not path:
        return []
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def outside(record: dict) -> float:
    phases = record.get("phases") or {}
    return record["wall_s"] - sum(phases.get(p, 0.0) for p in STEPS)


def table(fresh: list[dict], server: list[dict], seed: list[dict]) -> list[str]:
    by_name = {r["setup"]["name"]: r for r in server}
    scripts = {(s["mode"], s["attn"]): s for s in seed}
    lines = ["| setup | fresh step ms | server step ms | server / fresh | post's script ms | "
             "server / script | peak GB fresh, server | first step s fresh, server | "
             "process wall s fresh, server | outside the steps s fresh, server |",
             "| --- | " + " | ".join(["---:"] * 9) + " |"]
    for f in fresh:
        name = f["setup"]["name"]
        s = by_name[name]
        script = scripts.get((f["setup"]["mode"], f["setup"]["attn"]))
        lines.append(
            f"| {name} | {f['step_ms']:.2f} | {s['step_ms']:.2f} | "
            f"{s['step_ms'] / f['step_ms']:.3f} | "
            + (f"{script['step_ms']:.2f} | {s['step_ms'] / script['step_ms']:.3f} | "
               if script else "- | - | ")
            + f"{f['peak_memory_gb']:.2f}, {s['peak_memory_gb']:.2f} | "
            f"{f['first_step_s']:.1f}, {s['first_step_s']:.1f} | {f['wall_s']:.1f}, "
            f"{s['wall_s']:.1f} | {outside(f):.1f}, {outside(s):.1f} |")
    total = [sum(r["wall_s"] for r in records) for records in (fresh, server)]
    lines.append(f"| **processes together** | | | | | | | | {total[0]:.1f}, {total[1]:.1f} | "
                 f"{sum(map(outside, fresh)):.1f}, {sum(map(outside, server)):.1f} |")
    return lines


def peak(record: dict) -> float:
    return record.get("peak_memory_gb", record.get("peak_gb", 0.0))


def processes(methods: dict[str, list[dict]]) -> list[str]:
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
    parser.add_argument("--processes", action="store_true",
                        help="one setup's processes by round and by start method")
    args = parser.parse_args(argv)
    if not args.processes:
        print("\n".join(table(read(args.fresh), read(args.server), read(args.seed))))
        return 0
    methods = {"fresh": read(args.fresh), "server": read(args.server),
               "post's script": read(args.seed)}
    if not methods["fresh"]:
        parser.error(f"{args.fresh} holds no records: give the fresh processes' results file")
    kinds = {(r.get("setup", r).get("mode"), r.get("setup", r).get("attn"))
             for records in methods.values() for r in records}
    if len(kinds) > 1:
        parser.error(f"the files hold {len(kinds)} setups; --processes compares one setup's")
    print("\n".join(processes(methods)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
