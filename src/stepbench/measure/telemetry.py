"""GPU telemetry from NVML: clocks, temperature, power, throttling, energy, other processes;
and on a CPU, the machine's load and the CPU time other processes took.

A step time is only worth comparing when the GPU ran the same way for both setups. Two snapshots,
right before and right after the timed window, show whether it did: a clock that dropped, a
thermal or power throttle, or another process on the GPU are reasons not to trust a row as is
(`noise_flags`), and the energy counter turns the window into joules per step and tokens per kWh.

On a CPU the same two moments bracket the window with the machine's load average and CPU times
(`cpu_snapshot`): the CPU seconds that the CPUs this process may run on spent busy, minus its
own, are what other processes took; what they took beyond the CPUs the setup's threads left free
came out of the steps' time ("busy_cpu" in `cpu_noise_flags`).

NVML (`pynvml`, from the nvidia-ml-py package) is read without creating a CUDA context, so the
runner's parent process can name the GPU (`gpu_name`, for resuming) while the children own it.
Every NVML call is guarded: on a machine without NVML (a CPU box, a container without the
driver's library) every function returns None or an empty list and never raises, and a single
field a GPU does not support (energy on old cards, power on some boards) is None on its own.
"""

from __future__ import annotations

import os
from typing import Any

# Clock-event ("throttle") reason bits, as nvml.h defines them. Both pynvml generations
# (nvmlClocksThrottleReason* and the newer nvmlClocksEventReason*) use these same values; the
# names here follow NVML's, in snake case.
THROTTLE_REASONS: dict[int, str] = {
    0x0001: "gpu_idle",
    0x0002: "applications_clocks_setting",
    0x0004: "sw_power_cap",
    0x0008: "hw_slowdown",
    0x0010: "sync_boost",
    0x0020: "sw_thermal_slowdown",
    0x0040: "hw_thermal_slowdown",
    0x0080: "hw_power_brake_slowdown",
    0x0100: "display_clock_setting",
}

# Reasons that do not make a measurement suspect, so they never raise the "throttled" flag (they
# are still recorded in throttle_reasons):
#   gpu_idle: set whenever the GPU has no work, e.g. in the instant after the window's final
#     synchronize, when the end snapshot is read;
#   sw_power_cap: the GPU is at its power limit. That is the normal state of a loaded data-center
#     GPU, not a disturbance: back-to-back matmuls reach the cap within a fraction of a second and
#     run on with this bit set (docs/architecture.md, "Measured reasons"), and the end snapshot of a
#     window of such work still shows it. It is the same for every repeat of a setup, so flagging it
#     would flag nearly every GPU row and the flag would mean nothing. If the cap costs more over
#     the window, the SM clock falls and clock_drop says so;
#   applications_clocks_setting: the clocks are capped by an administrator's fixed application
#     clocks (nvidia-smi -ac): a property of the machine, constant over the whole run;
#   display_clock_setting: the display clock, irrelevant to compute.
# Every other reason (thermal or hardware slowdown, power brake, sync boost, and any bit this table
# does not know) means heat, hardware or another GPU held the clocks down, which depends on what
# ran before and so makes the row hard to reproduce.
BENIGN_THROTTLE_REASONS = frozenset({"gpu_idle", "sw_power_cap", "applications_clocks_setting",
                                     "display_clock_setting"})

# "clock_drop": SM clock at the end of the window more than this fraction below the start.
CLOCK_DROP_FRACTION = 0.10

_NVML_STATE: dict[str, Any] = {}


def _nvml():
    """The initialised pynvml module, or None when NVML cannot be used here (cached per process).

    STEPBENCH_NVML=0 turns NVML off, for a driver whose NVML hangs or misreports (and to test the
    routes that do without it).
    """
    if "module" not in _NVML_STATE:
        module = None
        try:
            if os.environ.get("STEPBENCH_NVML") == "0":
                raise RuntimeError("NVML turned off by STEPBENCH_NVML=0")
            import pynvml

            pynvml.nvmlInit()
            module = pynvml
        except Exception:  # noqa: BLE001 - NVMLError_LibraryNotFound, ImportError, driver errors
            module = None
        _NVML_STATE["module"] = module
    return _NVML_STATE["module"]


def _call(function_name: str, *args, nvml=None):
    """Call pynvml.<function_name>(*args); None when NVML, the function or the field is missing.

    Telemetry must never fail a benchmark, so any exception becomes None: NVMLError_NotSupported
    for a field this GPU lacks, AttributeError for a function an older pynvml does not have.
    """
    nvml = nvml or _nvml()
    if nvml is None:
        return None
    function = getattr(nvml, function_name, None)
    if function is None:
        return None
    try:
        return function(*args)
    except Exception:  # noqa: BLE001 - see docstring
        return None


def _text(value) -> str | None:
    # Older pynvml returns bytes for names, UUIDs and versions.
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return value


# ----------------------------------------------------------------------------------------------
# Which NVML device is torch's cuda:N
# ----------------------------------------------------------------------------------------------

def _visible_nvml_indices(nvml) -> list[int] | None:
    """NVML indices of the devices CUDA can see, in CUDA's order, from CUDA_VISIBLE_DEVICES.

    Unset: every device. Entries are indices or UUID prefixes ("GPU-8f3c..."); as CUDA does, the
    list ends at the first entry that names no device. MIG entries cannot be mapped: None.
    """
    count = _call("nvmlDeviceGetCount", nvml=nvml)
    if count is None:
        return None
    spec = os.environ.get("CUDA_VISIBLE_DEVICES")
    if spec is None:
        return list(range(count))
    uuids = {i: _uuid(i, nvml) or "" for i in range(count)} if "GPU-" in spec else {}
    visible: list[int] = []
    for entry in (e.strip() for e in spec.split(",")):
        if entry.startswith("MIG-"):
            return None
        if entry.isdigit() and int(entry) < count:
            visible.append(int(entry))
        elif entry.startswith("GPU-"):
            matches = [i for i, uuid in uuids.items() if uuid.startswith(entry)]
            if len(matches) != 1:
                break
            visible.append(matches[0])
        else:
            break
    return visible


def gpu_count() -> int | None:
    """GPUs NVML counts on this host (no CUDA context), or None without NVML."""
    nvml = _nvml()
    return _call("nvmlDeviceGetCount", nvml=nvml) if nvml is not None else None


def _uuid(nvml_index_: int, nvml) -> str | None:
    handle = _call("nvmlDeviceGetHandleByIndex", nvml_index_, nvml=nvml)
    return _text(_call("nvmlDeviceGetUUID", handle, nvml=nvml)) if handle is not None else None


def nvml_index(cuda_index: int = 0) -> int | None:
    """NVML's index of torch's cuda:`cuda_index`, or None when it cannot be told.

    NVML numbers every GPU of the host; CUDA numbers only those in CUDA_VISIBLE_DEVICES. When this
    process already has a CUDA context the device's UUID decides (exact); otherwise
    CUDA_VISIBLE_DEVICES does, which assumes CUDA's default order matches NVML's (true unless
    CUDA_DEVICE_ORDER=FASTEST_FIRST reorders mixed GPUs). Never creates a CUDA context.
    """
    nvml = _nvml()
    if nvml is None:
        return None
    uuid = _torch_uuid(cuda_index)
    cache = _NVML_STATE.setdefault("index", {})
    key = (cuda_index, uuid)     # a mapping found before the CUDA context existed is redone after
    if key not in cache:
        cache[key] = _find_nvml_index(cuda_index, uuid, nvml)
    return cache[key]


def _find_nvml_index(cuda_index: int, uuid: str | None, nvml) -> int | None:
    if uuid is not None:
        for i in range(_call("nvmlDeviceGetCount", nvml=nvml) or 0):
            nvml_uuid = _uuid(i, nvml)
            if nvml_uuid and nvml_uuid.removeprefix("GPU-") == uuid.removeprefix("GPU-"):
                return i
    visible = _visible_nvml_indices(nvml)
    if visible is None or not 0 <= cuda_index < len(visible):
        return None
    return visible[cuda_index]


def _torch_uuid(cuda_index: int) -> str | None:
    import sys

    torch = sys.modules.get("torch")    # only if the caller already imported it
    try:
        if torch is None or not torch.cuda.is_initialized():
            return None
        uuid = getattr(torch.cuda.get_device_properties(cuda_index), "uuid", None)
        return str(uuid) if uuid is not None else None
    except Exception:  # noqa: BLE001 - CPU builds raise on torch.cuda calls
        return None


def _handle(cuda_index: int):
    index = nvml_index(cuda_index)
    if index is None:
        return None
    return _call("nvmlDeviceGetHandleByIndex", index)


# ----------------------------------------------------------------------------------------------
# Snapshots and what they tell
# ----------------------------------------------------------------------------------------------

def decode_throttle_reasons(mask: int | None) -> list[str]:
    """Names of the reason bits set in `mask` (unknown bits as "unknown_0x..."), lowest bit first."""
    if not mask:
        return []
    names = []
    bit = 1
    while bit <= mask:
        if mask & bit:
            names.append(THROTTLE_REASONS.get(bit, f"unknown_0x{bit:x}"))
        bit <<= 1
    return names


def gpu_snapshot(index: int = 0) -> dict | None:
    """The GPU's state now, or None without NVML.

    `index` is the CUDA device index as torch numbers it (0 = the first visible GPU); it is mapped
    to NVML's numbering (`nvml_index`). Keys, each None when the GPU does not report it:
    energy_mj (total energy counter since the driver loaded, millijoules; read first, so an end
    snapshot taken right after the window's synchronize brackets it closely), sm_clock_mhz,
    mem_clock_mhz, temperature_c, power_w (board power draw now), throttle_reasons (list of names,
    see THROTTLE_REASONS; empty when none or unreadable).
    """
    nvml = _nvml()
    if nvml is None:
        return None
    handle = _handle(index)
    if handle is None:
        return None
    energy_mj = _call("nvmlDeviceGetTotalEnergyConsumption", handle)
    power_mw = _call("nvmlDeviceGetPowerUsage", handle)
    return {
        "sm_clock_mhz": _call("nvmlDeviceGetClockInfo", handle, getattr(nvml, "NVML_CLOCK_SM", 1)),
        "mem_clock_mhz": _call("nvmlDeviceGetClockInfo", handle, getattr(nvml, "NVML_CLOCK_MEM", 2)),
        "temperature_c": _call("nvmlDeviceGetTemperature", handle,
                               getattr(nvml, "NVML_TEMPERATURE_GPU", 0)),
        "power_w": power_mw / 1000 if power_mw is not None else None,
        "throttle_reasons": decode_throttle_reasons(_throttle_mask(handle)),
        "energy_mj": energy_mj,
    }


def _throttle_mask(handle) -> int | None:
    # nvidia-ml-py 12.535+ names it ClocksEventReasons and keeps ClocksThrottleReasons as a
    # deprecated alias that is to be removed; older releases have only the latter.
    for name in ("nvmlDeviceGetCurrentClocksEventReasons",
                 "nvmlDeviceGetCurrentClocksThrottleReasons"):
        mask = _call(name, handle)
        if mask is not None:
            return mask
    return None


def other_processes(index: int = 0) -> int | None:
    """Number of other processes (compute or graphics) on the GPU, or None when unknown.

    Called by a setup's process, which holds a CUDA context on the GPU. `index` as in
    `gpu_snapshot`. A process listed both as compute and graphics counts once. In a container with
    its own PID namespace NVML lists host PIDs, so this process's own PID is not among them; then
    one listed process is taken to be this one, and an empty list means NVML cannot see processes
    here: None.
    """
    handle = _handle(index) if _nvml() is not None else None
    if handle is None:
        return None
    compute = _call("nvmlDeviceGetComputeRunningProcesses", handle)
    graphics = _call("nvmlDeviceGetGraphicsRunningProcesses", handle)
    if compute is None and graphics is None:
        return None
    pids = {getattr(p, "pid", None) for p in (compute or []) + (graphics or [])}
    pids.discard(None)
    if os.getpid() in pids:
        return len(pids) - 1
    return len(pids) - 1 if pids else None


def energy_over_window(start: dict | None, end: dict | None, steps: int, tokens_per_step: int,
                       window_s: float) -> dict | None:
    """Energy of the timed window from two snapshots' counters, or None when it cannot be told.

    Returns joules_per_step, avg_watts (joules / window_s) and tokens_per_kwh. None when either
    snapshot or counter is missing, the counter did not advance or went backwards (driver reload),
    or steps / window_s are not positive. NVML updates the counter every few tens of ms, so
    windows under a second or so give coarse numbers.
    """
    if not start or not end or steps <= 0 or window_s <= 0 or tokens_per_step <= 0:
        return None
    start_mj, end_mj = start.get("energy_mj"), end.get("energy_mj")
    if start_mj is None or end_mj is None or end_mj <= start_mj:
        return None
    joules = (end_mj - start_mj) / 1000
    kwh = joules / 3.6e6
    return {
        "joules_per_step": joules / steps,
        "avg_watts": joules / window_s,
        "tokens_per_kwh": steps * tokens_per_step / kwh,
    }


def noise_flags(start: dict | None, end: dict | None, other_procs: int | None) -> list[str]:
    """Reasons not to trust a row as is, from the window's snapshots (empty when none or unknown).

    "other_processes": another process was on the GPU (`other_procs` > 0);
    "throttled": a reason outside BENIGN_THROTTLE_REASONS (a thermal or hardware slowdown, not the
    power cap) held the clocks at the start or at the end of the window; both are checked because
    a snapshot sees only its own instant;
    "clock_drop": the SM clock at the end is more than 10% below the start.
    Missing data raises no flag. "high_cv" and "recompiled" come from elsewhere (stats, compile).
    """
    flags = []
    if other_procs:
        flags.append("other_processes")
    reasons = [r for snap in (start, end) if snap for r in snap.get("throttle_reasons") or []]
    if any(r not in BENIGN_THROTTLE_REASONS for r in reasons):
        flags.append("throttled")
    start_mhz = (start or {}).get("sm_clock_mhz")
    end_mhz = (end or {}).get("sm_clock_mhz")
    if start_mhz and end_mhz is not None and end_mhz < (1 - CLOCK_DROP_FRACTION) * start_mhz:
        flags.append("clock_drop")
    return flags


def telemetry_record(start: dict | None, end: dict | None, other_procs: int | None) -> dict | None:
    """The result record's `telemetry` object: {start, end, other_processes}; None without NVML."""
    if start is None and end is None:
        return None
    return {"start": start, "end": end, "other_processes": other_procs}


# ----------------------------------------------------------------------------------------------
# The machine, for the parent process
# ----------------------------------------------------------------------------------------------

def gpu_name(cuda_index: int = 0) -> str | None:
    """The driver's name of torch's cuda:`cuda_index` ("NVIDIA H200"), or None without NVML."""
    handle = _handle(cuda_index)
    return _text(_call("nvmlDeviceGetName", handle)) if handle is not None else None


def gpu_facts(cuda_index: int = 0) -> dict:
    """{gpu_count, gpu_memory_gb, driver} from NVML without a CUDA context; {} without NVML.

    gpu_count counts the GPUs CUDA can see (CUDA_VISIBLE_DEVICES honoured); gpu_memory_gb is the
    total memory of cuda:`cuda_index` in GB (1e9 bytes).
    """
    nvml = _nvml()
    visible = _visible_nvml_indices(nvml) if nvml is not None else None
    handle = _handle(cuda_index)
    if not visible or handle is None:
        return {}
    total_bytes = getattr(_call("nvmlDeviceGetMemoryInfo", handle), "total", None)
    return {
        "gpu_count": len(visible),
        "gpu_memory_gb": round(total_bytes / 1e9, 1) if total_bytes is not None else None,
        "driver": _text(_call("nvmlSystemGetDriverVersion")),
    }


# ----------------------------------------------------------------------------------------------
# The CPU, for a setup's process on a CPU
# ----------------------------------------------------------------------------------------------

# "busy_cpu": other processes took more than this share of the time of the setup's threads
# (beyond the CPUs those threads left free) while it ran its timed steps.
BUSY_CPU_SHARE = 0.10


def cpu_snapshot() -> dict:
    """The CPUs now: `load_1m` (the load average over a minute, this process's threads
    included), `busy_s` (CPU seconds the CPUs this process may run on have spent busy since boot:
    user, nice, system, interrupts and time stolen by a hypervisor), `own_s` (this process's CPU
    seconds, all its threads) and `at` (time.monotonic())."""
    import time

    import psutil

    cpus = sorted(os.sched_getaffinity(0))
    per_cpu = psutil.cpu_times(percpu=True)
    busy = sum(t.user + t.nice + t.system + getattr(t, "irq", 0) + getattr(t, "softirq", 0)
               + getattr(t, "steal", 0) for i, t in enumerate(per_cpu) if i in cpus)
    own = psutil.Process().cpu_times()
    return {"load_1m": os.getloadavg()[0], "busy_s": busy, "own_s": own.user + own.system,
            "at": time.monotonic(), "cpus": len(cpus)}


def cpu_telemetry(start: dict, end: dict, threads: int) -> dict:
    """The record's `telemetry` on a CPU: the load average at the `start` and `end` of the timed
    window, the CPUs this process could run on and the `threads` its steps ran on (torch's
    intra-op threads), the CPU seconds other processes took on those CPUs during the window
    (`other_cpu_s`), also as a share of the CPUs' time (`other_cpu_share`), and what they took
    beyond the CPUs the threads left free, as a share of the threads' time (`contention`: with
    one thread on two CPUs, another process may use the other CPU whole without taking any)."""
    wall = end["at"] - start["at"]
    cpus = start["cpus"]
    used = max(1, min(threads, cpus))
    other = max(0.0, (end["busy_s"] - start["busy_s"]) - (end["own_s"] - start["own_s"]))
    return {"start": {"load_1m": start["load_1m"]}, "end": {"load_1m": end["load_1m"]},
            "cpus": cpus, "threads": threads, "other_cpu_s": round(other, 3),
            "other_cpu_share": round(other / (wall * cpus), 4) if wall > 0 else None,
            "contention": round(max(0.0, other - (cpus - used) * wall) / (used * wall), 4)
            if wall > 0 else None}


def cpu_noise_flags(telemetry: dict | None) -> list[str]:
    """["busy_cpu"] when other processes took more than BUSY_CPU_SHARE of the setup's threads'
    time during the timed steps (`contention`); nothing when it is unknown."""
    share = (telemetry or {}).get("contention")
    return ["busy_cpu"] if share is not None and share > BUSY_CPU_SHARE else []
