"""The CLI runner the tests share, and the order the test files start in.

A cold torch.compile of the tiny model takes tens of seconds on 2 cores, even with scalar
kernels (below), so the suite compiles for real in two places only: test_run.py's matrix (cold,
then warm from the same setup's cache) and test_axes.py's per-layer compile.

Faults are the tests' own, not product code's: a test puts tests/hooks first on its children's
PYTHONPATH (`with_hooks`) and sets DIVERGE_ENV or FAULT_ENV; tests/hooks/sitecustomize.py wraps
stepbench's functions in those processes as they are imported.
"""

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest

from hooks.stepbench_test_hooks import (DIVERGE_ENV, FAULT_ENV, RAY_POLL_ENV,  # noqa: F401
                                        SERVER_THREAD_ENV, SETUP_FAULT_ENV)

# Two pytest workers share two cores (pyproject's addopts): one torch thread per process, so that
# processes never wait on each other's spinning OpenMP threads (a 2-thread step on a core that
# another process holds can run 20x slower). Children inherit it.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# inductor's CPU kernels without SIMD (scalar C++ loops, not at::vec templates): still a real
# torch.compile (dynamo, inductor, g++, its caches cold then warm), at well under half the g++
# time (docs/development.md). What the compiled setups' tests check is stepbench's (cache state,
# counters, losses against eager), not the kernels' speed. Children inherit it.
os.environ.setdefault("TORCHINDUCTOR_VEC_ISA_OK", "0")
# The Ctrl-C tests send SIGINT to a command as a terminal sends it to its foreground job, whose
# SIGINT has its default action. pytest started as a shell's background job (`.ci/run ... &`)
# inherits SIGINT ignored; Python keeps it so, and so would every command a test starts: the
# signal was lost (a tune ran to its end and exited 0, a rented run waited forever). Python's own
# handler here, in the controller and in each xdist worker, makes the suite's processes what a
# foreground run's are; the commands they start get the default action (exec resets a caught
# signal, never an ignored one).
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
# stepbench's own caches (matmul peaks, FLOP counts; measure/cache.py) go to a folder of this
# session, never to the user's ~/.cache: one folder for both xdist workers of a run (named by
# the run's id; the cache's writers lock and replace atomically), a fresh one otherwise.
_RUN = os.environ.get("PYTEST_XDIST_TESTRUNUID")
if _RUN:
    os.environ["STEPBENCH_CACHE_DIR"] = os.path.join(tempfile.gettempdir(), f"stepbench-test-cache-{_RUN}")
else:
    os.environ["STEPBENCH_CACHE_DIR"] = tempfile.mkdtemp(prefix="stepbench-test-cache-")

SRC = str(Path(__file__).resolve().parent.parent / "src")
HOOKS = str(Path(__file__).resolve().parent / "hooks")
# The files that wait on real child processes, longest first (seconds of one worker in a whole
# run on 2 cores: their tests' durations summed, `pytest --durations=0` of the whole suite at
# load 1 to 2.3, 2026-12-05, branch fastsuite2; test_tune.py at its slowest that day, since its
# real tune took 12 to 43 s). pyproject's addopts hand whole files to the two workers in
# collection order (--no-loadscope-reorder), so these start first and the many quick files fill
# in behind them; a file left last that takes minutes would keep one worker busy while the
# other idles. A new file that runs real setups belongs in this list at its place.
SLOW_FILES = {
    "test_ray.py": 110, "test_distributed.py": 75, "test_run_outcomes.py": 58,
    "test_server.py": 44, "test_tune.py": 43, "test_run.py": 36, "test_slurm.py": 35,
    "test_memory_cap.py": 32, "test_workload_remote.py": 32, "test_workloads.py": 31,
    "test_remote.py": 23, "test_rent.py": 20, "test_max_batch.py": 20, "test_remote_stops.py": 18,
    "test_runner.py": 16, "test_axes.py": 12, "test_gpu_pool.py": 6, "test_backend_registry.py": 5,
    "test_compile_layers.py": 4, "test_plan.py": 4, "test_report.py": 4, "test_oom_kill.py": 3,
    "test_hooks.py": 3, "test_cli_errors.py": 3, "test_peak.py": 2,
}
# A CPU run small enough for a test: llama-tiny, 4 x 64 tokens, 2 warm-up and 5 timed steps, one
# process per setup (run's default of 2, and a third where they disagree, would double the
# suite's time; the tests of repeats ask for theirs).
SMALL = ["--device", "cpu", "--seq", "64", "--warmup", "2", "--steps", "5", "--repeats", "1"]


class _NoChildren:
    """While a test not marked `slow` sets up and runs, starting a process fails it: the fast
    loop (`pytest -m "not slow"`) is exactly the tests that start none."""

    def __init__(self, item):
        self.item = item

    def __enter__(self):
        self.saved = [(subprocess.Popen, "_execute_child"), (os, "fork"), (os, "forkpty"),
                      (os, "posix_spawn")]
        self.saved = [(owner, name, getattr(owner, name)) for owner, name in self.saved]
        for owner, name, _ in self.saved:
            setattr(owner, name, self.refuse)

    def __exit__(self, *exc):
        for owner, name, original in self.saved:
            setattr(owner, name, original)

    def refuse(self, *args, **kwargs):
        raise AssertionError(f"{self.item.nodeid} starts a child process: mark it "
                             "@pytest.mark.slow (the fast loop runs none)")


def pytest_configure(config):
    # matplotlib lists the system's fonts (running fc-list) the first time a user without its
    # font cache imports it (a fresh machine, CI): done here, in the controller before any test
    # runs, or the first fast test that draws a plot would start that process and fail.
    if not hasattr(config, "workerinput"):
        import matplotlib

        if not list(Path(matplotlib.get_cachedir()).glob("fontlist-*.json")):
            import matplotlib.font_manager  # noqa: F401


def _guard(item):
    return contextlib.nullcontext() if item.get_closest_marker("slow") else _NoChildren(item)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    with _guard(item):          # module fixtures start here too
        yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    with _guard(item):
        yield


def pytest_collection_modifyitems(items):
    # Stable: within a file, and among the quick files, the order stays as collected.
    items.sort(key=lambda item: -SLOW_FILES.get(item.path.name, 0))


def run_cli(*args, timeout=900, check_json=False, env=None, code=0) -> subprocess.CompletedProcess:
    """`python -m stepbench ARGS` in a real subprocess, as a user would run it (in `env`, else
    this process's environment); with `check_json`, it must exit with `code` (docs/cli.md) and
    its stdout is read as JSON into `.records`."""
    env = env if env is not None else os.environ
    env = dict(env, PYTHONPATH=os.pathsep.join(filter(None, [SRC, env.get("PYTHONPATH")])))
    proc = subprocess.run([sys.executable, "-m", "stepbench", *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, env=env)
    if check_json:
        assert proc.returncode == code, proc.stderr
        proc.records = json.loads(proc.stdout)
    return proc


def with_hooks(env) -> dict:
    """`env` with tests/hooks first on PYTHONPATH (and src after it): a process started with it,
    and every process beneath it, loads the tests' fault hooks (tests/hooks/sitecustomize.py)."""
    path = [HOOKS, SRC, env.get("PYTHONPATH")]
    return dict(env, PYTHONPATH=os.pathsep.join(filter(None, path)))


def wait_for(proc: subprocess.Popen, text: str) -> str:
    """A running process's stderr up to its first line holding `text` (a line-by-line wait on a
    real subprocess: no sleeping, no polling)."""
    seen = []
    for line in proc.stderr:
        seen.append(line)
        if text in line:
            return "".join(seen)
    raise AssertionError(f"never saw {text!r}; stderr was:\n{''.join(seen)}")


def on_a_terminal(args: list[str], env: dict | None = None, timeout: float = 300):
    """`python -m stepbench ARGS` with its stderr on a pseudo-terminal (where the live progress
    is drawn); (exit code, what the terminal showed, stdout)."""
    import pty

    leader, follower = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "stepbench", *map(str, args)], stdin=follower,
                            stdout=subprocess.PIPE, stderr=follower,
                            env={**(env or os.environ), "PYTHONPATH": SRC})
    os.close(follower)
    # stdout is read beside the terminal: a tune's JSON outgrows the pipe's 64 KiB, and a child
    # that waits to write it never closes the terminal that this waits on.
    stdout = []
    reader = threading.Thread(target=lambda: stdout.append(proc.stdout.read()), daemon=True)
    reader.start()
    seen = b""
    try:
        while True:     # read as it comes, so that a full terminal buffer never blocks it
            try:
                chunk = os.read(leader, 65536)
            except OSError:     # EIO: the child's end closed
                break
            if not chunk:
                break
            seen += chunk
    finally:
        os.close(leader)
    code = proc.wait(timeout=timeout)
    reader.join(timeout)
    return code, seen, stdout[0]


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def resumed_and_timed_out(again, kept: dict, out: Path, cluster: str) -> list[dict]:
    """Checks a cluster's second run of MATRIX (`again`, --format json) with --timeout 1: the
    first setup's record `kept` resumed as it was, the second stopped at 1 s in a job of its own
    (`placement[cluster]["job_id"]`), and the file holding just those two; returns them."""
    assert again.returncode == 0, again.stderr
    records = json.loads(again.stdout)
    assert records[0] == kept and records[1]["setup"]["attn"] == "eager"
    assert records[1]["status"] == "timeout"
    from says import names

    assert names(records[1]["error"], "1 s", "last phase", "--timeout")
    assert records[1]["placement"][cluster]["job_id"] != kept["placement"][cluster]["job_id"]
    assert read_jsonl(out) == records
    return records


@pytest.fixture(scope="module")
def sshd(tmp_path_factory):
    """A real OpenSSH server on 127.0.0.1 with its client config (tests/sshd.py); one per test
    module, so that a test that drops its connections drops only its own module's."""
    from sshd import SSHServer

    server = SSHServer(tmp_path_factory.mktemp("sshd"))
    yield server
    server.stop()


@pytest.fixture
def local_executor(monkeypatch):
    """`use(cls)`: the local backend's sites make `cls` (a LocalProcess stand-in, tests/fakes.py)
    instead of LocalProcess, for this test."""
    from stepbench.execute import registry

    def use(cls) -> None:
        monkeypatch.setattr(registry.get("local"), "executor_class", cls)

    return use


# A Ray or Slurm cluster for one test file (module scope: stopped when the file's last test
# ends, not at the session's end, since its daemons take CPU time while they idle beside the
# other files' tests); the test is skipped where one cannot be started here.
@pytest.fixture(scope="module")
def ray_cluster():
    from raynet import RayCluster, unavailable

    reason = unavailable()
    if reason:
        pytest.skip(reason)
    cluster = RayCluster()
    yield cluster
    cluster.stop()


@pytest.fixture(scope="module")
def slurm_cluster():
    from slurmnet import SlurmCluster, unavailable

    reason = unavailable()
    if reason:
        pytest.skip(reason)
    cluster = SlurmCluster()
    yield cluster
    cluster.stop()
