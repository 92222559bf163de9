"""A backend is one module and one registry entry: a toy backend defined here (no edit under src/)
is registered, chosen by the settings, and runs a real tiny CPU matrix through `stepbench run`'s
own path (cli/run.py, the runner, the records)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from stepbench import protocol as messages
from stepbench.cli import main
from stepbench.execute import registry
from stepbench.execute.protocol import Executor, Job, Outcome, now_iso, take, worker_command
from stepbench.execute.registry import Backend, Ran, Site
from stepbench.record import ResultsFile

from fakes import InProcess
from says import names


class ToyExecutor(Executor):
    """Each job a plain `python -m stepbench.measure.worker` process, read line by line."""

    host = "toy-host"               # tags the records and their resume key
    rental = {"provider": "toy", "price_per_hour": 0.5}

    def __init__(self, note):
        self.events: list[tuple[str, str]] = []     # (setup name, event) as they arrived
        self.ran: list[str] = []
        note("toy backend ready")

    def gpu_name(self, setup, slot):
        return "cpu"

    def run(self, job: Job, slot: str, timeout_s: float, on_message) -> Outcome:
        self.ran.append(job.setup.name)
        outcome = Outcome(started_at=now_iso())

        def seen(message: dict) -> None:
            self.events.append((job.setup.name, message["event"]))
            on_message(message)

        proc = subprocess.Popen(worker_command(sys.executable, job), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
        out, err = proc.communicate(timeout=timeout_s)
        for line in out.splitlines():
            take(messages.decode(line), outcome, seen)
        outcome.returncode, outcome.stderr_tail = proc.returncode, err.decode()[-2000:]
        outcome.finished_at = now_iso()
        return outcome

    def stop(self) -> None: ...


class ToySite(Site):
    def __init__(self, made: list):
        self.made = made

    def device(self, settings) -> str:
        return "cpu" if settings.device == "auto" else settings.device

    def executor(self, settings, plan, note):
        executor = ToyExecutor(note)
        self.made.append(executor)
        return executor


class ToyBackend(Backend):
    name = "toy"

    def __init__(self):
        self.made: list[ToyExecutor] = []

    def chosen(self, settings) -> bool:
        # Chosen by the settings alone, as the real ones are (--ray, --host, ...).
        return settings.device == "cpu" and settings.values["model"] == "llama-tiny"

    def open(self, settings, note) -> ToySite:
        return ToySite(self.made)


@pytest.fixture
def toy():
    backend = ToyBackend()
    registry.register(backend)
    try:
        yield backend
    finally:
        registry.unregister(backend.name)


CPU = ["--device", "cpu", "--model", "llama-tiny", "--mode", "eager", "--attn", "sdpa,eager",
       "--seq", "32", "--batch", "1", "--warmup", "1", "--steps", "2", "--repeats", "1"]


def test_the_registry_asks_a_registered_backend_first_and_the_local_one_last(toy):
    assert registry.names()[0] == "toy" and registry.names()[-1] == "local"
    assert registry.get("toy") is toy
    from stepbench.settings import RunSettings

    assert registry.choose(RunSettings.build({"device": "cpu", "model": "llama-tiny"})) is toy
    assert registry.choose(RunSettings.build({"device": "cpu"})).name == "local"
    assert registry.choose(RunSettings.build({"ray": "auto"})).name == "ray"
    assert registry.choose(RunSettings.build({"host": ["alpha"]})).name == "hosts"
    registry.unregister("toy")
    assert "toy" not in registry.names()
    assert registry.choose(RunSettings.build({"device": "cpu", "model": "llama-tiny"})).name \
        == "local"


@pytest.mark.slow
def test_a_toy_backend_runs_a_cpu_matrix_through_stepbench_run(toy, tmp_path, capsys):
    out = tmp_path / "toy.jsonl"
    assert main(["run", *CPU, "--out", str(out), "--format", "json"]) == 0
    [executor] = toy.made
    records = ResultsFile(out).latest()
    assert sorted(r.setup.name for r in records) == ["eager+eager", "eager+sdpa"]
    assert {r.status for r in records} == {"ok"}
    # What the executor declares reaches each record: its host and its rental.
    assert {r.host for r in records} == {"toy-host"}
    assert all(r.rental["provider"] == "toy" for r in records)
    assert all(r.step_ms > 0 and len(r.step_times_ms) == 2 for r in records)
    # The worker's own messages came through the toy executor, in order, for each setup.
    for name in ("eager+sdpa", "eager+eager"):
        events = [e for n, e in executor.events if n == name]
        assert events[0] == "start" and events[-1] == "result" and "progress" in events
    printed = json.loads(capsys.readouterr().out)
    assert sorted(r["setup"]["name"] for r in printed) == ["eager+eager", "eager+sdpa"]

    # The same command again resumes through the same backend: nothing runs.
    assert main(["run", *CPU, "--out", str(out), "--format", "json"]) == 0
    assert toy.made[1].ran == []
    assert len(ResultsFile(out).latest()) == 2


class Machine(InProcess):
    """One machine of a backend that runs a runner per machine (as SSH hosts do)."""

    def __init__(self, host: str):
        super().__init__(lambda job: [10.0, 11.0])
        self.host = host


class TwoMachines(Site):
    """A site that overrides `run`: its plan on two machines, one runner each; the second
    machine cannot be reached and says so in one line."""

    def __init__(self):
        self.machines = [Machine("alpha")]

    def device(self, settings) -> str:
        return "cpu"

    def run(self, settings, plan, store, display, measure) -> Ran:
        from stepbench.execute.runner import Runner

        runners = [Runner(machine, store) for machine in self.machines]
        records = [r for runner in runners for r in measure(runner, settings, plan, display)[0]]
        return Ran(records, [], runners[0].run_id, ["host beta: cannot be reached"])


class FleetBackend(Backend):
    name = "fleet-toy"
    remote = True

    def chosen(self, settings) -> bool:
        return settings.values["model"] == "llama-tiny" and settings.device == "cpu"

    def open(self, settings, note) -> TwoMachines:
        self.site = TwoMachines()
        return self.site


def test_a_backend_with_a_runner_per_machine_plugs_in_at_the_site(tmp_path, capsys):
    # `run` drives it as any other (no branch for it in cli/): the records of the machine that
    # ran, the line of the one that did not, exit 1.
    backend = FleetBackend()
    registry.register(backend)
    try:
        out = tmp_path / "fleet.jsonl"
        assert main(["run", *CPU, "--out", str(out), "--format", "json"]) == 1
    finally:
        registry.unregister(backend.name)
    records = ResultsFile(out).latest()
    assert sorted(r.setup.name for r in records) == ["eager+eager", "eager+sdpa"]
    assert {(r.host, r.status) for r in records} == {("alpha", "ok")}
    captured = capsys.readouterr()
    assert len(json.loads(captured.out)) == 2
    assert names(captured.err, "host beta", "cannot be reached")
