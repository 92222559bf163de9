"""--pin-cpus (measure/pinning.py): the GPU's local cores read from a sysfs tree made here, what
the record says when nothing changes, when it binds, and when it cannot; the setting's checks."""

import os

import pytest

from says import names
from stepbench.cli import main
from stepbench.execute.protocol import Job
from stepbench.measure import pinning
from stepbench.setup import Setup

BUS = "0000:1b:00.0"


def sysfs(tmp_path, local: str, nodes: int = 1):
    (tmp_path / "bus/pci/devices" / BUS).mkdir(parents=True)
    (tmp_path / "bus/pci/devices" / BUS / "local_cpulist").write_text(local + "\n")
    for n in range(nodes):
        (tmp_path / f"devices/system/node/node{n}").mkdir(parents=True)
    return tmp_path


def test_cpulists_read_and_written():
    assert pinning.parse_cpulist("0-3,8,10-11\n") == {0, 1, 2, 3, 8, 10, 11}
    assert pinning.parse_cpulist("") == set()
    assert pinning.format_cpulist({11, 0, 1, 2, 3, 8, 10}) == "0-3,8,10-11"


def test_one_numa_node_changes_nothing_and_says_so(tmp_path, monkeypatch):
    monkeypatch.setattr(pinning, "pci_bus_id", lambda index: BUS)
    allowed = os.sched_getaffinity(0)
    root = sysfs(tmp_path, pinning.format_cpulist(allowed))
    got = pinning.pin("auto", "cuda", 0, root)
    assert got["pinned"] is True and got["source"] == "sysfs" and got["numa_nodes"] == 1
    assert got["cpus"] == pinning.format_cpulist(allowed) and "nothing changed" in got["why"]
    assert os.sched_getaffinity(0) == allowed


def test_a_gpu_on_another_node_binds_the_process_to_its_cores(tmp_path, monkeypatch):
    allowed = sorted(os.sched_getaffinity(0))
    local = {allowed[-1]}
    bound = []
    monkeypatch.setattr(pinning, "pci_bus_id", lambda index: BUS)
    monkeypatch.setattr(pinning, "bind", bound.append)   # this test's own process stays as is
    got = pinning.pin("auto", "cuda", 0, sysfs(tmp_path, f"{allowed[-1]}", nodes=2))
    assert bound == [local] and got["pinned"] is True and got["numa_nodes"] == 2
    assert got["cpus"] == str(allowed[-1]) and "why" not in got


def test_why_not_pinned(tmp_path, monkeypatch):
    assert pinning.pin("off", "cuda")["pinned"] is False
    assert "CPU" in pinning.pin("auto", "cpu")["why"]
    # No bus id and no NVML (this machine has neither a GPU nor its driver).
    monkeypatch.setattr(pinning, "pci_bus_id", lambda index: None)
    monkeypatch.setattr(pinning, "_nvml_affinity", lambda index: set())
    assert "sysfs" in pinning.pin("auto", "cuda", 0, tmp_path)["why"]
    # The GPU's cores are none the process may use.
    monkeypatch.setattr(pinning, "pci_bus_id", lambda index: BUS)
    outside = max(os.sched_getaffinity(0)) + 1
    got = pinning.pin("auto", "cuda", 0, sysfs(tmp_path, str(outside), nodes=2))
    assert got["pinned"] is False and str(outside) in got["why"]


def test_the_job_carries_the_choice_and_a_bad_value_is_refused(capsys):
    setup = Setup(model="llama-tiny", mode="eager", attn="sdpa", device="cpu")
    assert "pin_cpus" not in Job(setup).payload()
    assert '"pin_cpus": "auto"' in Job(setup, pin_cpus="auto").payload()
    with pytest.raises(SystemExit) as exited:
        main(["run", "--device", "cpu", "--pin-cpus", "numa"])
    assert exited.value.code == 2
    assert names(capsys.readouterr().err, "--pin-cpus", "'numa'", "auto", "off")
