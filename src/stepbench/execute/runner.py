"""Run a plan of setups through an executor and keep every outcome as a record.

For each setup and repeat the runner looks for a record already in the results file (resume: the
same setup, repeat and GPU), else hands a job to the executor, one job in flight per slot, turns
the outcome into a Record (the one place a Record is made from a run) and appends it before the
slot takes its next job. With `repeats` None (run's default) each setup runs in two processes,
and in a third where those two disagree (noise.processes_disagree). Ctrl-C, SIGTERM and SIGHUP
stop every job in flight; the setups that finished are already in the file. So does a slot whose
thread fails (a results file that cannot be appended to, record.ResultsFileError, or a bug): no
job starts after it, the others are killed and its exception is raised.

With several slots (a pool of GPUs), jobs start in order of expected length, longest first
(`expected_cost`), each as soon as the slots it needs are free; a job that needs more slots than
are free waits, and the jobs after it wait behind it, so a big job is never starved.
"""

from __future__ import annotations

import re
import secrets
import signal
import threading
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from stepbench.execute.protocol import Executor, Job, Outcome
from stepbench.guard import loss_tolerance
from stepbench.noise import processes_disagree
from stepbench.record import MEASURED_FIELDS, Machine, Record, ResultsFile, Software, resume_key
from stepbench.setup import Setup


# The adaptive default (`repeats` None): this many processes per setup before the rule decides
# whether a setup needs one more.
FIRST_ROUNDS = 2
# Statuses of the moment, not of the setup: a stored record of one is measured again on resume
# (an oom or unsupported setup stays done: it would end the same way).
RETRIED = ("timeout", "error", "crashed")


def least_processes(repeats: int | None) -> int:
    """The processes per setup that `Runner.run(repeats=...)` runs at least."""
    return FIRST_ROUNDS if repeats is None else repeats


class NullDisplay:
    """The display interface the runner calls (execute/progress.py draws it); this one shows
    nothing (tests, JSON runs). `plan` announces the processes the runner will run or find in
    the results file (`skip`), in addition to those announced before; `start` and `finish`
    frame each process it runs, `message` passes on what the process reports."""

    def note(self, text: str) -> None: ...
    def line(self, text: str) -> None: ...
    def plan(self, jobs: list[Job], slots: int = 1) -> None: ...
    def skip(self, job: Job, record: Record, **label) -> None: ...
    def start(self, job: Job, where: str | None = None, **label) -> None: ...
    def message(self, job: Job, message: dict) -> None: ...
    def finish(self, job: Job, record: Record, **after) -> None: ...
    def close(self) -> None: ...


def before_finals(tag: dict | None) -> bool:
    """Whether a search's measurement comes before its finals (max-batch's probes; a tune's
    ladder, compiled, explore stages): its process takes the GPU's matmul rate and the FLOP
    counter's cross-check from their per-machine caches only (Job.probe), so that the search's
    first process does not pay for them; its finals (the winner's processes) measure them."""
    return bool(tag) and tag.get("role") != "final" and tag.get("stage") != "final"


class Runner:
    """Runs plans on one executor into one results file. What changes from one plan to the next
    (repeats, timeout, why a search asked, where progress shows) is given to each `run`."""

    def __init__(self, executor: Executor, store: ResultsFile, *, rerun: bool = False,
                 measure_peak: bool = True, run_id: str | None = None,
                 profile: Path | None = None, pin_cpus: str = "off"):
        self.executor = executor
        self.store = store
        self.rerun = rerun              # measure again what the file already has; the new wins
        self.measure_peak = measure_peak
        self.profile = profile          # --profile: the folder each process writes a profile to
        self.pin_cpus = pin_cpus        # --pin-cpus: auto binds each process to its GPU's cores
        self.run_id = run_id or new_run_id()
        # The SSH host an executor runs on (hosts/ssh.py): part of the resume key and the record.
        self.host = executor.host
        # A rented machine's provider and price (rent/), kept with each record.
        self.rental = executor.rental
        self._lock = threading.Lock()
        # Every record this runner found in the results file or made, by (setup, repeat):
        # what a run stopped by Ctrl-C still shows.
        self._kept: dict[tuple, Record] = {}
        # The setups (key) whose failed stored record this runner said it measures again.
        self._retried: set[str] = set()

    def kept(self) -> list[Record]:
        """The records of the plans run so far, old and new, in the order they were found or
        made; those of a run that was stopped too."""
        with self._lock:
            return list(self._kept.values())

    def run(self, plan: list[Setup], *, repeats: int | None = 1, timeout_s: float,
            tag: dict | None = None, display=None, retry: bool = True) -> list[Record]:
        """Every setup `repeats` times, interleaved (A B C A B C), each process stopped after
        `timeout_s`; returns this plan's records, old and new, repeat by repeat in plan order.
        `repeats` None is the adaptive default (`_run_adaptive`). `tag` marks the new records
        (Record.search): why a search asked for them. `display` shows progress; whoever made it
        closes it. `retry`: a stored record whose status is RETRIED is measured again (False:
        it counts as done, as tune's budget does)."""
        call = _Call(timeout_s, tag, display or NullDisplay(), retry)
        if repeats is None:
            return self._run_adaptive(plan, call)
        return self._run_jobs([Job(setup, r) for r in range(repeats) for setup in plan], call)

    def _run_adaptive(self, plan: list[Setup], call: "_Call") -> list[Record]:
        """Two processes per setup, interleaved, then a third for each setup whose two disagree
        (noise.processes_disagree), interleaved too: one process can be off by more than the
        difference a reader looks for, and a third tells which of two is. Nothing more runs
        when a process of the first two rounds was stopped (a lost host)."""
        jobs = [Job(setup, r) for r in range(FIRST_ROUNDS) for setup in plan]
        records = self._run_jobs(jobs, call)
        if len(records) < len(jobs):
            return records
        third = [setup for setup in plan if processes_disagree(
            [r for r in records if r.ok and r.setup.key() == setup.key()])]
        if not third:
            return records
        call.display.note(f"a third process for {len(third)} setup"
                          f"{'s' if len(third) > 1 else ''} whose two disagreed: "
                          + ", ".join(s.batch_words for s in third))
        return records + self._run_jobs([Job(s, FIRST_ROUNDS) for s in third], call,
                                        offset=len(jobs))

    def _run_jobs(self, jobs: list[Job], call: "_Call", offset: int = 0) -> list[Record]:
        """Run `jobs` (after `offset` jobs of this plan) except those the results file has;
        their records, old and new, in the jobs' order."""
        # Per-layer compile from before every layer had its graph is measured again. Records
        # appended after `since` (another run's) count when a job is claimed (claims.py).
        since = self.store.end()
        stored, stale, failed = [], [], []
        for r in [] if self.rerun else self.store.latest():
            if r.compiled_too_few_layers:
                stale.append(r)
            elif call.retry and r.status in RETRIED:
                failed.append(r)
            else:
                stored.append(r)
        done = {r.resume_key(): r for r in stored}
        stale_done = {r.resume_key(): r for r in stale}
        failed_done = {r.resume_key(): r for r in failed}
        records: dict[int, Record] = {}
        todo, again, retried = [], 0, {}
        call.display.plan(jobs, len(self.executor.slots))
        for index, job in enumerate(jobs, start=offset):
            found = self.executor.find_done(job, stored, done)
            if found is not None:
                records[index] = found
                self._keep(found)
                call.display.skip(job, found)
                continue
            todo.append((index, job))
            if stale and self.executor.find_done(job, stale, stale_done) is not None:
                again += 1
            gone = failed and self.executor.find_done(job, failed, failed_done)
            if gone:
                retried.setdefault(job.setup.key(), gone.status)
        if again:
            call.display.note(
                f"{again} stored record{'s' if again > 1 else ''} of per-layer compile measured "
                "again: written before every decoder layer could have its own graph (layers past "
                "dynamo's recompile limit ran eagerly)")
        self._say_retried(retried, call)
        if len(self.executor.slots) > 1:
            # Sorted within each repeat, so that repeats stay interleaved (A B C A B C).
            todo.sort(key=lambda item: (item[1].repeat, -expected_cost(item[1].setup), item[0]))
        with stop_signals():
            probe = before_finals(call.tag)
            self._run_all([(i, Job(j.setup, j.repeat, self.measure_peak, self.profile_stem(j),
                                   probe, self.pin_cpus)) for i, j in todo], records, call,
                          since)
        return [records[i] for i in sorted(records)]

    def _say_retried(self, retried: dict[str, str], call: "_Call") -> None:
        """Say once which setups are measured again because their stored record failed for a
        reason of the moment (RETRIED); a later plan of this runner names only new ones."""
        new = {k: v for k, v in retried.items() if k not in self._retried}
        if not new:
            return
        self._retried |= new.keys()
        statuses = "/".join(s for s in RETRIED if s in new.values())
        call.display.note(f"retrying {len(new)} setup{'s' if len(new) > 1 else ''} whose stored "
                          f"result was {statuses} (use --rerun to measure all again)")

    def profile_stem(self, job: Job) -> str | None:
        """Where `job`'s process writes its profile (--profile), less the suffixes: the
        setup's name, model, batch x seq, processes, the run and the repeat."""
        if self.profile is None:
            return None
        s = job.setup
        parts = [s.name, s.model_label, f"{s.batch}x{s.seq}", s.dtype,
                 f"{s.parallel}x{s.world_size}" if s.distributed else "", self.run_id, f"r{job.repeat}"]
        name = "_".join(re.sub(r"[^A-Za-z0-9.+-]", "-", p) for p in parts if p)
        return str(self.profile / name)

    def _keep(self, record: Record) -> None:
        with self._lock:
            self._kept[record.setup, record.repeat] = record

    def _run_all(self, todo: list[tuple[int, Job]], records: dict[int, Record],
                 call: "_Call", since: int) -> None:
        slots = SlotPool(self.executor.slots)
        running: dict[int, dict] = {}     # index -> placement of each job in flight

        def one(index: int, job: Job, slot: str) -> None:
            # Another run measured this into the same file since `since`, or a live one is
            # measuring it: take (or wait for) its record instead (claims.py).
            key = resume_key(job.setup, job.repeat, self.executor.gpu_name(job.setup, slot),
                             self.host)
            try:
                theirs = self.store.claims.claim(
                    key, call.display.note, _label(job), since,
                    match=lambda records: self.executor.find_done(job, records))
                if theirs is not None:
                    records[index] = theirs
                    self._keep(theirs)
                    call.display.skip(job, theirs)
                    return
                call.display.start(job, where=self.executor.where(job, slot))
                with self._lock:
                    running[index] = {"concurrent": 1}
                    for placement in running.values():   # jobs in flight alongside each other
                        placement["concurrent"] = max(placement["concurrent"], len(running))
                outcome = self.executor.run(job, slot, call.timeout_s,
                                            lambda message: call.display.message(job, message))
                with self._lock:
                    outcome.placement["concurrent"] = running.pop(index)["concurrent"]
                if outcome.stopped:
                    return          # interrupted: not a measurement, nothing is stored
                with self._lock:
                    baseline = baseline_record(self.store, job.setup,
                                               self.executor.gpu_name(job.setup, slot), self.host)
                    record = make_record(job, outcome, run_id=self.run_id,
                                         timeout_s=call.timeout_s,
                                         gpu=self.executor.gpu_name(job.setup, slot),
                                         baseline=baseline, host=self.host,
                                         rental=self.rental, search=call.tag)
                    self.store.append(record)
                    records[index] = record
                    self._kept[record.setup, record.repeat] = record
                call.display.finish(job, record)
            except BaseException:
                slots.close()   # start nothing more; the main thread stops the rest
                raise
            finally:
                self.store.claims.release(key)
                slots.release(slot)

        pool = ThreadPoolExecutor(max_workers=len(self.executor.slots),
                                  thread_name_prefix="stepbench-slot")
        futures = []
        try:
            for index, job in todo:
                slot = slots.acquire(min(self.executor.slots_needed(job.setup),
                                         len(self.executor.slots)))
                if slot is None:
                    break       # a slot's thread failed
                futures.append(pool.submit(one, index, job, slot))
            wait(futures, return_when=FIRST_EXCEPTION)
            for future in futures:
                if future.done() and future.exception() is not None:
                    # The slot's error (a results file that cannot be written) or bug, with its
                    # traceback; the jobs still in flight are stopped below.
                    future.result()
        except BaseException:
            self.executor.stop()
            pool.shutdown(wait=True, cancel_futures=True)
            raise
        pool.shutdown(wait=True)


def _label(job: Job) -> str:
    return f"{job.setup.batch_words} (repeat {job.repeat})"


@dataclass(frozen=True)
class _Call:
    """What one `Runner.run` was given for its jobs."""

    timeout_s: float
    tag: dict | None
    display: object
    retry: bool = True


class SlotPool:
    """The free slots; `acquire(n)` blocks until n are free and takes them (as "0,1"), or returns
    None once the pool is closed."""

    def __init__(self, slots: list[str]):
        self.order = list(slots)
        self.free = set(slots)
        self.cond = threading.Condition()
        self.closed = False

    def acquire(self, n: int) -> str | None:
        with self.cond:
            while len(self.free) < n and not self.closed:
                self.cond.wait(timeout=1.0)   # wakes for Ctrl-C and signals in the main thread
            if self.closed:
                return None
            taken = [s for s in self.order if s in self.free][:n]
            self.free.difference_update(taken)
            return ",".join(taken)

    def release(self, slot: str) -> None:
        with self.cond:
            self.free.update(slot.split(","))
            self.cond.notify_all()

    def close(self) -> None:
        with self.cond:
            self.closed = True
            self.cond.notify_all()


# Expected-length heuristic for ordering a pool's jobs, longest first; only the order matters. A
# cold torch.compile is most of a GPU setup's life, more than any step count; eager attention
# materialises the seq x seq scores (the slowest step of the default matrix); then step count x
# tokens; a job of several GPUs goes first so that smaller ones fill the GPUs around it
# (docs/architecture.md, "Measured reasons").
ATTENTION_WEIGHT = {"eager": 3.0}


def expected_cost(setup: Setup) -> float:
    steps = 1 + setup.warmup + setup.steps
    work = steps * setup.rank_tokens_per_step * ATTENTION_WEIGHT.get(setup.attn, 1.0)
    return (setup.world_size * 1e15 + (1e13 if setup.mode == "compile" else 0.0) + work)


class Stopped(KeyboardInterrupt):
    """SIGTERM or SIGHUP arrived: stop like Ctrl-C, exit with 128 + the signal's number."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class on_signals:
    """While inside, `SIGNALS` go to `handle` (in the main thread; elsewhere nothing changes),
    and the handlers before come back after."""

    SIGNALS: tuple = ()

    def handle(self, signum, frame) -> None:
        raise NotImplementedError

    def __enter__(self):
        self.previous = {}
        if threading.current_thread() is threading.main_thread():
            for sig in self.SIGNALS:
                self.previous[sig] = signal.signal(sig, self.handle)
        return self

    def __exit__(self, *exc):
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)
        return False


class stop_signals(on_signals):
    """While running, SIGTERM and SIGHUP raise Stopped in the main thread, as Ctrl-C raises
    KeyboardInterrupt, so that every way out goes through the same clean-up."""

    SIGNALS = (signal.SIGTERM, signal.SIGHUP)

    def handle(self, signum, frame):
        raise Stopped(signum)


def make_record(job: Job, outcome: Outcome, *, run_id: str, timeout_s: float,
                gpu: str | None, baseline: Record | None = None,
                host: str | None = None, rental: dict | None = None,
                search: dict | None = None) -> Record:
    """The record of one finished child: what it measured, with the status the parent decides.

    Machine and software come from the child's start message; a child that died before sending
    it is placed on `gpu`, the name the resume key used. A distributed job's scaling efficiency
    is taken against `baseline`, the same setup's single-process record, when there is one.
    """
    result = outcome.result or {}
    measured = {k: v for k, v in (result.get("measured") or {}).items() if k in MEASURED_FIELDS}
    measured.setdefault("phase", outcome.progress.get("phase", "starting"))
    if measured.get("phases") is not None and outcome.exit_s is not None:
        measured["phases"] = {**measured["phases"], "exit": round(outcome.exit_s, 3)}
    # A tune stops a process at what its budget has left, or at --timeout.
    fix = "--budget or --timeout" if (search or {}).get("kind") == "tune" else "--timeout"
    status, error = classify(outcome, measured["phase"], timeout_s,
                             capped_cpu=job.setup.device == "cpu"
                             and job.setup.memory_limit_gb is not None, fix=fix)
    start = outcome.start or {}
    machine = Machine.from_dict(start.get("machine") or {"gpu": gpu or "unknown GPU"})
    software = Software.from_dict(start.get("software"))
    if isinstance(measured.get("scaling"), dict) and baseline is not None:
        measured["scaling"] = {**measured["scaling"], **scaling_against(measured["scaling"], baseline)}
    measured.setdefault("loss_tolerance", loss_tolerance(job.setup))
    return Record(run_id=run_id, repeat=job.repeat, setup=job.setup, status=status, error=error,
                  **measured, started_at=outcome.started_at, finished_at=outcome.finished_at,
                  wall_s=round(outcome.wall_s, 3), host=host, rental=rental, machine=machine,
                  software=software, placement=outcome.placement or None, search=search)


def baseline_record(store: ResultsFile, setup: Setup, gpu: str | None,
                    host: str | None = None) -> Record | None:
    """The latest ok record of `setup` on one process without a wrapper, on the same GPU (and
    the same SSH host)."""
    if not setup.distributed:
        return None
    key = setup.single_process_twin().key()
    found = [r for r in store.latest()
             if r.ok and r.setup.key() == key and r.machine.gpu == gpu and r.host == host]
    return found[-1] if found else None


def scaling_against(scaling: dict, baseline: Record) -> dict:
    """Scaling efficiency: the job's tokens/s per GPU over one GPU's without a wrapper."""
    per_gpu = scaling.get("tokens_per_s_per_gpu")
    if not per_gpu or not baseline.tokens_per_s:
        return {}
    return {"efficiency": per_gpu / baseline.tokens_per_s,
            "baseline": {"run_id": baseline.run_id, "repeat": baseline.repeat,
                         "step_ms": baseline.step_ms, "tokens_per_s": baseline.tokens_per_s,
                         "started_at": baseline.started_at}}


# A native library that dereferences the null its refused allocation returned (oneDNN's
# primitives in a process forked by the server did): under a CPU memory cap, an oom.
CAPPED_OOM_SIGNALS = (signal.SIGSEGV, signal.SIGBUS, signal.SIGABRT)


def classify(outcome: Outcome, phase: str, timeout_s: float,
             capped_cpu: bool = False, fix: str = "--timeout") -> tuple[str, str | None]:
    """Status from the clock, the child's own verdict, or its exit; `capped_cpu`: a CPU setup
    under --memory-limit-gb, whose death by a memory fault after its imports is an oom; `fix`:
    the flag a timeout's line says to raise."""
    detail = f"; {outcome.detail}" if outcome.detail else ""
    if outcome.timed_out:
        # A tune's timeout is what its budget has left (1.03071 s): three digits, no exponent.
        limit = f"{timeout_s:.3g}" if timeout_s < 100 else f"{timeout_s:.0f}"
        return "timeout", (f"no result after {limit} s (last phase: {phase}); the process "
                           f"group was killed; raise {fix} if it needs longer{detail}")
    if outcome.result is not None:
        status, error = outcome.result.get("status", "error"), outcome.result.get("error")
        # A user's factory's traceback has a field of its own (`traceback`): `error` keeps its line.
        own = (outcome.result.get("measured") or {}).get("traceback")
        if status == "error" and outcome.stderr_tail and not own:
            error = f"{error}\n{outcome.stderr_tail}"
        return status, error
    rc = outcome.returncode
    if outcome.oom_killed:
        return "oom", (f"killed by the kernel's out-of-memory killer (last phase: {phase}; "
                       f"{outcome.oom_killed})")
    if rc is not None and rc < 0:
        how = f"killed by signal {signal.Signals(-rc).name}"
    else:
        how = f"exited with code {rc} and no result"
    said = (f"stderr ends with:\n{outcome.stderr_tail}" if outcome.stderr_tail
            else "it wrote nothing to stderr")
    if capped_cpu and rc is not None and -rc in CAPPED_OOM_SIGNALS and phase != "starting":
        return "oom", (f"{how} under its --memory-limit-gb cap (last phase: {phase}): a native "
                       f"library's allocation the cap refused{detail}; {said}")
    return "crashed", f"{how} (last phase: {phase}){detail}; {said}"


def new_run_id() -> str:
    return datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ") + "-" + secrets.token_hex(3)
