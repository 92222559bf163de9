"""The max-batch search's decisions (search/max_batch.py), driven by a stand-in runner.

The stand-in answers each setup from a rule of what fits (no process, so every threshold from 1
to 300 can be tried) and keeps its records as a results file would: a setup it already has is
answered from the store, as the real Runner does on resume. tests/test_max_batch.py runs the
search for real, under a real memory limit.
"""

import json
import math
import re
from dataclasses import replace
from pathlib import Path

import pytest

from stepbench.execute.runner import least_processes
from stepbench.record import Machine, Record
from stepbench.search.max_batch import MaxBatch, starts
from stepbench.settings import MaxBatchOptions
from stepbench.setup import Setup
from says import names

CPU = Setup(model="llama-tiny", mode="eager", attn="sdpa", batch=4, seq=128, device="cpu",
            warmup=2, steps=3, memory_limit_gb=1.1)
GPU = Setup(model="llama-468m", mode="compile", attn="sdpa", batch=4, seq=2048, device="cuda",
            warmup=4, steps=20)


class StandIn:
    """The Runner's interface: `run(plan, repeats=, timeout_s=, tag=, display=)` -> records."""

    def __init__(self, status, peak_gb=lambda setup: None, gpu_memory_gb=None):
        self.status, self.peak_gb, self.gpu_memory_gb = status, peak_gb, gpu_memory_gb
        self.store: dict[tuple, Record] = {}
        self.started = 0          # "processes" started
        self.asked: list = []     # (role, repeats) of each call

    def run(self, plan, *, repeats=1, timeout_s=None, tag=None, display=None, retry=True):
        self.asked.append(((tag or {}).get("role"), repeats))
        out = []
        for setup in plan:
            for repeat in range(least_processes(repeats)):
                key = (setup.key(), repeat)
                if key not in self.store:
                    self.started += 1
                    status = self.status(setup)
                    self.store[key] = Record(
                        run_id="r", repeat=repeat, setup=setup, status=status,
                        step_ms=10.0 * setup.batch if status == "ok" else None,
                        peak_reserved_gb=self.peak_gb(setup) if status == "ok" else None,
                        phase="done" if status == "ok" else "first_step", search=tag,
                        machine=Machine(gpu="cpu" if setup.device == "cpu" else "NVIDIA H200",
                                        gpu_memory_gb=self.gpu_memory_gb))
                out.append(self.store[key])
        return out


def fits_up_to(limit):
    return lambda setup: "ok" if setup.batch <= limit else "oom"


def search(runner, setup=CPU, repeats=1, **options):
    [found] = MaxBatch(runner, MaxBatchOptions(**options), repeats=repeats,
                       timeout_s=60).run([setup])
    return found


@pytest.mark.parametrize("start", [1, 5, 64])
def test_the_chosen_batch_fits_and_one_half_again_as_big_does_not(start):
    for largest in range(1, 201):
        found = search(StandIn(fits_up_to(largest)), setup=replace(CPU, batch=start))
        assert found.stopped is None
        assert found.measured == found.chosen == found.largest_fit, largest
        assert found.chosen <= largest < math.ceil(found.chosen * 1.5), (start, largest)
        # Bisected down to an eighth: the smallest batch seen not to fit is close above.
        assert found.smallest_oom - found.chosen <= max(1, found.chosen // 8)


def test_doubling_then_bisecting_probes_in_order():
    runner = StandIn(fits_up_to(37))
    found = search(runner)
    assert [(p.batch, p.step, p.status) for p in found.probes] == [
        (4, "start", "ok"), (8, "double", "ok"), (16, "double", "ok"), (32, "double", "ok"),
        (64, "double", "oom"), (48, "bisect", "oom"), (40, "bisect", "oom"),
        (36, "bisect", "ok")]
    assert (found.chosen, found.largest_fit, found.smallest_oom) == (36, 36, 40)
    # Probes are short (1 warm-up + --probe-steps); the full measurement uses the run's steps.
    assert {(p.record.setup.warmup, p.record.setup.steps) for p in found.probes} == {(1, 2)}
    [final] = found.finals
    assert (final.setup.batch, final.setup.warmup, final.setup.steps) == (36, 2, 3)
    assert final.search == {
        "kind": "max_batch", "role": "final", "start_batch": 4, "largest_fit": 36,
        "smallest_oom": 40, "chosen": 36, "margin": None, "capacity_gb": None,
        "probes": [[4, "ok", None], [8, "ok", None], [16, "ok", None], [32, "ok", None],
                   [64, "oom", None], [48, "oom", None], [40, "oom", None], [36, "ok", None]],
        "stepped_down_from": []}
    assert found.probes[4].record.search == {"kind": "max_batch", "role": "probe",
                                             "start_batch": 4, "step": "double"}


def test_a_start_batch_that_does_not_fit_is_halved():
    found = search(StandIn(fits_up_to(5)), setup=replace(CPU, batch=16))
    assert [(p.batch, p.step) for p in found.probes] == [
        (16, "start"), (8, "halve"), (4, "halve"), (6, "bisect"), (5, "bisect")]
    assert found.measured == 5


def test_nothing_fits_stops_without_a_measurement():
    found = search(StandIn(fits_up_to(0)))
    assert [p.batch for p in found.probes] == [4, 2, 1]
    assert found.stopped == "oom" and found.finals == [] and found.chosen is None
    assert names(found.summary(), "batch 1", "seq 128")


def test_the_limit_stops_the_doubling():
    found = search(StandIn(fits_up_to(10_000)), limit=20)
    assert [p.batch for p in found.probes] == [4, 8, 16, 20]
    assert found.measured == 20 and found.smallest_oom is None
    assert names(found.summary(), "--max-batch-limit 20")


def test_a_probe_that_fails_otherwise_stops_that_search():
    runner = StandIn(lambda s: "timeout" if s.batch == 16 else "ok")
    found = search(runner)
    assert [p.batch for p in found.probes] == [4, 8, 16]
    assert found.stopped == "timeout" and found.finals == []
    assert names(found.summary(), "batch 16", "timeout")


def test_on_a_gpu_the_margin_keeps_the_chosen_batch_below_the_capacity():
    # 2 GB per sequence of 100 GB: batch 50 runs, but only up to 47 leaves 5% free.
    runner = StandIn(fits_up_to(50), peak_gb=lambda s: 2.0 * s.batch, gpu_memory_gb=100.0)
    found = search(runner, setup=GPU)
    assert found.capacity_gb == 100.0 and found.margin == 0.05
    assert 2.0 * found.chosen <= 95.0 < 2.0 * math.ceil(found.chosen * 1.125)
    tag = found.finals[0].search
    assert tag["margin"] == 0.05 and tag["capacity_gb"] == 100.0 and tag["chosen"] == found.chosen
    # The largest batch seen to fit is recorded even when the margin chose a smaller one.
    ran = [b for b, status, _ in tag["probes"] if status == "ok"]
    assert tag["largest_fit"] == max(ran) >= found.chosen
    # A memory cap is the capacity when set.
    capped = search(StandIn(fits_up_to(50), peak_gb=lambda s: 0.5 * s.batch,
                            gpu_memory_gb=100.0),
                    setup=replace(GPU, memory_limit_gb=20.0), margin=0.1)
    assert capped.capacity_gb == 20.0 and 0.5 * capped.chosen <= 18.0


def test_a_full_measurement_out_of_memory_steps_down_to_the_next_batch_that_fit():
    # Probes fit up to 20; the full measurement (more steps) only up to 16.
    runner = StandIn(lambda s: "ok" if s.batch <= (20 if s.steps == 2 else 16) else "oom")
    found = search(runner, setup=replace(CPU, batch=8), repeats=2)
    assert found.chosen == 20 and found.stepped_down_from == [20] and found.measured == 16
    assert [(r.setup.batch, r.repeat, r.status) for r in found.finals] == [
        (20, 0, "oom"), (20, 1, "oom"), (16, 0, "ok"), (16, 1, "ok")]
    assert found.finals[-1].search["stepped_down_from"] == [20]
    assert found.finals[-1].search["chosen"] == 16


def test_the_full_measurement_takes_the_runs_repeats_and_probes_one_process():
    runner = StandIn(fits_up_to(20))
    found = search(runner, setup=replace(CPU, batch=8), repeats=None)
    assert found.measured == 20
    assert {asked for asked in runner.asked} == {("probe", 1), ("final", None)}


def test_rerunning_replays_the_decisions_from_the_store():
    runner = StandIn(fits_up_to(37))
    first = search(runner)
    started = runner.started
    again = search(runner)
    assert runner.started == started    # nothing new ran
    assert [p.as_list() for p in again.probes] == [p.as_list() for p in first.probes]
    assert again.finals == first.finals


def test_setups_that_differ_only_in_batch_are_one_search_from_the_smallest():
    plan = [replace(CPU, batch=b, attn=a) for a in ("sdpa", "eager") for b in (8, 2, 4)]
    assert [(s.attn, s.batch) for s in starts(plan)] == [("sdpa", 2), ("eager", 2)]


BAD = [
    (["--probe-steps", "3"], "--probe-steps sets up the batch search; add --max-batch (or drop it)"),
    (["--max-batch"], "--max-batch on the CPU needs --memory-limit-gb, the cap to search under"),
    (["--max-batch", "--memory-limit-gb", "2", "--warmup", "1", "--steps", "2"],
     "--warmup 1 --steps 2 are the probes' own steps, so the full measurement would be a probe"),
    (["--max-batch", "--memory-limit-gb", "2", "--parallel", "ddp"],
     "--max-batch searches the batch of one process; drop --parallel ddp"),
    (["--max-batch", "--host", "gpu-a"], "--max-batch runs its probes on this machine; drop --host"),
    (["--max-batch", "--memory-limit-gb", "2", "--batch", "8", "--max-batch-limit", "4"],
     "--max-batch-limit 4 is below the start batch 8; raise the limit or lower --batch"),
    (["--max-batch", "--memory-limit-gb", "2", "--memory-margin", "100"],
     "--memory-margin is a percentage from 0 to 99, got 100"),
    (["--max-batch", "--memory-limit-gb", "2", "--probe-steps", "0"],
     "--probe-steps must be an integer >= 1, got 0"),
]


@pytest.mark.parametrize("args, message", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_combinations_are_one_line_naming_the_fix(args, message, capsys, tmp_path):
    from stepbench.cli import main

    out = tmp_path / "r.jsonl"
    assert main(["run", "--device", "cpu", *args, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err
    assert not out.exists() or out.read_text() == ""


def test_a_plan_asks_for_the_search_with_a_boolean(tmp_path, capsys):
    from stepbench.cli import main

    plan = tmp_path / "plan.toml"
    plan.write_text('device = "cpu"\nmax_batch = 1\n')
    assert main(["run", "--plan", str(plan), "--dry-run"]) == 2
    assert names(capsys.readouterr().err, "max_batch", "got 1")
    plan.write_text('device = "cpu"\nmax_batch = true\nmemory_limit_gb = 2\nmax_batch_limit = 64\n'
                    'probe_steps = 3\n[axes]\nmodes = "eager"\nattn = "sdpa"\nbatch = [8, 2]\n')
    assert main(["run", "--plan", str(plan), "--dry-run", "--format", "json"]) == 0
    [item] = json.loads(capsys.readouterr().out)
    # One search from the smallest batch; no margin on the CPU.
    assert (item["start_batch"], item["limit"], item["margin"]) == (2, 64, None)
    assert item["probe"] == {"warmup": 1, "steps": 3}
    # The full measurement takes run's default: 2 processes, and a third where they disagree.
    assert item["final"] == {"warmup": 4, "steps": 20, "repeats": None}
    assert main(["run", "--plan", str(plan), "--dry-run"]) == 0
    assert names(capsys.readouterr().out, "4 warm-up", "20 timed steps x 2", "a third")
    assert main(["run", "--plan", str(plan), "--dry-run", "--repeats", "3"]) == 0
    out = capsys.readouterr().out
    assert names(out, "4 warm-up", "20 timed steps x 3") and "a third" not in out


def test_the_schema_document_names_every_key_of_the_tags():
    doc = (Path(__file__).parent.parent / "docs" / "results-schema.md").read_text()
    section = doc[doc.index("## `search` of `run --max-batch`"):doc.index("## `machine`")]
    documented = set(re.findall(r"^\| ([a-z_]+) \| (?:both|probe|final) \|", section, re.M))
    found = search(StandIn(fits_up_to(5)))
    tags = [p.record.search for p in found.probes] + [r.search for r in found.finals]
    assert documented == {key for tag in tags for key in tag}
