"""A user's factory project for the real runs of `--model FILE.py:FUNCTION` on the remote
backends (tests/test_workload_remote.py: SSH and rented machines; tests/test_ray.py and
tests/test_slurm.py: a Ray and a Slurm job, on the cluster their file starts once).

The factory refuses to run from the file the test wrote (`ORIGIN`): an `ok` record says the job
imported a carried copy, at the same relative path, with the module beside it (--workload-dir)
importable there too.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from conftest import SRC, read_jsonl
from says import error_line, lines_naming, names

FACTORY = '''
from pathlib import Path

import torch
from torch import nn

from helper import WIDTH        # beside this file: it travels with --workload-dir

ORIGIN = {origin!r}


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, WIDTH), nn.ReLU(), nn.Linear(WIDTH, 1))

    def forward(self, x):
        return self.body(x).pow(2).mean()


def make(batch_size, device):
    here = str(Path(__file__).resolve())
    if ORIGIN and here.startswith(ORIGIN):
        raise RuntimeError(f"imported from {{here}}, not from a carried copy")
    x = torch.randn(batch_size, 8, device=device)
    return Net(), lambda: x
'''
MODEL = "../proj/nets/mlp.py:make"
TINY = ["--device", "cpu", "--modes", "eager", "--batch", "2", "--warmup", "1", "--steps", "2",
        "--repeats", "1"]


def project(root: Path, guard: bool = True) -> Path:
    """root/proj/nets/{mlp,helper}.py (with a .git and a __pycache__ that do not travel) and
    root/run, the folder the run starts in; returns root/run."""
    nets = root / "proj" / "nets"
    nets.mkdir(parents=True)
    (nets / "mlp.py").write_text(FACTORY.format(origin=str((root / "proj").resolve())
                                                if guard else ""))
    (nets / "helper.py").write_text("WIDTH = 16\n")
    (nets / "__pycache__").mkdir()
    (nets / "__pycache__" / "mlp.cpython-311.pyc").write_bytes(b"\0" * 10)
    (root / "proj" / ".git").mkdir()
    (root / "proj" / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (root / "run").mkdir()
    return root / "run"



def one_ok(records: list[dict], start: str | None = None) -> dict:
    [record] = records
    assert record["status"] == "ok", record.get("error")
    assert record["setup"]["model"] == MODEL      # the identity, as given
    assert len(record["step_times_ms"]) == 2 and record["units"] == "samples"
    if start:
        assert record["placement"]["start"] == start
    return record


def with_src(**extra) -> dict:
    return dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [SRC, os.environ.get(
        "PYTHONPATH")])), **extra)


def only_the_nodes_have_it(cluster, engine: list[str], run: Path, out: Path, env: dict,
                           where: str, refusing: tuple[str, ...] = ()) -> None:
    """`--model nodes_only_net:make` (tests/nodes_only: the test cluster's nodes import it, this
    client cannot): its signature read `where`, then measured; a --param it does not take
    refused in one line, exit 2, before any setup's job (`refusing`: more flags of that run)."""
    for flags, code in [(["--param", "depth=2"], 0), (["--param", "width=8", *refusing], 2)]:
        proc = subprocess.run(cluster.client_argv(
            [sys.executable, "-m", "stepbench", "run", *engine, "--model", "nodes_only_net:make",
             *flags, *TINY, "--out", str(out), "--format", "json"]),
            cwd=run, capture_output=True, text=True, timeout=600, env=env)
        assert proc.returncode == code, proc.stderr
        assert lines_naming(proc.stderr, "read the signature of nodes_only_net:make", where)
    [record] = [r for r in read_jsonl(out) if r["setup"]["model"] == "nodes_only_net:make"]
    assert record["status"] == "ok" and record["setup"]["params"] == "depth=2"
    assert error_line(proc.stderr.strip().splitlines()[-1], "run")
    assert names(proc.stderr, "--param width", "depth")
