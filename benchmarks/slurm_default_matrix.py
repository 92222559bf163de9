"""Issue 25's "done when", by hand on a CPU machine: the default matrix (eager and compiled, sdpa
and eager attention; llama-tiny, 4 x 64 tokens, one process each) run locally and through the
tests' one-machine Slurm (tests/slurmnet.py: Debian's slurmctld, slurmd and munge, in namespaces
of their own), then compared record by record: the same setups, statuses and losses, the same
record fields, and no job or process left in the cluster. Not a test: a compiled matrix on two
cores takes minutes, which CI cannot spare; tests/test_slurm.py runs an eager one.

    PYTHONPATH=src python benchmarks/slurm_default_matrix.py OUT_FOLDER
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from slurmnet import SlurmCluster  # noqa: E402

ARGS = ["--device", "cpu", "--seq", "64", "--warmup", "2", "--steps", "5", "--repeats", "1",
        "--format", "json"]


def read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def main(out: Path) -> int:
    out.mkdir(parents=True, exist_ok=True)
    src = str(Path(__file__).resolve().parents[1] / "src")
    args = ARGS + ["--compile-cache", str(out / "inductor")]
    local = subprocess.run([sys.executable, "-m", "stepbench", "run", *args, "--out",
                            str(out / "local.jsonl")], env=dict(os.environ, PYTHONPATH=src),
                           capture_output=True, text=True)
    cluster = SlurmCluster()
    try:
        slurm = subprocess.run(cluster.client_argv([sys.executable, "-m", "stepbench", "run",
                                                    "--slurm", *args, "--out",
                                                    str(out / "slurm.jsonl")]),
                               env=dict(cluster.env, PYTHONPATH=src), capture_output=True, text=True)
        left = cluster.jobs(), [p.pid for p in cluster.processes("stepbench")]
    finally:
        cluster.stop()
    print(f"exit codes: local {local.returncode}, slurm {slurm.returncode}; left in the cluster: "
          f"jobs {left[0]}, processes {left[1]}")
    for a, b in zip(read(out / "local.jsonl"), read(out / "slurm.jsonl")):
        print(f"{a['setup']['name']}: status {a['status']}/{b['status']}, setup equal "
              f"{a['setup'] == b['setup']}, losses equal {a['losses'] == b['losses']}, fields "
              f"only in one {sorted(set(a) ^ set(b))}, placement only in one "
              f"{sorted(set(a['placement']) ^ set(b['placement']))}, slurm {b['placement'].get('slurm')}")
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
