"""`stepbench run --host` when things end early, through a real OpenSSH server (tests/sshd.py):
a setup's process killed on the host, the host lost mid-run, and SIGTERM to stepbench here.
The same results file goes through all three, resuming each time; the remote processes are
looked up by their command lines (the run's own --remote-dir is in them)."""

import pytest
import os
import signal
import subprocess
import sys
import threading
import time

import psutil

from conftest import SRC, read_jsonl, wait_for
from sshd import processes_with
from says import lines_naming, names

pytestmark = pytest.mark.slow     # every test here starts child processes

# Eager SDPA at seq 64: batch 64 (and 48) takes seconds per warm-up step, so those setups are
# still in their warm-up when the test acts.
BASE = ["--modes", "eager", "--attn", "sdpa", "--seq", "64", "--warmup", "5", "--steps", "100",
        "--repeats", "1"]


def start(sshd, remote_dir, out, batches):
    env = dict(os.environ, PYTHONPATH=SRC)
    proc = subprocess.Popen(
        [sys.executable, "-m", "stepbench", "run", "--host", "alpha", "--ssh-config",
         str(sshd.config), "--remote-python", sys.executable, "--remote-dir", str(remote_dir),
         *BASE, "--batch", batches, "--out", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    watchdog = threading.Timer(240, proc.kill)  # a hang fails the test instead of the suite
    watchdog.daemon = True
    watchdog.start()
    return proc



def remote_processes(remote_dir) -> tuple[psutil.Process, psutil.Process, psutil.Process]:
    """The hostside process of the running setup there (`hostside run`), the setup's own process,
    and the host's process server (`hostside serve`) that forked it: the setup's process is the
    server's child and shows the server's command line."""
    procs = processes_with(str(remote_dir))
    [side] = [p for p in procs if p.cmdline()[-2:-1] == ["run"]]
    serving = [p for p in procs if "serve" in p.cmdline()]
    [server] = [p for p in serving if p.ppid() not in {q.pid for q in serving}]
    [worker] = server.children()
    return side, worker, server


def gone(*procs, within_s: float = 20) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in procs):
            return True
        time.sleep(0.2)
    return False


def test_killed_setup_lost_host_and_sigterm(sshd, tmp_path):
    out, remote_dir = tmp_path / "r.jsonl", tmp_path / "remote"

    # 1. The setup's process is killed on the host: a crashed record, tagged with the host.
    # (Records of setups that finished there, tagged alike: tests/test_remote.py.)
    proc = start(sshd, remote_dir, out, "64")
    wait_for(proc, "alpha: [1/1] eager+sdpa batch 64 seq 64: warm-up")
    side, worker, server = remote_processes(remote_dir)
    worker.kill()
    rest = proc.stderr.read()
    assert proc.wait(60) == 1, rest         # no setup ran ok (docs/cli.md, "Exit codes")
    assert any(line.startswith("stepbench run: ") and "(1 crashed)" in line
               for line in rest.splitlines())
    [crashed] = read_jsonl(out)
    assert (crashed["setup"]["batch"], crashed["status"], crashed["host"]) == (64, "crashed", "alpha")
    assert names(crashed["error"].split(";")[0], "SIGKILL", "warmup")
    assert gone(side, server)

    # 2. The host is lost mid-run (its sshd processes die): one line; nothing recorded for the
    # setup that was running; the processes there end when their connection is gone.
    proc = start(sshd, remote_dir, out, "48")
    wait_for(proc, "alpha: [1/1] eager+sdpa batch 48 seq 64: warm-up")
    side, worker, server = remote_processes(remote_dir)
    assert sshd.drop_connections() >= 1
    rest = proc.stderr.read()
    assert proc.wait(60) == 1, rest
    [lost] = [line for line in rest.splitlines() if line.startswith("stepbench run: host alpha: ")]
    assert names(lost, "connection", "eager+sdpa batch 48 seq 64", "1 setup", "resume")
    assert len(read_jsonl(out)) == 1
    assert gone(side, worker, server)

    # 3. A crashed record is of its moment: the same command measures it again and says so
    # (docs/cli.md, "Resume"). SIGTERM here stops that setup there; the stored crash stays the
    # file's only record, and nothing new is in the table.
    proc = start(sshd, remote_dir, out, "64,48")
    said = wait_for(proc, "alpha: [1/2] eager+sdpa batch 64 seq 64: warm-up")
    assert lines_naming(said, "alpha: retrying 1 setup", "crashed", "--rerun")
    assert not lines_naming(said, "skipped")
    side, worker, server = remote_processes(remote_dir)
    proc.send_signal(signal.SIGTERM)
    rest = proc.stderr.read()
    assert proc.wait(60) == 143, rest
    rows = [line.split()[:4] for line in proc.stdout.read().splitlines()
            if line.strip().startswith("eager+sdpa")]
    assert rows == [], rows
    last = rest.strip().splitlines()[-1]
    assert names(last, "stopped by SIGTERM", "every host", "resume")
    assert "Traceback" not in rest
    assert gone(side, worker, server)
    assert read_jsonl(out) == [crashed]
    # The run's work folder there was removed on the way out.
    assert len(list((remote_dir / "runs").iterdir())) == 1      # only the lost run's is left
