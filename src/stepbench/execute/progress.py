"""Live progress on stderr while a plan runs: which setups are running, in which phase, how long.

On a terminal a rich live block shows one line per running setup, redrawn in place; elsewhere
(CI logs, pipes, the GPU machine's captured output) one plain line is printed per phase change,
so logs stay readable. stdout is never touched: it carries the table or the JSON. The runner calls
it from one thread per slot, so every method takes the lock.
"""

from __future__ import annotations

import sys
import threading
import time

from stepbench.errors import first_line
from stepbench.execute.executor import Job
from stepbench.record import Record

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
    return (f"{s.name} batch {s.batch} seq {s.seq}"
            + (f" {s.parallel_label}" if s.distributed else "")
            + (f" (repeat {job.repeat + 1})" if job.repeat else ""))


class Display:
    """The runner's display: a live block on a terminal, plain lines elsewhere."""

    def __init__(self, stream=None):
        self.stream = stream or sys.stderr
        # (prefix, job) -> [label, phase text, start time]
        self.running: dict[tuple[str, Job], list] = {}
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

        now = time.monotonic()
        with self.lock:
            lines = [f"{label}: {phase} [{now - since:.0f} s]"
                     for label, phase, since in self.running.values()]
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
    def skip(self, job: Job, record: Record, prefix: str = "") -> None:
        self._print(f"stepbench: {prefix}{job_name(job)}: already in the results file "
                    f"({record.status}), skipped")

    def start(self, job: Job, index: int, total: int, where: str | None = None,
              prefix: str = "") -> None:
        label = f"{prefix}[{index}/{total}] {job_name(job)}" + (f" on {where}" if where else "")
        with self.lock:
            self.running[prefix, job] = [label, None, time.monotonic()]
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

    def finish(self, job: Job, record: Record, prefix: str = "") -> None:
        with self.lock:
            label = self.running.pop((prefix, job), [prefix + job_name(job)])[0]
        if record.status == "ok":
            summary = f"ok, {record.step_ms:.1f} ms/step"
        else:
            summary = f"{record.status.upper()}: {first_line(record.error, 160)}"
        self._print(f"stepbench: {label}: {summary} ({record.wall_s:.0f} s)")

    def forget(self, prefix: str) -> None:
        """Drop the running lines of one host (its setups were stopped, or it was lost)."""
        with self.lock:
            for key in [k for k in self.running if k[0] == prefix]:
                del self.running[key]

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

    def skip(self, job: Job, record: Record) -> None:
        self.display.skip(job, record, self.prefix)

    def start(self, job: Job, index: int, total: int, where: str | None = None) -> None:
        self.display.start(job, index, total, where, self.prefix)

    def message(self, job: Job, message: dict) -> None:
        self.display.message(job, message, self.prefix)

    def finish(self, job: Job, record: Record) -> None:
        self.display.finish(job, record, self.prefix)

    def close(self) -> None:
        self.display.forget(self.prefix)
