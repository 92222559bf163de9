"""NVML telemetry: silent without NVML, right answers on a fake NVML and on synthetic snapshots."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
import torch

from stepbench.measure import telemetry


# --- a fake pynvml ---------------------------------------------------------------------------

class FakeNVMLError(Exception):
    """Stands in for pynvml.NVMLError_NotSupported and friends."""


def fake_gpu(**overrides) -> dict:
    gpu = dict(name="NVIDIA H200", uuid="GPU-11111111-2222-3333-4444-555555555555",
               memory_total=143771 * 2**20, sm=1980, mem=3201, temp=40, power_mw=123456,
               reasons=0, energy_mj=5_000_000, compute=[], graphics=[], unsupported=set())
    gpu.update(overrides)
    return gpu


def make_fake_nvml(gpus: list[dict], *, driver="580.159.04", event_api=True, throttle_api=True):
    """A module-like object with the pynvml functions telemetry uses, over `gpus`."""

    def field(name, fn):
        def call(handle, *args):
            if name in gpus[handle]["unsupported"]:
                raise FakeNVMLError(f"{name}: Not Supported")
            return fn(gpus[handle], *args)
        return call

    def processes(key):
        return lambda gpu: [SimpleNamespace(pid=pid, usedGpuMemory=1) for pid in gpu[key]]

    def get_handle(index):
        if not 0 <= index < len(gpus):
            raise FakeNVMLError("Invalid Argument")
        return index

    nvml = SimpleNamespace(
        NVML_CLOCK_SM=1, NVML_CLOCK_MEM=2, NVML_TEMPERATURE_GPU=0,
        nvmlDeviceGetCount=lambda: len(gpus),
        nvmlDeviceGetHandleByIndex=get_handle,
        nvmlSystemGetDriverVersion=lambda: driver,
        nvmlDeviceGetName=field("name", lambda g: g["name"]),
        nvmlDeviceGetUUID=field("uuid", lambda g: g["uuid"]),
        nvmlDeviceGetMemoryInfo=field("memory", lambda g: SimpleNamespace(total=g["memory_total"])),
        nvmlDeviceGetClockInfo=field("clock", lambda g, kind: g["sm"] if kind == 1 else g["mem"]),
        nvmlDeviceGetTemperature=field("temperature", lambda g, sensor: g["temp"]),
        nvmlDeviceGetPowerUsage=field("power", lambda g: g["power_mw"]),
        nvmlDeviceGetTotalEnergyConsumption=field("energy", lambda g: g["energy_mj"]),
        nvmlDeviceGetComputeRunningProcesses=field("compute", processes("compute")),
        nvmlDeviceGetGraphicsRunningProcesses=field("graphics", processes("graphics")),
    )
    if event_api:
        nvml.nvmlDeviceGetCurrentClocksEventReasons = field("reasons", lambda g: g["reasons"])
    if throttle_api:
        nvml.nvmlDeviceGetCurrentClocksThrottleReasons = field("reasons", lambda g: g["reasons"])
    return nvml


@pytest.fixture
def use_nvml(monkeypatch):
    """Install a fake NVML over the given GPUs; no CUDA context, CUDA_VISIBLE_DEVICES unset."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(telemetry, "_torch_uuid", lambda cuda_index: None)

    def install(gpus, **kwargs):
        nvml = make_fake_nvml(gpus, **kwargs)
        monkeypatch.setattr(telemetry, "_NVML_STATE", {"module": nvml})
        return nvml
    return install


# --- without NVML ---------------------------------------------------------------------------

def test_without_nvml_everything_is_none_and_nothing_raises(monkeypatch):
    import pynvml

    def library_not_found():
        raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    # What FIELD-NOTES saw on the CPU machines, forced here so the test means the same on a GPU box.
    monkeypatch.setattr(pynvml, "nvmlInit", library_not_found)
    monkeypatch.setattr(telemetry, "_NVML_STATE", {})
    assert telemetry._nvml() is None
    assert telemetry.gpu_snapshot() is None
    assert telemetry.gpu_snapshot(3) is None
    assert telemetry.other_processes() is None
    assert telemetry.gpu_name(0) is None and telemetry.gpu_facts(0) == {}
    assert telemetry.nvml_index(0) is None
    assert telemetry.noise_flags(None, None, None) == []
    assert telemetry.energy_over_window(None, None, 10, 100, 1.0) is None
    assert telemetry.telemetry_record(None, None, None) is None


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_real_nvml_is_absent_on_this_cpu_machine():
    # No monkeypatching: the real pynvml on a machine without the NVIDIA driver.
    assert telemetry.gpu_snapshot() is None
    assert telemetry.gpu_name() is None and telemetry.gpu_facts() == {}
    assert telemetry.other_processes() is None


# --- snapshots on a fake NVML ---------------------------------------------------------------

def test_snapshot_reads_every_field(use_nvml):
    use_nvml([fake_gpu(reasons=0x0004 | 0x0001)])
    assert telemetry.gpu_snapshot(0) == {
        "sm_clock_mhz": 1980, "mem_clock_mhz": 3201, "temperature_c": 40,
        "power_w": 123.456, "throttle_reasons": ["gpu_idle", "sw_power_cap"],
        "energy_mj": 5_000_000,
    }


def test_unsupported_fields_are_none_on_their_own(use_nvml):
    use_nvml([fake_gpu(unsupported={"energy", "power", "reasons"})])
    snap = telemetry.gpu_snapshot()
    assert snap["energy_mj"] is None and snap["power_w"] is None and snap["throttle_reasons"] == []
    assert snap["sm_clock_mhz"] == 1980 and snap["temperature_c"] == 40


@pytest.mark.parametrize("event_api, throttle_api", [(True, False), (False, True)])
def test_both_pynvml_naming_generations(use_nvml, event_api, throttle_api):
    use_nvml([fake_gpu(reasons=0x0040)], event_api=event_api, throttle_api=throttle_api)
    assert telemetry.gpu_snapshot()["throttle_reasons"] == ["hw_thermal_slowdown"]


def test_decode_throttle_reasons():
    assert telemetry.decode_throttle_reasons(0) == []
    assert telemetry.decode_throttle_reasons(None) == []
    assert telemetry.decode_throttle_reasons(0x0008 | 0x0020 | 0x0400) == [
        "hw_slowdown", "sw_thermal_slowdown", "unknown_0x400"]
    # Our table agrees with pynvml's constants, in both naming generations.
    import pynvml
    for bit, name in telemetry.THROTTLE_REASONS.items():
        camel = "".join(part.capitalize() for part in name.split("_"))   # sw_power_cap: SwPowerCap
        for prefix in ("nvmlClocksThrottleReason", "nvmlClocksEventReason"):
            assert getattr(pynvml, prefix + camel) == bit, prefix + camel


def test_snapshot_of_a_missing_device_is_none(use_nvml):
    use_nvml([fake_gpu()])
    assert telemetry.gpu_snapshot(1) is None
    assert telemetry.other_processes(1) is None


# --- which NVML device ------------------------------------------------------------------------

def test_cuda_visible_devices_maps_cuda_index_to_nvml_index(use_nvml, monkeypatch):
    use_nvml([fake_gpu(sm=100 + i, uuid=f"GPU-{i}aaa-0000") for i in range(4)])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,0")
    assert telemetry.nvml_index(0) == 2 and telemetry.nvml_index(1) == 0
    assert telemetry.nvml_index(2) is None
    assert telemetry.gpu_snapshot(0)["sm_clock_mhz"] == 102


@pytest.mark.parametrize("spec, expected", [
    (None, [0, 1, 2, 3]),
    ("3", [3]),
    ("1,7,2", [1]),             # CUDA stops at the first entry that names no device
    ("GPU-2aaa,GPU-0", [2, 0]),
    ("GPU-9", []),
    ("", []),
    ("MIG-1234", None),
])
def test_visible_devices(use_nvml, monkeypatch, spec, expected):
    nvml = use_nvml([fake_gpu(uuid=f"GPU-{i}aaa-0000") for i in range(4)])
    if spec is not None:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", spec)
    assert telemetry._visible_nvml_indices(nvml) == expected


def test_cuda_context_uuid_decides_over_the_environment(use_nvml, monkeypatch):
    use_nvml([fake_gpu(sm=100 + i, uuid=f"GPU-{i}aaa-0000") for i in range(3)])
    monkeypatch.setattr(telemetry, "_torch_uuid", lambda cuda_index: "1aaa-0000")
    assert telemetry.nvml_index(0) == 1
    assert telemetry.gpu_snapshot(0)["sm_clock_mhz"] == 101


# --- other processes ----------------------------------------------------------------------------

def test_other_processes_excludes_this_process_and_counts_each_pid_once(use_nvml):
    me = os.getpid()
    use_nvml([fake_gpu(compute=[me, 111, 222], graphics=[222, 333])])
    assert telemetry.other_processes() == 3


def test_other_processes_alone(use_nvml):
    use_nvml([fake_gpu(compute=[os.getpid()])])
    assert telemetry.other_processes() == 0


def test_other_processes_in_a_pid_namespace(use_nvml):
    # NVML shows host PIDs: our own (say 98765 on the host) is not os.getpid().
    use_nvml([fake_gpu(compute=[98765])])
    assert telemetry.other_processes() == 0
    use_nvml([fake_gpu(compute=[98765, 98766])])
    assert telemetry.other_processes() == 1


def test_other_processes_unknown_when_nvml_shows_none_but_we_hold_a_context(use_nvml):
    use_nvml([fake_gpu(compute=[], graphics=[])])
    assert telemetry.other_processes() is None


def test_other_processes_with_one_list_unsupported(use_nvml):
    use_nvml([fake_gpu(compute=[os.getpid(), 5], unsupported={"graphics"})])
    assert telemetry.other_processes() == 1
    use_nvml([fake_gpu(unsupported={"graphics", "compute"})])
    assert telemetry.other_processes() is None


# --- machine info ---------------------------------------------------------------------------

def test_gpu_name_and_facts(use_nvml):
    use_nvml([fake_gpu(), fake_gpu()])
    assert telemetry.gpu_name(0) == "NVIDIA H200"
    assert telemetry.gpu_facts(0) == {"gpu_count": 2, "gpu_memory_gb": 150.8,
                                      "driver": "580.159.04"}


def test_gpu_name_honours_cuda_visible_devices_and_decodes_bytes(use_nvml, monkeypatch):
    use_nvml([fake_gpu(name=b"NVIDIA A100-SXM4-80GB"), fake_gpu(name=b"NVIDIA L4",
                                                                memory_total=23034 * 2**20)],
             driver=b"535.104.05")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert telemetry.gpu_name(0) == "NVIDIA L4"
    assert telemetry.gpu_facts(0) == {"gpu_count": 1, "gpu_memory_gb": 24.2,
                                      "driver": "535.104.05"}
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    telemetry._NVML_STATE.pop("index")      # a process's visible devices never change: cached
    assert telemetry.gpu_name(0) is None and telemetry.gpu_facts(0) == {}


def test_stepbench_nvml_0_turns_nvml_off(monkeypatch):
    import pynvml

    monkeypatch.setattr(pynvml, "nvmlInit", lambda: None)     # an NVML that would work
    monkeypatch.setattr(telemetry, "_NVML_STATE", {})
    assert telemetry._nvml() is pynvml
    monkeypatch.setattr(telemetry, "_NVML_STATE", {})
    monkeypatch.setenv("STEPBENCH_NVML", "0")
    assert telemetry._nvml() is None and telemetry.gpu_name(0) is None


# --- energy ---------------------------------------------------------------------------------

def test_energy_over_window():
    start = {"energy_mj": 1_000_000}
    end = {"energy_mj": 1_000_000 + 1_400_000}         # 1400 J
    energy = telemetry.energy_over_window(start, end, steps=20, tokens_per_step=8192, window_s=2.0)
    assert energy["joules_per_step"] == pytest.approx(70.0)
    assert energy["avg_watts"] == pytest.approx(700.0)
    # 163,840 tokens for 1400 J = 3.889e-4 kWh.
    assert energy["tokens_per_kwh"] == pytest.approx(20 * 8192 / (1400 / 3.6e6))
    assert energy["tokens_per_kwh"] == pytest.approx(4.213e8, rel=1e-3)


@pytest.mark.parametrize("start, end, steps, window_s", [
    ({"energy_mj": 100}, {"energy_mj": None}, 10, 1.0),     # field unsupported
    ({"energy_mj": 100}, {"energy_mj": 100}, 10, 1.0),      # counter did not advance
    ({"energy_mj": 900}, {"energy_mj": 100}, 10, 1.0),      # went backwards (driver reload)
    ({"energy_mj": 100}, {"energy_mj": 900}, 0, 1.0),
    ({"energy_mj": 100}, {"energy_mj": 900}, 10, 0.0),
    (None, {"energy_mj": 900}, 10, 1.0),
    ({}, {"energy_mj": 900}, 10, 1.0),
])
def test_energy_over_window_unknown(start, end, steps, window_s):
    assert telemetry.energy_over_window(start, end, steps, 100, window_s) is None


# --- noise flags ------------------------------------------------------------------------------

def snap(sm=1980, reasons=()):
    return {"sm_clock_mhz": sm, "mem_clock_mhz": 3201, "temperature_c": 40, "power_w": 500.0,
            "throttle_reasons": list(reasons), "energy_mj": 1}


@pytest.mark.parametrize("start, end, others, expected", [
    (snap(), snap(), 0, []),
    (snap(), snap(reasons=["gpu_idle"]), 0, []),                        # idle after the sync
    (snap(), snap(reasons=["applications_clocks_setting"]), 0, []),
    (snap(), snap(reasons=["gpu_idle", "sw_power_cap"]), 0, []),       # loaded GPU at its cap
    (snap(), snap(reasons=["sw_power_cap", "sw_thermal_slowdown"]), 0, ["throttled"]),
    (snap(reasons=["hw_thermal_slowdown"]), snap(), 0, ["throttled"]),  # at the start only
    (snap(), snap(reasons=["unknown_0x400"]), 0, ["throttled"]),
    (snap(), snap(), 2, ["other_processes"]),
    (snap(sm=1980), snap(sm=1700), 0, ["clock_drop"]),                  # 14% below
    (snap(sm=1980), snap(sm=1800), 0, []),                              # 9% below
    (snap(sm=1980), snap(sm=1782), 0, []),                              # exactly 10%: not more
    (snap(sm=1500), snap(sm=1980), 0, []),                              # went up
    (snap(sm=1980), snap(sm=1000, reasons=["hw_slowdown"]), 1,
     ["other_processes", "throttled", "clock_drop"]),
    (snap(sm=None), snap(sm=1000), None, []),                           # unknown raises nothing
    (None, None, None, []),
    (None, snap(reasons=["sw_thermal_slowdown"]), None, ["throttled"]),
])
def test_noise_flags(start, end, others, expected):
    assert telemetry.noise_flags(start, end, others) == expected


def test_telemetry_record():
    assert telemetry.telemetry_record(snap(), snap(sm=1900), 0) == {
        "start": snap(), "end": snap(sm=1900), "other_processes": 0}


# --- a real GPU ---------------------------------------------------------------------------------

@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_real_gpu_telemetry():
    info = telemetry.gpu_facts(0)
    assert telemetry.gpu_name(0) == torch.cuda.get_device_name(0)
    assert info["gpu_count"] == torch.cuda.device_count()
    assert info["gpu_memory_gb"] > 1 and info["driver"]
    torch.ones(1, device="cuda")        # a CUDA context: now the UUID maps cuda:0 exactly
    assert telemetry.nvml_index(0) is not None
    a = torch.randn(4096, 4096, device="cuda")
    start = telemetry.gpu_snapshot(0)
    for _ in range(200):
        a @ a
    torch.cuda.synchronize()
    end = telemetry.gpu_snapshot(0)
    assert start["sm_clock_mhz"] > 0 and end["temperature_c"] > 0
    assert isinstance(end["throttle_reasons"], list)
    others = telemetry.other_processes(0)
    assert others is None or others >= 0
    if start["energy_mj"] is not None:
        assert end["energy_mj"] >= start["energy_mj"]
