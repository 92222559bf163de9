"""The progress lines on a stream that is not a terminal (a CI log, a pipe): a run's processes
numbered over the whole run ("[3/8]"), an estimate of the time left once a setup of each kind
has finished, a search's running count ("probe 5", "search 2/2, final 1") and a tune's budget
left. The real Runner drives the real Display; the executor starts no process (fakes.InProcess),
so each process's wall time is the test's."""

import io
import json
import re

from stepbench.execute.protocol import Outcome
from stepbench.execute.progress import Display, Estimate, kind
from stepbench.execute.runner import Runner
from stepbench.record import ResultsFile
from stepbench.search.max_batch import MaxBatch
from stepbench.search.tune import Tuner
from stepbench.settings import MaxBatchOptions
from stepbench.setup import Setup

from fakes import InProcess
from says import names

WALL_S = {"eager": 10.0, "compiled": 60.0}


def setup(mode: str, batch: int) -> Setup:
    return Setup(model="llama-tiny", mode=mode, attn="sdpa", batch=batch, seq=64, device="cpu")


def steady(job) -> list[float]:
    return [100.0, 101.0, 99.0]


def by_kind(job) -> float:
    return WALL_S[kind(job.setup)]


def finished_lines(text: str) -> list[str]:
    """The line of each process that ended or was found in the results file."""
    return [line for line in text.splitlines()
            if re.search(r"\(\d+ s\)(;|$)", line) or "already in" in line]


def time_left(line: str) -> str | None:
    """What a finished line says is left of the run ("4 min", "60 s"), or None."""
    said = re.search(r"; about (.+) left$", line)
    return said.group(1) if said else None


def test_a_run_is_numbered_over_all_its_processes_with_the_time_left_per_kind(tmp_path):
    stream = io.StringIO()
    plan = [setup("eager", 1), setup("compile", 1), setup("eager", 2), setup("compile", 2)]
    Runner(InProcess(steady, by_kind), ResultsFile(tmp_path / "r.jsonl")).run(
        plan, repeats=2, timeout_s=60, display=Display(stream, clock=lambda: 0.0))
    lines = finished_lines(stream.getvalue())
    assert [line.split("]")[0] for line in lines] == [f"stepbench: [{i}/8" for i in range(1, 9)]
    # No estimate until a compiled setup finished too (an eager one says nothing of a compile);
    # then each of the rest at its kind's wall, or its own setup's once that ran: 10 + 60 + 3
    # repeats (10, 60, 10, 60) = 210 s.
    # The family's golden line: a finished process, word for word.
    assert lines[0] == "stepbench: [1/8] eager+sdpa batch 1 seq 64: ok, 100.0 ms/step (10 s)"
    assert names(lines[1], "compile+sdpa", "batch 1", "ok", "100.0 ms", "(60 s)")
    assert time_left(lines[1]) == "4 min"
    assert names(lines[2], "(10 s)") and time_left(lines[2]) == "3 min"     # 200 s
    assert names(lines[6], "eager+sdpa", "batch 2", "repeat 2", "100.0 ms", "(10 s)")
    assert time_left(lines[6]) == "60 s"
    assert lines[7].endswith("(60 s)") and time_left(lines[7]) is None      # nothing left
    # Each phase line carries the same number, and nothing is said between phases.
    phases = [line for line in stream.getvalue().splitlines() if "[3/8]" in line]
    assert len(phases) == 2 and phases[1] == lines[2]
    assert names(phases[0], "[3/8]", "eager+sdpa", "batch 2", "starting")
    assert "(10 s)" not in phases[0]


def test_resumed_processes_are_numbered_and_the_estimate_counts_a_running_process_elapsed(tmp_path):
    out = tmp_path / "r.jsonl"
    Runner(InProcess(steady, by_kind), ResultsFile(out)).run(
        [setup("eager", 1)], repeats=1, timeout_s=60)
    stream = io.StringIO()
    Runner(InProcess(steady, by_kind), ResultsFile(out)).run(
        [setup("eager", 1), setup("eager", 2)], repeats=1, timeout_s=60,
        display=Display(stream, clock=lambda: 0.0))
    found, ran = finished_lines(stream.getvalue())
    assert names(found, "[1/2]", "eager+sdpa batch 1", "(ok)", "skipped") and "ms/step" not in found
    # The golden of a resumed process's line, word for word.
    assert found == "stepbench: [1/2] eager+sdpa batch 1 seq 64: already in the results file (ok), skipped"
    assert names(ran, "[2/2]", "eager+sdpa batch 2", "ok", "100.0 ms", "(10 s)")
    # Two eager processes left, one of them 4 s into its expected 10 s, on 1 slot: 16 s; on 2
    # slots they run side by side.
    estimate = Estimate()
    a, b, c = (_job(setup("eager", batch)) for batch in (1, 2, 3))
    estimate.add([a, b, c], slots=1)
    estimate.number(a)
    estimate.started(a, now=0.0)
    assert estimate.left_s(now=0.0) is None          # nothing of its kind has finished yet
    estimate.finished(a, 10.0)
    estimate.number(b)
    estimate.started(b, now=100.0)
    assert estimate.left_s(now=104.0) == 16.0
    estimate.slots = 2
    assert estimate.left_s(now=104.0) == 8.0


def _job(s: Setup):
    from stepbench.execute.protocol import Job

    return Job(s, 0)


class UpTo(InProcess):
    """Runs out of memory above batch `limit`."""

    def __init__(self, limit: int):
        super().__init__(steady, lambda job: 5.0)
        self.limit = limit

    def run(self, job, slot, timeout_s, on_message) -> Outcome:
        outcome = super().run(job, slot, timeout_s, on_message)
        if job.setup.batch > self.limit:
            outcome.result = {"status": "oom", "error": "out of memory",
                              "measured": {"phase": "first_step"}}
        return outcome


def test_max_batch_numbers_each_search_and_its_probes(tmp_path):
    stream = io.StringIO()
    runner = Runner(UpTo(limit=8), ResultsFile(tmp_path / "r.jsonl"))
    base = setup("eager", 4).replace(memory_limit_gb=2.0, warmup=2, steps=5)
    plan = [base, base.replace(seq=32)]
    MaxBatch(runner, MaxBatchOptions(limit=64), repeats=1, timeout_s=60,
             display=Display(stream)).run(plan)
    labels = [re.match(r"stepbench: \[(.*?)\] eager\+sdpa batch (\d+)", line).groups()
              for line in finished_lines(stream.getvalue())]
    # 4 and 8 fit, 16, 12, 10 and 9 do not: the full measurement at 8. The same for the
    # second search, numbered from 1 again.
    assert labels == [
        ("search 1/2, probe 1", "4"), ("search 1/2, probe 2", "8"),
        ("search 1/2, probe 3", "16"), ("search 1/2, probe 4", "12"),
        ("search 1/2, probe 5", "10"), ("search 1/2, probe 6", "9"),
        ("search 1/2, final 1", "8"),
        ("search 2/2, probe 1", "4"), ("search 2/2, probe 2", "8"),
        ("search 2/2, probe 3", "16"), ("search 2/2, probe 4", "12"),
        ("search 2/2, probe 5", "10"), ("search 2/2, probe 6", "9"),
        ("search 2/2, final 1", "8")]
    # A search's total is not known: no "[1/1]", no estimate of the time left.
    assert "[1/1]" not in stream.getvalue() and " left" not in stream.getvalue()


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class PricedInProcess(InProcess):
    """Each process advances the tune's clock by its wall time; eager attention runs out of
    memory, so the tune has something to skip."""

    def __init__(self, clock: Clock):
        super().__init__(steady, by_kind)
        self.clock = clock

    def run(self, job, slot, timeout_s, on_message) -> Outcome:
        outcome = super().run(job, slot, timeout_s, on_message)
        self.clock.now += outcome.wall_s
        s = job.setup
        tokens = s.batch * s.seq / 0.1 * (1.2 if s.mode == "compile" else 1.0)
        outcome.result["measured"].update(
            tokens_per_s=tokens, loss_first=6.9,
            losses=[6.9] * (1 + s.warmup + s.steps))
        return outcome


def test_a_tune_counts_its_processes_by_stage_and_says_the_budget_left(tmp_path):
    stream, clock = io.StringIO(), Clock()
    runner = Runner(PricedInProcess(clock), ResultsFile(tmp_path / "t.jsonl"))
    base = setup("eager", 4)
    space = {"mode": ["eager", "compile"], "attn": ["sdpa"], "compile_mode": ["default"],
             "compile_scope": ["model"], "dtype": ["bf16"], "kernels": ["none"],
             "optimizer": ["fused"], "checkpointing": [False]}
    result = Tuner(runner, base, space, budget_s=1800, objective="tokens", timeout_s=600,
                   repeats=2, clock=clock, display=Display(stream)).run()
    assert result.winner is not None
    lines = finished_lines(stream.getvalue())
    labels = [line.split("]")[0].removeprefix("stepbench: [") for line in lines]
    # Numbered within each stage (search/tune/results.py's STAGES): "ladder 1", "ladder 2", ...
    by_stage: dict[str, list[int]] = {}
    for label in labels:
        stage, number = label.rsplit(" ", 1)
        by_stage.setdefault(stage, []).append(int(number))
    assert all(numbers == list(range(1, len(numbers) + 1)) for numbers in by_stage.values())
    assert list(by_stage) == ["ladder", "compiled", "final"], labels
    assert len(by_stage["ladder"]) >= 3 and len(by_stage["final"]) >= 2
    # Each finished line ends with what the budget has left, as the tune's clock counts it.
    spent = 0.0
    for line in lines:
        spent += float(re.search(r"\((\d+) s\);", line).group(1))
        left = 1800 - spent
        minutes = left / 60
        said = f"{left:.0f} s" if left < 90 else f"{minutes:.0f} min"
        assert re.search(r"; (.+) of the budget left$", line).group(1) == said, line


def test_a_searchs_measurements_before_its_finals_ask_for_cached_peak_and_flops_only(tmp_path):
    # A search's processes before its finals (max-batch's probes, a tune's ladder and other
    # stages) must not pay the per-machine measurements that full runs cache; its finals, and a
    # plain run, ask for them.
    asked = []

    class Recording(InProcess):
        def run(self, job, slot, timeout_s, on_message):
            asked.append((job.setup.batch, json.loads(job.payload()).get("probe", False)))
            return super().run(job, slot, timeout_s, on_message)

    runner = Runner(Recording(steady), ResultsFile(tmp_path / "r.jsonl"))
    runner.run([setup("eager", 1)], timeout_s=60,
               tag={"kind": "max_batch", "role": "probe", "start_batch": 1, "step": 0})
    runner.run([setup("eager", 2)], timeout_s=60,
               tag={"kind": "max_batch", "role": "final", "start_batch": 1, "step": 1})
    runner.run([setup("eager", 4)], timeout_s=60)
    runner.run([setup("eager", 8)], timeout_s=60,
               tag={"kind": "tune", "stage": "ladder", "role": "reference"})
    runner.run([setup("eager", 16)], timeout_s=60,
               tag={"kind": "tune", "stage": "final", "role": "candidate"})
    assert asked == [(1, True), (2, False), (4, False), (8, True), (16, False)]
