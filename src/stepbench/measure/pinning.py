"""`--pin-cpus auto`: bind a setup's process to the CPU cores local to its GPU (its NUMA node),
as torchrun's `--numa-binding` does, so that the thread that launches the kernels runs on a core
beside the GPU's PCIe root and memory. The record's `cpu_pinning` says which cores, or why not.

The GPU's local cores come from sysfs (/sys/bus/pci/devices/<bus id>/local_cpulist, the kernel's
own answer, read without NVML or its thread), else NVML (nvmlDeviceGetCpuAffinity). Every thread
of the process is bound (Linux binds per thread; threads started later inherit the binding).
On a host of one NUMA node the GPU's local cores are all of them: nothing changes, and the
record says so.
"""

from __future__ import annotations

import os
from pathlib import Path

SYS = Path("/sys")


def parse_cpulist(text: str) -> set[int]:
    """The cores of a kernel cpulist ("0-15,32-47", "3"); an empty text is none."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        first, _, last = part.partition("-")
        cpus.update(range(int(first), int(last or first) + 1))
    return cpus


def format_cpulist(cpus) -> str:
    """The cpulist of `cpus`, runs joined ("0-15,32-47")."""
    runs: list[list[int]] = []
    for cpu in sorted(cpus):
        if runs and cpu == runs[-1][1] + 1:
            runs[-1][1] = cpu
        else:
            runs.append([cpu, cpu])
    return ",".join(f"{a}-{b}" if a != b else str(a) for a, b in runs)


def numa_nodes(sys_root: Path = SYS) -> int | None:
    """How many NUMA nodes the kernel lists, or None where it lists none."""
    nodes = list((sys_root / "devices/system/node").glob("node[0-9]*"))
    return len(nodes) or None


def local_cpus(cuda_index: int, sys_root: Path = SYS) -> tuple[set[int], str] | None:
    """The cores local to torch's cuda:`cuda_index` and where that came from ("sysfs",
    "nvml"), or None when neither tells."""
    bus = pci_bus_id(cuda_index)
    if bus is not None:
        path = sys_root / "bus/pci/devices" / bus / "local_cpulist"
        try:
            cpus = parse_cpulist(path.read_text())
        except (OSError, ValueError):
            cpus = set()
        if cpus:
            return cpus, "sysfs"
    cpus = _nvml_affinity(cuda_index)
    return (cpus, "nvml") if cpus else None


def pci_bus_id(cuda_index: int) -> str | None:
    """cuda:`cuda_index`'s PCI address as sysfs names it ("0000:1b:00.0"), from torch's device
    properties; None where torch does not give it."""
    try:
        import torch

        props = torch.cuda.get_device_properties(cuda_index)
        domain, bus, device = (getattr(props, f"pci_{n}_id") for n in ("domain", "bus", "device"))
    except Exception:  # noqa: BLE001 - an older torch, no CUDA: NVML may still tell
        return None
    return f"{domain:04x}:{bus:02x}:{device:02x}.0"


def _nvml_affinity(cuda_index: int) -> set[int]:
    """The cores NVML gives for the GPU (an affinity mask in 64-bit words), or none."""
    from stepbench.measure import telemetry

    handle = telemetry._handle(cuda_index)
    words = ((os.cpu_count() or 1) + 63) // 64
    mask = telemetry._call("nvmlDeviceGetCpuAffinity", handle, words) if handle else None
    if mask is None:
        return set()
    return {w * 64 + b for w, word in enumerate(mask) for b in range(64) if int(word) >> b & 1}


def pin(mode: str, device: str, cuda_index: int = 0, sys_root: Path = SYS) -> dict:
    """Apply `--pin-cpus` (`auto` or `off`) to this process; the record's `cpu_pinning`:
    `mode`, `cpus` (the cores it may run on after this), `pinned` (whether it was bound to its
    GPU's local cores), `source`, `numa_nodes`, and `why` where it was not bound."""
    allowed = os.sched_getaffinity(0)
    out = {"mode": mode, "cpus": format_cpulist(allowed), "pinned": False,
           "numa_nodes": numa_nodes(sys_root)}
    if mode == "off":
        return out
    if device != "cuda":
        return {**out, "why": "a CPU setup has no GPU to be near"}
    found = local_cpus(cuda_index, sys_root)
    if found is None:
        return {**out, "why": "neither sysfs nor NVML named the GPU's local cores"}
    cpus, source = found
    chosen = cpus & allowed
    if not chosen:
        return {**out, "source": source,
                "why": f"none of the GPU's local cores ({format_cpulist(cpus)}) is allowed to "
                       "this process"}
    bind(chosen)
    note = {} if chosen != allowed else {"why": "the GPU's local cores are all the process "
                                                "could run on: nothing changed"}
    return {**out, "cpus": format_cpulist(chosen), "pinned": True, "source": source, **note}


def bind(cpus: set[int]) -> None:
    """Bind every thread of this process to `cpus` (Linux binds per thread)."""
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), cpus)
        except (ProcessLookupError, PermissionError):
            pass   # a thread that ended meanwhile
    os.sched_setaffinity(0, cpus)
