"""Shared test fixtures: one inductor cache for the whole session, and a CLI runner.

A cold torch.compile of the tiny model takes about 20 s on 2 cores, a warm one about 3 s, so every
test that compiles passes the same --compile-cache folder.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SRC = str(Path(__file__).resolve().parent.parent / "src")


@pytest.fixture(scope="session")
def compile_cache(tmp_path_factory) -> Path:
    shared = os.environ.get("STEPBENCH_TEST_CACHE")
    return Path(shared) if shared else tmp_path_factory.mktemp("inductor-cache")


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
