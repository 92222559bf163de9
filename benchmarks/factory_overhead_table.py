"""What a user's factory adds to a setup's process against the HF path, from the records of
benchmarks/gpu_factory_overhead.sh.

    python benchmarks/factory_overhead_table.py RESULTS.jsonl [MORE.jsonl ...]

A setup's overhead is its process's wall time (`wall_s`) minus its time in steps (the phases
`first_step`, `warmup` and `timed`, measure/phases.py): start-up, imports, the device, the build,
FLOP counting, exit. Records of `--model FILE.py:FUNCTION` are the factory path, the others the
HF path; setups are matched by mode, attention and parallel style. Prints a Markdown table per
process, then per setup the mean overhead of each path, their difference (the goal: at most 1 s)
and the phases that differ most.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

IN_STEP = ("first_step", "warmup", "timed")
GOAL_S = 1.0


def load(paths: list[str]) -> list[dict]:
    records = []
    for path in paths:
        for line in Path(path).read_text().splitlines():
            if line.strip():
                records.append(json.loads(line))
    return records


def path_of(record: dict) -> str:
    return "factory" if ":" in record["setup"]["model"] else "hf"


def setup_of(record: dict) -> str:
    s = record["setup"]
    attn = s.get("attn") or "sdpa"
    params = dict(p.split("=", 1) for p in (s.get("params") or "").split(";") if "=" in p)
    attn = params.get("attn", attn)
    parallel = s.get("parallel", "none")
    return f"{s['mode']}+{attn}" + ("" if parallel == "none" else f" {parallel}")


def overhead(record: dict) -> float | None:
    phases = record.get("phases") or {}
    if record.get("status") != "ok" or record.get("wall_s") is None:
        return None
    return record["wall_s"] - sum(phases.get(p, 0.0) for p in IN_STEP)


def tables(records: list[dict]) -> str:
    lines = ["| path | setup | status | wall s | in steps s | overhead s | build s | flops s | "
             "step ms |", "|" + " --- |" * 9]
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in records:
        phases = r.get("phases") or {}
        extra = overhead(r)
        lines.append(f"| {path_of(r)} | {setup_of(r)} | {r['status']} | {r.get('wall_s') or 0:.1f} | "
                     f"{sum(phases.get(p, 0.0) for p in IN_STEP):.1f} | "
                     f"{'-' if extra is None else f'{extra:.1f}'} | {phases.get('build', 0):.1f} | "
                     f"{phases.get('flops', 0):.1f} | {r.get('step_ms') or 0:.1f} |")
        if extra is not None:
            groups.setdefault((setup_of(r), path_of(r)), []).append(r)
    lines += ["", "| setup | HF overhead s | factory overhead s | factory - HF s | within 1 s | "
              "phases apart most (factory - HF, s) |", "|" + " --- |" * 6]
    for setup in dict.fromkeys(k[0] for k in groups):
        hf, fac = groups.get((setup, "hf"), []), groups.get((setup, "factory"), [])
        if not hf or not fac:
            continue
        mean_hf = statistics.fmean(overhead(r) for r in hf)
        mean_fac = statistics.fmean(overhead(r) for r in fac)
        apart = {}
        for phase in {p for r in hf + fac for p in (r.get("phases") or {})} - set(IN_STEP):
            apart[phase] = (statistics.fmean((r.get("phases") or {}).get(phase, 0.0) for r in fac)
                            - statistics.fmean((r.get("phases") or {}).get(phase, 0.0) for r in hf))
        most = sorted(apart.items(), key=lambda kv: -abs(kv[1]))[:3]
        diff = mean_fac - mean_hf
        lines.append(f"| {setup} | {mean_hf:.2f} ({len(hf)}) | {mean_fac:.2f} ({len(fac)}) | "
                     f"{diff:+.2f} | {'yes' if diff <= GOAL_S else 'no'} | "
                     + ", ".join(f"{p} {d:+.2f}" for p, d in most) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    print(tables(load(argv)), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
