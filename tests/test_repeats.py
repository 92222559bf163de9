"""run's default repeats: two processes per setup, interleaved, and a third for the setups whose
two disagree (stepbench.noise.processes_disagree), interleaved too; resume by setup and repeat.

The executor here starts no process (fakes.InProcess): each job's step times are chosen by the
test, so that which processes disagree is known."""

from stepbench.execute.runner import Runner
from stepbench.record import ResultsFile
from stepbench.setup import Setup

from fakes import InProcess
from says import names


def plan(batches):
    return [Setup(model="llama-tiny", mode="eager", attn="sdpa", batch=b, seq=64, device="cpu")
            for b in batches]


def steady(ms: float) -> list[float]:
    """20 steps around `ms` with a coefficient of variation of about 1%."""
    return [ms * (1 + 0.01 * (-1) ** i) for i in range(20)]


def slower_second(*batches):
    """Step times where the second process of `batches` is 10% slower than the first (beyond
    their 1% noise); every other process of every setup agrees."""
    return lambda job: steady(110.0 if job.setup.batch in batches and job.repeat == 1 else 100.0)


class Notes:
    """A display that keeps the runner's notes."""

    def __init__(self):
        self.notes = []

    def note(self, text):
        self.notes.append(text)

    def __getattr__(self, name):
        return lambda *args, **kwargs: None


def run(executor, out, batches, repeats=None, **kwargs):
    return Runner(executor, ResultsFile(out)).run(plan(batches), repeats=repeats, timeout_s=60,
                                                  **kwargs)


def test_a_third_process_runs_only_for_the_setups_whose_two_disagree_interleaved(tmp_path):
    executor, display = InProcess(slower_second(1, 3)), Notes()
    records = run(executor, tmp_path / "r.jsonl", [1, 2, 3], display=display)
    # A B C, A B C, then the third round: A C.
    assert executor.ran == [(1, 0), (2, 0), (3, 0), (1, 1), (2, 1), (3, 1), (1, 2), (3, 2)]
    assert [(r.setup.batch, r.repeat) for r in records] == executor.ran
    assert [(r.setup.batch, r.repeat) for r in ResultsFile(tmp_path / "r.jsonl").read()] == \
        executor.ran
    # one note: how many setups get a third process, and which
    [note] = display.notes
    assert names(note, "third", "2 setups", "eager+sdpa batch 1 seq 64", "eager+sdpa batch 3 seq 64")
    assert "batch 2" not in note


def test_processes_that_agree_get_no_third(tmp_path):
    executor = InProcess(slower_second())
    run(executor, tmp_path / "r.jsonl", [1, 2])
    assert executor.ran == [(1, 0), (2, 0), (1, 1), (2, 1)]


def test_a_difference_within_the_processes_noise_gets_no_third(tmp_path):
    # 5% apart, but each process's steps spread by 3%: twice that spans the gap.
    def noisy(job):
        ms = 105.0 if job.repeat == 1 else 100.0
        return [ms * (1 + 0.03 * (-1) ** i) for i in range(20)]
    executor = InProcess(noisy)
    run(executor, tmp_path / "r.jsonl", [1])
    assert executor.ran == [(1, 0), (1, 1)]


def test_a_fixed_count_runs_that_many_and_no_third(tmp_path):
    executor = InProcess(slower_second(1))
    run(executor, tmp_path / "two.jsonl", [1, 2], repeats=2)
    assert executor.ran == [(1, 0), (2, 0), (1, 1), (2, 1)]
    executor = InProcess(slower_second(1))
    run(executor, tmp_path / "one.jsonl", [1, 2], repeats=1)
    assert executor.ran == [(1, 0), (2, 0)]


def test_a_one_process_file_resumes_by_adding_the_second_process(tmp_path):
    out = tmp_path / "r.jsonl"
    run(InProcess(slower_second(2)), out, [1, 2], repeats=1)      # a file from before
    executor = InProcess(slower_second(2))
    records = run(executor, out, [1, 2])
    assert executor.ran == [(1, 1), (2, 1), (2, 2)]
    assert [(r.setup.batch, r.repeat) for r in records] == [(1, 0), (2, 0), (1, 1), (2, 1),
                                                            (2, 2)]
    # Done: the same command again runs nothing, the third included.
    again = InProcess(slower_second(2))
    assert run(again, out, [1, 2]) == records and again.ran == []


def test_nothing_more_runs_after_a_process_of_the_first_two_was_stopped(tmp_path):
    def lost(job):
        return None if (job.setup.batch, job.repeat) == (2, 1) else slower_second(1)(job)
    executor = InProcess(lost)
    records = run(executor, tmp_path / "r.jsonl", [1, 2])
    assert executor.ran == [(1, 0), (2, 0), (1, 1), (2, 1)]
    assert [(r.setup.batch, r.repeat) for r in records] == [(1, 0), (2, 0), (1, 1)]
