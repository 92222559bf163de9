"""How long `stepbench report` takes for a large results file (issue 23, item 6).

Writes synthetic records of WORKLOADS x 16 setups (default 200 x 16 = 3,200 setups, two
processes each, 20 timed steps per process) on one GPU, then times `stepbench report --format
json` and `--format html` on them, each as a user's command runs: `python -m stepbench report` in
a fresh process (so no import and no cache of an earlier timing helps a later one). The
records are made from a seeded generator: the same arguments give the same file, so the findings
of two stepbench versions can be compared (`--findings FILE` writes them, one line each).

Each workload is a model (20 names, nothing is built), a batch (1, 2, 4, 8, 16) and a sequence
length (512, 2048); its 16 setups are eager or compile x sdpa or eager attention x kernels none
or liger x AdamW fused or foreach. Compiled steps are 20% faster on most models and within a
percent on some (so both significant and within-the-noise comparisons occur), eager attention
is 1.5x slower and at the largest workloads runs out of memory in eager mode.

    PYTHONPATH=src python benchmarks/report_scale.py                  # 3,200 setups, json + html
    PYTHONPATH=src python benchmarks/report_scale.py --workloads 20 --findings /tmp/f.txt
    PYTHONPATH=src python benchmarks/report_scale.py --repeat 3 --results out.jsonl
    git archive main src | tar -x -C /tmp/old        # then, timed in turn at the same load:
    PYTHONPATH=src python benchmarks/report_scale.py --baseline /tmp/old/src
    python benchmarks/report_scale.py --table out.jsonl             # the timings as Markdown

With `--small W` a report of the first W workloads (1: 16 setups) is timed right before each
large one, and the call prints and keeps the ratio of their CPU times (issue 37, item 6: the
3,200-setup report within 6x of the 16-setup one); `--processes 1` writes one process per setup,
whose comparisons take the pooled-steps test (a median bootstrap and a rank test) rather than
the hierarchical one.

With `--baseline`, the two stepbench versions' JSON reports of the same file are compared
(`same_report`): the findings (every one, in order), the whole report object and its bytes;
the script exits 1 where the findings differ.

Each time is the command's wall time and its process's CPU time (all its threads), with the
machine's load average (os.getloadavg) before and after: on a machine that other work shares,
the wall time grows with the load while the CPU time says what the report itself cost.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timedelta, timezone
from itertools import product
from pathlib import Path

import numpy as np

MODELS = [f"synth-{i:02d}" for i in range(20)]
BATCHES = (1, 2, 4, 8, 16)
SEQS = (512, 2048)
SETUPS = list(product(("eager", "compile"), ("sdpa", "eager"), ("none", "liger"),
                      ("fused", "foreach")))
GPU = "NVIDIA H200"


def workloads(n: int) -> list[tuple[str, int, int]]:
    return list(product(MODELS, BATCHES, SEQS))[:n]


def records(n_workloads: int, processes: int = 2, steps: int = 20, seed: int = 0) -> list[dict]:
    """The synthetic records, in the order a run would write them."""
    rng = np.random.default_rng(seed)
    start = datetime(2026, 12, 1, 8, 0, tzinfo=timezone.utc)
    out = []
    for w, (model, batch, seq) in enumerate(workloads(n_workloads)):
        size = 1.0 + (w % 20) / 10                      # per model
        tokens = batch * seq
        compile_gain = 0.99 if w % 7 == 0 else 0.8       # within the noise on some workloads
        losses = list(10.5 - np.linspace(0, 1.5, 2 + 4 + steps) + rng.normal(0, 0.01, 2 + 4 + steps))
        for mode, attn, kernels, optimizer in SETUPS:
            setup = {"name": "", "model": model, "mode": mode, "compile_mode": "default",
                     "attn": attn, "batch": batch, "seq": seq, "dtype": "bf16",
                     "device": "cuda", "warmup": 4, "steps": steps, "seed": 0,
                     "memory_limit_gb": None}
            if kernels != "none":
                setup["kernels"] = kernels
            if optimizer != "fused":
                setup["optimizer"] = optimizer
            setup["name"] = _name(mode, attn, kernels, optimizer)
            step_ms = (tokens / 1000 * size * (compile_gain if mode == "compile" else 1.0)
                       * (1.5 if attn == "eager" else 1.0) * (0.95 if kernels == "liger" else 1.0)
                       * (1.01 if optimizer == "foreach" else 1.0))
            peak_gb = tokens / 1000 * size * (0.8 if mode == "compile" else 1.0) \
                * (2.2 if attn == "eager" else 1.0)
            oom = attn == "eager" and mode == "eager" and tokens >= 16 * 2048
            for repeat in range(processes):
                when = start + timedelta(seconds=30 * len(out))
                out.append(_record(setup, repeat, oom, step_ms, peak_gb, steps, losses, rng,
                                   when))
    return out


def _name(mode: str, attn: str, kernels: str, optimizer: str) -> str:
    return "+".join([mode, attn] + ([kernels] if kernels != "none" else [])
                    + ([optimizer] if optimizer != "fused" else []))


def _record(setup: dict, repeat: int, oom: bool, step_ms: float, peak_gb: float, steps: int,
            losses: list[float], rng: np.random.Generator, when: datetime) -> dict:
    base = {"schema": 1, "run_id": "synthetic", "repeat": repeat, "setup": setup,
            "started_at": when.isoformat().replace("+00:00", "Z"),
            "machine": {"gpu": GPU, "gpu_count": 1, "gpu_memory_gb": 150.1,
                        "driver": "580.159.04", "hostname": "synthetic"},
            "software": {"python": "3.12.3", "torch": "2.11.0+cu130", "transformers": "5.17.0",
                         "stepbench": "0.1.0", "cuda": "13.0"}}
    if oom:
        return {**base, "status": "oom", "error": "CUDA out of memory", "phase": "first_step"}
    offset = 1 + rng.normal(0, 0.02)                  # between processes
    times = step_ms * offset * (1 + np.abs(rng.normal(0, 0.03, steps)))
    times = [round(float(t), 3) for t in times]
    compiled = setup["mode"] == "compile"
    first = (30.0 if repeat == 0 else 4.0) if compiled else 1.0
    noise = 1 + 0.0002 * (setup["attn"] == "eager")
    return {**base, "status": "ok", "error": None, "phase": "done",
            "first_step_s": round(first + rng.normal(0, 0.2) ** 2, 3),
            "step_ms": float(np.mean(times)), "step_ms_median": float(np.median(times)),
            "step_times_ms": times,
            "tokens_per_s": setup["batch"] * setup["seq"] * 1000 / float(np.mean(times)),
            "peak_memory_gb": round(peak_gb, 3),
            "losses": [round(v * noise, 5) for v in losses],
            "loss_first": losses[0], "loss_last": losses[-1],
            "compile": ({"cache": "cold" if repeat == 0 else "warm", "graph_breaks": 0,
                         "recompiles": 0} if compiled else None),
            "noise_flags": []}


def write(path: Path, n_workloads: int, processes: int = 2) -> int:
    data = records(n_workloads, processes)
    path.write_text("".join(json.dumps(r) + "\n" for r in data))
    return len(data)


def timed_report(path: Path, fmt: str, out: Path, source: str | None = None) -> dict:
    """One `python -m stepbench report --format FMT` in its own process (with stepbench from
    the `source` folder, else as this script's environment has it): wall and CPU seconds (user
    + system, all its threads), and the load average around it."""
    env = dict(os.environ, PYTHONPATH=source) if source else None
    load_before = os.getloadavg()
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "stepbench", "report", str(path), "--format", fmt,
                           "--out", str(out)], capture_output=True, text=True, env=env)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime - used.ru_utime + after.ru_stime - used.ru_stime
    if proc.returncode != 0:                 # its warnings (no price) are expected
        raise SystemExit(f"report --format {fmt} exited {proc.returncode}: {proc.stderr}")
    return {"format": fmt, "source": source or "this", "wall_s": round(wall, 2),
            "cpu_s": round(cpu, 2),
            "load_before": [round(v, 2) for v in load_before],
            "load_after": [round(v, 2) for v in os.getloadavg()]}


def scale_ratios(runs: list[dict], setups: int) -> dict:
    """Per format, the large report's (`setups` setups) CPU and wall time over the small
    one's (`--small`), each the sum over the repeats of this stepbench's runs."""
    out = {}
    for fmt in dict.fromkeys(r["format"] for r in runs):
        small = [r for r in runs if r["format"] == fmt and "setups" in r]
        large = [r for r in runs if r["format"] == fmt and "setups" not in r
                 and r["source"] == "this"]
        if small and large:
            out[fmt] = {"small_setups": small[0]["setups"], "setups": setups,
                        **{f"{k}_ratio": round(sum(r[f"{k}_s"] for r in large)
                                               / sum(r[f"{k}_s"] for r in small), 2)
                           for k in ("cpu", "wall")}}
    return out


def machine() -> dict:
    """This machine's CPU and the versions the report ran with."""
    import matplotlib
    import scipy

    import stepbench

    cpu = next((line.split(":", 1)[1].strip() for line in
                Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("model name")),
               platform.processor()) if Path("/proc/cpuinfo").exists() else platform.processor()
    return {"cpu": cpu, "cpu_count": os.cpu_count(),
            "cpus_allowed": len(os.sched_getaffinity(0)),     # fewer under taskset
            "python": platform.python_version(),
            "numpy": np.__version__, "scipy": scipy.__version__,
            "matplotlib": matplotlib.__version__, "stepbench": stepbench.__version__,
            "commit": _commit(Path(stepbench.__file__).parent),
            # Whether each report's process compiles stepbench's modules anew (imports take
            # longer) or reads the bytecode an earlier one wrote.
            "bytecode": ("compiled each run (PYTHONDONTWRITEBYTECODE)"
                         if os.environ.get("PYTHONDONTWRITEBYTECODE") else "cached")}


def _commit(folder: Path) -> str | None:
    """The git commit of the stepbench source that ran, if it is a checkout."""
    try:
        return subprocess.run(["git", "-C", str(folder), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def same_report(ours: Path, theirs: Path) -> dict:
    """Whether two JSON reports of one results file say the same: their findings (kind, group,
    text, lead: every one, in order), the whole object (rows, notes, meta ...), the bytes; and
    the top-level keys whose values differ."""
    a, b = json.loads(ours.read_text()), json.loads(theirs.read_text())
    return {"findings_equal": a.get("findings") == b.get("findings"),
            "findings": len(a.get("findings") or []), "json_equal": a == b,
            "bytes_equal": ours.read_bytes() == theirs.read_bytes(),
            "keys_differ": sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))}


def table(path: Path) -> str:
    """The timings of a --results file as a Markdown table: per call and format, each source's
    CPU seconds and wall seconds with the 1-minute load average before it, in order; whether
    stepbench's bytecode was cached (a call that did not record it: "?")."""
    lines = ["| call (UTC) | commit | bytecode | format | stepbench | CPU s | wall s (load) |",
             "| --- | --- | --- | --- | --- | ---: | ---: |"]
    for line in path.read_text().splitlines():
        call = json.loads(line)
        for fmt in dict.fromkeys(r["format"] for r in call["runs"]):
            for source in dict.fromkeys(r["source"] for r in call["runs"]):
                runs = [r for r in call["runs"] if (r["format"], r["source"]) == (fmt, source)]
                lines.append(
                    f"| {call['when'][:16].replace('T', ' ')} | {call['machine']['commit']} | "
                    f"{call['machine'].get('bytecode', '?').split(' ')[0]} | "
                    f"{fmt} | {'this' if source == 'this' else 'baseline'} | "
                    + ", ".join(f"{r['cpu_s']:.1f}" for r in runs) + " | "
                    + ", ".join(f"{r['wall_s']:.1f} ({r['load_before'][0]:.1f})" for r in runs)
                    + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", type=int, default=200,
                        help="workloads of 16 setups each (default 200: 3,200 setups)")
    parser.add_argument("--formats", default="json,html", help="comma list (default json,html)")
    parser.add_argument("--findings", type=Path,
                        help="write the JSON report's findings here, one per line")
    parser.add_argument("--keep", type=Path, help="keep the results file and reports here")
    parser.add_argument("--repeat", type=int, default=1,
                        help="time each format this many times, in turn (default 1)")
    parser.add_argument("--baseline", metavar="SRC",
                        help="also time the stepbench in this source folder (its src/, e.g. "
                             "from git archive), each format right after this one's, at the "
                             "same load")
    parser.add_argument("--processes", type=int, default=2,
                        help="processes per setup (default 2)")
    parser.add_argument("--small", type=int, metavar="W",
                        help="also time a report of the first W workloads before each large one "
                             "and print the ratio of CPU times")
    parser.add_argument("--results", type=Path,
                        help="append the times, loads and machine to this JSON Lines file")
    parser.add_argument("--table", type=Path, metavar="RESULTS",
                        help="print the timings of a --results file as Markdown, run nothing")
    args = parser.parse_args(argv)
    if args.table:
        sys.stdout.write(table(args.table))
        return 0
    folder = args.keep or Path(tempfile.mkdtemp(prefix="stepbench-report-scale-"))
    folder.mkdir(parents=True, exist_ok=True)
    results = folder / "synthetic.jsonl"
    count = write(results, args.workloads, args.processes)
    print(f"{args.workloads * len(SETUPS):,} setups, {count:,} records: {results}")
    small = None
    if args.small:
        small = folder / "small.jsonl"
        write(small, args.small, args.processes)
    here = machine()                          # the commit as the timings start
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    runs = []
    for _ in range(args.repeat):
        for fmt in args.formats.split(","):
            if small is not None:
                runs.append({**timed_report(small, fmt, folder / f"small.{fmt}"),
                             "setups": args.small * len(SETUPS)})
            for source in [None] + ([args.baseline] if args.baseline else []):
                name = f"report.{fmt}" if source is None else f"baseline.{fmt}"
                runs.append(timed_report(results, fmt, folder / name, source))
                r = runs[-1]
                print(f"{'baseline ' if source else ''}report --format {fmt}: {r['wall_s']:.1f} "
                      f"s wall, {r['cpu_s']:.1f} s CPU (load {r['load_before'][0]:.1f} before, "
                      f"{r['load_after'][0]:.1f} after)")
    ratios = scale_ratios(runs, args.workloads * len(SETUPS)) if small is not None else None
    for fmt, ratio in (ratios or {}).items():
        print(f"report --format {fmt}: {ratio['setups']:,} setups took {ratio['cpu_ratio']:.1f}x "
              f"the CPU time of {ratio['small_setups']:,} (wall {ratio['wall_ratio']:.1f}x)")
    same = None
    if args.baseline and "json" in args.formats.split(","):
        same = same_report(folder / "report.json", folder / "baseline.json")
        print(f"against the baseline: findings {'the same' if same['findings_equal'] else 'DIFFER'}"
              f" ({same['findings']}), JSON {'the same' if same['json_equal'] else 'differs'}"
              f"{' to the byte' if same['bytes_equal'] else ''}"
              + (f" (differs in {', '.join(same['keys_differ'])})" if same["keys_differ"] else ""))
    if args.results:                          # one line per call: calls at other loads add up
        with args.results.open("a") as out:
            out.write(json.dumps({
                "command": "python benchmarks/report_scale.py " + " ".join(argv or sys.argv[1:]),
                "when": started,
                "setups": args.workloads * len(SETUPS), "records": count,
                "processes": args.processes, "baseline": args.baseline, "machine": here,
                "runs": runs, **({"ratios": ratios} if ratios else {}),
                **({"same_as_baseline": same} if same else {})}) + "\n")
        print(f"appended to {args.results}")
    if args.findings:
        out = folder / "report.json"
        if not out.exists():
            timed_report(results, "json", out)
        findings = json.loads(out.read_text())["findings"]
        args.findings.write_text("".join(f"{f['kind']}\t{f['group']}\t{f['text']}\n"
                                         for f in findings))
        print(f"{len(findings)} findings: {args.findings}")
    return 1 if same and not same["findings_equal"] else 0


if __name__ == "__main__":
    sys.exit(main())
