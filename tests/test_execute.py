"""The executor seam and the runner's slots, with real child processes that speak the protocol.

The children here are short Python scripts, not benchmarks: they send the same JSON lines a
setup's process sends (stepbench.protocol), so the runner's scheduling, resume and record-making
are exercised for real without paying for a model.
"""

import pytest
import dataclasses
import json
import sys
from pathlib import Path


from stepbench import protocol
from stepbench.execute.executor import LocalProcess
from stepbench.execute.runner import Runner
from stepbench.measure import machine
from stepbench.record import ResultsFile
from stepbench.setup import Setup

# A child that sleeps, logs when it ran, and reports a made-up measurement over the protocol.
FAKE_CHILD = """
import json, sys, time
from stepbench import protocol
job, log = json.loads(sys.argv[1]), sys.argv[2]
start = time.time()
print(protocol.encode("start", machine={"gpu": "cpu", "hostname": "fake"}, software={}), end="")
print(protocol.encode("progress", phase="timed", args=[3]), end="", flush=True)
print("a stray line from a library", flush=True)
time.sleep(float(sys.argv[3]))
with open(log, "a") as f:
    f.write(json.dumps([job["setup"]["batch"], start, time.time()]) + "\\n")
print(protocol.encode("result", status="ok", error=None,
                      measured={"phase": "done", "step_ms": 10.0 * job["setup"]["batch"],
                                "not_a_field": 1}), end="", flush=True)
"""


class FakeChildren(LocalProcess):
    """A local executor with `slots` slots whose children are FAKE_CHILD."""

    def __init__(self, log, slots=1, sleep_s=1.5):
        super().__init__()
        self.slots = [str(i) for i in range(slots)]
        self.log, self.sleep_s = log, sleep_s

    def command(self, job):
        return [sys.executable, "-c", FAKE_CHILD, job.payload(), str(self.log), str(self.sleep_s)]


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
    log, out = tmp_path / "log.jsonl", tmp_path / "r.jsonl"
    records = run(FakeChildren(log, slots=2), out, plan([1, 2, 3, 4]))
    assert [r.setup.batch for r in records] == [1, 2, 3, 4]
    assert [r.step_ms for r in records] == [10.0, 20.0, 30.0, 40.0]
    assert all(r.status == "ok" and r.machine.hostname == "fake" for r in records)
    # Every record is in the file (in the order the setups finished).
    assert sorted(r.setup.batch for r in ResultsFile(out).read()) == [1, 2, 3, 4]
    spans = [json.loads(line)[1:] for line in log.read_text().splitlines()]
    in_flight = [sum(s <= t < e for s, e in spans) for t, _ in spans]
    assert max(in_flight) == 2, spans        # two at a time, never three


@pytest.mark.slow
def test_one_slot_runs_one_setup_at_a_time(tmp_path):
    log = tmp_path / "log.jsonl"
    run(FakeChildren(log, slots=1, sleep_s=0.3), tmp_path / "r.jsonl", plan([1, 2, 3]))
    spans = [json.loads(line)[1:] for line in log.read_text().splitlines()]
    assert all(s2 >= e1 for (_, e1), (s2, _) in zip(spans, spans[1:])), spans


@pytest.mark.slow
def test_resume_skips_done_setups_and_rerun_measures_them_again(tmp_path):
    log, out = tmp_path / "log.jsonl", tmp_path / "r.jsonl"
    run(FakeChildren(log, sleep_s=0), out, plan([1]))
    run(FakeChildren(log, sleep_s=0), out, plan([1, 2]))
    assert [json.loads(line)[0] for line in log.read_text().splitlines()] == [1, 2]
    records = run(FakeChildren(log, sleep_s=0), out, plan([1, 2]), rerun=True)
    assert [json.loads(line)[0] for line in log.read_text().splitlines()] == [1, 2, 1, 2]
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


def test_a_gpu_is_named_by_the_same_route_in_the_parent_and_in_the_child(monkeypatch):
    # Without NVML, the parent (no CUDA context) asks torch in a short-lived process; the child
    # (which holds a context) asks torch directly: both get torch's name, so resume keys match.
    from stepbench.measure import telemetry

    monkeypatch.setattr(telemetry, "gpu_name", lambda index: None)
    calls = []

    class FakeCuda:
        initialized = False

        def is_initialized(self):
            return self.initialized

        def get_device_name(self, index):
            calls.append("in process")
            return "NVIDIA H200"

    fake_torch = type("torch", (), {"cuda": FakeCuda()})()
    monkeypatch.setitem(sys.modules, "torch", fake_torch)
    probe = type("Done", (), {"returncode": 0, "stdout": "NVIDIA H200"})
    monkeypatch.setattr(machine.subprocess, "run", lambda *a, **k: calls.append("probe") or probe)
    monkeypatch.setattr(machine, "_NAMES", {})
    parent = machine.gpu_name("cuda")
    monkeypatch.setattr(machine, "_NAMES", {})
    fake_torch.cuda.initialized = True
    child = machine.gpu_name("cuda")
    assert parent == child == "NVIDIA H200" and calls == ["probe", "in process"]
    assert machine.gpu_name("cpu") == "cpu"


def test_compiled_setups_get_their_own_cache_or_the_shared_one(tmp_path, monkeypatch):
    from stepbench.execute.executor import Job
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
