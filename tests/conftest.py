"""The CLI runner the tests share.

A cold torch.compile of the tiny model takes about 20 s on 2 cores, so the suite compiles for real
in one place only: test_run.py's matrix (cold, then warm from the same setup's cache).
"""

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

# Two pytest workers share two cores (pyproject's addopts): one torch thread per process, so that
# processes never wait on each other's spinning OpenMP threads (a 2-thread step on a core that
# another process holds can run 20x slower). Children inherit it.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# stepbench's own caches (matmul peaks, FLOP counts; measure/cache.py) go to a folder of this
# session, never to the user's ~/.cache.
os.environ["STEPBENCH_CACHE_DIR"] = tempfile.mkdtemp(prefix="stepbench-test-cache-")

SRC = str(Path(__file__).resolve().parent.parent / "src")
# A CPU run small enough for a test: llama-tiny, 4 x 64 tokens, 2 warm-up and 5 timed steps.
SMALL = ["--device", "cpu", "--seq", "64", "--warmup", "2", "--steps", "5"]


def run_cli(*args, timeout=900, check_json=False) -> subprocess.CompletedProcess:
    """`python -m stepbench ARGS` in a real subprocess, as a user would run it."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [SRC, os.environ.get("PYTHONPATH")])))
    proc = subprocess.run([sys.executable, "-m", "stepbench", *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, env=env)
    if check_json:
        assert proc.returncode == 0, proc.stderr
        proc.records = json.loads(proc.stdout)
    return proc


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def sshd(tmp_path_factory):
    """A real OpenSSH server on 127.0.0.1 with its client config (tests/sshd.py); one per test
    module, so that a test that drops its connections drops only its own module's."""
    from sshd import SSHServer

    server = SSHServer(tmp_path_factory.mktemp("sshd"))
    yield server
    server.stop()
