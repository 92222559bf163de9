"""Compare stepbench's numbers with the post's own script for the same setups, as a Markdown table.

Issue 2 asks that stepbench measure a setup as a bare loop does: within 2% of the post's script
(seed_train.py) for every setup. benchmarks/gpu_matrix_vs_seed.sh runs both on one GPU in one call;
this script only reads what they stored and pairs the setups by (mode, attention, batch).

    python benchmarks/compare_seed.py STEPBENCH.jsonl SEED.jsonl

What is compared, per setup:
- stepbench step ms: `step_ms`, the mean of the timed steps (20 by default), each timed with CUDA
  events; the post's script: host-clock wall time over its 20 timed steps / 20.
- ratio: stepbench / script (above 1: stepbench measured a slower step).
- first step s: wall time of the first step, compilation included.
- peak GB: torch.cuda.max_memory_allocated() over the timed steps, 1e9 bytes, in both.

One process per setup and side is expected. Where a file holds several (`--repeats`), the step
time and peak are the median over the ok processes, the first step is the first process's (the
one that compiled with a cold cache), and the setup cell says how many processes each side had.
A setup that failed on a side shows its status (e.g. OOM) instead of numbers.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

COLUMNS = ["setup", "stepbench step ms", "post script step ms", "ratio stepbench/script",
           "stepbench first step s", "script first step s", "stepbench peak GB",
           "script peak GB"]


def read_jsonl(path: Path) -> list[dict]:
    """Objects of a JSON Lines file; blank lines are skipped."""
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def _stepbench_side(record: dict) -> dict:
    """A stepbench record in the script's terms: key, status and the three measurements."""
    s = record["setup"]
    return {"key": (s["mode"], s["attn"], s["batch"]), "status": record["status"],
            "step_ms": record.get("step_ms"), "first_step_s": record.get("first_step_s"),
            "peak_gb": record.get("peak_memory_gb")}


def _seed_side(record: dict) -> dict:
    """A line of seed_train.py's output; its OOM catch prints {"oom": true} without numbers."""
    return {"key": (record["mode"], record["attn"], record.get("B", 4)),
            "status": "oom" if record.get("oom") else "ok", "step_ms": record.get("step_ms"),
            "first_step_s": record.get("first_step_s"), "peak_gb": record.get("peak_gb")}


def _combine(sides: list[dict]) -> dict:
    """One setup's processes on one side: medians over the ok ones, the first one's first step."""
    ok = [s for s in sides if s["status"] == "ok" and s["step_ms"] is not None]
    if not ok:
        return {"status": sides[0]["status"], "processes": len(sides), "step_ms": None,
                "first_step_s": None, "peak_gb": None}
    peaks = [s["peak_gb"] for s in ok if s["peak_gb"] is not None]
    return {"status": "ok", "processes": len(sides),
            "step_ms": statistics.median(s["step_ms"] for s in ok),
            "first_step_s": ok[0]["first_step_s"],
            "peak_gb": statistics.median(peaks) if peaks else None}


def pair(stepbench_records: list[dict], seed_records: list[dict]) -> list[dict]:
    """Rows {key, stepbench, script, ratio} for every (mode, attn, batch) on either side, in
    stepbench's order then the script's; a side with no record of a setup is None."""
    groups: dict[tuple, dict[str, list[dict]]] = {}
    for side, records, convert in (("stepbench", stepbench_records, _stepbench_side),
                                   ("script", seed_records, _seed_side)):
        for record in records:
            item = convert(record)
            groups.setdefault(item["key"], {"stepbench": [], "script": []})[side].append(item)
    rows = []
    for key, sides in groups.items():
        a = _combine(sides["stepbench"]) if sides["stepbench"] else None
        b = _combine(sides["script"]) if sides["script"] else None
        ratio = (a["step_ms"] / b["step_ms"]
                 if a and b and a["step_ms"] is not None and b["step_ms"] else None)
        rows.append({"key": key, "stepbench": a, "script": b, "ratio": ratio})
    return rows


def _label(row: dict) -> str:
    mode, attn, batch = row["key"]
    notes = [f"batch {batch}"] if batch != 4 else []
    counts = [side["processes"] if side else 0 for side in (row["stepbench"], row["script"])]
    if max(counts) > 1:
        notes.append(f"{counts[0]} / {counts[1]} processes")
    return f"{mode}+{attn}" + (f" ({'; '.join(notes)})" if notes else "")


def _cell(side: dict | None, field: str, digits: int) -> str:
    if side is None:
        return "not run"
    if side["status"] != "ok":
        return "OOM" if side["status"] == "oom" else side["status"]
    value = side[field]
    return "-" if value is None else f"{value:.{digits}f}"


def markdown(rows: list[dict]) -> str:
    """The comparison as a Markdown table."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "| --- " + "| ---: " * (len(COLUMNS) - 1) + "|"]
    for row in rows:
        a, b = row["stepbench"], row["script"]
        ratio = "-" if row["ratio"] is None else f"{row['ratio']:.3f}"
        cells = [_label(row), _cell(a, "step_ms", 1), _cell(b, "step_ms", 1), ratio,
                 _cell(a, "first_step_s", 1), _cell(b, "first_step_s", 1),
                 _cell(a, "peak_gb", 2), _cell(b, "peak_gb", 2)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("stepbench", type=Path, help="results file of `stepbench run` (*.jsonl)")
    parser.add_argument("seed", type=Path, help="output of seed_train.py, one JSON per line")
    args = parser.parse_args(argv)
    sys.stdout.write(markdown(pair(read_jsonl(args.stepbench), read_jsonl(args.seed))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
