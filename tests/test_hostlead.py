"""The host's lead over the GPU (stepbench.hostlead): computed from synthetic clocks the way a
GPU process records them, the CPU's timing loop leaving it out, and the report's `^` mark on
records that carry `host_bound` (CPU records of stepbench 0.1, given the fields a GPU writes)."""

import copy
import statistics
import json
from pathlib import Path

import pytest

from says import names
from stepbench.cli import main
from stepbench.hostlead import HOST_BOUND_SHARE, host_bound, host_leads
from stepbench.measure.step import timed_steps

DATA = Path(__file__).parent / "data"


def clocks(host_ms: list[float], gpu_ms: list[float], anchor=(10.0, 10.00002)):
    """What a timed window records when the host takes `host_ms` to enqueue each step and the
    GPU `gpu_ms` to run it, the GPU starting each step when both its work and the previous step
    are there (the launch queue never full): the anchor's host clock readings, each end event
    after the anchor (ms) and the host clock when each step was enqueued (s)."""
    t0 = (anchor[0] + anchor[1]) / 2
    host, gpu, ends, enqueued = 0.0, 0.0, [], []
    for h, g in zip(host_ms, gpu_ms):
        host += h
        gpu = max(gpu, host - h) + g   # the GPU starts a step no earlier than its first launch
        gpu = max(gpu, host)           # and ends it no earlier than its last
        ends.append(gpu)
        enqueued.append(t0 + host / 1000)
    return anchor, ends, enqueued


def test_a_gpu_bound_step_leaves_the_host_far_ahead():
    anchor, ends, enqueued = clocks([30.0] * 10, [90.0] * 10)
    leads = host_leads(anchor, ends, enqueued)
    # The lead grows by 60 ms a step (the queue never fills here): the median is steps 5 and 6's.
    assert leads["host_lead_steps_ms"] == pytest.approx([60.0 * (i + 1) for i in range(10)])
    assert leads["host_lead_ms"] == pytest.approx(330.0)
    assert leads["host_lead_offset_ms"] == pytest.approx(0.01)
    assert not host_bound(leads["host_lead_ms"], 90.0)


def test_a_host_bound_step_is_finished_right_after_its_last_launch():
    # The host needs 100 ms a step, the GPU 86 of them; the GPU ends each step 0.2 ms after the
    # host's last launch (its last kernel).
    anchor, ends, enqueued = clocks([100.0] * 8, [86.0] * 8)
    ends = [e + 0.2 for e in ends]
    leads = host_leads(anchor, ends, enqueued)
    assert leads["host_lead_ms"] == pytest.approx(0.2)
    assert host_bound(leads["host_lead_ms"], 100.0)


def test_the_threshold_is_a_share_of_the_step():
    assert host_bound(HOST_BOUND_SHARE * 100.0 - 0.01, 100.0)
    assert not host_bound(HOST_BOUND_SHARE * 100.0 + 0.01, 100.0)
    # No lead (a CPU) and no step say nothing.
    assert not host_bound(None, 100.0) and not host_bound(1.0, None)


def test_the_anchor_puts_both_clocks_on_one():
    # The anchor's GPU time is the midpoint of the host readings around it; their distance is
    # the offset's uncertainty, and moves every lead by half of it at most.
    leads = host_leads((5.0, 5.002), [50.0], [5.03])
    assert leads["host_lead_ms"] == pytest.approx(5.001 * 1000 + 50.0 - 5.03 * 1000)
    assert leads["host_lead_offset_ms"] == pytest.approx(1.0)
    with pytest.raises(ValueError):
        host_leads((5.0, 5.002), [50.0, 60.0], [5.03])


def test_a_cpu_window_records_no_lead():
    # A CPU step is synchronous: the device never trails the host, and the loop is unchanged.
    leads: dict = {}
    losses: list = []
    times = timed_steps(lambda: 1.0, 3, False, losses, leads)
    assert len(times) == 3 and losses == [1.0] * 3 and leads == {}


BASE = {json.loads(line)["setup"]["mode"]: json.loads(line)
        for line in (DATA / "v0.1" / "cpu-results.jsonl").read_text().splitlines()}


def rec(mode: str, repeat: int, step: float, lead: float) -> dict:
    r = copy.deepcopy(BASE[mode])
    steps = [step, step + 0.4, step - 0.3, step + 0.1, step]
    bound = host_bound(lead, step)
    r.update(repeat=repeat, step_times_ms=steps, step_ms=sum(steps) / len(steps),
             host_lead_ms=lead, host_lead_steps_ms=[lead] * 5, host_lead_offset_ms=0.01,
             noise_flags=["host_bound"] if bound else [])
    return r


def report(capsys, tmp_path, records, fmt):
    path = tmp_path / "r.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    assert main(["report", str(path), "--format", fmt]) == 0
    out = capsys.readouterr().out
    return json.loads(out) if fmt == "json" else out


def test_the_report_marks_a_host_bound_row_and_still_compares_it(capsys, tmp_path):
    records = [rec("eager", i, 90.0, 0.3) for i in range(2)] + \
              [rec("compile", i, 68.0, 40.0) for i in range(2)]
    doc = report(capsys, tmp_path, records, "json")
    assert [r["noise_flags"] for r in doc["rows"]] == [["host_bound"], []]
    # Host-bound is the setup's nature on this host, not a disturbance: the rows are compared.
    assert names(" ".join(f["text"] for f in doc["findings"] if f["kind"] == "compile_speed"),
                 "68", "90")
    table = report(capsys, tmp_path, records, "markdown")
    assert "| 90^ |" in table or "| 90.0^ |" in table
    assert any(line.startswith("^ ") and names(line, "host", "5%") for line in table.splitlines())


class SimulatedGPU:
    """A host clock and one CUDA stream, for the timing loop's GPU branch on a CPU: a kernel
    starts when it is launched or when the one before it ends, an event completes when the
    stream reaches it, and synchronize waits for the stream."""

    def __init__(self, host_ms: float, gpu_ms: float, kernels: int = 100):
        self.host = self.stream = 1000.0          # seconds
        self.launch_s, self.kernel_s, self.kernels = host_ms / kernels / 1e3, gpu_ms / kernels / 1e3, kernels
        sim = self

        class Event:
            def __init__(self, enable_timing=False):
                self.at = None

            def record(self):
                self.at = sim.stream = max(sim.stream, sim.host)

            def synchronize(self):
                sim.host = max(sim.host, self.at)

            def elapsed_time(self, end):
                return (end.at - self.at) * 1000

        self.Event = Event

    def perf_counter(self) -> float:
        return self.host

    def synchronize(self) -> None:
        self.host = max(self.host, self.stream)

    def step(self) -> float:
        for _ in range(self.kernels):
            self.host += self.launch_s
            self.stream = max(self.stream, self.host) + self.kernel_s
        return 1.0


@pytest.mark.parametrize("host_ms, gpu_ms, bound", [(100.0, 86.0, True), (30.0, 90.0, False)])
def test_the_gpu_loop_measures_the_lead_it_was_given(monkeypatch, host_ms, gpu_ms, bound):
    from types import SimpleNamespace

    from stepbench.measure import step as measure_step

    sim = SimulatedGPU(host_ms, gpu_ms)
    monkeypatch.setattr(measure_step.torch.cuda, "Event", sim.Event)
    monkeypatch.setattr(measure_step.torch.cuda, "synchronize", sim.synchronize)
    monkeypatch.setattr(measure_step, "time", SimpleNamespace(perf_counter=sim.perf_counter))
    leads: dict = {}
    times = timed_steps(sim.step, 10, True, [], leads)
    # Each step takes the slower side's time; the lead is the last kernel's (0.86 ms) when the
    # host bounds the step, and grows by the GPU's surplus (60 ms) a step when the GPU does.
    assert times[1:] == pytest.approx([max(host_ms, gpu_ms)] * 9, rel=0.02)
    expected = 0.86 if bound else 60.0 * 5.5
    assert leads["host_lead_ms"] == pytest.approx(expected, rel=0.02)
    assert leads["host_lead_offset_ms"] == 0.0 and len(leads["host_lead_steps_ms"]) == 10
    assert host_bound(leads["host_lead_ms"], statistics.median(times)) is bound
