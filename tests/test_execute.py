"""The executor seam and the runner's slots, with real child processes that speak the protocol.

The children here are short Python scripts, not benchmarks: they send the same JSON lines a
setup's process sends (stepbench.protocol), so the runner's scheduling, resume and record-making
are exercised for real without paying for a model.
"""

import pytest
import dataclasses
from pathlib import Path


from stepbench import protocol
from stepbench.execute.local.process import LocalProcess
from stepbench.execute.runner import Runner
from stepbench.measure import machine
from stepbench.record import ResultsFile
from stepbench.setup import Setup

from fakes import ProtocolChild, ScriptedProcesses

def plan(batches):
    return [Setup(model="llama-tiny", mode="eager", attn="sdpa", batch=b, seq=64, device="cpu")
            for b in batches]


def run(executor, out, setups, **kwargs):
    try:
        return Runner(executor, ResultsFile(out), **kwargs).run(setups, timeout_s=60)
    finally:
        executor.close()


@pytest.mark.slow
def test_two_slots_run_two_setups_at_a_time_and_keep_plan_order(tmp_path):
    out, child = tmp_path / "r.jsonl", ProtocolChild(tmp_path, sleep_s=0.2, together=2)
    records = run(ScriptedProcesses(child, slots=2), out, plan([1, 2, 3, 4]))
    assert [r.setup.batch for r in records] == [1, 2, 3, 4]
    assert [r.step_ms for r in records] == [10.0, 20.0, 30.0, 40.0]
    assert all(r.status == "ok" and r.machine.hostname == "fake" for r in records)
    # Every record is in the file (in the order the setups finished).
    assert sorted(r.setup.batch for r in ResultsFile(out).read()) == [1, 2, 3, 4]
    # Two at a time (the first two met at their barrier), never three.
    assert [e["met"] for e in child.entries()].count(True) == 2
    spans = [(e["start"], e["end"]) for e in child.entries()]
    assert max(sum(s <= t < e for s, e in spans) for t, _ in spans) <= 2, spans


@pytest.mark.slow
def test_one_slot_runs_one_setup_at_a_time(tmp_path):
    child = ProtocolChild(tmp_path, sleep_s=0.3)
    run(ScriptedProcesses(child, slots=1), tmp_path / "r.jsonl", plan([1, 2, 3]))
    spans = [(e["start"], e["end"]) for e in child.entries()]
    assert all(s2 >= e1 for (_, e1), (s2, _) in zip(spans, spans[1:])), spans


@pytest.mark.slow
def test_resume_skips_done_setups_and_rerun_measures_them_again(tmp_path):
    out, child = tmp_path / "r.jsonl", ProtocolChild(tmp_path)
    run(ScriptedProcesses(child), out, plan([1]))
    run(ScriptedProcesses(child), out, plan([1, 2]))
    assert [e["batch"] for e in child.entries()] == [1, 2]
    records = run(ScriptedProcesses(child), out, plan([1, 2]), rerun=True)
    assert [e["batch"] for e in child.entries()] == [1, 2, 1, 2]
    # The file keeps all four records; resume and report take the latest of each setup.
    store = ResultsFile(out)
    assert len(store.read()) == 4
    assert [r.run_id for r in store.latest()] == [r.run_id for r in records]


def test_the_protocol_survives_stray_lines_and_unknown_fields():
    assert protocol.decode("a stray line from a library") is None
    assert protocol.decode('{"no": "event"}') is None
    assert protocol.decode(protocol.encode("progress", phase="warmup"))["phase"] == "warmup"
    # A diverged loss is a result too.
    assert protocol.decode(protocol.encode("result", measured={"loss_last": float("nan")}))


@pytest.fixture
def fake_cuda():
    """A torch whose CUDA names its GPU, and the calls made to name it: in this process or by
    a probe process (a stand-in for subprocess.run)."""
    calls = []

    class FakeCuda:
        initialized = False

        def is_initialized(self):
            return self.initialized

        def get_device_name(self, index):
            calls.append("in process")
            return "NVIDIA H200"

    def probe(*args, **kwargs):
        calls.append("probe")
        return type("Done", (), {"returncode": 0, "stdout": "NVIDIA H200"})

    return type("torch", (), {"cuda": FakeCuda()})(), probe, calls


def test_a_gpu_is_named_by_the_same_route_in_the_parent_and_in_the_child(fake_cuda):
    # Without NVML, the parent (no CUDA context) asks torch in a short-lived process; the child
    # (which holds a context) asks torch directly: both get torch's name, so resume keys match.
    torch, probe, calls = fake_cuda
    no_nvml = lambda index: None        # noqa: E731
    parent = machine.name_gpu(0, no_nvml, torch, run=probe)
    torch.cuda.initialized = True
    child = machine.name_gpu(0, no_nvml, torch, run=probe)
    assert parent == child == "NVIDIA H200" and calls == ["probe", "in process"]
    # NVML's name comes first wherever it answers; a process without torch probes.
    assert machine.name_gpu(0, lambda index: "NVIDIA H100", torch, run=probe) == "NVIDIA H100"
    assert machine.name_gpu(0, no_nvml, None, run=probe) == "NVIDIA H200"
    assert calls == ["probe", "in process", "probe"]
    assert machine.gpu_name("cpu") == "cpu"


def test_compiled_setups_get_their_own_cache_or_the_shared_one(tmp_path, monkeypatch):
    from stepbench.execute.protocol import Job
    from stepbench.measure.worker import compile_cache_label

    eager = plan([1])[0]
    compiled = dataclasses.replace(eager, mode="compile")
    # inductor sets TORCHINDUCTOR_CACHE_DIR in its own process once it compiled anything.
    for name in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "STEPBENCH_COMPILE_CACHE"):
        monkeypatch.delenv(name, raising=False)
    private = LocalProcess()
    shared = LocalProcess(compile_cache=tmp_path / "shared")
    try:
        env = private.environment(Job(compiled))
        assert "TORCHINDUCTOR_CACHE_DIR" not in private.environment(Job(eager))
        assert env["TRITON_CACHE_DIR"].startswith(env["TORCHINDUCTOR_CACHE_DIR"])
        assert env == private.environment(Job(compiled, repeat=1))   # a repeat finds it again
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        assert compile_cache_label(compiled) == "cold"
        (Path(env["TORCHINDUCTOR_CACHE_DIR"]) / "fxgraph").mkdir()
        assert compile_cache_label(compiled) == "warm"
        for name, value in shared.environment(Job(compiled)).items():
            monkeypatch.setenv(name, value)
        assert compile_cache_label(compiled) == "shared"
        assert compile_cache_label(eager) is None
    finally:
        private.close()
        shared.close()
