"""Setups on a Ray cluster (ray/cluster.py): Ray places each setup's process; stepbench
measures, as everywhere else.

One setup (one repeat) is one Ray job, through Ray's Jobs API (the `ray` extra):
  - `submit_job` with the setup's GPUs as `entrypoint_num_gpus` (its --nproc; a CPU setup asks
    for one CPU), `--gpu-type` as Ray's `accelerator_type:NAME` resource, and a runtime_env whose
    py_modules carry this very stepbench package (the cluster's Python brings torch) and,
    for a user's factory file, whose working_dir holds that file or its --workload-dir folder
    (execute/bundle.py);
  - the job's entrypoint is `python -m stepbench.execute.hosts.hostside run SPEC`, the command an SSH
    host runs: the setup's process (or a torchrun job) in its own process group, its protocol
    lines passed through whole, a first "placed" line (where Ray put it: the timeout's clock
    starts there, not while the job waits for a GPU), a "ranks" line for a torchrun job and an
    "exit" line;
  - `tail_job_logs` carries those lines back (stdout and stderr share the job's log: what is
    not a protocol line is the stderr tail), up to hostside's exit line, its last: by then the
    setup's process group has ended and its output is all in the log (Ray's own stream ends a
    second or more after the job does);
  - `stop_job` at the timeout and on Ctrl-C, SIGTERM and SIGHUP: Ray sends SIGTERM to the
    entrypoint and every process below it, then SIGKILL; hostside ends the setup's group itself;
  - `delete_job` once it ended, in the background (the next job does not wait for it; the run's
    end does).
A job over several nodes (`--nnodes`) runs `python -m stepbench.execute.ray.nodes SPEC` instead:
a placement group, one task per node (execute/ray/nodes.py).

The runner, the protocol and the records are the local run's (execute/runner.py). Slots are GPUs:
at most `--gpus N` of them (default: the cluster's GPUs, of `--gpu-type` when given) in use by
this run at once, each job taking its setup's; which GPUs is Ray's choice, recorded in the
record's placement with the Ray job and node. CPU setups run one at a time, as locally.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import threading
import time
from pathlib import Path

from stepbench import protocol
from stepbench.errors import first_line
from stepbench.execute.clusters import ClusterExecutor, Refused, Submitted, device_indices
from stepbench.execute.hosts import hostside
from stepbench.execute.hosts.hostside import PLACED_EVENT, Exit, Lines, event_of
from stepbench.execute.local import FRESH, uses_server
from stepbench.execute.protocol import (KILL_GRACE_S, STDERR_TAIL_CHARS, Job, OnMessage,
                                        Outcome, rank_verdict, worker_command)
from stepbench.execute.ray.cluster import ACCELERATOR, Cluster, _reason
from stepbench.setup import Setup

# Ray ends a stopped job's processes within its own grace period (RAY_JOB_STOP_WAIT_TIME_S, 3 s
# by default); past this the log stream is given up on.
STOP_WAIT_S = 2 * KILL_GRACE_S + 20
SETTLE_S = 3.0              # Ray's job manager looks at a job's supervisor about once a second
DELETE_POLL_S = 0.25        # an ended job's status, until it is deleted and stays deleted
NODE_TMP = "/tmp"           # on the nodes: a job's own files (rank states, a private cache)


class RayExecutor(ClusterExecutor):
    """Each job a Ray job on `cluster`; see the module's docstring."""

    engine = "ray"              # records are tagged through their placement (placement["ray"])

    def __init__(self, cluster: Cluster, device: str, *, gpus: int = 1,
                 gpu_type: str | None = None, compile_cache: Path | None = None,
                 python: str | None = None, run_id: str = "", start: str = FRESH,
                 preload: dict | None = None, note=lambda text: None, loop=None,
                 workload=None):
        from stepbench.execute.hosts.ssh import EventLoop

        super().__init__(cluster, device, gpus, gpu_type, compile_cache, run_id, start, note)
        # The nodes' Python (on their PATH as `python`); a local Ray's is this very one.
        self.python = python or (cluster.local.python if cluster.local else "python")
        self.tag = f"stepbench-{run_id or os.getpid()}".replace(":", "-")   # names its jobs
        self.preload = preload or {"models": [], "compile": True}
        # A user's factory file (or --workload-dir folder), execute/bundle.py: every job's
        # working_dir, written once into a folder of this run's own (removed by close()).
        self.workload = workload
        self._working_dir: str | None = None
        if workload is not None:
            import tempfile

            self._working_dir = tempfile.mkdtemp(prefix="stepbench-workload-")
            workload.write(Path(self._working_dir))
        self._servers_job: str | None = None
        self._server_path: str | None = None
        self._servers_lock = threading.Lock()
        self._deleting: list[threading.Thread] = []     # _forget's, joined by close()
        self.loop = loop or EventLoop()
        self._own_loop = loop is None
        self._stopping = False
        self._stop_event = None     # made in the loop's thread (asyncio.Event binds to it)
        self.loop.call(self._make_event())

    async def _make_event(self) -> None:
        self._stop_event = asyncio.Event()

    # -- one job (clusters.ClusterExecutor.run) ------------------------------------------------

    def stopping(self) -> bool:
        return self._stopping

    def submit_job(self, job: Job, count: int, timeout_s: float) -> Submitted:
        job_id = f"{self.tag}-{count}"
        setup = job.setup
        entrypoint, resources = self._entrypoint(job, job_id), self._resources(setup)
        start = time.monotonic()
        try:
            self.cluster.client.submit_job(
                entrypoint=entrypoint, submission_id=job_id, runtime_env=self.runtime_env(),
                metadata={"stepbench": setup.name, "repeat": str(job.repeat)}, **resources)
        except Exception as exc:  # noqa: BLE001 - the cluster is gone or refuses: said once
            raise Refused(f"Ray refused job {job_id} ({_reason(exc)})") from None
        return Submitted(job_id, start)

    def follow_job(self, submitted: Submitted, job: Job, timeout_s: float, outcome: Outcome,
                   on_message: OnMessage) -> tuple["_Follow", object]:
        """The job's log as it came, and Ray's job info once it ended."""
        follow = _Follow(outcome, on_message)
        outcome.timed_out, outcome.stopped = self.loop.call(
            self._follow(submitted.job_id, timeout_s, follow))
        return follow, self._info(submitted.job_id)

    def job_placed(self, followed) -> bool:
        return followed[0].running.is_set()

    def why_not_started(self, submitted: Submitted, followed) -> str:
        follow, info = followed
        status = getattr(info, "status", None)
        return (f"Ray job {submitted.job_id} ended {getattr(status, 'value', status)} before its "
                f"process started: {first_line(getattr(info, 'message', None) or '')}"
                + (f" ({first_line(follow.other[-1])})" if follow.other else ""))

    def finish_job(self, submitted: Submitted, followed, job: Job, outcome: Outcome) -> None:
        follow, info = followed
        setup, job_id = job.setup, submitted.job_id
        placed, end = follow.placed or {}, follow.exit or Exit()
        devices = placed.get("cuda_visible_devices") if setup.device == "cuda" else None
        outcome.placement = {
            "ray": {"job_id": job_id, "node_id": getattr(info, "driver_node_id", None),
                    "gpu_type": self.gpu_type,
                    **({"nodes": placed["nodes"]} if placed.get("nodes") else {})},
            "gpus": device_indices(devices), "cuda_visible_devices": devices,
            "compile_threads": None, "start": FRESH, "concurrent": 1}
        end.tell(outcome)           # the exit code, how it started, told by hostside on the node
        outcome.stderr_tail = "\n".join(follow.other)[-STDERR_TAIL_CHARS:].strip()
        if end.returncode is None and not (outcome.timed_out or outcome.stopped):
            status = getattr(info, "status", None)
            outcome.detail = (f"Ray job {job_id} ended {getattr(status, 'value', status)}: "
                              f"{getattr(info, 'message', None) or 'no message'}")
        if setup.distributed:
            rank_verdict(outcome, follow.ranks)
        if outcome.result_at is not None:
            outcome.exit_s = (end.at or time.monotonic()) - outcome.result_at
        self._forget(job_id)
        outcome.wall_s = time.monotonic() - submitted.start

    def _entrypoint(self, job: Job, job_id: str) -> str:
        from stepbench.execute.hosts.ssh import quote_command

        setup = job.setup
        env, dirs, cleanup = {"PYTHONUNBUFFERED": "1"}, [], []
        if setup.mode == "compile":
            if self.compile_cache is not None:
                cache, kind = str(self.compile_cache), "shared"
            else:   # this process's own folder on the node, cold, removed with the job
                name = hashlib.sha1(setup.key().encode()).hexdigest()[:12]
                cache, kind = f"{NODE_TMP}/{job_id}/inductor/{name}", "private"
                cleanup.append(f"{NODE_TMP}/{job_id}")
            env.update({"TORCHINDUCTOR_CACHE_DIR": cache, "TRITON_CACHE_DIR": f"{cache}/triton",
                        protocol.CACHE_KIND_ENV: kind})
            dirs.append(cache)
        spec = {"env": env, "dirs": dirs, "cleanup": cleanup, "watch_stdin": False}
        if self.workload is not None:   # below the working_dir, where the model's path resolves
            spec["cwd"] = self.workload.cwd
        if setup.nnodes > 1:
            spec.update(job=json.loads(job.payload()), nnodes=setup.nnodes,
                        bundle=self._bundle(setup), python=self.python,
                        rank_dir=f"{NODE_TMP}/{job_id}-ranks")
            return quote_command([self.python, "-m", "stepbench.execute.ray.nodes",
                                  json.dumps(spec)])
        spec["argv"] = self.command(job)
        if setup.distributed:
            spec["rank_dir"] = f"{NODE_TMP}/{job_id}-ranks"
        else:
            path = self._servers()
            if path is not None:
                spec.update(server=path, payload=job.payload())
        return quote_command(hostside.command(self.python, "run", json.dumps(spec)))

    def _servers(self) -> str | None:
        """Where this run's process servers listen on every host (started by the first job
        that asks, execute/ray/servers.py), or None: fresh start asked for, or no server."""
        if not uses_server(self.start):
            return None
        with self._servers_lock:
            if self._servers_job is not None:
                return self._server_path
            from stepbench.execute.hosts.ssh import quote_command

            self._servers_job = f"{self.tag}-servers"
            path = f"{NODE_TMP}/{self.tag}.sock"
            spec = {"path": path, "preload": self.preload,
                    "cwd": self.workload.cwd if self.workload is not None else None}
            try:
                self.cluster.client.submit_job(
                    entrypoint=quote_command([self.python, "-m", "stepbench.execute.ray.servers",
                                              json.dumps(spec)]),
                    submission_id=self._servers_job, entrypoint_num_cpus=0,
                    runtime_env=self.runtime_env(),
                    metadata={"stepbench": "process servers"})
            except Exception as exc:  # noqa: BLE001 - the setups start fresh; said once
                self.note(f"no process servers ({_reason(exc)}); every setup's process starts "
                          "fresh")
                return None
            hosts, ready = self.loop.call(self._await_servers(self._servers_job))
            if ready:
                imports = ready[0].get("imports_s") or {}
                self.note(f"process servers ready on {len(ready)} of {hosts} host(s) (imports: "
                          + ", ".join(f"{k} {v:.1f} s" for k, v in imports.items()) + ")"
                          + ("; the other hosts' setups start fresh" if len(ready) < hosts
                             else ""))
                self._server_path = path
            else:
                self.note("no process server started on the cluster; every setup's process "
                          "starts fresh")
            return self._server_path

    async def _await_servers(self, job_id: str) -> tuple[int, list[dict]]:
        """The servers job's count of hosts and the ready lines, once every host answered (or
        the job ended, or stop() came, or READY_TIMEOUT_S passed)."""
        from stepbench.execute.local.server import READY_TIMEOUT_S

        hosts, ready, answered, pending = 0, [], 0, ""

        async def read() -> None:
            nonlocal hosts, answered, pending
            async for chunk in self.cluster.client.tail_job_logs(job_id):
                *lines, pending = (pending + chunk).split("\n")
                for line in lines:
                    message = event_of(line) or {}
                    if message.get("event") == "servers":
                        hosts = message.get("hosts", 0)
                    elif message.get("event") in ("ready", "failed"):
                        answered += 1
                        if message["event"] == "ready":
                            ready.append(message)
                if hosts and answered >= hosts:
                    return

        reader = asyncio.ensure_future(read())
        stopper = asyncio.ensure_future(self._stop_event.wait())
        try:
            await asyncio.wait({reader, stopper}, timeout=READY_TIMEOUT_S,
                               return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (reader, stopper):
                task.cancel()
        return hosts, ready

    def runtime_env(self) -> dict:
        """Every job's: this very stepbench package, and a user's workload files as its
        working_dir."""
        from stepbench.execute.bundle import PACKAGE

        env = {"py_modules": [str(PACKAGE)]}
        if self._working_dir is not None:
            env["working_dir"] = self._working_dir
        return env

    def command(self, job: Job) -> list[str]:
        """A setup's process on its node, or a one-node torchrun job, its ranks on the job's
        GPUs (as LocalProcess.command runs them here)."""
        return worker_command(self.python, job)

    def _bundle(self, setup: Setup) -> dict:
        """One node's share of a job over several nodes (a placement group's bundle)."""
        bundle = {"CPU": 1}
        if setup.device == "cuda":
            bundle["GPU"] = setup.nproc
            if self.gpu_type:
                bundle[f"{ACCELERATOR}{self.gpu_type}"] = 0.001
        return bundle

    def _resources(self, setup: Setup) -> dict:
        """The job's entrypoint resources: where its process may run."""
        if setup.nnodes > 1:
            return {}       # the driver only places the tasks; they take the bundles' resources
        if setup.device != "cuda":
            return {"entrypoint_num_cpus": 1}
        resources = {"entrypoint_num_gpus": setup.nproc}
        if self.gpu_type:
            resources["entrypoint_resources"] = {f"{ACCELERATOR}{self.gpu_type}": 0.001}
        return resources

    async def _follow(self, job_id: str, timeout_s: float, follow: "_Follow") -> tuple[bool, bool]:
        """Follow the job's log until it ends; stop it at the timeout (counted from the moment it
        runs) or on stop(). (timed out, stopped)."""
        tail = asyncio.ensure_future(self._tail(job_id, follow))
        stopper = asyncio.ensure_future(self._stop_event.wait())
        placed = asyncio.ensure_future(follow.running.wait())
        timed_out = stopped = False
        try:
            while not tail.done():
                if follow.running.is_set():
                    left = follow.placed_at + timeout_s - time.monotonic()
                    if left <= 0:
                        timed_out = True
                        break
                    waits = {tail, stopper}
                else:
                    left, waits = None, {tail, stopper, placed}
                done, _ = await asyncio.wait(waits, timeout=left,
                                             return_when=asyncio.FIRST_COMPLETED)
                if stopper in done:
                    stopped = True
                    break
            if timed_out or stopped:
                await asyncio.get_running_loop().run_in_executor(None, self._stop_job, job_id)
                try:
                    await asyncio.wait_for(asyncio.shield(tail), STOP_WAIT_S)
                except asyncio.TimeoutError:
                    tail.cancel()
        finally:
            stopper.cancel()
            placed.cancel()
        if tail.done() and not tail.cancelled() and tail.exception() is not None:
            follow.other.append(f"stepbench: lost the job's log ({_reason(tail.exception())})")
        return timed_out, stopped

    async def _tail(self, job_id: str, follow: "_Follow") -> None:
        """The job's log into `follow`, until hostside's exit line (its last) or the log's end."""
        logs = self.cluster.client.tail_job_logs(job_id)
        try:
            async for chunk in logs:
                follow.feed(chunk)
                if follow.exit is not None:
                    return
        finally:
            await logs.aclose()
        follow.feed("\n")

    def _stop_job(self, job_id: str) -> None:
        try:
            self.cluster.client.stop_job(job_id)
        except Exception:  # noqa: BLE001 - it ended on its own meanwhile
            pass

    def _info(self, job_id: str):
        try:
            return self.cluster.client.get_job_info(job_id)
        except Exception:  # noqa: BLE001 - the record says what arrived
            return None

    def _forget(self, job_id: str) -> None:
        """Delete the job (once it ended) in a thread of its own, joined by close(); not on a
        `--ray local` cluster, which ends with the run, its jobs with it."""
        if self.cluster.local is not None:
            return
        thread = threading.Thread(target=delete_ended, args=(self.cluster.client, job_id),
                                  daemon=True, name=f"delete {job_id}")
        thread.start()
        with self._lock:
            self._deleting = [t for t in self._deleting if t.is_alive()] + [thread]

    def _lose(self, reason: str) -> None:
        """The cluster cannot run this run's jobs: no job starts after this one."""
        with self._lock:
            self.lost = self.lost or reason
            self._stopping = True

    def stop(self) -> None:
        with self._lock:
            self._stopping = True
        self.loop.soon(self._stop_event.set)

    def close(self) -> None:
        if self._servers_job is not None:       # the servers end what they forked still running
            self._stop_job(self._servers_job)
            self._forget(self._servers_job)
            self._servers_job = None
        with self._lock:
            deleting, self._deleting = self._deleting, []
        for thread in deleting:
            thread.join()
        if self._own_loop:
            self.loop.close()
        if self._working_dir is not None:
            import shutil

            shutil.rmtree(self._working_dir, ignore_errors=True)
            self._working_dir = None


class _Follow(Lines):
    """A job's log as hostside's lines (stdout and stderr share it: the other lines are the
    stderr tail), and an event set once the setup's process runs (its placed line)."""

    def __init__(self, outcome: Outcome, on_message: OnMessage):
        super().__init__(outcome, on_message)
        self.running = asyncio.Event()

    def line(self, line: str) -> str | None:
        event = super().line(line)
        if event == PLACED_EVENT:
            self.running.set()
        return event


def executor_for(cluster: Cluster, settings, plan: list[Setup], gpus: int, run_id: str,
                 note) -> RayExecutor:
    from stepbench.execute.bundle import carried
    from stepbench.execute.local.server import imports_for

    workload = carried(settings, "the Ray cluster")
    if workload is not None:
        note(f"each Ray job {workload.describe()} as its working_dir")
    return RayExecutor(cluster, settings.device, gpus=gpus, gpu_type=settings.gpu_type,
                       compile_cache=settings.compile_cache, run_id=run_id,
                       start=settings.start, preload=imports_for(plan), note=note,
                       workload=workload)


def delete_ended(client, job_id: str) -> None:
    """Remove the job from the cluster's list once it ended (Ray deletes only ended jobs),
    then watch it for SETTLE_S: Ray's job manager (each node's that was asked about the job
    has one), which looks at a job's supervisor about once a second, writes FAILED
    ("supervisor actor died") into a job deleted before it saw the supervisor end; such a
    job is deleted again."""
    from ray.job_submission import JobStatus

    deadline, deleted_at = time.monotonic() + STOP_WAIT_S, None
    while time.monotonic() < deadline:
        try:
            status = client.get_job_status(job_id)
        except Exception:  # noqa: BLE001 - gone (or the cluster is): nothing to delete
            if deleted_at is None or time.monotonic() - deleted_at >= SETTLE_S:
                return
            status = None
        if status in (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED):
            try:
                client.delete_job(job_id)
            except Exception:  # noqa: BLE001 - deleted meanwhile
                pass
            deleted_at = deleted_at or time.monotonic()
        time.sleep(DELETE_POLL_S)
