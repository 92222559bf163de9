"""A real Ray cluster for the tests: a head and a second raylet on this machine, with two fake
GPUs on the head, in a network namespace of their own with loopback only.

Why a namespace: Ray listens on the machine's network interface even when told 127.0.0.1; inside
`unshare --net` the only interface is loopback, so nothing reaches or leaves it. Why a PID
namespace too (and a mount namespace for its /proc): every process Ray starts (daemonized by
`ray start`, so never this process's children) is inside it, and killing the namespace's first
process ends them all; no `ray stop`, which would end every Ray process on the machine by name.

Ray's own processes (and so the jobs' processes) have tests/hooks on their PYTHONPATH: with
RAY_POLL_ENV its dashboard streams a job's log polling every 0.1 s, not every second (to find
the job's node, once more after it, and twice at the log file's end for every new line): a
job's first line comes about 2.5 s sooner, every later one up to 2 s sooner; the same lines
(tests/hooks/sitecustomize.py). Ray's job manager still looks at a job's supervisor once a
second (what stepbench's deletion of an ended job waits for, execute/ray/jobs.py).

The namespaces are held by a small Python process (HOLDER: it brings loopback up and reaps
orphans as the namespace's init). Commands enter them with nsenter: `ray start` the network, PID
and mount namespaces; a stepbench client (`client_argv`) only the network namespace, so that it
stays this process's child, in this machine's PID namespace, and signals reach it directly.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import psutil

from conftest import HOOKS, RAY_POLL_ENV

HOLDER = """
import os, subprocess, sys, time
subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
print("ready", flush=True)
while True:
    try:
        os.wait()
    except ChildProcessError:
        time.sleep(1)
"""
# A package the nodes import and the tests' clients cannot (tests/nodes_only/nodes_only_net).
NODES_ONLY = str(Path(__file__).resolve().parent / "nodes_only")
DASHBOARD_PORT = 8265
# Ray's dashboard's polls on the test cluster (RAY_POLL_ENV), and its clients' pace of deleting
# ended jobs (tests/hooks/stepbench_test_hooks.py, settle_sooner).
POLL_S = "0.1"
GPU_TYPE = "FAKE-GPU"
# Small: two cores shared with everything else. The head has two fake GPUs (and the GPU type
# above), two CPUs; the second raylet one CPU and no GPU (the second node of a two-node job).
HEAD = ["--head", "--port=6379", "--num-cpus=2", "--num-gpus=2",
        f"--resources={json.dumps({'accelerator_type:' + GPU_TYPE: 1})}",
        "--include-dashboard=true", f"--dashboard-port={DASHBOARD_PORT}",
        "--dashboard-host=127.0.0.1"]
# Its own ports: two raylets on one address must not share the agent's and managers' ports.
WORKER = ["--address=127.0.0.1:6379", "--num-cpus=1", "--num-gpus=0",
          "--dashboard-agent-listen-port=52366", "--dashboard-agent-grpc-port=52367",
          "--metrics-export-port=52368", "--runtime-env-agent-port=52369",
          "--node-manager-port=52370", "--object-manager-port=52371",
          "--min-worker-port=20000", "--max-worker-port=20999"]
COMMON = ["--node-ip-address=127.0.0.1", "--object-store-memory=100000000",
          "--disable-usage-stats"]


def unavailable() -> str | None:
    """Why no Ray cluster can be started here, or None."""
    try:
        import ray  # noqa: F401
        from ray.job_submission import JobSubmissionClient  # noqa: F401
    except ImportError:
        return "Ray's Jobs API cannot be imported (pip install 'stepbench[ray]')"
    if not shutil.which("unshare") or not shutil.which("nsenter") or not shutil.which("ip"):
        return "unshare, nsenter or ip is missing (util-linux, iproute2)"
    if os.geteuid() != 0:
        return "network namespaces need root here"
    return None


class Namespaced:
    """A cluster whose processes live in namespaces held by HOLDER's child (`self.pid`): a
    command entering them, a client's command in the network namespace only, and the live
    processes of its PID namespace, and its end (tests/slurmnet.py's cluster is one too).
    A subclass sets `pid`, `holder` (the HOLDER process) and `folder` (removed at the end)."""

    def enter(self, namespaces: list[str]) -> list[str]:
        return ["nsenter", "-t", str(self.pid), *namespaces]

    def client_argv(self, argv: list[str]) -> list[str]:
        """`argv` run in the cluster's network namespace (and nothing else of it)."""
        return self.enter(["-n"]) + argv

    def processes(self, text: str) -> list[psutil.Process]:
        """The cluster's live processes whose command line holds `text`."""
        mine = os.readlink(f"/proc/{self.pid}/ns/pid")
        found = []
        for p in psutil.process_iter(["cmdline"]):
            try:
                if (os.readlink(f"/proc/{p.pid}/ns/pid") == mine
                        and text in " ".join(p.info["cmdline"] or [])
                        and p.status() != psutil.STATUS_ZOMBIE):
                    found.append(p)
            except (OSError, psutil.Error):
                pass
        return found

    def stop(self) -> None:
        """Ends every process of the namespace: the kernel kills them all when its first
        process (the holder's child, PID 1 there) dies."""
        pid = getattr(self, "pid", None)
        if pid is not None:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self.holder.poll() is None:
            self.holder.wait(timeout=30)
        shutil.rmtree(self.folder, ignore_errors=True)


class RayCluster(Namespaced):
    """The cluster; `address` is its Jobs API as a client inside the namespace reaches it."""

    address = f"http://127.0.0.1:{DASHBOARD_PORT}"

    def __init__(self, env: dict | None = None):
        self.folder = Path(tempfile.mkdtemp(prefix="sbray-"))   # short: Unix socket paths
        bin_dir = str(Path(sys.executable).parent)
        # The jobs' `python` is this Python (first on the raylets' PATH), as on a cluster whose
        # nodes have one Python with torch and Ray.
        # No token authentication: the namespace has only loopback, and a token would be read
        # from (or, by ray.init, written to) the user's ~/.ray.
        env = env or os.environ
        self.env = dict(env, PATH=os.pathsep.join([bin_dir, os.environ["PATH"]]),
                        PYTHONPATH=os.pathsep.join(filter(None, [HOOKS, NODES_ONLY,
                                                                 env.get("PYTHONPATH")])),
                        RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_MODE="disabled",
                        **{RAY_POLL_ENV: POLL_S})
        self.holder = subprocess.Popen(["unshare", "--net", "--pid", "--fork", "--mount-proc",
                                        "--kill-child", sys.executable, "-c", HOLDER], stdout=subprocess.PIPE,
                                       stderr=subprocess.DEVNULL,
                                       text=True)
        try:
            assert self.holder.stdout.readline().strip() == "ready", "the namespace holder failed"
            self.pid = psutil.Process(self.holder.pid).children()[0].pid
            self.ray = str(Path(bin_dir) / "ray")
            for args in (HEAD, WORKER):
                done = subprocess.run(self.enter(["-n", "-p", "-m"]) + [
                    self.ray, "start", *args, *COMMON, f"--temp-dir={self.folder}"],
                    env=self.env, capture_output=True, text=True, timeout=180)
                assert done.returncode == 0, f"ray start {args[0]} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        except BaseException:
            self.stop()
            raise

    def jobs(self) -> list[dict]:
        """The cluster's jobs as the Jobs API lists them (GET /api/jobs/, what Ray's
        JobSubmissionClient.list_jobs asks; asked from inside the namespace, by a Python that
        does not import Ray)."""
        script = ("import json, sys, urllib.request; "
                  "print(json.dumps([{'id': j['submission_id'], 'status': j['status']} for j in "
                  "json.load(urllib.request.urlopen(sys.argv[1] + '/api/jobs/', timeout=50))]))")
        out = subprocess.run(self.client_argv([sys.executable, "-c", script, self.address]),
                             capture_output=True, text=True, check=True, timeout=60).stdout
        return json.loads(out.strip().splitlines()[-1])
