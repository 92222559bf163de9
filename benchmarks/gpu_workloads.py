"""Runs on the GPU machine (issue 35): stepbench on the two user-workload examples against a plain
script of the same step (benchmarks/plain_step.py), interleaved in one call: GPT-2 124M
(examples/gpt.py, batch 8 x 1024) and torchvision ResNet-50 (examples/resnet.py, batch 128),
eager and compiled. Each pair runs the plain script first, then `stepbench run` of the same
setup in a fresh process (`--start fresh --repeats 1`: one process per setup, as the script),
both on one inductor cache in a temporary folder (the script's compile is the cold one, so
compare first steps with that in mind).

    PYTHONPATH=src python3 benchmarks/gpu_workloads.py --out $OUT

Writes $OUT/plain.jsonl (the script's lines), $OUT/stepbench.jsonl (stepbench's records),
$OUT/summary.md (step time and peak memory, stepbench / script, per setup) and $OUT/env.txt
(versions, commit, wall time of every command). Stops starting new pairs past --budget-s.
`--setups resnet:compile,resnet:eager --rounds 3` measures only those, three pairs each, round by
round (stepbench with --rerun after the first); the summary then compares the medians of the
processes' step times.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SETUPS = [  # (example, mode, batch, seq)
    ("gpt", "eager", 8, 1024), ("gpt", "compile", 8, 1024),
    ("resnet", "eager", 128, None), ("resnet", "compile", 128, None),
]


def stepbench_args(example: str, mode: str, batch: int, seq: int | None, out: Path,
                   cache: Path, rerun: bool = False) -> list[str]:
    args = [sys.executable, "-m", "stepbench", "run", "--model", f"examples/{example}.py:make",
            "--device", "cuda", "--modes", mode, "--batch", str(batch), "--start", "fresh",
            "--repeats", "1", "--compile-cache", str(cache), "--out", str(out), "--no-peak"]
    return args + (["--seq", str(seq)] if seq else []) + (["--rerun"] if rerun else [])


def timed(args: list[str], env: dict, log, stdout=None, timeout: float = 400) -> float:
    start = time.perf_counter()
    log.write(f"$ {' '.join(args)}\n")
    log.flush()
    try:
        proc = subprocess.run(args, cwd=ROOT, env=env, stdout=stdout or log, stderr=log,
                              text=True, timeout=timeout)
        code = proc.returncode
    except subprocess.TimeoutExpired:
        code = "timeout"
    wall = time.perf_counter() - start
    log.write(f"# exit {code}, {wall:.1f} s\n")
    log.flush()
    return wall


def summary(plain_path: Path, stepbench_path: Path) -> str:
    """Per setup: the median over its processes of the script's and of stepbench's mean step time
    (one process each way: those means), their ratio, peaks and first steps."""
    import statistics

    plain = [json.loads(line) for line in plain_path.read_text().splitlines() if line.strip()]
    records = [json.loads(line) for line in stepbench_path.read_text().splitlines()
               if line.strip()] if stepbench_path.exists() else []
    lines = ["| setup | processes (script, stepbench) | script ms | stepbench ms | ratio | script GB | "
             "stepbench GB | ratio | first step s (script, stepbench) |",
             "|---|---|---|---|---|---|---|---|---|"]
    med = statistics.median
    for key in dict.fromkeys((p["model"], p["mode"], p["batch"]) for p in plain):
        model, mode, batch = key
        ps = [p for p in plain if (p["model"], p["mode"], p["batch"]) == key and p.get("step_ms")]
        rs = [r for r in records if r["setup"]["model"] == f"examples/{model}.py:make"
              and r["setup"]["mode"] == mode and r["setup"]["batch"] == batch
              and r.get("step_ms") is not None]
        label = f"{model} {mode} b{batch}"
        if not ps or not rs:
            lines.append(f"| {label} | {len(ps)}, {len(rs)} | missing | | | | | | |")
            continue
        p_ms, r_ms = med(p["step_ms"] for p in ps), med(r["step_ms"] for r in rs)
        p_gb, r_gb = max(p["peak_memory_gb"] for p in ps), max(r["peak_memory_gb"] for r in rs)
        each_p = ", ".join(f"{p['step_ms']:.2f}" for p in ps)
        each_r = ", ".join(f"{r['step_ms']:.2f}" for r in rs)
        lines.append(f"| {label} | {len(ps)}, {len(rs)} | {p_ms:.2f} ({each_p}) | {r_ms:.2f} "
                     f"({each_r}) | {r_ms / p_ms:.3f} | "
                     f"{p_gb:.2f} | {r_gb:.2f} | {r_gb / p_gb:.3f} | "
                     f"{ps[0]['first_step_s']:.1f}, {rs[0]['first_step_s']:.1f} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "out")))
    parser.add_argument("--budget-s", type=float, default=420.0,
                        help="start no new pair after this many seconds (default 420)")
    parser.add_argument("--setups", default="",
                        help="only these, EXAMPLE:MODE,... (default: all four)")
    parser.add_argument("--rounds", type=int, default=1, help="pairs per setup, round by round")
    args = parser.parse_args()
    wanted = set(filter(None, args.setups.split(",")))
    setups = [s for s in SETUPS if not wanted or f"{s[0]}:{s[1]}" in wanted]
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    cache = Path(tempfile.mkdtemp(prefix="stepbench-workloads-inductor-"))
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(cache),
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT / "src"),
                                                        os.environ.get("PYTHONPATH")])))
    begun = time.perf_counter()
    with open(out / "env.txt", "w") as log:
        try:
            commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                                    text=True).stdout.strip()
        except OSError:
            commit = ""
        now = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
        log.write(f"# commit {commit or 'unknown'}; {now}\n")
        log.flush()
        subprocess.run([sys.executable, "-c", "import torch, torchvision; print('torch', "
                        "torch.__version__, 'torchvision', torchvision.__version__, "
                        "torch.cuda.get_device_name())"], stdout=log, stderr=log, env=env)
        with open(out / "plain.jsonl", "a") as plain:
            for round_ in range(args.rounds):
                for example, mode, batch, seq in setups:
                    if time.perf_counter() - begun > args.budget_s:
                        log.write(f"# budget spent: {example} {mode} round {round_ + 1} not run\n")
                        continue
                    script = [sys.executable, "benchmarks/plain_step.py", example, mode, str(batch)]
                    timed(script + ([str(seq)] if seq else []), env, log, stdout=plain)
                    plain.flush()
                    timed(stepbench_args(example, mode, batch, seq, out / "stepbench.jsonl", cache,
                                         rerun=round_ > 0), env, log)
        log.write(f"# total {time.perf_counter() - begun:.1f} s\n")
    text = summary(out / "plain.jsonl", out / "stepbench.jsonl")
    (out / "summary.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
