"""Run a plan of setups, each in a fresh child process, and keep every outcome.

For each setup the parent writes the Setup to a file, launches `python -m stepbench.worker` in a
new process group, waits with a deadline (waking a few times a second to show the child's phase),
kills the whole group on timeout, and decides the status from the child's result file, its exit
code and the clock. The record is appended to the results file before the next setup starts.

How a child is launched is one replaceable piece (Launcher): a torchrun launcher for multi-GPU
setups, or an SSH one for remote machines, only has to build another command line.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from stepbench.results import (MEASURED_FIELDS, SCHEMA, ResultsFile, machine_info, read_records,
                               record_key, software_info)
from stepbench.setups import Setup

STDERR_TAIL_CHARS = 2000
POLL_S = 0.25           # how often the parent wakes to refresh the display while it waits
KILL_GRACE_S = 5.0      # SIGTERM, then SIGKILL after this long


class Launcher:
    """Builds the child's command line and environment. Subclass to launch elsewhere."""

    def command(self, setup: Setup, files: "ChildFiles") -> list[str]:
        return [sys.executable, "-m", "stepbench.worker", str(files.setup), str(files.result),
                str(files.progress)]

    def environment(self, setup: Setup, cache_dir: Path | None) -> dict[str, str]:
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        src = str(Path(__file__).resolve().parent.parent)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
        if cache_dir is not None:
            env["TORCHINDUCTOR_CACHE_DIR"] = str(cache_dir)
            # Triton kernels cache beside inductor's, so "cold" really is cold on a GPU.
            env["TRITON_CACHE_DIR"] = str(cache_dir / "triton")
        return env


@dataclass
class ChildFiles:
    """The files one child reads and writes, in a private folder."""

    folder: Path
    setup: Path = field(init=False)
    result: Path = field(init=False)
    progress: Path = field(init=False)
    stderr: Path = field(init=False)

    def __post_init__(self):
        self.folder.mkdir(parents=True, exist_ok=True)
        self.setup = self.folder / "setup.json"
        self.result = self.folder / "result.json"
        self.progress = self.folder / "progress.json"
        self.stderr = self.folder / "stderr.log"


@dataclass
class Outcome:
    """What the parent saw of one child."""

    result: dict | None
    returncode: int | None
    timed_out: bool
    stderr_tail: str
    last_progress: dict
    wall_s: float


class NullDisplay:
    """The display interface the runner calls; this one shows nothing (used by tests and --quiet)."""

    def skip(self, setup: Setup, repeat: int, record: dict) -> None: ...
    def start(self, index: int, total: int, setup: Setup, repeat: int) -> None: ...
    def progress(self, progress: dict, elapsed_s: float) -> None: ...
    def finish(self, record: dict) -> None: ...
    def close(self) -> None: ...


def run_plan(plan: list[Setup], out: Path, *, repeats: int = 1, timeout_s: float = 1200,
             compile_cache: Path | None = None, display=None, launcher: Launcher | None = None,
             run_id: str | None = None, peak_tflops: float | None = None) -> list[dict]:
    """Run every setup `repeats` times, interleaved (A B C A B C), appending each record to `out`.

    Setups that already have a record in `out` are skipped (resume). Returns the records of this
    plan, old and new, in plan order. `peak_tflops` (the device's measured matmul rate, see
    measure_peak_tflops) gives each record its mfu_measured.
    """
    display = display or NullDisplay()
    launcher = launcher or Launcher()
    store = ResultsFile(out)
    run_id = run_id or new_run_id()
    machine = machine_info(plan[0].device) if plan else {}
    done = {record_key(r["setup"], r.get("repeat", 0), r["machine"].get("gpu")): r
            for r in read_records(out)}
    workdir = Path(tempfile.mkdtemp(prefix="stepbench-"))
    todo = [(repeat, setup) for repeat in range(repeats) for setup in plan]
    records = []
    try:
        for index, (repeat, setup) in enumerate(todo, 1):
            key = record_key(setup.to_dict(), repeat, machine.get("gpu"))
            if key in done:
                display.skip(setup, repeat, done[key])
                records.append(done[key])
                continue
            display.start(index, len(todo), setup, repeat)
            cache_dir, cache_label = compile_cache_for(setup, workdir, compile_cache)
            files = ChildFiles(workdir / f"child-{index}")
            started_at = now_iso()
            outcome = run_child(setup, files, launcher, cache_dir, timeout_s, display)
            record = build_record(setup, repeat, outcome, run_id=run_id, machine=machine,
                                  started_at=started_at, timeout_s=timeout_s,
                                  cache_label=cache_label, peak_tflops=peak_tflops)
            store.append(record)
            records.append(record)
            display.finish(record)
    finally:
        display.close()
        shutil.rmtree(workdir, ignore_errors=True)
    return records


def measure_peak_tflops(dtype: str, timeout_s: float = 300) -> float | None:
    """The GPU's dense matmul rate in TFLOP/s, measured in a child (`stepbench peak`), or None.

    A child, like every setup: the parent never holds a CUDA context that would take memory
    from the setups.
    """
    command = [sys.executable, "-m", "stepbench", "peak", "--device", "cuda", "--dtype", dtype,
               "--format", "json"]
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s,
                              env=Launcher().environment(None, None))
        return float(json.loads(proc.stdout)["measured_tflops"])
    except (subprocess.TimeoutExpired, ValueError, KeyError, TypeError):
        return None


def compile_cache_for(setup: Setup, workdir: Path, shared: Path | None) -> tuple[Path | None, str | None]:
    """The inductor cache a child uses, and whether its compile starts cold.

    By default each compiled setup gets its own fresh cache folder: the first process compiles
    cold (as the post measured it) and later repeats of the same setup find it warm. A user-given
    folder is shared by every setup and kept.
    """
    if setup.mode != "compile":
        return None, None
    if shared is not None:
        shared.mkdir(parents=True, exist_ok=True)
        return shared, "shared"
    name = json.dumps(setup.to_dict(), sort_keys=True)
    folder = workdir / "inductor" / hashlib.sha1(name.encode()).hexdigest()[:12]
    label = "warm" if folder.exists() and any(folder.iterdir()) else "cold"
    folder.mkdir(parents=True, exist_ok=True)
    return folder, label


def run_child(setup: Setup, files: ChildFiles, launcher: Launcher, cache_dir: Path | None,
              timeout_s: float, display) -> Outcome:
    files.setup.write_text(json.dumps(setup.to_dict()))
    start = time.monotonic()
    with open(files.stderr, "wb") as stderr:
        # A new session puts the child and everything it starts (inductor's compile workers) in
        # one process group that we can kill whole; it also keeps Ctrl-C away from the child.
        proc = subprocess.Popen(launcher.command(setup, files), stdin=subprocess.DEVNULL,
                                stdout=stderr, stderr=stderr,
                                env=launcher.environment(setup, cache_dir), start_new_session=True)
        try:
            timed_out = wait_with_deadline(proc, start + timeout_s, files, display, start)
        except BaseException:
            kill_group(proc)
            raise
    return Outcome(result=read_json(files.result), returncode=proc.returncode,
                   timed_out=timed_out, stderr_tail=tail(files.stderr),
                   last_progress=read_json(files.progress) or {}, wall_s=time.monotonic() - start)


def wait_with_deadline(proc: subprocess.Popen, deadline: float, files: ChildFiles, display,
                       start: float) -> bool:
    """Wait for the child; True if the deadline passed and the group was killed."""
    while True:
        try:
            proc.wait(timeout=max(0.0, min(POLL_S, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            pass
        else:
            kill_group(proc)
            return False
        display.progress(read_json(files.progress) or {}, time.monotonic() - start)
        if time.monotonic() >= deadline:
            kill_group(proc)
            return True


def kill_group(proc: subprocess.Popen) -> None:
    """End the child's whole process group: SIGTERM, then SIGKILL after a grace period.

    Also called after a normal exit, to end compile workers the child may have left behind.
    """
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            break
        try:
            proc.wait(timeout=KILL_GRACE_S)  # returns at once when the leader is already gone
        except subprocess.TimeoutExpired:
            pass
    proc.wait()


def build_record(setup: Setup, repeat: int, outcome: Outcome, *, run_id: str, machine: dict,
                 started_at: str, timeout_s: float, cache_label: str | None = None,
                 peak_tflops: float | None = None) -> dict:
    """The results record: setup, status, everything the child measured, machine and software.

    `cache_label` says how the inductor cache started (compile_cache_for); `peak_tflops`, the
    matmul rate measured once per run, gives the record its mfu_measured.
    """
    measured = copy.deepcopy(MEASURED_FIELDS)  # its lists must not be shared between records
    measured["phase"] = outcome.last_progress.get("phase", "starting")
    child = outcome.result or {}
    device_name = child.pop("device_name", None)
    cuda_version = child.pop("cuda_version", None)
    measured.update({k: v for k, v in child.items() if k not in ("status", "error")})
    status, error = classify(outcome, measured["phase"], timeout_s)
    machine = dict(machine)
    if device_name and machine.get("gpu") in (None, "cpu") and setup.device == "cuda":
        machine["gpu"] = device_name
    if measured["compile"] is not None:
        measured["compile"]["cache"] = cache_label
    if peak_tflops:
        from stepbench import flops  # imports torch; the parent needs it only here

        measured["peak_tflops_measured"] = peak_tflops
        measured["mfu_measured"] = flops.mfu(measured["achieved_tflops"], peak_tflops)
    software = software_info()
    software["cuda"] = cuda_version
    return {"schema": SCHEMA, "run_id": run_id, "repeat": repeat, "setup": setup.to_dict(),
            "status": status, "error": error, **measured, "started_at": started_at,
            "finished_at": now_iso(), "wall_s": round(outcome.wall_s, 3), "machine": machine,
            "software": software}


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
    return "crashed", f"{how} (last phase: {phase}); stderr ends with:\n{outcome.stderr_tail}"


def read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def tail(path: Path, chars: int = STDERR_TAIL_CHARS) -> str:
    try:
        data = path.read_bytes()[-chars:]
    except OSError:
        return ""
    return data.decode("utf-8", "replace").strip()


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def new_run_id() -> str:
    return datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ") + "-" + secrets.token_hex(3)
