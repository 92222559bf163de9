"""The process server itself (the forked side of local/server.py): what `python -c SERVER_MAIN`
runs. It imports what a setup's process imports once, then forks each setup's process while it
holds one thread; the parent's side (ProcessServer, ForkedChild) is local/server.py, which says
why and how.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import NoReturn

from stepbench.process import exit_now
from stepbench.execute.local.server import (SERVER_ENV, SOCKET_PATH_MAX, ServerError, _receive,
                                            _send)

# What a fresh process's torch would set and see: its intra- and inter-op threads and its GPU
# count, measured once per machine and cached (see FreshThreads).
THREADS_PROBE = ("import json, torch; print(json.dumps([torch.get_num_threads(), "
                 "torch.get_num_interop_threads(), torch.cuda.device_count()]))")


def thread_names() -> list[str]:
    """The names of this process's threads, as the kernel knows them (Python's and native)."""
    names = []
    for task in sorted(os.listdir("/proc/self/task")):
        try:
            names.append(Path(f"/proc/self/task/{task}/comm").read_text().strip())
        except OSError:
            pass
    return names



# ---------------------------------------------------------------- the server's side

class _Laps:
    """Seconds per named part, each from the end of the one before."""

    def __init__(self):
        self.seconds: dict[str, float] = {}
        self.mark = time.perf_counter()

    def __call__(self, name: str) -> None:
        now = time.perf_counter()
        self.seconds[name] = round(now - self.mark, 3)
        self.mark = now


def preload(spec: dict, probe: "FreshThreads | None" = None) -> dict:
    """Import what a setup's process imports; seconds per part. Inductor's compiler (compiled
    setups) is imported once `probe` tells the GPU count a fresh process sees (see
    nvml_answered); without a probe it is left to the child."""
    lap = _Laps()
    import torch  # noqa: F401

    lap("torch")
    from stepbench.measure import models, step, worker  # noqa: F401

    for model, seq in spec.get("models") or []:
        try:
            models.import_modeling(model, seq)
        except Exception:  # noqa: BLE001 - the child says what is wrong with its model
            pass
    lap("transformers")
    if spec.get("compile"):
        import torch._dynamo  # noqa: F401
        import torch._inductor.config  # noqa: F401
        lap("dynamo")
        if probe is not None:
            with nvml_answered(probe.result()[2]):
                import torch._inductor.compile_fx  # noqa: F401
            lap("inductor")
    return lap.seconds


@contextlib.contextmanager
def nvml_answered(gpus: int):
    """torch.cuda's NVML count answered with `gpus` while the block imports. Importing
    torch._inductor asks torch.cuda.is_available() at module level (torch 2.11's
    runtime/benchmarking.py), which under PYTORCH_NVML_BASED_CUDA_CHECK initialises NVML, and
    NVML starts a thread that a forked child must not inherit. The answer is what a fresh process
    of this machine sees (FreshThreads measures it), so a module that keeps it keeps the same."""
    import torch.cuda

    names = [n for n in ("_device_count_nvml", "_device_count_amdsmi") if hasattr(torch.cuda, n)]
    saved = {n: getattr(torch.cuda, n) for n in names}
    for name in names:
        setattr(torch.cuda, name, lambda: gpus)
    try:
        yield
    finally:
        for name, function in saved.items():
            setattr(torch.cuda, name, function)


class FreshThreads:
    """[intra-op threads, inter-op threads, GPUs] that torch sets and sees in a fresh process
    started with `parent_env`: cached per machine, torch and thread settings (measure/cache.py),
    else measured by a process started here, which imports torch while the server imports too."""

    def __init__(self, parent_env: dict[str, str]):
        from importlib.metadata import version

        from stepbench.measure.cache import JsonCache

        self.cache = JsonCache("threads")
        self.key = {"torch": version("torch"), "cpus": len(os.sched_getaffinity(0)),
                    "host": socket.gethostname(),
                    "env": {k: parent_env.get(k) for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS",
                                                         "CUDA_VISIBLE_DEVICES")}}
        hit = self.cache.get(self.key)
        self.value = hit[0] if hit is not None and self._valid(hit[0]) else None
        self.proc = None
        if self.value is None:
            env = {k: v for k, v in parent_env.items() if not k.startswith("STEPBENCH_SERVER")}
            self.proc = subprocess.Popen([sys.executable, "-c", THREADS_PROBE], env=env,
                                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                         text=True)

    @staticmethod
    def _valid(value) -> bool:
        return isinstance(value, list) and len(value) == 3 and \
            all(isinstance(v, int) and v > 0 for v in value[:2]) and \
            isinstance(value[2], int) and value[2] >= 0

    def result(self) -> list[int]:
        if self.value is None:
            out, _ = self.proc.communicate(timeout=300)
            value = json.loads(out.strip().splitlines()[-1])
            if not self._valid(value):
                raise ServerError(f"a fresh process's threads could not be told ({out!r})")
            self.value = value
            self.cache.put(self.key, value)
        return self.value


def ready(spec: dict, parent_env: dict[str, str]) -> dict:
    """Import what the setups need, learn a fresh process's threads; the "ready" message (or a
    ServerError)."""
    probe = FreshThreads(parent_env)
    seconds = preload(spec, probe)
    threads = probe.result()[:2]
    import torch

    if torch.cuda.is_initialized():
        raise ServerError("CUDA was started while importing; the server cannot fork")
    sys.stdout.flush()
    sys.stderr.flush()
    return {"op": "ready", "pid": os.getpid(), "imports_s": seconds, "threads": thread_names(),
            "fresh_threads": threads}


def serve(sock: socket.socket, spec: dict, parent_env: dict[str, str]) -> None:
    """The server of one parent, on the socket it was started with: it ends when the parent
    closes it."""
    try:
        message = ready(spec, parent_env)
    except Exception as exc:  # noqa: BLE001 - the parent says it in one line
        _send(sock, {"op": "failed", "error": f"the process server could not start: "
                                              f"{type(exc).__name__}: {exc}"})
        return
    _send(sock, message)
    Server(message["fresh_threads"], parent=sock).loop()


def serve_at(path: str, spec: dict) -> None:
    """The server of an SSH host (`hostside serve`): it listens at `path` (or, where that is too
    long for a Unix socket, in a temporary folder) for the run's `hostside run` processes, says
    "ready" with the path (one JSON line on stdout) and ends when its stdin ends (the SSH channel
    that started it closed). Started with the host's own environment, it takes SERVER_ENV
    before anything imports torch."""
    import shutil
    import tempfile

    parent_env = dict(os.environ)
    os.environ.update(SERVER_ENV)
    folder = None
    if len(os.fsencode(path)) > SOCKET_PATH_MAX:
        folder = tempfile.mkdtemp(prefix="stepbench-server-")
        path = os.path.join(folder, "server.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    bound = False
    try:
        listener.bind(path)
        bound = True
        listener.listen(8)
        try:
            message = ready(spec, parent_env)
        except Exception as exc:  # noqa: BLE001 - the parent says it in one line
            print(json.dumps({"op": "failed", "error": f"the process server could not start: "
                                                       f"{type(exc).__name__}: {exc}"}), flush=True)
            return
        print(json.dumps({**message, "path": path}), flush=True)
        Server(message["fresh_threads"], listener=listener).loop()
    finally:
        listener.close()
        if folder:
            shutil.rmtree(folder, ignore_errors=True)
        elif bound:
            with contextlib.suppress(OSError):
                os.unlink(path)     # its socket file, not left in a shared /tmp (a Ray node's)


class Server:
    """The loop: fork on request, tell each child's parent how it ended, and kill what still
    runs when the server ends (its parent closed the socket, its stdin ended, or a signal)."""

    def __init__(self, threads: list[int], parent: socket.socket | None = None,
                 listener: socket.socket | None = None):
        self.threads, self.parent, self.listener = threads, parent, listener
        self.children: dict[int, tuple[int, socket.socket]] = {}   # pidfd -> (pid, client)
        self.selector = selectors.DefaultSelector()
        if parent is not None:
            self.selector.register(parent, selectors.EVENT_READ, "client")
        if listener is not None:
            self.selector.register(listener, selectors.EVENT_READ, "listener")
            self.selector.register(sys.stdin.fileno(), selectors.EVENT_READ, "stdin")
        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
            signal.signal(sig, self._stop)

    def _stop(self, signum, frame):
        raise SystemExit(0)

    def loop(self) -> None:
        try:
            while True:
                for key, _ in self.selector.select():
                    if key.data == "listener":
                        client, _ = self.listener.accept()
                        self.selector.register(client, selectors.EVENT_READ, "client")
                    elif key.data == "stdin":
                        if not os.read(key.fd, 4096):
                            return      # the SSH channel that started it is gone
                    elif key.data == "client":
                        if not self.receive(key.fileobj):
                            return      # the parent is gone or done
                    else:
                        self.reap(key.fd)
        finally:
            self.kill_all()

    def receive(self, client: socket.socket) -> bool:
        """Serve one message of `client`; False when the server should end."""
        try:
            message, fds = _receive(client)
        except OSError:
            message, fds = None, []
        if message is not None:
            self.start(message, fds, client)
            return True
        self.selector.unregister(client)
        client.close()
        # A host's `hostside run` that is gone (killed before it could end its setup's group,
        # as Ray's stop_job does after its grace period) leaves no setup of its own running.
        for pid, owner in self.children.values():
            if owner is client:
                _kill_group(pid)
        return client is not self.parent

    def start(self, message: dict, fds: list[int], client: socket.socket) -> None:
        threads = thread_names()
        if len(threads) != 1:
            for fd in fds:
                os.close(fd)
            _send(client, {"op": "refused", "id": message["id"],
                           "error": f"the process server holds {len(threads)} threads "
                                    f"({', '.join(threads)}); forking it is not safe"})
            return
        pid = os.fork()
        if pid == 0:
            self.child(message, fds)        # never returns
        for fd in fds:
            os.close(fd)
        pidfd = os.pidfd_open(pid)
        self.children[pidfd] = (pid, client)
        self.selector.register(pidfd, selectors.EVENT_READ, "child")
        _send(client, {"op": "started", "id": message["id"], "pid": pid})

    def reap(self, pidfd: int) -> None:
        pid, client = self.children.pop(pidfd)
        self.selector.unregister(pidfd)
        os.close(pidfd)
        _, status = os.waitpid(pid, 0)
        try:
            _send(client, {"op": "exit", "pid": pid,
                           "returncode": os.waitstatus_to_exitcode(status)})
        except OSError:
            pass        # that child's parent is gone

    def kill_all(self) -> None:
        for pid, _ in self.children.values():
            _kill_group(pid)
        for pid, _ in list(self.children.values()):
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass

    def child(self, message: dict, fds: list[int]) -> None:
        """In the new process: become a fresh setup's process, run the worker, exit."""
        code = 70
        try:
            os.setsid()
            for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT, signal.SIGCHLD,
                        signal.SIGPIPE):
                signal.signal(sig, signal.SIG_DFL if sig != signal.SIGPIPE else signal.SIG_IGN)
            stdout_fd, stderr_fd = fds
            devnull = os.open(os.devnull, os.O_RDONLY)
            os.dup2(devnull, 0)
            os.dup2(stdout_fd, 1)
            os.dup2(stderr_fd, 2)
            os.closerange(3, os.sysconf("SC_OPEN_MAX") if os.sysconf("SC_OPEN_MAX") > 0 else 4096)
            os.environ.clear()
            os.environ.update(message["env"])
            os.chdir(message["cwd"])
            as_fresh(self.threads)
            from stepbench.measure import worker

            code = worker.main([message["payload"]])
        except BaseException:  # noqa: BLE001 - said on stderr; the parent classifies the exit
            import traceback

            traceback.print_exc()
        finally:
            exit_now(code)


def _kill_group(pid: int) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pid, sig)
        except (ProcessLookupError, PermissionError):
            break


def as_fresh(threads: list[int]) -> None:
    """What a fresh process decides at start from its environment, decided again in a forked one:
    torch's threads (OMP_NUM_THREADS where set, else a fresh process's default) and inductor's
    compile threads and worker start method (read when torch._inductor.config was imported)."""
    import torch

    intra = os.environ.get("OMP_NUM_THREADS") or os.environ.get("MKL_NUM_THREADS")
    torch.set_num_threads(int(intra) if intra and intra.isdigit() and int(intra) > 0
                          else threads[0])
    if torch.get_num_interop_threads() != threads[1]:
        torch.set_num_interop_threads(threads[1])
    config = sys.modules.get("torch._inductor.config")
    if config is not None:
        if hasattr(config, "decide_compile_threads"):
            config.compile_threads = config.decide_compile_threads()
        if hasattr(config, "decide_worker_start_method"):
            config.worker_start_method = config.decide_worker_start_method()


def ended(serving) -> NoReturn:
    """Run `serving` (a server's whole life), then end this process at once (exit_now): what it
    forked is ended by then. A signal (Server._stop) ends it with code 0, as a closed socket or
    stdin does; an error with its traceback on stderr and code 1."""
    code = 1
    try:
        serving()
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 0
    except BaseException:  # noqa: BLE001 - said on stderr (the server's log), then ended
        import traceback

        traceback.print_exc()
    exit_now(code)


def main(argv: list[str]) -> NoReturn:
    from stepbench.process import die_with_parent

    die_with_parent(signal.SIGTERM)     # the parent's end is the server's
    sock = socket.socket(fileno=int(os.environ.pop("STEPBENCH_SERVER_FD")))
    parent_env = json.loads(os.environ.pop("STEPBENCH_SERVER_PARENT_ENV"))
    ended(lambda: serve(sock, json.loads(argv[0]), parent_env))

