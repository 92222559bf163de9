"""The wander study's tables (issue 37): eager+sdpa's per-process step times, the ways measured
interleaved in one call by benchmarks/gpu_wander.py (or the older gpu_wander.sh), as Markdown.

    python benchmarks/wander_table.py benchmarks/results/h200-2026-12-04-wander

reads PREFIX-server.jsonl, PREFIX-nvml-off.jsonl, PREFIX-pinned.jsonl (stepbench records; a
way without its file is left out) and PREFIX-script.jsonl (the post's script's lines). Per way:
the processes, their median step time (each process's mean, as `step_ms`), fastest - slowest,
the interquartile range, the median against the script's, and for stepbench's records the
median host lead (`host_lead_ms`) and how many processes were marked `host_bound`. Then, for
the processes that also profiled a step (`--profile`), the cheap mark against the profile's GPU
busy share (kernel time over the median timed step, as the report's "GPU busy").
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

WAYS = (("server", "stepbench (process server)"), ("nvml-off", "stepbench, STEPBENCH_NVML=0"),
        ("pinned", "stepbench, --pin-cpus auto"), ("script", "the post's script"))


def rows(path: Path) -> list[dict]:
    if not path.exists():
        return []
    found = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in found if r.get("step_ms") is not None]


def iqr(values: list[float]) -> float:
    if len(values) < 2:
        return 0.0
    q1, _, q3 = statistics.quantiles(values, n=4)
    return q3 - q1


def fmt(value, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def busy_share(r: dict) -> float | None:
    device_s = (r.get("profile") or {}).get("device_s")
    return min(1.0, device_s * 1000 / r["step_ms_median"]) if device_s and r.get(
        "step_ms_median") else None


def main(prefix: str) -> None:
    found = {way: rows(Path(f"{prefix}-{way}.jsonl")) for way, _ in WAYS}
    script = statistics.median(r["step_ms"] for r in found["script"]) if found["script"] else None
    print("| way | processes | median ms | fastest - slowest | IQR ms | median / script | "
          "host lead, median ms | host_bound |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for way, label in WAYS:
        recs = found[way]
        if not recs:
            continue
        t = [r["step_ms"] for r in recs]
        med = statistics.median(t)
        leads = [r["host_lead_ms"] for r in recs if r.get("host_lead_ms") is not None]
        bound = sum("host_bound" in (r.get("noise_flags") or []) for r in recs)
        print(f"| {label} | {len(t)} | {med:.1f} | {min(t):.1f} - {max(t):.1f} | "
              f"{iqr(t):.1f} | {fmt(med / script if script else None, 3)} | "
              f"{fmt(statistics.median(leads) if leads else None, 2)} | "
              f"{f'{bound} of {len(recs)}' if way != 'script' else '-'} |")
    profiled = [r for way, _ in WAYS for r in found[way] if busy_share(r) is not None]
    if not profiled:
        return
    print()
    print("| process | step ms (median) | host lead ms | offset ± ms | host_bound | GPU busy "
          "(profile) | GPU idle in the profiled step, ms |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for i, r in enumerate(sorted(profiled, key=lambda r: r["step_ms_median"]), start=1):
        print(f"| {i} | {r['step_ms_median']:.1f} | {fmt(r.get('host_lead_ms'), 2)} | "
              f"{fmt(r.get('host_lead_offset_ms'), 3)} | "
              f"{'yes' if 'host_bound' in (r.get('noise_flags') or []) else 'no'} | "
              f"{busy_share(r):.3f} | {fmt((r['profile'].get('idle_s') or 0) * 1000)} |")


if __name__ == "__main__":
    main(sys.argv[1])
