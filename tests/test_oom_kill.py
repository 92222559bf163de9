"""A setup's process that the kernel's out-of-memory killer ends is recorded as `oom`.

For real, never by filling the machine: the process runs in a memory cgroup of its own, made
here, whose limit (1 GB) it outgrows in its first step, so that the kernel kills it there.
Skipped, with the reason, where no such cgroup can be made (cgroup v2 needs the memory
controller delegated to a cgroup without processes; v1 a writable memory hierarchy)."""

import os
import uuid
from pathlib import Path

import pytest

from stepbench.execute.local.process import LocalProcess
from stepbench.execute.runner import Runner
from stepbench.record import ResultsFile
from stepbench.setup import Setup

from says import names

pytestmark = pytest.mark.slow     # starts a setup's process

LIMIT_BYTES = 1_000_000_000


def _mounts() -> list[tuple[str, str, str, str]]:
    """(root, mount point, filesystem type, super options) of every cgroup mount."""
    out = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields, _, fs = line.partition(" - ")
        fields, fs = fields.split(), fs.split()
        if fs and fs[0] in ("cgroup", "cgroup2"):
            out.append((fields[3], fields[4], fs[0], fs[-1]))
    return out


def _own(version: str) -> Path | None:
    """The folder of this process's cgroup in the memory hierarchy of `version` (v1, v2)."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if (version == "v2") != (controllers == "") or \
                (version == "v1" and "memory" not in controllers.split(",")):
            continue
        for root, point, fs, options in _mounts():
            if (fs == "cgroup2") == (version == "v2") and \
                    (version == "v2" or "memory" in options.split(",")) and \
                    (path + "/").startswith(root.rstrip("/") + "/"):
                return Path(point) / path[len(root.rstrip("/")):].lstrip("/")
    return None


def make_memory_cgroup(limit: int) -> tuple[Path | None, list[str]]:
    """A new memory cgroup below this process's, capped at `limit` bytes; or None and why not."""
    reasons = []
    name = f"stepbench-test-{uuid.uuid4().hex[:8]}"
    v2 = _own("v2")
    if v2 is not None:
        if "memory" not in (v2 / "cgroup.controllers").read_text().split():
            reasons.append(f"cgroup v2 at {v2} has no memory controller")
        else:
            try:
                folder = v2 / name
                folder.mkdir()
                (folder / "memory.max").write_text(str(limit))
                (folder / "memory.swap.max").write_text("0")
                return folder, reasons
            except OSError as exc:
                reasons.append(f"cgroup v2 at {v2}: {exc.strerror}")
                _remove(v2 / name)
    v1 = _own("v1")
    if v1 is None:
        reasons.append("no cgroup v1 memory hierarchy")
        return None, reasons
    try:
        folder = v1 / name
        folder.mkdir()
        (folder / "memory.limit_in_bytes").write_text(str(limit))
        if (folder / "memory.memsw.limit_in_bytes").exists():
            (folder / "memory.memsw.limit_in_bytes").write_text(str(limit))
        return folder, reasons
    except OSError as exc:
        reasons.append(f"cgroup v1 at {v1}: {exc.strerror}")
        _remove(v1 / name)
        return None, reasons


def _remove(folder: Path) -> None:
    try:
        folder.rmdir()
    except OSError:
        pass


class InCgroup(LocalProcess):
    """A fresh setup's process that enters `folder` (its cgroup) before Python starts."""

    def __init__(self, folder: Path):
        super().__init__(start="fresh")
        self.procs = folder / "cgroup.procs"

    def command(self, job):
        return ["sh", "-c", f'echo $$ > "{self.procs}" && exec "$0" "$@"',
                *super().command(job)]


def test_a_process_the_kernel_kills_for_memory_is_oom(tmp_path):
    folder, reasons = make_memory_cgroup(LIMIT_BYTES)
    if folder is None:
        pytest.skip("no memory cgroup can be made here: " + "; ".join(reasons))
    # Eager attention's scores at batch 8 x 4096: 2 GB in fp32 for the softmax alone.
    setup = Setup(model="llama-tiny", mode="eager", attn="eager", batch=8, seq=4096,
                  device="cpu", warmup=0, steps=1)
    executor = InCgroup(folder)
    try:
        [record] = Runner(executor, ResultsFile(tmp_path / "r.jsonl"),
                          measure_peak=False).run([setup], timeout_s=300)
    finally:
        executor.close()
        _remove(folder)
    assert record.status == "oom", record.error
    assert names(record.error, "out-of-memory killer", "last phase"), record.error
    # Said from the kernel's log where it can be read, else from an OOM-kill counter.
    if os.access("/dev/kmsg", os.R_OK):
        assert names(record.error, "kernel log", "Killed process"), record.error
    else:
        assert "oom_kill" in record.error
