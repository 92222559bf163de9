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
        from stepbench.measure.telemetry import gpu_name as nvml_name

        _NAMES[index] = name_gpu(index, nvml_name, sys.modules.get("torch"))
    return _NAMES[index]


def name_gpu(index: int, nvml_name, torch, run=subprocess.run) -> str | None:
    """CUDA device `index`'s name by the one route: NVML (`nvml_name(index)`), else torch: in
    this process where `torch` (the module, None when not imported) holds a CUDA context, else
    in a short-lived process (`run`, subprocess.run's signature)."""
    name = nvml_name(index)
    if name:
        return name
    if torch is not None and torch.cuda.is_initialized():
        return torch.cuda.get_device_name(index)
    try:
        proc = run([sys.executable, "-c", _PROBE, str(index)], capture_output=True, text=True,
                   timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return (proc.stdout.strip() or None) if proc.returncode == 0 else None


def resolve_device(requested: str) -> str:
    """'auto' picks CUDA when torch sees a GPU; asking for CUDA without one is a user error.

    Answered without importing torch where it can be (the parent's start-up: about 3 s on a GPU
    host, paid by every command): see cuda_available.
    """
    from stepbench.errors import UserError

    if requested == "cpu":
        return "cpu"
    available = cuda_available()
    if requested == "cuda" and not available:
        raise UserError("--device cuda was asked for, but torch sees no CUDA GPU here; use "
                        "--device cpu (or install a CUDA build of torch)")
    if requested == "auto":
        return "cuda" if available else "cpu"
    return requested


def cuda_available() -> bool:
    """torch.cuda.is_available(), known without importing torch when it can be: a torch built
    without CUDA (its version.py says cuda = None) has none; a CUDA build with NVML working and
    CUDA_VISIBLE_DEVICES unset sees the GPUs NVML counts. Anything else (no NVML, a device list in
    CUDA_VISIBLE_DEVICES, a version.py it cannot read) asks torch itself."""
    if "torch" not in sys.modules:
        built_with = _torch_cuda_version()
        if built_with is None:
            return False
        if built_with and "CUDA_VISIBLE_DEVICES" not in os.environ:
            from stepbench.measure import telemetry

            count = telemetry.gpu_count()
            if count is not None:
                return count > 0
    import torch

    return torch.cuda.is_available()


def _torch_cuda_version() -> str | None | bool:
    """The CUDA version torch was built with, read from torch/version.py without importing torch:
    None for a CPU build, False when it cannot be told (a ROCm build's GPUs are torch.cuda too)."""
    import importlib.util
    import re

    try:
        spec = importlib.util.find_spec("torch")
        text = open(os.path.join(os.path.dirname(spec.origin), "version.py")).read()
    except (ImportError, AttributeError, TypeError, OSError):
        return False

    def field(name: str) -> str | None | bool:
        match = re.search(rf"^{name}\s*(?::[^=]*)?=\s*(None|'([^']*)'|\"([^\"]*)\")\s*$", text, re.M)
        if match is None:
            return False
        return None if match.group(1) == "None" else (match.group(2) or match.group(3) or False)

    cuda, hip = field("cuda"), field("hip")
    return cuda if hip is None else False


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
