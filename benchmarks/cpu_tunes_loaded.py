"""Issue 37's loaded-CPU tune goal: "2-core CPU under load: 10 tunes in a row, none names a
winner below its reference; no finding or compare verdict rests on a ‡ row".

Runs N tunes in a row (`stepbench tune --device cpu --model llama-tiny --budget 2m --format
json`, each with a fresh --out) beside a process that keeps one core busy (a Python loop, started
before the first tune and stopped after the last), then checks each tune:

- the winner's tokens/s against its reference's (the loss guard's eager reference at the
  winner's batch, the JSON's `reference`) and against every setup the tune measured (`tried`),
  each setup's the mean over its processes that ran: `below_reference` / `below_best` where
  the winner is more than 1% slower (the tune's own tolerance when it names a winner,
  search/tune/finals.py);
- `stepbench report TUNE.jsonl --format json`: every finding whose text names a `‡` row, but
  those that list what was not compared (kind `untested`);
- `stepbench compare` of each tune's file against the one before: every verdict other than
  `disturbed` (or untested, or a status change) on a pair where either row carries a disturbed
  flag (busy_cpu and its kin, report/marks.DISTURBED).

    python3 benchmarks/cpu_tunes_loaded.py --out DIR [--tunes 10] [--budget 2m]   # runs + checks
    python3 benchmarks/cpu_tunes_loaded.py --out DIR --check        # checks what DIR holds
    python3 benchmarks/cpu_tunes_loaded.py --out DIR --table        # the check as Markdown

DIR gets tune-K.jsonl (the records), tune-K.json (the tune's JSON object), tune-K.err (its
stderr), report-K.json, compare-K.json, and check.jsonl (one line per tune). Run from the
repository root with PYTHONPATH=src (or an installed stepbench).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

DISTURBED = ("busy_cpu", "other_processes", "throttled", "clock_drop", "recompiled")
TOLERANCE = 0.01       # the tune names a winner within 1% of the fastest it measured
MARK = "‡"


def stepbench(*args: str, stdout=None, stderr=None) -> int:
    return subprocess.run([sys.executable, "-m", "stepbench", *args], stdout=stdout,
                          stderr=stderr).returncode


def busy() -> subprocess.Popen:
    """One core kept busy for as long as the tunes run."""
    return subprocess.Popen([sys.executable, "-c", "while True: pass"])


def run_tunes(out: Path, tunes: int, budget: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    hog = busy()
    try:
        for k in range(1, tunes + 1):
            if (out / f"tune-{k}.json").exists() and (out / f"tune-{k}.json").stat().st_size:
                continue
            began = time.time()
            with open(out / f"tune-{k}.json", "w") as so, open(out / f"tune-{k}.err", "w") as se:
                rc = stepbench("tune", "--device", "cpu", "--model", "llama-tiny", "--budget",
                               budget, "--format", "json", "--out", str(out / f"tune-{k}.jsonl"),
                               stdout=so, stderr=se)
            print(f"tune {k}: exit {rc}, {time.time() - began:.0f} s, load "
                  f"{os.getloadavg()[0]:.1f}", flush=True)
    finally:
        hog.kill()
        hog.wait()


def tokens(record: dict | None) -> float | None:
    if record and record.get("status") == "ok":
        return record.get("tokens_per_s")
    return None


def flags(record: dict | None) -> list[str]:
    return list((record or {}).get("noise_flags") or [])


def identity(record: dict) -> str:
    return json.dumps({k: v for k, v in record["setup"].items() if k != "name"}, sort_keys=True)


def check_tune(out: Path, k: int) -> dict:
    """One tune's check. A setup's figure is the mean tokens/s of its processes that ran, as
    the tune names its winner (search/tune/finals.py `ranked`)."""
    tune = json.loads((out / f"tune-{k}.json").read_text())
    winner, reference = tune.get("winner"), tune.get("reference")
    means: dict[str, list] = {}
    for r in tune.get("tried", []):
        if tokens(r):
            means.setdefault(identity(r), []).append(r)
    mean = {key: sum(map(tokens, rs)) / len(rs) for key, rs in means.items()}
    mine = mean.get(identity(winner)) if winner else None
    ref = mean.get(identity(reference)) if reference else None
    measured = [rs[0] for rs in means.values()]
    best = max(measured, key=lambda r: mean[identity(r)], default=None)
    with open(out / f"report-{k}.json", "w") as so:
        stepbench("report", str(out / f"tune-{k}.jsonl"), "--format", "json", stdout=so,
                  stderr=subprocess.DEVNULL)
    report = json.loads((out / f"report-{k}.json").read_text() or "{}")
    # A finding that names a ‡ row to say it was not compared (kind "untested") claims nothing.
    marked = [f["text"] for f in report.get("findings", []) if MARK in f.get("text", "")
              and f.get("kind") != "untested"]
    verdicts = []
    if k > 1:
        with open(out / f"compare-{k}.json", "w") as so:
            stepbench("compare", str(out / f"tune-{k - 1}.jsonl"), str(out / f"tune-{k}.jsonl"),
                      "--format", "json", stdout=so, stderr=subprocess.DEVNULL)
        text = (out / f"compare-{k}.json").read_text()
        compare = json.loads(text) if text.strip() else {}
        for row in compare.get("rows", []):
            shaken = [f for key in ("before_noise_flags", "after_noise_flags")
                      for f in row.get(key) or [] if f in DISTURBED]
            if shaken and row.get("verdict") in ("slower", "faster", "noise"):
                verdicts.append(f"{row.get('setup')}: {row.get('verdict')} ({', '.join(shaken)})")
    def name(r):
        s = r["setup"]
        return f"{s['name']} batch {s['batch']}"
    return {"tune": k, "winner": name(winner) if winner else None, "winner_tokens_per_s": mine,
            "winner_flags": flags(winner),
            "reference": name(reference) if reference else None, "reference_tokens_per_s": ref,
            "best_measured": name(best) if best else None,
            "best_tokens_per_s": mean[identity(best)] if best else None,
            "measured_ok": sum(map(len, means.values())),
            "busy_cpu_records": sum("busy_cpu" in flags(r) for r in tune.get("tried", [])),
            "below_reference": bool(mine and ref and mine < ref * (1 - TOLERANCE)),
            "below_best": bool(mine and best and mine < mean[identity(best)] * (1 - TOLERANCE)),
            "no_winner": winner is None, "spent_s": tune.get("spent_s"),
            "findings_on_marked_rows": marked, "verdicts_on_disturbed_rows": verdicts}


def check(out: Path) -> list[dict]:
    rows = []
    k = 1
    while (out / f"tune-{k}.json").exists() and (out / f"tune-{k}.json").stat().st_size:
        rows.append(check_tune(out, k))
        k += 1
    (out / "check.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return rows


def table(rows: list[dict]) -> str:
    lines = ["| tune | winner | tokens/s | reference | tokens/s | winner / reference | "
             "best measured / winner | busy_cpu rows | findings on ‡ | verdicts on ‡ |",
             "| ---: | --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        mine, ref, best = r["winner_tokens_per_s"], r["reference_tokens_per_s"], r["best_tokens_per_s"]
        lines.append(
            f"| {r['tune']} | {r['winner'] or 'none'} | {mine or 0:,.0f} | {r['reference'] or '-'} | "
            f"{ref or 0:,.0f} | {mine / ref if mine and ref else float('nan'):.3f} | "
            f"{best / mine if mine and best else float('nan'):.3f} | "
            f"{r['busy_cpu_records']}/{r['measured_ok']} | {len(r['findings_on_marked_rows'])} | "
            f"{len(r['verdicts_on_disturbed_rows'])} |")
    bad = [r["tune"] for r in rows if r["below_reference"] or r["below_best"]]
    lines.append("")
    lines.append(f"{len(rows)} tunes; winner below its reference or below a measured setup "
                 f"(by more than {TOLERANCE:.0%}): {bad or 'none'}; findings on ‡ rows: "
                 f"{sum(len(r['findings_on_marked_rows']) for r in rows)}; compare verdicts on "
                 f"disturbed rows: {sum(len(r['verdicts_on_disturbed_rows']) for r in rows)}.")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--tunes", type=int, default=10)
    parser.add_argument("--budget", default="2m")
    parser.add_argument("--check", action="store_true", help="check what --out holds, no runs")
    parser.add_argument("--table", action="store_true", help="print check.jsonl as Markdown")
    args = parser.parse_args()
    if args.table:
        rows = [json.loads(line) for line in (args.out / "check.jsonl").read_text().splitlines()]
        print(table(rows))
        return 0
    if not args.check:
        run_tunes(args.out, args.tunes, args.budget)
    rows = check(args.out)
    print(table(rows))
    return 1 if any(r["below_reference"] or r["below_best"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
