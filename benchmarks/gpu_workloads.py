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
                   cache: Path) -> list[str]:
    args = [sys.executable, "-m", "stepbench", "run", "--model", f"examples/{example}.py:make",
            "--device", "cuda", "--modes", mode, "--batch", str(batch), "--start", "fresh",
            "--repeats", "1", "--compile-cache", str(cache), "--out", str(out), "--no-peak"]
    return args + (["--seq", str(seq)] if seq else [])


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
    plain = [json.loads(line) for line in plain_path.read_text().splitlines() if line.strip()]
    records = [json.loads(line) for line in stepbench_path.read_text().splitlines()
               if line.strip()] if stepbench_path.exists() else []
    lines = ["| setup | script ms | stepbench ms | ratio | script GB | stepbench GB | ratio | "
             "first step s (script, stepbench) |", "|---|---|---|---|---|---|---|---|"]
    for p in plain:
        name = f"examples/{p['model']}.py:make"
        match = [r for r in records if r["setup"]["model"] == name
                 and r["setup"]["mode"] == p["mode"] and r["setup"]["batch"] == p["batch"]]
        r = match[-1] if match else None
        if r is None or r.get("step_ms") is None:
            lines.append(f"| {p['model']} {p['mode']} b{p['batch']} | {p['step_ms']:.2f} | "
                         f"{r['status'] if r else 'missing'} | | | | | |")
            continue
        lines.append(f"| {p['model']} {p['mode']} b{p['batch']} | {p['step_ms']:.2f} | "
                     f"{r['step_ms']:.2f} | {r['step_ms'] / p['step_ms']:.3f} | "
                     f"{p['peak_memory_gb']:.2f} | {r['peak_memory_gb']:.2f} | "
                     f"{r['peak_memory_gb'] / p['peak_memory_gb']:.3f} | "
                     f"{p['first_step_s']:.1f}, {r['first_step_s']:.1f} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "out")))
    parser.add_argument("--budget-s", type=float, default=420.0,
                        help="start no new pair after this many seconds (default 420)")
    args = parser.parse_args()
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
            for example, mode, batch, seq in SETUPS:
                if time.perf_counter() - begun > args.budget_s:
                    log.write(f"# budget spent: {example} {mode} not run\n")
                    continue
                script = [sys.executable, "benchmarks/plain_step.py", example, mode, str(batch)]
                timed(script + ([str(seq)] if seq else []), env, log, stdout=plain)
                timed(stepbench_args(example, mode, batch, seq, out / "stepbench.jsonl", cache),
                      env, log)
        log.write(f"# total {time.perf_counter() - begun:.1f} s\n")
    text = summary(out / "plain.jsonl", out / "stepbench.jsonl")
    (out / "summary.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
