"""The wander study's table (issue 37): eager+sdpa's per-process step times, three ways measured
interleaved in one call by benchmarks/gpu_wander.sh, as a Markdown table.

    python benchmarks/wander_table.py benchmarks/results/h200-2026-12-04-wander

reads PREFIX-server.jsonl, PREFIX-nvml-off.jsonl (stepbench records) and PREFIX-script.jsonl
(the post's script's lines). Per way: the processes, their median step time, the fastest and the
slowest, the spread (slowest - fastest) and the median against the script's.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

WAYS = (("server", "stepbench (process server)"), ("nvml-off", "stepbench, STEPBENCH_NVML=0"),
        ("script", "the post's script"))


def step_times(path: Path) -> list[float]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r["step_ms"] for r in rows if r.get("step_ms") is not None]


def main(prefix: str) -> None:
    times = {way: step_times(Path(f"{prefix}-{way}.jsonl")) for way, _ in WAYS}
    script = statistics.median(times["script"])
    print("| way | processes | median ms | fastest | slowest | spread ms | median / script |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for way, label in WAYS:
        t = times[way]
        med = statistics.median(t)
        print(f"| {label} | {len(t)} | {med:.1f} | {min(t):.1f} | {max(t):.1f} | "
              f"{max(t) - min(t):.1f} | {med / script:.3f} |")


if __name__ == "__main__":
    main(sys.argv[1])
