"""Where a setup's process spends its wall time: seconds per phase, in the order they ran.

The record's `phases` (docs/results-schema.md). The child measures its own phases with one
monotonic clock; "start" reaches back to the process's creation (the interpreter's start, the
import of stepbench, reading the job), and the parent adds "exit" (from the result message to
the process's end). Their sum is the setup's wall_s, up to the pipe's latency.
"""

from __future__ import annotations

import os
import time

# In the order a setup's process goes through them (the parent adds "exit").
PHASES = ("start", "imports", "device_init", "peak", "build", "first_step", "warmup", "timed",
          "after", "profile", "memory", "flops", "exit")


class Phases:
    """A lap clock writing {phase: seconds} into `into["phases"]`."""

    def __init__(self, into: dict):
        self.seconds = into.setdefault("phases", {})
        self.mark = time.perf_counter()
        self.seconds["start"] = round(max(_seconds_since_process_start(), 0.0), 3)

    def lap(self, name: str, now: float | None = None) -> None:
        """The time since the last lap belongs to phase `name` (up to `now`, a perf_counter
        reading the caller took for its own measurement, so that the two agree)."""
        now = time.perf_counter() if now is None else now
        self.seconds[name] = round(self.seconds.get(name, 0.0) + now - self.mark, 3)
        self.mark = now


def _seconds_since_process_start() -> float:
    """Linux: the kernel's uptime minus the process's start, both counted from boot in clock
    ticks (10 ms). psutil's create_time() adds the boot time, which it has to the second only."""
    try:
        with open("/proc/self/stat") as f:
            after_name = f.read().rsplit(")", 1)[1].split()
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return uptime - int(after_name[19]) / os.sysconf("SC_CLK_TCK")   # field 22: starttime
    except (OSError, ValueError, IndexError):
        import psutil

        return time.time() - psutil.Process().create_time()
