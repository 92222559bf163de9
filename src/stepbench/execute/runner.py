"""Run a plan of setups through an executor and keep every outcome as a record.

For each setup and repeat the runner looks for a record already in the results file (resume: the
same setup, repeat and GPU), else hands a job to the executor, one job in flight per slot, turns
the outcome into a Record (the one place a Record is made from a run) and appends it before the
slot takes its next job. Ctrl-C, SIGTERM and SIGHUP stop every job in flight; the setups that
finished are already in the file.
"""

from __future__ import annotations

import queue
import secrets
import signal
import threading
from concurrent.futures import ThreadPoolExecutor, wait
from datetime import datetime, timezone

from stepbench.execute.executor import Executor, Job, Outcome
from stepbench.record import MEASURED_FIELDS, Machine, Record, ResultsFile, Software, resume_key
from stepbench.setup import Setup


class NullDisplay:
    """The display interface the runner calls; this one shows nothing (tests, JSON runs)."""

    def note(self, text: str) -> None: ...
    def skip(self, job: Job, record: Record) -> None: ...
    def start(self, job: Job, index: int, total: int) -> None: ...
    def message(self, job: Job, message: dict) -> None: ...
    def finish(self, job: Job, record: Record) -> None: ...
    def close(self) -> None: ...


class Runner:
    """Runs plans on one executor into one results file."""

    def __init__(self, executor: Executor, store: ResultsFile, *, timeout_s: float,
                 display=None, rerun: bool = False, measure_peak: bool = True,
                 run_id: str | None = None):
        self.executor = executor
        self.store = store
        self.timeout_s = timeout_s
        self.display = display or NullDisplay()
        self.rerun = rerun              # measure again what the file already has; the new wins
        self.measure_peak = measure_peak
        self.run_id = run_id or new_run_id()
        # The SSH host an executor runs on (execute/ssh.py): part of the resume key and the record.
        self.host = getattr(executor, "host", None)
        self._lock = threading.Lock()

    def run(self, plan: list[Setup], repeats: int = 1) -> list[Record]:
        """Every setup `repeats` times, interleaved (A B C A B C); returns this plan's records,
        old and new, in plan order."""
        jobs = [Job(setup, repeat) for repeat in range(repeats) for setup in plan]
        slot = self.executor.slots[0]
        done = {} if self.rerun else {r.resume_key(): r for r in self.store.latest()}
        records: dict[int, Record] = {}
        todo = []
        for index, job in enumerate(jobs):
            key = resume_key(job.setup, job.repeat, self.executor.gpu_name(job.setup, slot),
                             self.host)
            if key in done:
                records[index] = done[key]
                self.display.skip(job, done[key])
            else:
                todo.append((index, job))
        try:
            with stop_signals():
                peaks = self._peaks([job for _, job in todo], slot)
                self._run_all([(i, Job(j.setup, j.repeat, peaks.get(j.setup.dtype)))
                               for i, j in todo], len(jobs), records)
        finally:
            self.display.close()
        return [records[i] for i in sorted(records)]

    def _peaks(self, jobs: list[Job], slot: str) -> dict[str, float | None]:
        """The GPU's matmul rate per dtype the jobs use, measured once (for mfu_measured)."""
        if not self.measure_peak:
            return {}
        dtypes = dict.fromkeys(j.setup.dtype for j in jobs if j.setup.device == "cuda")
        if dtypes:
            self.display.note("measuring the GPU's matmul rate (for MFU)")
        return {dtype: self.executor.measure_peak(dtype, slot) for dtype in dtypes}

    def _run_all(self, todo: list[tuple[int, Job]], total: int, records: dict[int, Record]) -> None:
        free: queue.Queue[str] = queue.Queue()
        for slot in self.executor.slots:
            free.put(slot)

        def one(index: int, job: Job) -> None:
            slot = free.get()
            try:
                self.display.start(job, index + 1, total)
                outcome = self.executor.run(job, slot, self.timeout_s,
                                            lambda message: self.display.message(job, message))
                if outcome.stopped:
                    return          # interrupted: not a measurement, nothing is stored
                record = make_record(job, outcome, run_id=self.run_id, timeout_s=self.timeout_s,
                                     gpu=self.executor.gpu_name(job.setup, slot), host=self.host)
                with self._lock:
                    self.store.append(record)
                    records[index] = record
                self.display.finish(job, record)
            finally:
                free.put(slot)

        pool = ThreadPoolExecutor(max_workers=len(self.executor.slots),
                                  thread_name_prefix="stepbench-slot")
        futures = [pool.submit(one, index, job) for index, job in todo]
        try:
            wait(futures)
        except BaseException:
            self.executor.stop()
            pool.shutdown(wait=True, cancel_futures=True)
            raise
        pool.shutdown(wait=True)
        for future in futures:
            future.result()     # a bug in a slot's thread surfaces here, with its traceback


class Stopped(KeyboardInterrupt):
    """SIGTERM or SIGHUP arrived: stop like Ctrl-C, exit with 128 + the signal's number."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class stop_signals:
    """While running, SIGTERM and SIGHUP raise Stopped in the main thread, as Ctrl-C raises
    KeyboardInterrupt, so that every way out goes through the same clean-up."""

    SIGNALS = (signal.SIGTERM, signal.SIGHUP)

    def __enter__(self):
        self.previous = {}
        if threading.current_thread() is threading.main_thread():
            for sig in self.SIGNALS:
                self.previous[sig] = signal.signal(sig, self._raise)
        return self

    def __exit__(self, *exc):
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)
        return False

    @staticmethod
    def _raise(signum, frame):
        raise Stopped(signum)


def make_record(job: Job, outcome: Outcome, *, run_id: str, timeout_s: float,
                gpu: str | None, host: str | None = None) -> Record:
    """The record of one finished child: what it measured, with the status the parent decides.

    Machine and software come from the child's start message; a child that died before sending
    it is placed on `gpu`, the name the resume key used.
    """
    result = outcome.result or {}
    measured = {k: v for k, v in (result.get("measured") or {}).items() if k in MEASURED_FIELDS}
    measured.setdefault("phase", outcome.progress.get("phase", "starting"))
    status, error = classify(outcome, measured["phase"], timeout_s)
    start = outcome.start or {}
    machine = Machine.from_dict(start.get("machine") or {"gpu": gpu or "unknown GPU"})
    software = Software.from_dict(start.get("software"))
    return Record(run_id=run_id, repeat=job.repeat, setup=job.setup, status=status, error=error,
                  **measured, started_at=outcome.started_at, finished_at=outcome.finished_at,
                  wall_s=round(outcome.wall_s, 3), host=host, machine=machine, software=software)


def classify(outcome: Outcome, phase: str, timeout_s: float) -> tuple[str, str | None]:
    """Status from the clock, the child's own verdict, or its exit."""
    if outcome.timed_out:
        return "timeout", (f"no result after {timeout_s:g} s (last phase: {phase}); the process "
                           "group was killed; raise --timeout if it needs longer")
    if outcome.result is not None:
        status, error = outcome.result.get("status", "error"), outcome.result.get("error")
        if status == "error" and outcome.stderr_tail:
            error = f"{error}\n{outcome.stderr_tail}"
        return status, error
    rc = outcome.returncode
    if rc is not None and rc < 0:
        how = f"killed by signal {signal.Signals(-rc).name}"
    else:
        how = f"exited with code {rc} and no result"
    said = (f"stderr ends with:\n{outcome.stderr_tail}" if outcome.stderr_tail
            else "it wrote nothing to stderr")
    return "crashed", f"{how} (last phase: {phase}); {said}"


def new_run_id() -> str:
    return datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ") + "-" + secrets.token_hex(3)
