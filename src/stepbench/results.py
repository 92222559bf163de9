"""The results store: one JSON object per setup (per repeat) in a JSON Lines file.

Field meanings are in docs/results-schema.md. Records are appended, flushed and fsynced as each
setup ends, so a crash of the parent never loses a finished setup, and rerunning the same command
resumes from what is there. Reading is forgiving: a truncated or garbled line is reported with its
file and line number and skipped; the rest is kept.
"""

from __future__ import annotations

import json
import os
import platform
import socket
import warnings
from importlib import metadata
from pathlib import Path

from stepbench import __version__
from stepbench.errors import UserError

SCHEMA = 1
STATUSES = ("ok", "oom", "timeout", "crashed", "error", "unsupported")

# Every measured field with its value when nothing was measured; a record always has them all.
MEASURED_FIELDS = {
    "phase": "starting", "params": None, "first_step_s": None, "step_ms": None,
    "step_ms_median": None, "step_ms_min": None, "step_ms_max": None, "step_ms_std": None,
    "step_times_ms": [], "timed_wall_s": None, "tokens_per_s": None, "peak_memory_gb": None,
    "peak_reserved_gb": None, "oom_memory_gb": None, "loss_first": None, "loss_last": None,
    "losses": [], "flops_per_token": None, "flops_per_token_causal": None,
    "flops_convention": None, "flop_counter_per_step": None, "achieved_tflops": None,
    "peak_tflops_datasheet": None, "peak_tflops_measured": None, "mfu_datasheet": None,
    "mfu_measured": None, "compile": None, "telemetry": None, "energy": None, "noise_flags": [],
}


class ResultsFile:
    """Append-only writer for one results file; checks up front that it can be written."""

    def __init__(self, path: Path):
        self.path = Path(path)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path, "a"):
                pass
        except OSError as exc:
            raise UserError(f"cannot write results to {self.path} ({exc.strerror}); pass a writable "
                            "--out path") from None

    def append(self, record: dict) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")
            f.flush()
            os.fsync(f.fileno())


def read_records(path: Path, *, warn=None) -> list[dict]:
    """Records of one results file; bad lines and unknown schema versions are warned about and skipped."""
    warn = warn or (lambda message: warnings.warn(message, stacklevel=2))
    path = Path(path)
    if not path.exists():
        return []
    records = []
    # errors="replace": one garbled byte spoils its line (skipped below), not the whole file.
    with open(path, encoding="utf-8", errors="replace") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                warn(f"{path}:{number}: skipped a line that is not valid JSON ({exc.msg}); "
                     "it may be truncated")
                continue
            if not isinstance(record, dict) or "setup" not in record:
                warn(f"{path}:{number}: skipped a line that is not a stepbench record")
                continue
            if record.get("schema") != SCHEMA:
                warn(f"{path}:{number}: skipped a record of schema {record.get('schema')!r}; this "
                     f"stepbench reads schema {SCHEMA} (upgrade stepbench to read it)")
                continue
            records.append(record)
    return records


def record_key(setup: dict, repeat: int, gpu: str) -> str:
    """What makes a record 'the same setup' for resuming: the whole setup, the repeat index and
    the GPU (a results file shared between machines resumes each machine's own setups)."""
    return json.dumps({"setup": setup, "repeat": repeat, "gpu": gpu}, sort_keys=True)


def software_info() -> dict:
    """Versions from package metadata: the parent never imports torch for this."""
    def version(name: str) -> str | None:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return None

    return {"python": platform.python_version(), "torch": version("torch"),
            "transformers": version("transformers"), "stepbench": __version__,
            "cuda": None}


def machine_info(device: str) -> dict:
    """The machine as the records store it; the GPU from NVML so the parent makes no CUDA context."""
    info = {"gpu": "cpu", "gpu_count": 0, "gpu_memory_gb": None, "driver": None,
            "hostname": socket.gethostname(), "cpu": _cpu_name(), "cpu_count": os.cpu_count()}
    if device == "cuda":
        from stepbench import telemetry

        gpu = telemetry.machine_gpu_info()
        if gpu:
            info.update(gpu)
    return info


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
