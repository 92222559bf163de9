"""The machine and software a setup ran on, taken where it runs (as pytest-benchmark does).

`gpu_name` is the one source of a GPU's name: the parent asks it for the resume key before a
setup starts, the setup's process for its record, and both get the same answer by the same
route (NVML first, then torch), so a rerun never measures a finished setup again because the two
named the GPU differently.
"""

from __future__ import annotations

import os
import platform
import socket
import subprocess
import sys
from importlib import metadata

from stepbench import __version__

# The parent must not hold a CUDA context (it would take GPU memory from the setups), so when NVML
# cannot name the GPU it asks torch in a short-lived process instead.
_PROBE = "import torch, sys; sys.stdout.write(torch.cuda.get_device_name(int(sys.argv[1])))"
_NAMES: dict[int, str | None] = {}


def gpu_name(device: str, index: int = 0) -> str | None:
    """'NVIDIA H200' (the driver's name for CUDA device `index`), 'cpu' for the CPU, or None when
    no route can tell."""
    if device == "cpu":
        return "cpu"
    if index not in _NAMES:
        from stepbench.measure import telemetry

        _NAMES[index] = telemetry.gpu_name(index) or _torch_gpu_name(index)
    return _NAMES[index]


def _torch_gpu_name(index: int) -> str | None:
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return torch.cuda.get_device_name(index)
    try:
        proc = subprocess.run([sys.executable, "-c", _PROBE, str(index)], capture_output=True,
                              text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return (proc.stdout.strip() or None) if proc.returncode == 0 else None


def resolve_device(requested: str) -> str:
    """'auto' picks CUDA when torch sees a GPU; asking for CUDA without one is a user error."""
    import torch

    from stepbench.errors import UserError

    available = torch.cuda.is_available()
    if requested == "cuda" and not available:
        raise UserError("--device cuda was asked for, but torch sees no CUDA GPU here; use "
                        "--device cpu (or install a CUDA build of torch)")
    if requested == "auto":
        return "cuda" if available else "cpu"
    return requested


def machine_info(device: str, index: int = 0) -> dict:
    """The record's `machine` object for a setup on `device` (CUDA device `index`)."""
    info = {"gpu": gpu_name(device, index) or "unknown GPU", "gpu_count": 0, "gpu_memory_gb": None,
            "driver": None, "hostname": socket.gethostname(), "cpu": cpu_name(),
            "cpu_count": os.cpu_count()}
    if device == "cuda":
        from stepbench.measure import telemetry

        info.update(telemetry.gpu_facts(index))
    return info


def software_info() -> dict:
    """Versions of what this process runs: the installed packages' versions (as pip names them),
    and the CUDA version torch was built with."""
    import torch

    def version(name: str) -> str | None:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return None

    return {"python": platform.python_version(), "torch": version("torch"),
            "transformers": version("transformers"), "stepbench": __version__,
            "cuda": torch.version.cuda}


def cpu_name() -> str:
    """The CPU's model name. psutil does not expose it, so it is read from /proc/cpuinfo on Linux."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
