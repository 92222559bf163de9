"""Live progress on stderr while a plan runs: which setups are running, in which phase, how long,
how far the whole run is and about how long it has left.

On a terminal a rich live block shows one line per running setup, redrawn in place, and a last
line with the run's progress; elsewhere (CI logs, pipes, the GPU machine's captured output) one
plain line is printed per phase change, so logs stay readable. Either way a line is written only
when a setup's process reports a phase (never from inside its timed window: it sends nothing
there) or ends. stdout is never touched: it carries the table or the JSON. The runner calls it
from one thread per slot, so every method takes the lock.

Numbering: the runner announces the processes of its plan (`plan`), and each is numbered as it
starts or is found in the results file, "[3/8]", over the whole run. Once a setup of each kind
among those left has finished (eager, compiled and autotuned setups take very different times),
each finished line ends with an estimate of the time left (`Estimate`). A search runs one setup
per runner call and cannot know its total: its `SearchView` numbers its processes itself
("probe 5"), and a tune's lines end with the budget it has left.
"""

from __future__ import annotations

import collections
import re
import statistics
import sys
import threading
import time
from typing import Callable

from stepbench.errors import first_line
from stepbench.execute.protocol import Job
from stepbench.record import Record
from stepbench.setup import Setup
from stepbench.units import duration, gigabytes

PHASE_TEXT = {
    "starting": "starting its process",
    "peak": "the GPU's matmul rate (for MFU)",
    "building": "building the model",
    "first_step": "first step",
    "warmup": "warm-up",
    "timed": "timed steps",
    "done": "finishing",
}


def describe(progress: dict) -> str:
    """'warm-up 2/4', 'first step (compiling)', 'timed steps (20)'."""
    phase = progress.get("phase", "starting")
    text = PHASE_TEXT.get(phase, phase)
    args = progress.get("args") or []
    if phase == "first_step" and progress.get("compiling"):
        return "first step (compiling)"
    if phase == "warmup" and len(args) == 2:
        return f"{text} {args[0]}/{args[1]}"
    if phase == "timed" and args:
        # Nothing is reported from inside the timed window: that would disturb what is measured.
        return f"{text} ({args[0]})"
    return text


def job_name(job: Job) -> str:
    s = job.setup
    return (s.batch_words
            + (f" {s.params}" if s.params else "")
            + (f" {s.parallel_label}" if s.distributed else "")
            + (f" (repeat {job.repeat + 1})" if job.repeat else ""))


def kind(setup: Setup) -> str:
    """What a setup's time is estimated from until one of its own processes has finished: a cold
    compile is most of a compiled setup's life, and autotuning takes longer still."""
    if setup.mode != "compile":
        return "eager"
    return "autotuned" if setup.compile_mode.startswith("max-autotune") else "compiled"


class Estimate:
    """One plan's progress (one runner's, on one machine): how many of its processes have been
    numbered, out of how many, and the time left, from the wall times of its finished processes:
    a process is expected to take as long as the same setup's finished ones took on average,
    else as long as those of its kind; the sum over what is left, spread over the slots."""

    def __init__(self):
        self.total = 0
        self.numbered = 0
        self.slots = 1
        self.waiting: collections.Counter = collections.Counter()   # (setup, repeat) -> count
        self.running: dict[tuple, tuple[Setup, float]] = {}         # job key -> (setup, since)
        self.by_setup: dict[Setup, list[float]] = collections.defaultdict(list)
        self.by_kind: dict[str, list[float]] = collections.defaultdict(list)

    @staticmethod
    def key(job: Job) -> tuple:
        return job.setup, job.repeat

    def add(self, jobs: list[Job], slots: int) -> None:
        self.total += len(jobs)
        self.slots = max(1, slots)
        self.waiting.update(self.key(job) for job in jobs)

    def number(self, job: Job) -> str:
        """The next number, "3/8", taking `job` off the waiting list."""
        self.numbered += 1
        self.total = max(self.total, self.numbered)
        if self.waiting[self.key(job)] > 0:
            self.waiting[self.key(job)] -= 1
        return f"{self.numbered}/{self.total}"

    def started(self, job: Job, now: float) -> None:
        self.running[self.key(job)] = (job.setup, now)

    def finished(self, job: Job, wall_s: float | None) -> None:
        self.running.pop(self.key(job), None)
        if wall_s is not None:
            self.by_setup[job.setup].append(wall_s)
            self.by_kind[kind(job.setup)].append(wall_s)

    def forget(self, job: Job) -> None:
        self.running.pop(self.key(job), None)

    def left_s(self, now: float) -> float | None:
        """Seconds left, or None until a setup of each kind left has finished (or none is)."""
        expected = []
        left = [(setup, None) for (setup, _), n in self.waiting.items() for _ in range(n)]
        left += [(setup, since) for setup, since in self.running.values()]
        for setup, since in left:
            walls = self.by_setup.get(setup) or self.by_kind.get(kind(setup))
            if not walls:
                return None
            mean = statistics.fmean(walls)
            expected.append(mean if since is None else max(mean - (now - since), 0.0))
        if not expected:
            return None
        return sum(expected) / min(self.slots, len(expected))


def time_left(seconds: float) -> str:
    return f"about {duration(max(seconds, 1.0))} left"


# What an allocator's out-of-memory error asked for: the CPU's "you tried to allocate N bytes",
# CUDA's "Tried to allocate 2.00 GiB".
_ASKED = re.compile(r"tried to allocate (?:(\d+) bytes|([\d.]+ [KMGT]?i?B))", re.IGNORECASE)


def summary(record: Record) -> str:
    """How a finished setup's line ends: 'ok, 31.2 ms/step', 'OOM in the first step: could not
    allocate 0.27 GB (0.41 GB in use)', or the status and its error's first line, cut at a word."""
    if record.status == "ok":
        return f"ok, {record.step_ms:.1f} ms/step"
    if record.status != "oom":
        return f"{record.status.upper()}: {first_line(record.error, 160)}"
    error = record.error or ""
    asked = _ASKED.search(error)
    if asked:
        why = "could not allocate " + (gigabytes(int(asked[1]) / 1e9) if asked[1] else asked[2])
    elif "out-of-memory killer" in error:
        why = "killed by the kernel's out-of-memory killer"
    else:
        why = first_line(error, 120)
    used = f" ({gigabytes(record.oom_memory_gb)} in use)" if record.oom_memory_gb else ""
    return f"OOM in {PHASE_TEXT.get(record.phase, record.phase)}: {why}{used}"


class Display:
    """The runner's display: a live block on a terminal, plain lines elsewhere."""

    def __init__(self, stream=None, clock: Callable[[], float] = time.monotonic):
        self.stream = stream or sys.stderr
        self.clock = clock
        # (prefix, job) -> [label, phase text, start time]
        self.running: dict[tuple[str, Job], list] = {}
        # prefix -> its plan's progress (each SSH host runs a plan of its own)
        self.estimates: dict[str, Estimate] = collections.defaultdict(Estimate)
        self.lock = threading.Lock()
        self.print_lock = threading.Lock()
        # Last: rich's Live renders once as it is made, which reads the state above.
        self.live = None if not self.stream.isatty() else self._live()

    def _live(self):
        from rich.console import Console
        from rich.live import Live

        live = Live(console=Console(file=self.stream), get_renderable=self._render,
                    refresh_per_second=4, transient=True)
        live.start()
        return live

    def _render(self):
        from rich.text import Text

        now = self.clock()
        with self.lock:
            lines = [f"{label}: {phase} [{now - since:.0f} s]"
                     for label, phase, since in self.running.values()]
            for prefix, estimate in self.estimates.items():
                left = estimate.left_s(now)
                if estimate.total and left is not None:
                    lines.append(f"{prefix}{estimate.numbered}/{estimate.total} started, "
                                 f"{time_left(left)}")
        return Text("\n".join(lines))

    def _print(self, text: str) -> None:
        if self.live is not None:
            self.live.console.print(text, highlight=False, markup=False)
        else:
            with self.print_lock:       # whole lines, also from several hosts' threads
                self.stream.write(text + "\n")
                self.stream.flush()

    def note(self, text: str) -> None:
        self._print(f"stepbench: {text}")

    def line(self, text: str) -> None:
        """A whole line of the command's own (on a terminal, above the live block)."""
        self._print(text)

    # `prefix` names the host a line is about (HostView): several hosts run the same jobs at once.
    # `label`: what stands in brackets instead of the plan's number (a search's "probe 5").
    def plan(self, jobs: list[Job], slots: int = 1, prefix: str = "") -> None:
        """The runner's next processes (some of them may be in the results file already)."""
        with self.lock:
            self.estimates[prefix].add(jobs, slots)

    def skip(self, job: Job, record: Record, prefix: str = "", label: str | None = None) -> None:
        with self.lock:
            label = label or self.estimates[prefix].number(job)
        self._print(f"stepbench: {prefix}[{label}] {job_name(job)}: already in the results "
                    f"file ({record.status}), skipped")

    def start(self, job: Job, where: str | None = None, prefix: str = "",
              label: str | None = None) -> None:
        now = self.clock()
        with self.lock:
            if label is None:
                label = self.estimates[prefix].number(job)
                self.estimates[prefix].started(job, now)
            text = f"{prefix}[{label}] {job_name(job)}" + (f" on {where}" if where else "")
            self.running[prefix, job] = [text, None, now]
        self.message(job, {"event": "progress", "phase": "starting"}, prefix)

    def message(self, job: Job, message: dict, prefix: str = "") -> None:
        if message.get("event") != "progress":
            return
        with self.lock:
            entry = self.running.get((prefix, job))
            if entry is None:
                return
            phase = describe(message)
            changed, entry[1] = phase != entry[1], phase
        if changed and self.live is None:
            self._print(f"stepbench: {entry[0]}: {phase}")

    def finish(self, job: Job, record: Record, prefix: str = "", after: str | None = None) -> None:
        """The setup's one line: its status, its wall time and, unless `after` says what to end
        with instead, the time the run has left."""
        with self.lock:
            label = self.running.pop((prefix, job), [prefix + job_name(job)])[0]
            estimate = self.estimates.get(prefix)
            if after is None and estimate is not None:
                estimate.finished(job, record.wall_s)
                left = estimate.left_s(self.clock())
                after = time_left(left) if left is not None else ""
        self._print(f"stepbench: {label}: {summary(record)} ({record.wall_s or 0:.0f} s)"
                    + (f"; {after}" if after else ""))

    def forget(self, prefix: str) -> None:
        """Drop the running lines of one host (its setups were stopped, or it was lost)."""
        with self.lock:
            for key in [k for k in self.running if k[0] == prefix]:
                del self.running[key]
            self.estimates.pop(prefix, None)

    def close(self) -> None:
        if self.live is not None:
            self.live.stop()
            self.live = None


class HostView:
    """The display as one SSH host's runner sees it: every line names the host, and closing it
    leaves the shared display (and the other hosts' lines) running."""

    def __init__(self, display: Display, host: str):
        self.display, self.prefix = display, f"{host}: "

    def note(self, text: str) -> None:
        self.display.note(self.prefix + text)

    def line(self, text: str) -> None:
        self.display.line(text)

    def plan(self, jobs: list[Job], slots: int = 1) -> None:
        self.display.plan(jobs, slots, self.prefix)

    def skip(self, job: Job, record: Record, label: str | None = None) -> None:
        self.display.skip(job, record, self.prefix, label)

    def start(self, job: Job, where: str | None = None, label: str | None = None) -> None:
        self.display.start(job, where, self.prefix, label)

    def message(self, job: Job, message: dict) -> None:
        self.display.message(job, message, self.prefix)

    def finish(self, job: Job, record: Record, after: str | None = None) -> None:
        self.display.finish(job, record, self.prefix, after)

    def close(self) -> None:
        self.display.forget(self.prefix)


class SearchView:
    """The display as a search's runner calls see it. A search runs one setup per runner call
    (the runner would number each "[1/1]") and does not know how many it will run: it numbers
    its processes itself, by what they are ("probe 5", "final 2"; tune's by stage, "ladder 3"),
    within its `scope` ("search 2/3, "), each number given once (a final measured again with one
    more repeat is not "found in the results file" again). `budget_left` (tune): the seconds its budget has
    left, said at the end of each finished line."""

    def __init__(self, display, budget_left: Callable[[], float] | None = None):
        self.display = display
        self.budget_left = budget_left
        self.scope = ""                 # "search 2/3, ": which of a run's searches
        self.what = "probe"             # what the next processes are: probe, final, a tune stage
        self.counts: collections.Counter = collections.Counter()
        self.labels: dict[tuple, str] = {}

    def _label(self, job: Job) -> tuple[str, bool]:
        key = (job.setup, job.repeat)
        new = key not in self.labels
        if new:
            self.counts[self.scope, self.what] += 1
            self.labels[key] = f"{self.scope}{self.what} {self.counts[self.scope, self.what]}"
        return self.labels[key], new

    def note(self, text: str) -> None:
        self.display.note(text)

    def line(self, text: str) -> None:
        self.display.line(text)

    def plan(self, jobs: list[Job], slots: int = 1) -> None:
        """A search's total is not known in advance: no "[3/8]", no estimate."""

    def skip(self, job: Job, record: Record) -> None:
        label, new = self._label(job)
        if new:
            self.display.skip(job, record, label=label)

    def start(self, job: Job, where: str | None = None) -> None:
        self.display.start(job, where, label=self._label(job)[0])

    def message(self, job: Job, message: dict) -> None:
        self.display.message(job, message)

    def finish(self, job: Job, record: Record) -> None:
        after = ""
        if self.budget_left is not None:
            after = f"{duration(max(self.budget_left(), 0.0))} of the budget left"
        self.display.finish(job, record, after=after)

    def close(self) -> None:
        """The display is its owner's to close."""
