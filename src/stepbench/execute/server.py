"""A process server: imports torch and transformers once per run, then forks one new process per
setup, so that a setup's process starts in well under a second instead of paying for Python's
imports again (`run --start server`, the default; `--start fresh` starts each setup's process
from scratch, as stepbench did before).

Why our own server and not multiprocessing's forkserver: the parent needs a setup's process as it
needs a fresh one, a new session whose process group is killed whole, its stdout (the protocol)
and stderr on pipes the parent made, and its exit status with the signal that ended it; and the
server must prove, before every fork, that it holds one thread. That is a small loop over
`os.fork`, a Unix socket that carries the pipes (`socket.send_fds`) and a pidfd per child; the
forkserver would add its own bootstrap, resource tracker and pickling around the same calls.

The server (`serve`, started as `python -c SERVER_MAIN`):
- imports what a setup's process imports (torch, transformers, the models' modeling modules,
  torch._dynamo and torch._inductor's compiler for compiled setups, stepbench.measure) with one
  OpenMP thread and no jemalloc background thread, and never starts CUDA
  (PYTORCH_NVML_BASED_CUDA_CHECK) nor NVML (importing inductor asks torch.cuda.is_available(),
  which NVML would answer by starting a thread: the server answers it with the GPU count a fresh
  process sees, see `nvml_answered`) nor runs a torch operation: a thread pool or a CUDA context
  in the server would be copied broken into every child;
- forks only while it has exactly one thread (/proc/self/task), and refuses otherwise;
- in the child: a new session, the job's pipes on fds 1 and 2, the job's own environment, the
  threads a fresh process would have (torch intra-/inter-op threads, inductor's compile threads
  and worker start method), then the worker (measure/worker.py) as a fresh process runs it;
- reports each child's exit status (pidfd, then waitpid) and kills every child's group when the
  parent closes the socket or signals it.

The parent (`ProcessServer`) starts the server once, sends each job with its pipes and gets a
`ForkedChild`, which answers like subprocess.Popen (pid, stdout, poll, wait), so the executor's
timeout, kill and classification are the same for either start method.
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
import threading
import time
from pathlib import Path
from typing import NoReturn

from stepbench.process import exit_now

START_METHODS = ("server", "fresh")
# The server's startup (imports) may be slow on a busy host; past this it is given up on.
READY_TIMEOUT_S = 600.0
MAX_FDS = 4
MESSAGE_BYTES = 1 << 20
# The server's environment while it imports, so that no thread starts: one OpenMP thread;
# pyarrow's jemalloc (pandas imports it under transformers) without its background thread; CUDA
# asked through NVML, never started.
SERVER_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
              "JE_ARROW_MALLOC_CONF": "background_thread:false",
              "PYTORCH_NVML_BASED_CUDA_CHECK": "1"}
# A Unix socket's path has at most 107 bytes; a longer one is made in the temporary folder.
SOCKET_PATH_MAX = 100
# The server's command: this module's main as the imported module (not a `__main__` copy), so
# that what wraps its functions as it is imported (the tests' hooks) wraps the ones that run.
SERVER_MAIN = "import sys; from stepbench.execute import server; server.main(sys.argv[1:])"
# What a fresh process's torch would set and see: its intra- and inter-op threads and its GPU
# count, measured once per machine and cached (see FreshThreads).
THREADS_PROBE = ("import json, torch; print(json.dumps([torch.get_num_threads(), "
                 "torch.get_num_interop_threads(), torch.cuda.device_count()]))")


class ServerError(Exception):
    """The server could not start, or refused a job; the message is one line."""


def _send(sock: socket.socket, message: dict, fds: list[int] = ()) -> None:
    socket.send_fds(sock, [json.dumps(message).encode()], list(fds))


def _receive(sock: socket.socket) -> tuple[dict | None, list[int]]:
    data, fds, _, _ = socket.recv_fds(sock, MESSAGE_BYTES, MAX_FDS)
    return (json.loads(data) if data else None), fds


def thread_names() -> list[str]:
    """The names of this process's threads, as the kernel knows them (Python's and native)."""
    names = []
    for task in sorted(os.listdir("/proc/self/task")):
        try:
            names.append(Path(f"/proc/self/task/{task}/comm").read_text().strip())
        except OSError:
            pass
    return names


# ---------------------------------------------------------------- the parent's side

class ForkedChild:
    """A setup's process started by the server, answering as subprocess.Popen does."""

    def __init__(self, server: "ProcessServer", pid: int, stdout):
        self.server, self.pid, self.stdout = server, pid, stdout
        self.returncode: int | None = None
        self.exit_unknown = False       # the server died before it could say how the child ended
        self._ended = threading.Event()
        # A pidfd tells when the child is gone even when the server that could say how is not.
        try:
            self._pidfd = os.pidfd_open(pid)
        except OSError:
            self._pidfd = None

    def _exited(self, returncode: int | None) -> None:
        if returncode is None:
            self.exit_unknown = True
        self.returncode = returncode if returncode is not None else 255
        self._ended.set()

    def _gone(self) -> bool:
        """Whether the process ended (asked of the kernel, for when the server is dead)."""
        if self._pidfd is not None:
            with selectors.DefaultSelector() as selector:
                selector.register(self._pidfd, selectors.EVENT_READ)
                return bool(selector.select(timeout=0))
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return True
        return False

    def poll(self) -> int | None:
        if not self._ended.is_set() and self.server.dead and self._gone():
            self._exited(None)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._ended.wait(0.5 if deadline is None else
                                   max(0.0, min(0.5, deadline - time.monotonic()))):
            if self.poll() is not None:
                break
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout)
        return self.returncode

    def close(self) -> None:
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None


class ProcessServer:
    """The parent's handle on one server: start it, send it jobs, learn how children ended.

    `preload`: {"models": [[model, seq], ...], "compile": bool}, what the server imports up
    front. `env`: the environment the server starts with (the parent's); children get their own.
    """

    def __init__(self, preload: dict, env: dict[str, str] | None = None,
                 python: str = sys.executable, log: Path | None = None):
        self.preload, self.python, self.log = preload, python, log
        self.env = dict(env if env is not None else os.environ)
        self.dead = False
        self.info: dict = {}            # the server's "ready" message: its imports' seconds, ...
        self.ready_s: float | None = None
        self._lock = threading.Lock()   # one request at a time on the socket
        self._replies: dict[int, dict] = {}
        self._reply_ready = threading.Condition()
        self._children: dict[int, ForkedChild] = {}
        self._next_id = 0
        self._proc: subprocess.Popen | None = None
        self._sock: socket.socket | None = None

    # -- life -----------------------------------------------------------------------------------

    def start(self) -> "ProcessServer":
        """Start the server and wait until it has imported everything (ServerError if it
        cannot). The server is started from the thread that then reads its messages for as long
        as it runs: it dies with that thread (PR_SET_PDEATHSIG follows the thread that started a
        process), so it must be one that lives as long as the server."""
        self._started_at = time.monotonic()
        self._ready = threading.Event()
        self._failure: str | None = None
        threading.Thread(target=self._run, name="stepbench-server", daemon=True).start()
        self._ready.wait()
        if self._failure is not None:
            self.close()
            raise ServerError(self._failure)
        return self

    def _run(self) -> None:
        try:
            self._spawn_server()
            self.info = self._wait_ready(self._started_at + READY_TIMEOUT_S)
            self.ready_s = time.monotonic() - self._started_at
        except BaseException as exc:  # noqa: BLE001 - the caller says it; it must not wait on
            self._failure = f"{exc}{self._log_tail()}"
            self._ready.set()
            return
        self._ready.set()
        self._read()

    def _wait_ready(self, deadline: float) -> dict:
        with selectors.DefaultSelector() as selector:
            selector.register(self._sock, selectors.EVENT_READ)
            while True:
                if not selector.select(timeout=max(0.0, min(1.0, deadline - time.monotonic()))):
                    if self._proc.poll() is not None:
                        raise ServerError(f"the process server exited with code "
                                          f"{self._proc.returncode} while importing")
                    if time.monotonic() >= deadline:
                        raise ServerError(f"the process server was not ready after "
                                          f"{READY_TIMEOUT_S:g} s")
                    continue
                message, _ = _receive(self._sock)
                if message is None:
                    self._proc.wait()
                    raise ServerError(f"the process server exited with code "
                                      f"{self._proc.returncode} while importing")
                if message.get("op") == "ready":
                    return message
                if message.get("op") == "failed":
                    raise ServerError(message.get("error", "the process server failed"))

    def _spawn_server(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        src = str(Path(__file__).resolve().parents[2])
        env = dict(self.env, **SERVER_ENV, PYTHONUNBUFFERED="1",
                   STEPBENCH_SERVER_FD=str(theirs.fileno()),
                   STEPBENCH_SERVER_PARENT_ENV=json.dumps(self.env),
                   PYTHONPATH=os.pathsep.join(p for p in (src, self.env.get("PYTHONPATH")) if p))
        log = open(self.log, "ab") if self.log else subprocess.DEVNULL
        try:
            # A new session: Ctrl-C reaches the parent alone, which then ends the server itself.
            self._proc = subprocess.Popen(
                [self.python, "-c", SERVER_MAIN, json.dumps(self.preload)],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env,
                pass_fds=[theirs.fileno()], start_new_session=True)
        finally:
            theirs.close()
            if self.log:
                log.close()
        self._sock = ours

    def _log_tail(self) -> str:
        if not self.log:
            return ""
        from stepbench.errors import first_line

        try:
            text = Path(self.log).read_text(errors="replace")
        except OSError:
            return ""
        last = first_line(text, 300, last=True)
        return f" (its stderr ends with: {last})" if last else ""

    def close(self) -> None:
        """End the server: it kills what it still runs. Idempotent."""
        sock, proc = self._sock, self._proc
        self._sock = None
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()
        if proc is not None and proc.poll() is None:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.dead = True

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    @classmethod
    def connect(cls, path: str) -> "ProcessServer":
        """A handle on a server already listening at `path` (an SSH host's, `serve_at`):
        closing it leaves that server running."""
        handle = cls(preload={}, env={})
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        sock.connect(path)
        handle._sock = sock
        threading.Thread(target=handle._read, name="stepbench-server", daemon=True).start()
        return handle

    # -- jobs -----------------------------------------------------------------------------------

    def spawn(self, payload: str, env: dict[str, str], stderr_fd: int,
              cwd: str | None = None) -> ForkedChild:
        """A new process for one job: `payload` is the worker's argument, `env` its whole
        environment; its stderr goes to `stderr_fd`, its stdout to the returned child's pipe."""
        if self.dead:
            raise ServerError("the process server is not running")
        read_end, write_end = os.pipe()
        try:
            with self._lock:
                self._next_id += 1
                request = self._next_id
                _send(self._sock, {"op": "start", "id": request, "payload": payload, "env": env,
                                   "cwd": cwd or os.getcwd()}, [write_end, stderr_fd])
            reply = self._reply(request)
        except (OSError, ServerError):
            os.close(read_end)
            raise
        finally:
            os.close(write_end)
        if reply.get("op") != "started":
            os.close(read_end)
            raise ServerError(reply.get("error") or "the process server refused the job")
        child = ForkedChild(self, reply["pid"], os.fdopen(read_end, "rb", buffering=0))
        with self._reply_ready:
            self._children[child.pid] = child
            early = self._replies.pop(("exit", child.pid), None)
        if early is not None:
            child._exited(early["returncode"])
        return child

    def _reply(self, request: int) -> dict:
        with self._reply_ready:
            while request not in self._replies:
                if self.dead:
                    raise ServerError("the process server died")
                self._reply_ready.wait(1.0)
            return self._replies.pop(request)

    def _read(self) -> None:
        """The reader thread: replies to requests, and how each child ended."""
        sock = self._sock
        try:
            while True:
                message, fds = _receive(sock)
                for fd in fds:
                    os.close(fd)
                if message is None:
                    break
                with self._reply_ready:
                    if message.get("op") == "exit":
                        child = self._children.pop(message["pid"], None)
                        if child is None:       # before spawn() registered it
                            self._replies[("exit", message["pid"])] = message
                        else:
                            child._exited(message["returncode"])
                    else:
                        self._replies[message["id"]] = message
                    self._reply_ready.notify_all()
        except OSError:
            pass
        with self._reply_ready:
            self.dead = True
            self._reply_ready.notify_all()


def imports_for(plan) -> dict:
    """What a process server imports for `plan` (its `preload`): the models' modeling code at
    their sequence lengths, and torch.compile's stack where a setup compiles."""
    return {"models": [list(pair) for pair in dict.fromkeys((s.model, s.seq) for s in plan)],
            "compile": any(s.mode == "compile" for s in plan)}


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

