"""Whether the kernel's out-of-memory killer ended a setup's process, and how much memory a
setup's process can have here.

A process the kernel kills for memory gets SIGKILL and says nothing: the parent sees only the
signal. Where the kernel lets it, two things tell that signal apart from any other SIGKILL:
the kernel log's line naming the process ("Out of memory: Killed process 4242 (python)", from
/dev/kmsg, readable by root or where kernel.dmesg_restrict is 0), and the OOM-kill counters
that rose while it ran: its memory cgroup's (cgroup v2 memory.events, v1 memory.oom_control:
the victim's own cgroup counts the kill, whichever limit it hit) and the machine's
(/proc/vmstat). A `Watch` is opened before the process starts and asked after it died.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

# A kill's line in the kernel log (global and memory cgroup OOM alike).
KILLED = re.compile(r"Killed process (\d+) \(([^)]*)\)")


def _cgroup_folders() -> list[tuple[str, Path]]:
    """("v2" or "v1", folder) of this process's memory cgroups."""
    try:
        mounts = Path("/proc/self/mountinfo").read_text().splitlines()
        memberships = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return []
    found = []
    for line in memberships:
        _, controllers, path = line.split(":", 2)
        v2 = controllers == ""
        if not v2 and "memory" not in controllers.split(","):
            continue
        for mount in mounts:
            fields, _, fs = mount.partition(" - ")
            fields, fs = fields.split(), fs.split()
            if not fs or (v2 and fs[0] != "cgroup2") or \
                    (not v2 and (fs[0] != "cgroup" or "memory" not in fs[-1].split(","))):
                continue
            root, point = fields[3], fields[4]
            if not (path + "/").startswith(root.rstrip("/") + "/"):
                continue
            found.append(("v2" if v2 else "v1",
                          Path(point) / path[len(root.rstrip("/")):].lstrip("/")))
    return found


def _cgroup_counters() -> dict[str, Path]:
    """{name: file} of the OOM-kill counters of this process's memory cgroups."""
    found = {}
    for version, folder in _cgroup_folders():
        counter = folder / ("memory.events" if version == "v2" else "memory.oom_control")
        if counter.is_file():
            found[f"its memory cgroup's oom_kill ({counter})"] = counter
    return found


def available_bytes() -> int:
    """The memory a process started here can have: what the machine has available (psutil's
    estimate: free memory and the cache it can reclaim), and no more than the memory limit of
    this process's cgroup (v2 memory.max, v1 memory.limit_in_bytes) where one is set."""
    import psutil

    available = psutil.virtual_memory().available
    for version, folder in _cgroup_folders():
        try:
            text = (folder / ("memory.max" if version == "v2" else
                              "memory.limit_in_bytes")).read_text().strip()
        except OSError:
            continue
        if text.isdigit():
            available = min(available, int(text))
    return available


def _count(path: Path) -> int | None:
    try:
        for line in path.read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
    except (OSError, ValueError):
        pass
    return None


def counts() -> dict[str, int]:
    """Every OOM-kill counter readable here, by what it counts."""
    files = {**_cgroup_counters(), "the machine's oom_kill (/proc/vmstat)": Path("/proc/vmstat")}
    values = {name: _count(path) for name, path in files.items()}
    return {name: value for name, value in values.items() if value is not None}


class Watch:
    """Opened before a process starts; `verdict(pid)` after it died of SIGKILL says why it is
    taken for the OOM killer's victim, or None. The kernel log is read from where it ended when
    the watch began, so an older line naming a reused pid is never taken."""

    def __init__(self):
        self.before = counts()
        try:
            self.log = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
            os.lseek(self.log, 0, os.SEEK_END)
        except OSError:
            self.log = None

    def _new_lines(self) -> list[str]:
        lines = []
        while self.log is not None:
            try:
                record = os.read(self.log, 8192)
            except BlockingIOError:
                break
            except OSError:     # EPIPE: the ring buffer overran the records not read yet
                continue
            if not record:
                break
            # "priority,sequence,time,flags;message"
            lines.append(record.decode(errors="replace").split(";", 1)[-1].strip())
        return lines

    def verdict(self, pid: int) -> str | None:
        for line in self._new_lines():
            match = KILLED.search(line)
            if match and int(match.group(1)) == pid:
                return f"the kernel log says: {line[:match.end()]}"
        rose = [name for name, value in counts().items()
                if name in self.before and value > self.before[name]]
        return f"{rose[0]} rose while it ran" if rose else None

    def close(self) -> None:
        if self.log is not None:
            os.close(self.log)
            self.log = None
