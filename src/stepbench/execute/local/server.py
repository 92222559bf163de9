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

The server (local/serving.py's `serve`, started as `python -c SERVER_MAIN`):
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


# The server's startup (imports) may be slow on a busy host; past this it is given up on.
READY_TIMEOUT_S = 600.0
# A run's setups' --timeout bounds it too (a user's file that hangs as it is imported), but never
# below this: the imports of torch and transformers on a busy host.
READY_FLOOR_S = 60.0
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
SERVER_MAIN = ("import sys; from stepbench.execute.local import serving; "
               "serving.main(sys.argv[1:])")


class ServerError(Exception):
    """The server could not start, or refused a job; the message is one line."""


def _send(sock: socket.socket, message: dict, fds: list[int] = ()) -> None:
    socket.send_fds(sock, [json.dumps(message).encode()], list(fds))


def _receive(sock: socket.socket) -> tuple[dict | None, list[int]]:
    data, fds, _, _ = socket.recv_fds(sock, MESSAGE_BYTES, MAX_FDS)
    return (json.loads(data) if data else None), fds



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
        self.aborted = False            # abort(): stop waiting for a server that is starting
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

    def start(self, ready_timeout_s: float = READY_TIMEOUT_S) -> "ProcessServer":
        """Start the server and wait until it has imported everything (ServerError if it
        cannot, within `ready_timeout_s`, or abort() came). The server is started from the
        thread that then reads its messages for as long as it runs: it dies with that thread
        (PR_SET_PDEATHSIG follows the thread that started a process), so it must be one that
        lives as long as the server."""
        self._started_at = time.monotonic()
        self._ready_timeout_s = ready_timeout_s
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
            self.info = self._wait_ready(self._started_at + self._ready_timeout_s)
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
                    # Ended at once: an import that hangs would not see the socket close.
                    if self.aborted:
                        self._kill()
                        raise ServerError("the process server was stopped while importing")
                    if time.monotonic() >= deadline:
                        self._kill()
                        raise ServerError(f"the process server was not ready after "
                                          f"{self._ready_timeout_s:g} s")
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

    def abort(self) -> None:
        """Stop a start() in progress (Ctrl-C, SIGTERM): within a second it ends the server and
        raises ServerError, rather than waiting out the imports."""
        self.aborted = True

    def _kill(self) -> None:
        try:
            os.killpg(self._proc.pid, signal.SIGKILL)   # its own session: the group is its own
        except ProcessLookupError:
            pass
        self._proc.wait()

    def _spawn_server(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        src = str(Path(__file__).resolve().parents[3])
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

