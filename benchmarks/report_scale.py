"""How long `stepbench report` takes for a large results file (issue 23, item 6).

Writes synthetic records of WORKLOADS x 16 setups (default 200 x 16 = 3,200 setups, two
processes each, 20 timed steps per process) on one GPU, then times `stepbench report --format
json` and `--format html` on them in this process (through stepbench.cli.main, as a user's
command would run, reading the file). The records are made from a seeded generator: the same
arguments give the same file, so the findings of two stepbench versions can be compared
(`--findings FILE` writes them, one line each).

Each workload is a model (20 names, nothing is built), a batch (1, 2, 4, 8, 16) and a sequence
length (512, 2048); its 16 setups are eager or compile x sdpa or eager attention x kernels none
or liger x AdamW fused or foreach. Compiled steps are 20% faster on most models and within a
percent on some (so both significant and within-the-noise comparisons occur), eager attention
is 1.5x slower and at the largest workloads runs out of memory in eager mode.

    PYTHONPATH=src python benchmarks/report_scale.py                  # 3,200 setups, json + html
    PYTHONPATH=src python benchmarks/report_scale.py --workloads 20 --findings /tmp/f.txt
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
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


def write(path: Path, n_workloads: int) -> int:
    data = records(n_workloads)
    path.write_text("".join(json.dumps(r) + "\n" for r in data))
    return len(data)


def timed_report(path: Path, fmt: str, out: Path) -> float:
    from stepbench.cli import main

    start = time.perf_counter()
    with contextlib.redirect_stderr(io.StringIO()):     # warnings (no price) are expected
        code = main(["report", str(path), "--format", fmt, "--out", str(out)])
    elapsed = time.perf_counter() - start
    if code != 0:
        raise SystemExit(f"report --format {fmt} exited {code}")
    return elapsed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", type=int, default=200,
                        help="workloads of 16 setups each (default 200: 3,200 setups)")
    parser.add_argument("--formats", default="json,html", help="comma list (default json,html)")
    parser.add_argument("--findings", type=Path,
                        help="write the JSON report's findings here, one per line")
    parser.add_argument("--keep", type=Path, help="keep the results file and reports here")
    args = parser.parse_args(argv)
    folder = args.keep or Path(tempfile.mkdtemp(prefix="stepbench-report-scale-"))
    folder.mkdir(parents=True, exist_ok=True)
    results = folder / "synthetic.jsonl"
    count = write(results, args.workloads)
    print(f"{args.workloads * len(SETUPS):,} setups, {count:,} records: {results}")
    import stepbench.cli  # noqa: F401 - imported before the clock starts, as `stepbench` would be

    for fmt in args.formats.split(","):
        out = folder / f"report.{fmt}"
        print(f"report --format {fmt}: {timed_report(results, fmt, out):.1f} s")
    if args.findings:
        out = folder / "report.json"
        if not out.exists():
            timed_report(results, "json", out)
        findings = json.loads(out.read_text())["findings"]
        args.findings.write_text("".join(f"{f['kind']}\t{f['group']}\t{f['text']}\n"
                                         for f in findings))
        print(f"{len(findings)} findings: {args.findings}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
