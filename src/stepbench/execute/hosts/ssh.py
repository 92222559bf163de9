"""Setups on machines reached over SSH: one Executor per host, through asyncssh.

asyncssh (the `fleet` extra) reads the OpenSSH config (aliases, HostName, Port, User,
IdentityFile, ProxyJump, UserKnownHostsFile), uses the ssh agent, and verifies host keys against
known_hosts: a host whose key is not there is refused, and a config that turns the check off
(`UserKnownHostsFile none`) is refused too. All hosts share one asyncio loop in a background
thread; each runner thread waits on its own host's calls, so the runner stays what it is.

On each host (its connection made once, every command a channel of it):
  1. prepare: execute/hosts/hostprep.py under the host's Python installs this stepbench (a wheel made by
     execute/bundle.py) into a cached environment that sees that Python's torch, writes the model
     configs, makes this run's work folder and probes the device and GPU name there;
  2. each setup: `python -m stepbench.execute.hosts.hostside run SPEC` runs the setup's process in its
     own process group there and passes its JSON lines through as they come; closing the
     channel's stdin (timeout, Ctrl-C) or losing the connection kills that group on the host;
  3. close: the work folder (inductor caches) is removed and the connection closed.

Every command is built from argv lists, each element through shlex.quote: no value (a path, a
JSON payload) reaches the remote shell unquoted. `--remote-setup` alone is shell code by intent,
run before each command in the same shell (e.g. `module load cuda`, `conda activate torch`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import shlex
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from stepbench import __version__, protocol
from stepbench.errors import UserError
from stepbench.execute.hosts import hostprep
from stepbench.execute.hosts import hostside
from stepbench.execute.hosts.hostside import Exit, Lines
from stepbench.execute import progress
from stepbench.execute.protocol import (KILL_GRACE_S, STDERR_TAIL_CHARS, Executor, Job, OnMessage,
                                        Outcome, now_iso, worker_command)
from stepbench.settings import Remote
from stepbench.setup import Setup

CONNECT_TIMEOUT_S = 30          # unless the SSH config sets ConnectTimeout
KEEPALIVE_S, KEEPALIVE_COUNT = 15, 4   # a host that stops answering is lost after about a minute
PREPARE_TIMEOUT_S = 1800        # installing requirements a host lacks may download a lot
CLOSE_TIMEOUT_S = 20
INSTALL_HINT = "pip install 'stepbench[fleet]' (asyncssh)"


def require_asyncssh():
    try:
        import asyncssh
    except ImportError:
        raise UserError(f"--host needs the asyncssh package: {INSTALL_HINT}") from None
    return asyncssh


# ---------------------------------------------------------------- naming hosts

@dataclass(frozen=True)
class HostSpec:
    """A host as the command line names it: an SSH config alias or [user@]host[:port]."""

    name: str                   # as given: tags the records, part of the resume key
    host: str                   # what SSH connects to (an alias is resolved by the SSH config)
    user: str | None = None
    port: int | None = None


def parse_host(text: str) -> HostSpec:
    """'gpu-a', 'alice@10.0.0.5', 'gpu-b:2222', 'alice@[fe80::1]:22'."""
    name = text.strip()
    user, _, rest = name.rpartition("@")
    host, port = rest, ""
    if rest.startswith("["):
        host, _, tail = rest[1:].partition("]")
        port = tail[1:] if tail.startswith(":") else tail
    elif rest.count(":") == 1:
        host, port = rest.split(":")
    bad = (not host or any(c.isspace() for c in name) or name.startswith("-") or "@" in user
           or (port and not (port.isdigit() and 0 < int(port) < 65536)) or (user == "" and "@" in name))
    if bad:
        raise UserError(f"--host {text!r} is not a host; pass an SSH config alias or "
                        "user@host[:port]")
    return HostSpec(name, host, user or None, int(port) if port else None)


class HostError(Exception):
    """One host cannot go on; the message is the one line the user sees for it."""


class HostStopped(Exception):
    """stop() came while the host was being connected or prepared."""


def quote_command(argv: list[str], setup: str | None = None) -> str:
    """argv as one POSIX shell command line, every element quoted; a leading ~/ of the program
    stays expandable (--remote-python ~/venv/bin/python)."""
    program = argv[0]
    head = ('"$HOME"/' + shlex.quote(program[2:])) if program.startswith("~/") else shlex.quote(program)
    line = "exec " + " ".join([head] + [shlex.quote(a) for a in argv[1:]])
    return f"{{ {setup}\n}} && {line}" if setup else line


# ---------------------------------------------------------------- the asyncio side

class EventLoop:
    """One asyncio loop in a daemon thread; the runners' threads wait on calls into it."""

    def __init__(self):
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="stepbench-ssh",
                                        daemon=True)
        self._thread.start()

    def call(self, coro, timeout: float | None = None):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def soon(self, callback, *args) -> None:
        self.loop.call_soon_threadsafe(callback, *args)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        if not self._thread.is_alive():
            self.loop.close()


@dataclass
class _Exit:
    """How one remote command ended, beside what its exit line says (`Lines.exit`)."""

    timed_out: bool = False
    stopped: bool = False
    lost: str | None = None             # the connection is gone: why
    stderr_tail: str = ""


# ---------------------------------------------------------------- the executor

class SSHExecutor(Executor):
    """Runs setups on one SSH host, one at a time (its slot is the host)."""

    def __init__(self, spec: HostSpec, loop: EventLoop, options: Remote):
        self.spec, self.loop, self.options = spec, loop, options
        self.host = spec.name
        self.slots = [spec.name]
        self.info: dict = {}            # what the host's preparation found (hostprep.prepare)
        self.rental: dict | None = None  # a rented machine's provider, price, GPUs (rent.py)
        self.lost: str | None = None    # set when the connection is gone: the host's one line
        self.running: str | None = None
        self._conn = None
        self._stopping = False
        self._stop_event = asyncio.Event()
        self._server = None             # this run's process server there (hostside serve)
        self._server_path: str | None = None

    # -- before the runner: connect and prepare ------------------------------------------------

    def connect(self) -> None:
        self.loop.call(self._until_stopped(self._connect()))

    def prepare(self, wheel, models: list[dict], device: str,
                compile_cache: Path | None = None, workload=None) -> dict:
        """Install stepbench there (once per version), copy the model configs and a user's
        workload files (`workload`, execute/bundle.py: its setups then run in that folder there),
        probe the device; `compile_cache`: a folder there shared by every compiled setup
        (--compile-cache)."""
        args = {"dir": self.options.dir, "version": __version__, "wheel_name": wheel.filename,
                "requires": list(wheel.requires), "models": models, "device": device,
                "compile_cache": str(compile_cache) if compile_cache else None,
                "wheel_size": len(wheel.data),
                "workload": {"sha": workload.sha, "cwd": workload.cwd} if workload else None}
        data = wheel.data + (workload.archive() if workload else b"")
        source = Path(hostprep.__file__).read_text()
        command = quote_command([self.options.python, "-c", source, json.dumps(args)],
                                self.options.setup)
        result = self.loop.call(self._until_stopped(self._prepare(command, data)))
        probe = result.get("probe") or {}
        if probe.get("error"):
            raise HostError(probe["error"])
        self.info = result
        return result

    def run_python(self, source: str, *args: str, timeout_s: float = CONNECT_TIMEOUT_S) -> str:
        """A short `python -c SOURCE ARGS...` there under the host's Python and --remote-setup,
        as the setups' processes see their packages: its stdout."""
        command = quote_command([self.options.python, "-c", source, *args], self.options.setup)
        return self.loop.call(self._until_stopped(self._short(command, timeout_s)))

    async def _short(self, command: str, timeout_s: float) -> str:
        asyncssh = require_asyncssh()
        try:
            result = await asyncio.wait_for(self._conn.run(command), timeout_s)
        except (asyncssh.Error, OSError, asyncio.TimeoutError) as exc:
            raise HostError(f"`{self.options.python} -c` failed there ({_reason(exc)})") from None
        return result.stdout or ""

    def start_server(self, preload: dict) -> str:
        """Start this run's process server on the host (`hostside serve`), which forks each
        setup's process there; one line for the user: ready, or why every setup there starts
        fresh."""
        try:
            return self.loop.call(self._until_stopped(self._start_server(preload)))
        except HostStopped:
            raise
        except Exception as exc:  # noqa: BLE001 - the setups start fresh instead; said once
            return f"no process server ({_reason(exc)}); every setup's process starts fresh"

    async def _start_server(self, preload: dict) -> str:
        from stepbench.execute.local.server import READY_TIMEOUT_S

        path = f"{self.info['workdir']}/server.sock"
        command = quote_command(hostside.command(self.info["python"], "serve", path,
                                                 json.dumps(preload),
                                                 *filter(None, [self.info.get("workload_cwd")])),
                                self.options.setup)
        proc = await self._conn.create_process(command, encoding=None)
        try:
            line = await asyncio.wait_for(proc.stdout.readline(), READY_TIMEOUT_S)
            ready = json.loads(line)
        except (asyncio.TimeoutError, ValueError):
            proc.close()
            return ("no process server (it did not say it was ready); every setup's process "
                    "starts fresh")
        if ready.get("op") != "ready":
            proc.close()
            return f"{ready.get('error', 'no process server')}; every setup's process starts fresh"
        self._server, self._server_path = proc, ready.get("path", path)
        imports = ", ".join(f"{k} {v:.1f} s" for k, v in (ready.get("imports_s") or {}).items())
        return f"process server ready (imports: {imports})"

    async def _until_stopped(self, coro):
        task = asyncio.ensure_future(coro)
        stopper = asyncio.ensure_future(self._stop_event.wait())
        try:
            await asyncio.wait({task, stopper}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopper.cancel()
        if not task.done():
            task.cancel()
            raise HostStopped()
        return task.result()

    async def _connect(self) -> None:
        asyncssh = require_asyncssh()
        spec, where = self.spec, self.spec.host + (f":{self.spec.port}" if self.spec.port else "")
        config = [str(self.options.ssh_config)] if self.options.ssh_config else ()
        try:
            options = await asyncssh.SSHClientConnectionOptions.construct(
                config=config, host=spec.host, port=spec.port or (), username=spec.user or ())
            where = f"{options.host} port {options.port}"      # as the SSH config resolved them
            if options.known_hosts is None:
                raise HostError("its SSH config turns host key checking off (UserKnownHostsFile "
                                "none); stepbench verifies host keys: remove that setting and "
                                f"accept the key once with `ssh {spec.host}`")
            extra = {}
            if options.connect_timeout is None:
                extra["connect_timeout"] = CONNECT_TIMEOUT_S
            if not options.keepalive_interval:
                extra.update(keepalive_interval=KEEPALIVE_S, keepalive_count_max=KEEPALIVE_COUNT)
            self._conn = await asyncssh.connect(spec.host, port=spec.port or (), options=options,
                                                **extra)
        except asyncssh.HostKeyNotVerifiable as exc:
            raise HostError(f"host key not verified ({exc.reason}); check its fingerprint and "
                            f"accept it once with `ssh {spec.name}` (or add it to known_hosts), "
                            "then run again") from None
        except asyncssh.PermissionDenied:
            raise HostError(f"{where} refused every key for user {options.username}; add your "
                            "public key to ~/.ssh/authorized_keys there, or name the key with "
                            "IdentityFile in the SSH config") from None
        except asyncssh.KeyImportError as exc:
            raise HostError(f"cannot read an SSH key ({exc}); add it to the ssh agent (ssh-add) "
                            "or name another with IdentityFile") from None
        except asyncssh.Error as exc:
            raise HostError(f"SSH to {where} failed: {getattr(exc, 'reason', exc)}") from None
        except (OSError, asyncio.TimeoutError) as exc:
            reason = {ConnectionRefusedError: "connection refused",
                      asyncio.TimeoutError: "no answer"}.get(type(exc)) or _reason(exc)
            raise HostError(f"cannot connect to {where} ({reason}); check the name and that "
                            "sshd runs there") from None
        except ValueError as exc:      # the SSH config or a key could not be read
            raise HostError(f"SSH config: {exc}") from None

    async def _prepare(self, command: str, wheel: bytes) -> dict:
        asyncssh = require_asyncssh()
        try:
            result = await asyncio.wait_for(
                self._conn.run(command, input=wheel, encoding=None), PREPARE_TIMEOUT_S)
        except asyncio.TimeoutError:
            raise HostError(f"preparing the host took over {PREPARE_TIMEOUT_S} s; see what "
                            f"`{self.options.python} -m pip` does there") from None
        except (asyncssh.Error, OSError) as exc:
            raise HostError(f"lost the connection while preparing ({_reason(exc)})") from None
        lines = (result.stdout or b"").decode("utf-8", "replace").strip().splitlines()
        try:
            answer = json.loads(lines[-1])
        except (IndexError, ValueError):
            answer = None
        if isinstance(answer, dict) and "error" in answer:
            raise HostError(answer["error"])
        if not isinstance(answer, dict):
            said = _last_lines((result.stderr or b"").decode("utf-8", "replace"))
            hint = ("; pass --remote-python the path of the Python that has torch there"
                    if result.exit_status == 127 else "")
            raise HostError(f"`{self.options.python}` failed there (exit code "
                            f"{result.exit_status}): {said or 'no output'}{hint}")
        return answer

    # -- the Executor protocol ---------------------------------------------------------------

    def gpu_name(self, setup: Setup, slot: str) -> str | None:
        return "cpu" if setup.device == "cpu" else self.info["probe"]["gpu"]

    def slots_needed(self, setup: Setup) -> int:
        return 1        # one setup at a time per host (distributed jobs are refused with --host)

    def run(self, job: Job, slot: str, timeout_s: float, on_message: OnMessage) -> Outcome:
        outcome = Outcome(started_at=now_iso())
        if self._stopping or self.lost:
            outcome.stopped, outcome.finished_at = True, outcome.started_at
            return outcome
        setup = job.setup
        # The child reads the model config where it was copied; the record keeps the user's path.
        remote = dataclasses.replace(setup, model=self.info["models"].get(setup.model, setup.model))
        payload = json.dumps({**json.loads(job.payload()), "setup": remote.to_dict()})
        env, dirs = {"PYTHONUNBUFFERED": "1"}, []
        if setup.mode == "compile":
            cache, kind = self._cache_for(setup)
            env.update({"TORCHINDUCTOR_CACHE_DIR": cache, "TRITON_CACHE_DIR": f"{cache}/triton",
                        protocol.CACHE_KIND_ENV: kind})
            dirs.append(cache)

        lines = Lines(outcome, on_message)
        self.running = progress.job_name(job)      # as its progress lines name it (--param too)
        start = time.monotonic()
        end = self.loop.call(self._exec(self.command(job, payload), env, dirs, timeout_s, lines,
                                        payload))
        outcome.timed_out = end.timed_out
        (lines.exit or Exit()).tell(outcome)
        outcome.stderr_tail = end.stderr_tail
        outcome.wall_s, outcome.finished_at = time.monotonic() - start, now_iso()
        if outcome.result_at is not None:
            outcome.exit_s = time.monotonic() - outcome.result_at
        if end.lost:
            self.lost = f"lost the connection while {self.running} ran ({end.lost})"
        # Stopped, or the host is gone: not a result of the setup, so nothing is recorded and a
        # rerun of the same command runs it again.
        outcome.stopped = end.stopped or end.lost is not None
        self.running = None
        return outcome

    def command(self, job: Job, payload: str) -> list[str]:
        """A setup's process on the host (`payload`: the job with the host's model paths)."""
        return worker_command(self.info["python"], job, payload=payload)

    @property
    def cwd(self) -> str:
        """Where a setup's process runs there: the user's workload folder where one travelled
        (its `model` path resolves there as here), else the run's work folder."""
        return self.info.get("workload_cwd") or self.info["workdir"]

    def _cache_for(self, setup: Setup) -> tuple[str, str]:
        if self.info.get("compile_cache"):
            return self.info["compile_cache"], "shared"
        name = hashlib.sha1(setup.key().encode()).hexdigest()[:12]
        return f"{self.info['workdir']}/inductor/{name}", "private"

    def stop(self) -> None:
        self._stopping = True
        self.loop.soon(self._stop_event.set)

    def close(self) -> None:
        if self._conn is None:
            return
        try:
            self.loop.call(self._close(), timeout=CLOSE_TIMEOUT_S + 5)
        except Exception:  # noqa: BLE001 - a host that cannot be tidied must not hide the results
            pass
        self._conn = None

    async def _close(self) -> None:
        conn = self._conn
        if self._server is not None:
            try:
                self._server.stdin.write_eof()      # the host's server ends with its stdin
            except Exception:  # noqa: BLE001 - see close()
                pass
            self._server = None
        try:
            if self.info.get("workdir") and not self.lost:
                await asyncio.wait_for(conn.run(quote_command(["rm", "-rf", "--",
                                                               self.info["workdir"]])),
                                       CLOSE_TIMEOUT_S)
        except Exception:  # noqa: BLE001 - see close()
            pass
        conn.close()
        try:
            await asyncio.wait_for(conn.wait_closed(), CLOSE_TIMEOUT_S)
        except asyncio.TimeoutError:
            pass

    # -- one remote command --------------------------------------------------------------------

    async def _exec(self, argv: list[str], env: dict, dirs: list[str], timeout_s: float,
                    lines: Lines, payload: str | None = None) -> _Exit:
        """Run argv through hostside there (a worker's `payload` through the host's process
        server, where it runs); `lines` takes each stdout line as it comes."""
        asyncssh = require_asyncssh()
        end = _Exit()
        spec = {"argv": argv, "env": env, "dirs": dirs, "cwd": self.cwd}
        if payload is not None and self._server_path:
            spec.update(server=self._server_path, payload=payload)
        command = quote_command(hostside.command(self.info["python"], "run", json.dumps(spec)),
                                self.options.setup)
        try:
            proc = await self._conn.create_process(command, encoding=None)
        except (asyncssh.Error, OSError) as exc:
            end.lost = _reason(exc)
            return end
        stderr = asyncio.ensure_future(_tail(proc.stderr))
        reader = asyncio.ensure_future(self._read(proc, lines))
        stopper = asyncio.ensure_future(self._stop_event.wait())
        try:
            await asyncio.wait({reader, stopper}, timeout=timeout_s,
                               return_when=asyncio.FIRST_COMPLETED)
            if not reader.done():
                end.stopped = stopper.done()
                end.timed_out = not end.stopped
                try:
                    proc.stdin.write_eof()      # hostside kills the process group there
                except (asyncssh.Error, OSError):
                    pass
                try:
                    await asyncio.wait_for(asyncio.shield(reader), 2 * KILL_GRACE_S + 10)
                except asyncio.TimeoutError:
                    proc.close()
        finally:
            stopper.cancel()
        if reader.done() and not reader.cancelled() and reader.exception() is not None:
            end.lost = _reason(reader.exception())
        elif lines.exit is None and not end.stopped and not end.timed_out:
            # No exit line: hostside itself was killed (a signal), or the connection went.
            try:
                await asyncio.wait_for(proc.wait(), 5)
            except (asyncssh.Error, OSError, asyncio.TimeoutError) as exc:
                end.lost = _reason(exc)
            if end.lost is None and (self._conn.is_closed() or proc.returncode is None):
                end.lost = "the connection closed"
            lines.exit = Exit(returncode=proc.returncode)
        try:
            end.stderr_tail = await asyncio.wait_for(stderr, 5)
        except asyncio.TimeoutError:
            stderr.cancel()
        return end

    @staticmethod
    async def _read(proc, lines: Lines) -> None:
        while True:
            line = await proc.stdout.readline()
            if not line:
                return
            lines.line(line)


async def _tail(stream, chars: int = STDERR_TAIL_CHARS) -> str:
    data = b""
    try:
        while chunk := await stream.read(65536):
            data = (data + chunk)[-4 * chars:]
    except Exception:  # noqa: BLE001 - a lost connection ends the stream; keep what came
        pass
    return data.decode("utf-8", "replace")[-chars:].strip()


def _reason(exc: BaseException) -> str:
    return getattr(exc, "reason", None) or getattr(exc, "strerror", None) or str(exc) or \
        type(exc).__name__


def _last_lines(text: str, n: int = 3) -> str:
    return " | ".join(text.strip().splitlines()[-n:])
