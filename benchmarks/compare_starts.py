"""Section h's tables: a setup's process started fresh against one forked by the process server
(issue 21), from the records of one call (`gpu_start.sh`), and the post's script where given.

    python benchmarks/compare_starts.py FRESH.jsonl SERVER.jsonl [SEED.jsonl]

Per setup: the mean of the timed steps (ms) of each (the script times the mean too), their ratio,
peak memory, first step, and the process's wall and its time outside the first step, warm-up and
timed steps (`phases`).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

STEPS = ("first_step", "warmup", "timed")


def read(path: str) -> list[dict]:
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("fresh")
    parser.add_argument("server")
    parser.add_argument("seed", nargs="?")
    args = parser.parse_args(argv)
    print("\n".join(table(read(args.fresh), read(args.server),
                          read(args.seed) if args.seed else [])))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
