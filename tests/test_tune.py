"""stepbench tune: the search's decisions against a model of a GPU (fast, exact), and one real
tune of a tiny model on this CPU (budget, loss guard, resume after an interruption)."""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import math
import re
import os
import signal
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from stepbench.cli import build_parser, main
from stepbench.cli.run import settings_of
from stepbench.guard import DEPARTS, UNCHECKED
from stepbench.record import Record, ResultsFile, resume_key
from stepbench.execute.executor import KILL_GRACE_S
from stepbench.search.tune import Tried, Tuner
from stepbench.settings import parse_budget
from stepbench.setup import Setup

from conftest import on_a_terminal, wait_for, DIVERGE_ENV, with_hooks

# ---------------------------------------------------------------- a model of a GPU

SPEED = {("eager", "sdpa"): 90e3, ("eager", "eager"): 60e3, ("eager", "flex_attention"): 30e3,
         ("compile", "sdpa"): 120e3, ("compile", "flex_attention"): 140e3,
         ("compile", "eager"): 100e3}
GB_PER_SEQUENCE = {"eager": 5.0, "compile": 3.0}
CAPACITY_GB = 100.0
FLOAT8 = {"runs": False}    # float8 fails, unless a test makes it run: 10% faster, drifting


def gpu_model(s: Setup) -> tuple[str, float | None, float, float]:
    """(status, tokens/s, first loss, process wall s) of a setup on an imaginary GPU."""
    wall = 400.0 if s.compile_mode.startswith("max-autotune") else 60.0 if s.mode == "compile" \
        else 15.0
    memory = s.batch * GB_PER_SEQUENCE[s.mode] * (2 if s.attn == "eager" else 1) * \
        (0.4 if s.checkpointing else 1)
    if memory > CAPACITY_GB:
        return "oom", None, math.nan, wall
    if s.dtype == "float8" and not FLOAT8["runs"]:
        return "error", None, math.nan, wall
    tokens = SPEED[(s.mode, s.attn)] * (1 + 0.1 * math.log2(s.batch / 4))
    tokens *= {"none": 1, "liger-no-flce": 1.05, "liger": 1.2}[s.kernels]
    tokens *= {"default": 1, "reduce-overhead": 1.01, "max-autotune-no-cudagraphs": 1.005}[
        s.compile_mode]
    tokens *= (0.98 if s.optimizer == "foreach" else 1) * (0.8 if s.compile_scope == "layer"
                                                           else 1) * (0.75 if s.checkpointing else 1)
    tokens *= 1.1 if s.dtype == "float8" else 1
    loss = 111.5 if s.kernels == "liger" else 10.575   # liger's fused cross-entropy departs
    return "ok", tokens, loss, wall + (s.warmup + s.steps) * s.batch * s.seq / tokens


def losses(s: Setup, first: float) -> list[float]:
    """One loss a step; float8's drifts 0.5% a step away (as on the H200: within 1.2% after 8
    steps, 14% apart after 25), so only a long run shows it."""
    drift = 0.005 if s.dtype == "float8" else 0.0
    return [first * (1 + drift * i) for i in range(s.warmup + s.steps + 1)]


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class FakeRunner:
    """The Runner's interface (run, run_id, store), measuring with gpu_model."""

    def __init__(self, store: ResultsFile, clock: Clock, run_id: str = "fake"):
        self.store, self.clock, self.run_id = store, clock, run_id
        self.new: list[Record] = []

    def run(self, plan, *, repeats=1, timeout_s, tag=None, display=None):
        done = {r.resume_key(): r for r in self.store.latest()}
        out = []
        for repeat in range(repeats):
            for s in plan:
                key = resume_key(s, repeat, "cpu")
                if key in done:
                    out.append(done[key])
                    continue
                status, tokens, loss, wall = gpu_model(s)
                if wall > timeout_s:
                    status, tokens, wall = "timeout", None, timeout_s
                self.clock.now += wall
                ms = s.batch * s.seq / tokens * 1e3 if tokens else None
                steps = [ms * (1 + 0.002 * ((i + repeat) % 5)) for i in range(s.steps)] if ms else []
                record = Record(run_id=self.run_id, repeat=repeat, setup=s, status=status,
                                step_ms=sum(steps) / len(steps) if steps else None,
                                step_ms_median=statistics.median(steps) if steps else None,
                                step_times_ms=steps, tokens_per_s=tokens,
                                peak_memory_gb=None if status != "ok" else 1.0,
                                losses=losses(s, loss) if tokens else [],
                                loss_first=loss if tokens else None, wall_s=wall,
                                search=tag)
                self.store.append(record)
                self.new.append(record)
                out.append(record)
        return out


SPACE = {"mode": ["eager", "compile"], "attn": ["sdpa", "flex_attention", "eager"],
         "compile_mode": ["default", "reduce-overhead", "max-autotune-no-cudagraphs"],
         "compile_scope": ["model", "layer"], "dtype": ["bf16", "float8"],
         "kernels": ["none", "liger-no-flce", "liger"], "optimizer": ["fused", "foreach"],
         "checkpointing": [False, True]}
BASE = Setup(model="llama-468m", mode="eager", attn="sdpa", batch=4, seq=2048, device="cuda",
             init="device")


def tune_with(tmp_path, budget_s: float, name: str = "tune.jsonl", run_id: str = "fake",
              objective: str = "tokens", base: Setup = BASE):
    store = ResultsFile(tmp_path / name)
    clock = Clock()
    runner = FakeRunner(store, clock, run_id)
    tuner = Tuner(runner, base, dict(SPACE), budget_s=budget_s, objective=objective,
                  timeout_s=1800, repeats=3, clock=clock)
    return tuner.run(), runner


def test_the_search_finds_the_fastest_setup_whose_losses_agree(tmp_path):
    result, runner = tune_with(tmp_path, budget_s=3600)
    probes = [r.setup for r in runner.new if r.search["role"] == "probe"]
    # The winner: compiled flex attention, its batch grown to the largest that fits (100 GB at
    # 3 GB a sequence: 32; 64 and the bisection's 48 ran out of memory), with liger's norms,
    # RoPE and SwiGLU kept (5% faster); measured in full, 3 processes.
    w = result.winner.setup
    assert (w.mode, w.attn, w.batch, w.kernels, w.dtype) == ("compile", "flex_attention", 32,
                                                              "liger-no-flce", "bf16")
    assert result.measured_in_full and (w.warmup, w.steps) == (4, 20)
    assert sum(1 for t in result.tried if t.stage == "final" and t.record.setup == w) == 3
    # liger with its fused cross-entropy was faster still (1.2x) but departs: flagged, never a
    # finalist, never the winner.
    liger = [t for t in result.tried if t.record.setup.kernels == "liger"]
    assert liger and all(t.stage != "final" for t in liger)
    from stepbench.guard import loss_verdicts
    verdicts = loss_verdicts([t.record for t in result.tried])
    assert all(verdicts[(t.record.setup.key(), "cpu")].status == DEPARTS for t in liger)
    # Checkpointing let batch 64 run, but no eager reference fit there to check its losses:
    # unchecked, so not a finalist either.
    unchecked = [t.record.setup for t in result.tried
                 if verdicts.get((t.record.setup.key(), "cpu")) is not None
                 and verdicts[(t.record.setup.key(), "cpu")].status == UNCHECKED]
    assert unchecked and not {dataclasses.replace(s, warmup=4, steps=20) for s in unchecked} & \
        {t.record.setup for t in result.tried if t.stage == "final"}
    # Pruned: eager attention is not compiled once sdpa beat it in eager mode; no batch beyond
    # the one that ran out of memory; float8 failed and was not kept.
    assert not any(s.mode == "compile" and s.attn == "eager" for s in probes)
    assert any("eager attention: not compiled" in s for s in result.skipped)
    flex = [s.batch for s in probes if (s.mode, s.attn, s.kernels) ==
            ("compile", "flex_attention", "none") and not s.checkpointing]
    assert max(flex) == 64 and 48 in flex and all(b in (4, 8, 16, 32, 48, 64) for b in flex)
    assert any(s.dtype == "float8" for s in probes) and w.dtype != "float8"
    # Every batch a candidate ran at has an eager reference for the loss guard.
    for batch in {s.batch for s in probes if s.mode == "compile"} - {48, 64}:
        assert any(s.mode == "eager" and s.attn == "sdpa" and s.batch == batch for s in probes)
    # The runner-up is the next best setup, and the two were tested against each other.
    assert result.runner_up.setup != w and result.comparison["significant"] is True
    assert result.spent_s <= 3600


def test_fit_finds_the_fastest_setup_that_fits_the_batch_with_checkpointing_if_need_be(tmp_path):
    # Batch 48 fits no setup without recomputing activations (144 GB and more against 100).
    result, runner = tune_with(tmp_path, budget_s=3600, objective="fit",
                               base=dataclasses.replace(BASE, batch=48))
    assert {r.setup.batch for r in runner.new} == {48}          # the batch is not searched
    assert not any(r.status == "ok" and not r.setup.checkpointing for r in runner.new)
    w = result.winner.setup
    assert w.checkpointing and (w.mode, w.attn, w.batch) == ("compile", "flex_attention", 48)


def test_a_small_budget_is_kept_and_what_did_not_fit_is_said(tmp_path):
    result, runner = tune_with(tmp_path, budget_s=400)
    assert result.spent_s <= 400
    assert result.winner is not None
    assert any("not tried, the budget has" in s for s in result.skipped)
    # The probes never ran past what the budget had left: each one's timeout was that.
    assert sum(r.wall_s for r in runner.new) <= 400


def test_a_probe_is_priced_by_the_slowest_like_it_of_its_own_precision(tmp_path):
    # On the H200 a float8 compile took 174 s against 76-98 s in bf16; priced at 174 s, the
    # bf16 options after it were not tried with 83 s left. Now a bf16 probe is priced by the
    # bf16 ones, float8 by float8, and a precision not seen yet by the slowest of any.
    store = ResultsFile(tmp_path / "t.jsonl")
    clock = Clock()
    tuner = Tuner(FakeRunner(store, clock), BASE, dict(SPACE), budget_s=3600,
                  objective="tokens", timeout_s=1800, repeats=3, clock=clock)
    base = dataclasses.replace(tuner.base, mode="compile", attn="flex_attention")
    for setup, wall in [(base, 76.0), (dataclasses.replace(base, batch=8), 98.0),
                        (dataclasses.replace(base, dtype="float8"), 174.0),
                        (dataclasses.replace(base, mode="eager"), 15.0)]:
        tuner.tried.append(Tried("screen", Record(run_id="x", repeat=0, setup=setup,
                                                  status="ok", wall_s=wall)))
    assert tuner.estimate_s(dataclasses.replace(base, optimizer="foreach")) == 98.0
    assert tuner.estimate_s(dataclasses.replace(base, batch=16, dtype="float8")) == 174.0
    assert tuner.estimate_s(dataclasses.replace(base, dtype="fp32")) == 174.0
    assert tuner.estimate_s(dataclasses.replace(base, mode="eager", attn="sdpa")) == 15.0
    autotune = dataclasses.replace(base, compile_mode="max-autotune-no-cudagraphs")
    assert tuner.estimate_s(autotune) == 420.0      # the prior: nothing like it ran


def test_a_finalist_whose_losses_drift_apart_over_the_full_run_is_dropped(tmp_path, monkeypatch):
    monkeypatch.setitem(FLOAT8, "runs", True)
    result, runner = tune_with(tmp_path, budget_s=3600)
    # In the probes (2 + 5 steps) float8 agrees (3% apart, tolerance 5%) and is 10% faster: it
    # is kept and is the first finalist...
    float8 = [t for t in result.tried if t.record.setup.dtype == "float8"]
    assert any(t.stage == "option" for t in float8)
    finals = [t for t in float8 if t.stage == "final"]
    # ...but over the final 25 steps it is checked against an eager reference of 25 steps at
    # its batch, departs, is measured no more, and the next best probe takes its place (here
    # the float8 variants kept after it, foreach and autotuned, one after the other).
    assert finals and len({t.record.setup for t in finals}) == len(finals)
    assert sum("dropped" in text and "float8" in text for text in result.skipped) == len(finals)
    # (batch 32 does not fit eager: the reference recomputes its activations.)
    refs = [r for r in runner.new if (r.search or {}).get("role") == "reference"]
    assert [(r.setup.mode, r.setup.attn, r.setup.batch, r.setup.warmup + r.setup.steps,
             r.setup.checkpointing, r.status) for r in refs] == \
        [("eager", "sdpa", 32, 24, False, "oom"), ("eager", "sdpa", 32, 24, True, "ok")]
    from stepbench.guard import loss_verdicts
    verdict = loss_verdicts([t.record for t in result.tried])[
        (finals[0].record.setup.key(), finals[0].record.machine.gpu)]
    assert verdict.status == DEPARTS and verdict.steps == 25
    w, second = result.winner.setup, result.runner_up.setup
    assert w.dtype == second.dtype == "bf16" and result.measured_in_full
    assert (w.mode, w.attn, w.batch, w.kernels) == ("compile", "flex_attention", 32,
                                                    "liger-no-flce")
    assert sum(1 for t in result.tried if t.stage == "final" and t.record.setup == w) == 3
    assert sum(1 for t in result.tried if t.stage == "final" and t.record.setup == second) == 3
    # The reference measured in full is in the result, the JSON and the summary.
    assert result.reference is refs[-1]
    assert result.to_dict()["reference"]["setup"]["checkpointing"] is True
    from stepbench.report.tune import verdict
    line = next(text for text in verdict(result) if text.startswith("Measured in full"))
    assert f"{result.winner.tokens_per_s / refs[-1].tokens_per_s:.2f}x" in line


def test_without_a_reference_in_full_the_tune_says_its_finals_were_checked_over_fewer_steps(
        tmp_path):
    class ReferenceFails(FakeRunner):
        def run(self, plan, *, repeats=1, timeout_s, tag=None, display=None):
            if (tag or {}).get("role") != "reference":
                return super().run(plan, repeats=repeats, timeout_s=timeout_s, tag=tag)
            record = Record(run_id=self.run_id, repeat=0, setup=plan[0], status="error",
                            error="RuntimeError: no", wall_s=5.0, search=tag)
            self.clock.now += 5.0
            self.store.append(record)
            return [record]

    store, clock = ResultsFile(tmp_path / "t.jsonl"), Clock()
    tuner = Tuner(ReferenceFails(store, clock), BASE, dict(SPACE), budget_s=3600,
                  objective="tokens", timeout_s=1800, repeats=3, clock=clock)
    result = tuner.run()
    assert result.measured_in_full and result.reference is None
    assert "final: no eager reference measured in full at batch 32; the finals there are " \
        "checked over the probes' steps only" in result.skipped


def test_a_finalist_that_departed_is_never_the_winner_even_when_no_final_ran(tmp_path,
                                                                              monkeypatch):
    # float8 departs over the full run; every other final times out (say, the machine went
    # bad): no final is measured, and the fallback to the best probe must not pick float8,
    # whose probe is the fastest.
    monkeypatch.setitem(FLOAT8, "runs", True)

    class FinalsTimeOut(FakeRunner):
        def run(self, plan, *, repeats=1, timeout_s, tag=None, display=None):
            if (tag or {}).get("role") == "final" and plan[0].dtype != "float8":
                timeout_s = 1.0
            return super().run(plan, repeats=repeats, timeout_s=timeout_s, tag=tag)

    store, clock = ResultsFile(tmp_path / "t.jsonl"), Clock()
    tuner = Tuner(FinalsTimeOut(store, clock), BASE, dict(SPACE), budget_s=3600,
                  objective="tokens", timeout_s=1800, repeats=3, clock=clock)
    result = tuner.run()
    finals = [t.record for t in result.tried if t.stage == "final"]
    assert any(r.setup.dtype == "float8" and r.ok for r in finals)
    assert all(r.status == "timeout" for r in finals
               if r.setup.dtype != "float8" and r.search["role"] == "final")
    assert result.winner is None and result.runner_up is None and not result.measured_in_full
    assert "final: nothing measured in full; every finalist failed or departed from its " \
        "reference, so there is no winner" in result.skipped


def test_one_slow_step_in_a_probe_does_not_stop_the_batch_from_growing(tmp_path):
    # On the H200 (llama-135m), a batch-32 probe timed 201, 198, 208, 205 and 1351 ms: its mean
    # was 2.1x its median. Here compiled flex attention's batch-16 probe has such a last step:
    # by its mean it is slower than batch 8 and the growth would stop there.
    class Hiccup(FakeRunner):
        def run(self, plan, *, repeats=1, timeout_s, tag=None, display=None):
            out = super().run(plan, repeats=repeats, timeout_s=timeout_s, tag=tag)
            s = plan[0]
            if (tag or {}).get("role") == "probe" and (s.mode, s.attn, s.batch, s.kernels) \
                    == ("compile", "flex_attention", 16, "none") and len(self.new) and \
                    self.new[-1].setup == s:
                r = self.new[-1]
                r.step_times_ms[-1] *= 8
                r.step_ms = sum(r.step_times_ms) / len(r.step_times_ms)
                r.step_ms_median = statistics.median(r.step_times_ms)
                r.tokens_per_s = s.batch * s.seq / r.step_ms * 1e3
            return out

    store, clock = ResultsFile(tmp_path / "t.jsonl"), Clock()
    tuner = Tuner(Hiccup(store, clock), BASE, dict(SPACE), budget_s=3600, objective="tokens",
                  timeout_s=1800, repeats=3, clock=clock)
    lines: list[str] = []
    tuner.say = lines.append
    result = tuner.run()
    [spiky] = [t.record for t in result.tried if t.stage == "batch" and t.record.setup.batch == 16
               and t.record.setup.attn == "flex_attention"]
    eight = next(t.record for t in result.tried if t.stage == "batch"
                 and t.record.setup.batch == 8 and t.record.setup.attn == "flex_attention")
    assert spiky.tokens_per_s < eight.tokens_per_s      # its mean: slower than batch 8
    assert result.winner.setup.batch == 32             # its median step: grown on, as before
    assert any("by its median step, which the search goes by" in line for line in lines)


def test_the_guard_checks_a_long_run_against_the_longest_reference(tmp_path):
    from stepbench.guard import loss_verdicts

    def record(steps, dtype="bf16", mode="eager", drift=0.0):
        setup = dataclasses.replace(BASE, mode=mode, dtype=dtype, warmup=0, steps=steps - 1)
        return Record(run_id="x", repeat=0, setup=setup, status="ok",
                      losses=[10 * (1 + drift * i) for i in range(steps)])

    short_ref, long_ref = record(8), record(25)
    drifting = record(25, dtype="float8", mode="compile", drift=0.005)
    verdicts = loss_verdicts([short_ref, long_ref, drifting])
    verdict = verdicts[(drifting.setup.key(), drifting.machine.gpu)]
    assert verdict.status == DEPARTS and verdict.steps == 25
    # The short reference is itself checked against the long one, over its 8 steps.
    assert verdicts[(short_ref.setup.key(), short_ref.machine.gpu)].steps == 8
    # With the short reference alone, the 25-step run is compared over 8 steps and passes.
    alone = loss_verdicts([short_ref, drifting])[(drifting.setup.key(), drifting.machine.gpu)]
    assert alone.status == "ok" and alone.steps == 8


def test_a_tune_resumes_from_its_records_and_decides_the_same(tmp_path):
    first, _ = tune_with(tmp_path, budget_s=3600)
    again, runner = tune_with(tmp_path, budget_s=3600, run_id="second")
    assert runner.new == []     # every probe and final measurement came from the file
    assert again.winner.setup == first.winner.setup
    assert [t.record.setup for t in again.tried] == [t.record.setup for t in first.tried]
    # The stored probes count against the budget: a resumed tune has no more time than one,
    # and knows it from the start, before it replays anything.
    assert again.spent_s >= sum(t.record.wall_s for t in first.tried)
    store = ResultsFile(tmp_path / "tune.jsonl")
    fresh = Tuner(FakeRunner(store, Clock(), "third"), BASE, dict(SPACE), budget_s=3600,
                  objective="tokens", timeout_s=1800, repeats=3, clock=Clock())
    assert fresh.spent_s() == pytest.approx(sum(r.wall_s for r in store.latest()))
    other = Tuner(FakeRunner(store, Clock(), "fourth"), dataclasses.replace(BASE, seq=1024),
                  dict(SPACE), budget_s=3600, objective="tokens", timeout_s=1800, repeats=3,
                  clock=Clock())
    assert other.spent_s() == 0       # another tune (here another sequence length) in the file


def test_the_command_measures_the_winner_again():
    winner = Setup(model="llama-468m", mode="compile", attn="flex_attention", batch=32, seq=2048,
                   device="cuda", compile_mode="reduce-overhead", kernels="liger-no-flce",
                   optimizer="foreach", checkpointing=True, init="device", warmup=4, steps=20)
    command = winner.command(repeats=3)
    settings = settings_of(build_parser().parse_args(command.split()[1:]))
    assert [s.key() for s in settings.resolved("cuda").plan()] == [winner.key()]
    assert settings.repeats == 3


@pytest.mark.parametrize("text, seconds", [("20m", 1200), ("90s", 90), ("1h30m", 5400),
                                           ("45", 45), ("1.5m", 90)])
def test_budget_durations(text, seconds):
    assert parse_budget(text) == seconds


@pytest.mark.parametrize("argv, message", [
    (["--budget", "soon"], "--budget takes a duration like 20m"),
    (["--budget", "0s"], "--budget must be more than 0 seconds"),
    (["--budget", "1m", "--objective", "fit"], "--objective fit needs --memory-limit-gb"),
    (["--budget", "1m", "--attn", "sdp"], "unknown attention 'sdp'"),
])
def test_bad_tune_input_is_one_line_and_exit_2(argv, message, capsys, tmp_path):
    code = main(["tune", "--device", "cpu", "--out", str(tmp_path / "t.jsonl"), *argv])
    err = capsys.readouterr().err
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1


# ---------------------------------------------------------------- the tune's output

STORED = Path(__file__).parent.parent / "benchmarks" / "results" / "h200-2026-12-01-tune-135m.json"


@pytest.fixture(scope="module")
def stored_tune():
    from stepbench.search.tune import TuneResult

    return TuneResult.from_dict(json.loads(STORED.read_text()))


def test_the_tune_prints_its_table_and_verdict_in_every_format_but_json(stored_tune, capsys):
    from stepbench.cli.tune import print_result

    print_result(stored_tune, "table")
    text = capsys.readouterr().out
    assert text.startswith("Tried\n")
    # The report's noise marks after the step time, with their footnote.
    assert "128*" in text and "* step times varied by more than 5%" in text
    assert text.rstrip().endswith("Budget 16 min 0 s, spent 14 min 54 s; 19 measurements.")
    print_result(stored_tune, "markdown")
    markdown = capsys.readouterr().out
    assert markdown.startswith("**Tried**\n\n| Stage | Setup | Batch | Precision | Status |")
    assert "\n\nWinner: compile+flex_attention batch 16 bf16: 310,854 tokens/s" in markdown
    print_result(stored_tune, "html")
    page = capsys.readouterr().out
    assert "<h1>Tried</h1>" in page and "<p class=\"note\">Reproduce: stepbench run" in page
    print_result(stored_tune, "csv")
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert len(rows) == len(stored_tune.tried)
    assert [r["search"] for r in rows[:2]] == ["tune screen", "tune screen"]
    assert rows[1]["noise_flags"] == "high_cv" and rows[0]["loss_guard"] == "reference"
    assert rows[-1]["search"] == "tune final #3" and float(rows[-1]["tokens_per_s"]) > 3e5
    # json stays the TuneResult object.
    print_result(stored_tune, "json")
    assert set(json.loads(capsys.readouterr().out)) >= {"winner", "runner_up", "tried", "command"}


def test_the_tune_and_the_report_of_its_records_build_one_table(stored_tune):
    from stepbench.report.tune import tried_table, tune_tables

    tried = [t.record for t in stored_tune.tried]
    [in_report] = tune_tables(tried)
    own = tried_table([(t.stage, t.record) for t in stored_tune.tried])
    assert in_report.title == "Tune: llama-135m at seq 2048 on NVIDIA H200"
    assert in_report.columns == own.columns and in_report.cells == own.cells


# ---------------------------------------------------------------- one real tune on the CPU

TUNE = ["tune", "--device", "cpu", "--model", "llama-tiny", "--seq", "32", "--batch", "1",
        "--modes", "eager", "--attn", "sdpa,eager", "--optimizer", "fused",
        "--checkpointing", "off", "--repeats", "2", "--warmup", "1", "--steps", "3",
        "--budget", "60s", "--format", "json"]


@pytest.mark.slow
def test_a_real_tune_keeps_its_budget_skips_a_departing_setup_and_resumes(tmp_path):
    out = tmp_path / "tune.jsonl"
    env = with_hooks({**os.environ, DIVERGE_ENV: "eager+eager"})
    command = [sys.executable, "-m", "stepbench", *TUNE, "--out", str(out)]
    # Interrupted once its first probe is stored, as Ctrl-C would.
    first = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, start_new_session=True)
    wait_for(first, "stepbench tune: screen: ")      # said once the probe's record is stored
    first.send_signal(signal.SIGINT)
    _, err = first.communicate(timeout=60)
    assert first.returncode == 130, err
    assert "run the same command again to resume" in err
    kept = ResultsFile(out).read()
    assert len(kept) >= 1
    # The same command resumes: nothing stored is measured again, and it ends within what the
    # budget has left.
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    records = ResultsFile(out).read()
    keys = [(r.setup.key(), r.repeat) for r in records]
    assert len(keys) == len(set(keys)), "a stored probe was measured again"
    assert {r.run_id for r in kept} & {r.run_id for r in records[len(kept):]} == set()
    # By its own count, within the budget: a probe's timeout is what the budget has left (a
    # process stopped at it may take the kill's grace period more).
    assert result["spent_s"] <= 60 + KILL_GRACE_S + 2
    # eager+eager's weights were spoiled: its losses depart and it is never the winner.
    assert result["winner"]["setup"]["name"] == "eager+sdpa"
    assert all(r["setup"]["name"] != "eager+eager" for r in [result["winner"],
                                                             result["runner_up"] or {"setup": {}}])
    assert any(t["setup"]["name"] == "eager+eager" for t in result["tried"])
    assert all(r.search and r.search["kind"] == "tune" for r in records)
    # The command it prints measures the winner's setup.
    settings = settings_of(build_parser().parse_args(result["command"].split()[1:]))
    assert settings.resolved("cpu").plan()[0].key() == \
        Setup.from_dict(result["winner"]["setup"]).key()
    # A third time, everything is stored: the same answer, no process started.
    replay = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
    assert json.loads(replay.stdout)["winner"] == result["winner"]
    assert len(ResultsFile(out).read()) == len(records)




@pytest.mark.slow
def test_a_tune_on_a_terminal_keeps_its_live_progress_from_probe_to_probe(tmp_path):
    # The display belongs to the command, not to a plan: after the first probe the live block
    # (each running setup's line with its seconds, "[3 s]") is still drawn for the next ones.
    out = tmp_path / "tune.jsonl"
    code, seen, _ = on_a_terminal([*TUNE[:-2], "--budget", "25s", "--out", str(out)])
    assert b"Traceback" not in seen, seen.decode(errors="replace")[-2000:]
    probes = [r.setup.attn for r in ResultsFile(out).read()]
    assert probes[:2] == ["sdpa", "eager"], seen.decode(errors="replace")[-2000:]
    live = re.findall(rb"\] eager\+(\w+) batch 1 seq 32: [^\r\n]*? \[\d+ s\]", seen)
    assert b"sdpa" in live and b"eager" in live, seen.decode(errors="replace")[-2000:]
