"""stepbench tune: the search's decisions against a model of a GPU and against a replay of
measured H200 hosts (fast, exact, on a simulated clock), its output, and one real tune of a tiny
model on this CPU (budget, resume after an interruption)."""

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
from stepbench.guard import DEPARTS
from stepbench.execute.runner import RETRIED
from stepbench.record import Machine, Record, ResultsFile, resume_key
from stepbench.execute.protocol import KILL_GRACE_S
from stepbench.search.gains import Observation, committed
from stepbench.search.tune import STAGES, Tuner, TuneResult
from stepbench.search.tune.results import label
from stepbench.settings import parse_budget
from stepbench.setup import Setup

from conftest import on_a_terminal, run_cli, wait_for, with_hooks
import replay
from says import error_line, names, table_rows

# ---------------------------------------------------------------- a model of a GPU

SPEED = {("eager", "sdpa"): 90e3, ("eager", "eager"): 60e3, ("eager", "flex_attention"): 30e3,
         ("compile", "sdpa"): 120e3, ("compile", "flex_attention"): 140e3,
         ("compile", "eager"): 100e3}
GB_PER_SEQUENCE = {"eager": 2.5, "compile": 3.0}
CAPACITY_GB = 100.0
FLOAT8 = {"runs": False}    # float8 fails, unless a test makes it run: 10% faster, drifting
COLD_S, WARM_S, OTHER_S, SERVER_S = 60.0, 8.0, 2.0, 10.0


def gpu_model(s: Setup) -> tuple[str, float | None, float, float]:
    """(status, tokens/s, first loss, peak GB) of a setup on an imaginary GPU: tokens/s grow
    with the batch as b / (b + 2) (+20% from 4 to 8, +11% to 16, +6% to 32), compiled setups
    need 3 GB a sequence and eager ones 2.5 (eager attention twice that), liger's fused
    cross-entropy departs."""
    memory = s.batch * GB_PER_SEQUENCE[s.mode] * (2 if s.attn == "eager" else 1) * \
        (0.4 if s.checkpointing else 1)
    if memory > CAPACITY_GB:
        return "oom", None, math.nan, memory
    if s.dtype == "float8" and not FLOAT8["runs"]:
        return "error", None, math.nan, memory
    tokens = SPEED[(s.mode, s.attn)] * s.batch / (s.batch + 2) * 1.5
    tokens *= {"none": 1, "liger-no-flce": 1.05, "liger": 1.2}[s.kernels]
    tokens *= {"default": 1, "reduce-overhead": 1.01, "max-autotune-no-cudagraphs": 1.005}[
        s.compile_mode]
    tokens *= (0.98 if s.optimizer == "foreach" else 1) * (0.8 if s.compile_scope == "layer"
                                                           else 1) * (0.75 if s.checkpointing else 1)
    tokens *= 1.1 if s.dtype == "float8" else 1
    loss = 111.5 if s.kernels == "liger" else 10.575   # liger's fused cross-entropy departs
    return "ok", tokens, loss, memory


def losses(s: Setup, first: float) -> list[float]:
    """One loss a step; float8's drifts 0.5% a step away (as on the H200: within 1.2% after 8
    steps, 14% apart after 25)."""
    drift = 0.005 if s.dtype == "float8" else 0.0
    return [first * (1 + drift * i) for i in range(s.warmup + s.steps + 1)]


Clock = replay.Clock


class FakeRunner:
    """The Runner's interface (run, run_id, store), measuring with gpu_model: a process server's
    start once, then per process OTHER_S outside the steps, a compile of COLD_S the first time a
    setup compiles and WARM_S after, and the steps; records carry their phases and compile
    counters as a real process's do. `spread(setup, repeat)` multiplies a process's step times
    (identical processes by default); `blocks`: the repeated blocks every record says its model
    has (a factory's), where the model was built."""

    def __init__(self, store: ResultsFile, clock: Clock, run_id: str = "fake", spread=None,
                 blocks: dict | None = None):
        self.store, self.clock, self.run_id = store, clock, run_id
        self.new: list[Record] = []
        self.compiled: set[str] = set()
        self.spread = spread or (lambda setup, repeat: 1.0)
        self.blocks = blocks

    def run(self, plan, *, repeats=1, timeout_s, tag=None, display=None, retry=True):
        # As the Runner resumes: a stored timeout or error is measured again unless `retry` is
        # False, as tune asks (its stored failures are done).
        done = {r.resume_key(): r for r in self.store.latest()
                if not (retry and r.status in RETRIED)}
        out = []
        for repeat in range(repeats):
            for s in plan:
                key = resume_key(s, repeat, "fake GPU")
                if key in done:
                    out.append(done[key])
                    continue
                record = self.measure(s, repeat, timeout_s, tag)
                self.store.append(record)
                self.new.append(record)
                out.append(record)
        return out

    def measure(self, s: Setup, repeat: int, timeout_s: float, tag) -> Record:
        placement = {"start": "server"}
        if not self.new:
            placement["server_start_s"] = SERVER_S
            self.clock.now += SERVER_S
        status, tokens, loss, memory = gpu_model(s)
        family = s.replace(warmup=0, steps=1).key()
        warm = family in self.compiled
        if s.mode == "compile":
            self.compiled.add(family)
        compile_s = (WARM_S if warm else COLD_S) * (7 if s.compile_mode.startswith(
            "max-autotune") else 1) if s.mode == "compile" else 0.5
        ms = s.tokens_per_step / tokens * 1e3 * self.spread(s, repeat) if tokens else None
        steps = [ms * (1 + 0.002 * ((i + repeat) % 5)) for i in range(s.steps)] if ms else []
        first = compile_s + (ms or 0) / 1e3
        wall = OTHER_S + first + sum(steps) / 1e3 * (1 + s.warmup / s.steps)
        if wall > timeout_s:
            status, tokens, steps, wall = "timeout", None, [], timeout_s
        self.clock.now += wall
        ok = status == "ok"
        return Record(
            run_id=self.run_id, repeat=repeat, setup=s, status=status,
            step_ms=statistics.fmean(steps) if ok else None,
            step_ms_median=statistics.median(steps) if ok else None,
            step_times_ms=steps if ok else [],
            tokens_per_s=s.tokens_per_step / statistics.fmean(steps) * 1e3 if ok else None,
            first_step_s=first if ok else None, peak_memory_gb=memory if ok else None,
            losses=losses(s, loss) if ok else [], loss_first=loss if ok else None,
            compile={"cache_hits": 1 if warm else 0, "cache_misses": 0 if warm else 1}
            if s.mode == "compile" else None,
            phases={"build": OTHER_S, "first_step": first,
                    "warmup": sum(steps) / 1e3 * s.warmup / s.steps,
                    "timed": sum(steps) / 1e3} if ok else None,
            wall_s=wall, placement=placement, search=tag, blocks=self.blocks,
            machine=Machine(gpu="fake GPU", gpu_memory_gb=CAPACITY_GB))


SPACE = {"mode": ["eager", "compile"], "attn": ["sdpa", "flex_attention", "eager"],
         "compile_mode": ["default", "reduce-overhead", "max-autotune-no-cudagraphs"],
         "compile_scope": ["model", "layer"], "dtype": ["bf16", "float8"],
         "kernels": ["none", "liger-no-flce", "liger"], "optimizer": ["fused", "foreach"],
         "checkpointing": [False, True]}
# Eager and compiled sdpa, every option at its first value.
NARROW = dict(SPACE, attn=["sdpa"], compile_mode=["default"], compile_scope=["model"],
              dtype=["bf16"], kernels=["none"], optimizer=["fused"], checkpointing=[False])
BASE = Setup(model="llama-468m", mode="eager", attn="sdpa", batch=4, seq=2048, device="cuda",
             init="device", warmup=4, steps=20)


def observed(key: tuple, *ratios: float, gpu: str = "fake GPU") -> list[Observation]:
    """Committed observations of one change, for a test's own gain table: measured on the
    fake GPU's machine class unless `gpu` says another."""
    return [Observation(key, r, "a test's", "test", gpu) for r in ratios]


def tune_with(tmp_path, budget_s: float, name: str = "tune.jsonl", run_id: str = "fake",
              objective: str = "tokens", base: Setup = BASE, gains=None, runner=None,
              space=None, repeats: int = 3):
    store = ResultsFile(tmp_path / name)
    clock = runner.clock if runner else Clock()
    runner = runner or FakeRunner(store, clock, run_id)
    tuner = Tuner(runner, base, dict(space or SPACE), budget_s=budget_s, objective=objective,
                  timeout_s=1800, repeats=repeats, clock=clock, gains=gains)
    return tuner.run(), runner


def stages(result) -> list[tuple[str, str, int]]:
    return [(t.stage, t.record.setup.name, t.record.setup.batch) for t in result.tried]


def test_the_ladder_measures_the_reference_in_full_until_a_doubling_buys_under_10_percent(
        tmp_path):
    result, runner = tune_with(tmp_path, budget_s=3600)
    ladder = [t.record for t in result.tried if t.stage == "ladder"]
    # eager+sdpa at 4, 8, 16, 32 (+20%, +11%, then +6%: saturated), each in full (the final's
    # steps).
    assert [(r.setup.name, r.setup.batch) for r in ladder] == \
        [("eager+sdpa", 4), ("eager+sdpa", 8), ("eager+sdpa", 16), ("eager+sdpa", 32)]
    assert all((t.record.setup.warmup, t.record.setup.steps) == (4, 20) for t in result.tried)
    assert all(r.search["role"] == "reference" for r in ladder)
    assert result.ladder["saturating_batch"] == 32
    assert names(result.ladder["stopped"], "batch 32", "+6%", "batch 16", "10%")
    # The golden of the ladder's stop reasons, word for word.
    assert result.ladder["stopped"] == "batch 32 bought +6% over batch 16, under 10%"
    assert result.ladder["gb_per_sequence"] == pytest.approx(2.5)
    # Then the compiled candidates at the saturating batch and the one below, before any
    # other change.
    order = [t.stage for t in result.tried]
    compiled = [t.record.setup for t in result.tried if t.stage == "compiled"]
    assert order.index("compiled") == 4 and "explore" not in order[:4 + len(compiled)]
    assert compiled and all(s.mode == "compile" and s.batch in (16, 32) for s in compiled)
    assert ("compile", "flex_attention", 32) in [(s.mode, s.attn, s.batch) for s in compiled]


def test_a_ladder_stops_where_the_reference_runs_out_of_memory(tmp_path, monkeypatch):
    # 5 GB a sequence: batch 32 needs 160 GB of the 100.
    monkeypatch.setitem(GB_PER_SEQUENCE, "eager", 5.0)
    result, runner = tune_with(tmp_path, budget_s=3600)
    ladder = [(t.record.setup.batch, t.record.status) for t in result.tried
              if t.stage == "ladder"]
    assert ladder == [(4, "ok"), (8, "ok"), (16, "ok"), (32, "oom")]
    assert result.ladder["saturating_batch"] == 16
    assert names(result.ladder["stopped"], "batch 32", "memory")
    assert result.ladder["stopped"] == "batch 32 ran out of memory"      # golden


def test_the_search_finds_the_fastest_setup_whose_losses_agree(tmp_path):
    # A gain table in which liger's kernels look promising (up to 1.3x), so that the tune
    # measures them: liger with its fused cross-entropy is faster still (1.2x) but departs.
    gains = committed() + observed(("kernels", "none", "liger", None), 1.3) + \
        observed(("kernels", "none", "liger-no-flce", None), 1.1)
    result, runner = tune_with(tmp_path, budget_s=3600, gains=gains)
    w = result.winner.setup
    # The winner: compiled flex attention at batch 32 (the largest that fits: 3 GB a sequence
    # of 100 GB), with liger's norms, RoPE and SwiGLU (5% faster).
    assert (w.mode, w.attn, w.batch, w.kernels, w.dtype) == ("compile", "flex_attention", 32,
                                                              "liger-no-flce", "bf16")
    assert result.measured_in_full and (w.warmup, w.steps) == (4, 20)
    # liger was measured, faster, flagged by the guard, and never the winner or runner-up.
    from stepbench.guard import loss_verdicts
    verdicts = loss_verdicts([t.record for t in result.tried])
    liger = [t.record for t in result.tried if t.record.setup.kernels == "liger"]
    assert liger and all(verdicts[(r.setup.key(), "fake GPU")].status == DEPARTS for r in liger)
    assert max(r.tokens_per_s for r in liger) > result.winner.tokens_per_s
    assert all(r.setup.kernels != "liger" for r in (result.winner, result.runner_up))
    # Batch 64 would need 192 GB: never measured, said so.
    assert not any(t.record.setup.batch == 64 for t in result.tried)
    assert any(c["setup"]["batch"] == 64 and names(c["reason"], "192 GB", "100 GB")
               for c in result.not_measured)
    # float8 fails here: measured once, never the winner. Eager attention in eager mode, which
    # the committed H200 gains put at most 0.58x eager+sdpa, is measured all the same: gains
    # measured on another machine class order the candidates, they never skip one here.
    assert any(t.record.setup.dtype == "float8" and t.record.status == "error"
               for t in result.tried)
    assert any(t.record.setup.name == "eager+eager" for t in result.tried)
    assert not any(c["why"] == "pruned" and "committed H200" in c["reason"]
                   for c in result.not_measured)
    assert result.spent_s <= 3600


def test_a_candidate_whose_largest_gain_cannot_beat_the_best_is_pruned(tmp_path):
    # The committed H200 results put CUDA graphs (reduce-overhead) at 0.99x to 1.01x; a test
    # table at 0.97x to 0.99x: on the best setup they cannot beat it, so they are not measured,
    # and the note gives the bound, the change and where its gains came from.
    gains = [o for o in committed() if o.key[0] != "compile_mode"] + \
        observed(("compile_mode", "default", "reduce-overhead", None), 0.97, 0.99)
    space = dict(SPACE, compile_mode=["default", "reduce-overhead"])
    result, runner = tune_with(tmp_path, budget_s=3600, gains=gains, space=space)
    assert not any(r.setup.compile_mode == "reduce-overhead" for r in runner.new)
    best = result.winner.setup
    note = next(s for s in result.skipped if s.startswith(
        f"compile:reduce-overhead+flex_attention batch {best.batch} bf16: not measured"))
    assert names(note, "largest gain", "best so far")
    # the bound, the setup it is measured against, the change and its gains' source
    assert names(note, "0.99x", "compile+flex_attention", "default -> reduce-overhead",
                 "committed fake GPU results")
    # The same change with a chance of gain (up to 1.03x) is measured.
    gains = gains[:-2] + observed(("compile_mode", "default", "reduce-overhead", None), 1.03)
    _, runner = tune_with(tmp_path, budget_s=3600, gains=gains, name="again.jsonl", space=space)
    assert any(r.setup.compile_mode == "reduce-overhead" for r in runner.new)


def test_the_best_value_per_second_runs_first(tmp_path):
    # Two options on the best setup with the same gain table entry size: foreach AdamW costs a
    # compile of 60 s like any other; max-autotune compiles 7x as long for the same gain, so it
    # comes after, if at all.
    gains = [o for o in committed() if o.key[0] not in ("compile_mode", "optimizer")] + \
        observed(("optimizer", "fused", "foreach", None), 1.05) + \
        observed(("compile_mode", "default", "max-autotune-no-cudagraphs", None), 1.05)
    result, runner = tune_with(tmp_path, budget_s=3600, gains=gains)
    names = [r.setup.name for r in runner.new]
    foreach = next(i for i, n in enumerate(names) if "foreach" in n)
    autotune = [i for i, n in enumerate(names) if "max-autotune" in n]
    assert not autotune or foreach < autotune[0]


def test_prices_come_from_this_machines_parts(tmp_path):
    from stepbench.search.prices import PRIORS, THIS_MACHINE

    store = ResultsFile(tmp_path / "t.jsonl")
    clock = Clock()
    tuner = Tuner(FakeRunner(store, clock), BASE, dict(SPACE), budget_s=3600,
                  objective="tokens", timeout_s=1800, clock=clock)
    flex = dataclasses.replace(BASE, mode="compile", attn="flex_attention", batch=8)
    # Before anything ran: the priors, the server's start included.
    first = tuner.first_price()
    assert first.parts["server start"] == PRIORS["cuda"].server_start_s
    assert first.sources["process"] == PRIORS["cuda"].source
    tuner.measure(BASE, "ladder", "reference")
    tuner.measure(flex, "compiled")
    cold = tuner.price(flex.replace(batch=16))     # a new batch: a cold compile
    assert cold.sources["first step"] == THIS_MACHINE and "server start" not in cold.parts
    assert cold.parts["first step"] == pytest.approx(COLD_S, rel=0.02)
    assert cold.parts["process"] == pytest.approx(OTHER_S)
    warm = tuner.price(flex)                        # compiled before: warm
    assert warm.parts["first step"] == pytest.approx(COLD_S * PRIORS["cuda"].warm_share,
                                                     rel=0.02)
    tuner.measure(flex, "final")                    # a warm compile measured here
    assert tuner.price(flex).parts["first step"] == pytest.approx(WARM_S, rel=0.05)
    # sdpa has not compiled here: flex_attention's cold compile, scaled by the kernels' prior
    # ratio; autotuning by its factor.
    sdpa = tuner.price(flex.replace(attn="sdpa"))
    prior = PRIORS["cuda"].first_step_s
    ratio = prior[("compile", "sdpa")] / prior[("compile", "flex_attention")]
    assert sdpa.parts["first step"] == pytest.approx(COLD_S * ratio, rel=0.02)
    autotune = tuner.price(flex.replace(batch=16, compile_mode="max-autotune-no-cudagraphs"))
    assert autotune.parts["first step"] == pytest.approx(COLD_S * 7.3, rel=0.02)


def test_a_skipped_measurements_price_is_never_0_s_nor_empty_parentheses():
    from stepbench.search.prices import Price

    small = Price({"first step": 0.3, "steps": 0.1})
    assert small.over_budget(0.2) == ("the budget has 0.2 s left for it and it takes about "
                                      "0.4 s")
    big = Price({"first step": 48.0, "steps": 0.4})
    assert big.over_budget(-3) == ("the budget has 0.0 s left for it and it takes about 48 s "
                                   "(first step 48 s)")
    assert big.over_budget(48.2).startswith("the budget has 48.2 s left for it and it takes "
                                            "about 48.4 s")


def test_a_fresh_start_prices_the_imports_in_every_process(tmp_path):
    from stepbench.search.prices import PRIORS

    tuner = Tuner(FakeRunner(ResultsFile(tmp_path / "t.jsonl"), Clock()), BASE, dict(SPACE),
                  budget_s=3600, objective="tokens", timeout_s=1800, start="fresh")
    price = tuner.first_price()
    assert "server start" not in price.parts
    assert price.parts["process"] == PRIORS["cuda"].overhead_s[("fresh", "eager")]


def test_a_small_budget_is_kept_and_what_did_not_fit_is_said(tmp_path):
    result, runner = tune_with(tmp_path, budget_s=200)
    assert result.spent_s <= 200 and result.winner is not None
    assert any(names(s, "not measured", "budget") for s in result.skipped)
    assert sum(r.wall_s for r in runner.new) + SERVER_S <= 200


def test_finals_run_only_the_processes_the_test_needs(tmp_path):
    # Compiled sdpa (1.3x eager here) against the eager reference: further apart than
    # identical processes ever are, told apart by the test on one process each: no final
    # process at all.
    space = NARROW
    result, runner = tune_with(tmp_path, budget_s=3600, space=space)
    assert (result.winner.setup.mode, result.runner_up.setup.mode) == ("compile", "eager")
    assert not any(t.stage == "final" for t in result.tried)
    assert result.comparison["significant"] and result.comparison["ratio"] < 1 / 1.25
    assert result.processes == {"winner": 1, "runner_up": 1}
    # Two close ones (compiled flex_attention at 32, and with foreach AdamW, 2% slower):
    # two processes each, then a third each while the processes' test finds no difference.
    gains = [o for o in committed() if o.key[0] != "optimizer"] + \
        observed(("optimizer", "fused", "foreach", None), 1.05)
    space = dict(space, attn=["flex_attention"], optimizer=["fused", "foreach"])
    noisy = FakeRunner(ResultsFile(tmp_path / "noisy.jsonl"), Clock(),
                       spread=lambda s, repeat: (1.0, 1.06, 0.95)[repeat % 3])
    result, runner = tune_with(tmp_path, budget_s=3600, gains=gains, runner=noisy, space=space)
    assert {result.winner.setup.optimizer, result.runner_up.setup.optimizer} == {"fused",
                                                                                 "foreach"}
    finals = [t.record for t in result.tried if t.stage == "final"]
    assert result.processes == {"winner": 3, "runner_up": 3}
    assert result.comparison["method"] == "processes"
    # Interleaved: A #2, B #2, A #3, B #3.
    assert [r.repeat for r in finals] == [1, 1, 2, 2]
    assert finals[0].setup != finals[1].setup


def mean_tokens(records) -> float:
    return statistics.fmean(r.tokens_per_s for r in records)


def assert_never_slower(result, by_test: bool = True) -> None:
    """No setup the tune measured whose losses agree is faster than the winner by its mean
    tokens/s by more than 1% (tune's BEAT), over the processes the tune weighs
    (Measurements.mean_tokens: the undisturbed ones where there are any), nor (`by_test`)
    significantly faster by the report's test."""
    from stepbench import stats
    from stepbench.guard import OK, REFERENCE, loss_verdicts
    from stepbench.search.tune.measured import Measurements

    verdicts = loss_verdicts([t.record for t in result.tried])
    by_setup: dict = {}
    seen = Measurements(set())
    for t in result.tried:
        by_setup.setdefault(t.record.setup, []).append(t.record)
        seen.add(t.stage, t.record)
    # The winner's processes that ran: a final process the budget's end cut short (a timeout
    # at the tune's shortened limit) is no measurement of it, as the tune itself takes it.
    winner = [r for r in by_setup[result.winner.setup] if r.ok]
    for setup, records in by_setup.items():
        if setup == result.winner.setup or not all(r.ok for r in records):
            continue
        test = stats.compare_records(records, winner, per_token=True)
        assert not (by_test and test and test.significant and test.ratio < 1), setup.name
        verdict = verdicts.get((setup.key(), records[0].machine.gpu))
        if verdict is not None and verdict.status in (OK, REFERENCE):
            assert seen.mean_tokens(setup) <= 1.01 * seen.mean_tokens(result.winner.setup), \
                setup.name


def test_the_winner_is_never_slower_than_a_setup_measured(tmp_path):
    # By the report's test and by tokens/s: in a replay of measured H200 hosts, compiled
    # flex_attention at batch 32 ran its one process with a few very slow steps: its median
    # step tests 3% faster than batch 16's, its mean tokens/s half of it. The finals measure
    # it again (the test and the means disagree), and the tune names batch 16.
    for profile in (replay.slow_host(), replay.fast_host()):
        result, grid, machine = replay.replay(profile, tmp_path, name=f"{profile.name}.jsonl")
        assert_never_slower(result)


class StallingRunner(FakeRunner):
    """A machine under contention: every compiled process runs fast steps but stalls in its
    last three (40x), so that its median step is the fastest and its mean the slowest."""

    def measure(self, s, repeat, timeout_s, tag):
        record = super().measure(s, repeat, timeout_s, tag)
        if s.mode != "compile" or not record.ok:
            return record
        steps = record.step_times_ms[:-3] + [t * 40 for t in record.step_times_ms[-3:]]
        return dataclasses.replace(record, step_times_ms=steps, step_ms=statistics.fmean(steps),
                                   step_ms_median=statistics.median(steps),
                                   tokens_per_s=s.tokens_per_step / statistics.fmean(steps) * 1e3)


def test_a_tune_never_names_a_winner_slower_than_its_reference(tmp_path):
    # One process each (--repeats 1): the test between the reference and the compiled setup
    # goes by their steps' medians, where the compiled one is faster; by its mean tokens/s it
    # is the slowest. The winner is the reference, and the output says why (the two disagree:
    # the tokens/s decide).
    space = NARROW
    runner = StallingRunner(ResultsFile(tmp_path / "busy.jsonl"), Clock())
    result, _ = tune_with(tmp_path, budget_s=3600, runner=runner, space=space, repeats=1)
    compiled = [t.record for t in result.tried if t.record.setup.mode == "compile"]
    assert compiled and all(r.ok for r in compiled)
    assert result.winner.setup.mode == "eager"
    assert_never_slower(result, by_test=False)
    # the compiled setup, that it is not the winner, and both means
    assert any(names(line, "compile+sdpa", "not the winner", "tokens/s", "winner's")
               for line in result.skipped)


class CutRunner(FakeRunner):
    """A busy machine: the processes `cut(runner, setup, repeat)` picks do not finish within
    whatever limit the tune gives them."""

    def __init__(self, *args, cut, **kwargs):
        super().__init__(*args, **kwargs)
        self.cut = cut

    def measure(self, s, repeat, timeout_s, tag):
        cut = self.cut(self, s, repeat)
        return super().measure(s, repeat, 0.0 if cut else timeout_s, tag)   # 0: past any limit


def CutShortRunner(*args):
    """At the end of a tune's budget: the reference's second process (eager, repeat 2) does not
    finish within the limit the tune gave it, and a compiled setup's first process runs 1.05x
    as fast as eager, its second 0.8x (the fake GPU's compile gain, 1.4x, taken out)."""
    return CutRunner(*args, spread=lambda s, repeat: 1.0 if s.mode == "eager" else
                     1.4 / (1.05 if repeat == 0 else 0.8),
                     cut=lambda runner, s, repeat: s.mode == "eager" and repeat >= 1)


def test_a_reference_cut_short_by_the_tune_still_counts(tmp_path):
    # Seen on a loaded 2-core CPU (benchmarks/README.md, section n): the reference ran at 645
    # tokens/s, its second process timed out at the budget's end, and the tune named compiled
    # sdpa, whose two processes averaged 566. A timeout under the tune's own shortened limit
    # leaves a setup that ran in another process in the running, by its processes that ran.
    space = NARROW
    runner = CutShortRunner(ResultsFile(tmp_path / "cut.jsonl"), Clock())
    result, _ = tune_with(tmp_path, budget_s=3600, runner=runner, space=space, repeats=2)
    timeouts = [t.record for t in result.tried if t.record.status == "timeout"]
    assert timeouts and {r.setup.mode for r in timeouts} == {"eager"}
    assert result.winner.setup.mode == "eager" and result.winner.ok
    compiled = [t.record for t in result.tried if t.record.setup.mode == "compile"]
    assert len(compiled) == 2 and all(r.ok for r in compiled)
    assert result.winner.tokens_per_s > mean_tokens(compiled)
    # The record says so: run again on the same file, the tune replays every measurement and
    # names the same winner (a real tune beside busy loops named another: its replay took the
    # stored timeout for the setup's own failure).
    assert all(r.search["limit_s"] < 1800 for r in timeouts)
    again, runner = tune_with(tmp_path, budget_s=3600, name="cut.jsonl", run_id="again",
                              space=space, repeats=2)
    assert runner.new == [] and again.winner.to_dict() == result.winner.to_dict()


class LoadedRunner(FakeRunner):
    """A heavily loaded machine: every process's steps 60x (eager) and 40x (compiled) slower
    than the fake GPU's; `limits`: the limit the tune gave each process."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, spread=lambda s, repeat: 60.0 if s.mode == "eager" else 40.0,
                         **kwargs)
        self.limits: list[float] = []

    def run(self, plan, *, repeats=1, timeout_s, tag=None, display=None, retry=True):
        self.limits.append(timeout_s)
        return super().run(plan, repeats=repeats, timeout_s=timeout_s, tag=tag, display=display,
                           retry=retry)


def test_the_first_reference_may_take_what_the_budget_has_left(tmp_path):
    # Seen on a loaded 2-core CPU: the first reference, priced without its steps (nothing said
    # how long a step takes), was stopped at 120 s (three times its price, at least 120 s)
    # with a third of the budget left; the tune measured one compiled setup and ended without
    # a winner. Priced without its steps, it may take what the budget has left.
    space = NARROW
    runner = LoadedRunner(ResultsFile(tmp_path / "loaded.jsonl"), Clock())
    result, _ = tune_with(tmp_path, budget_s=400, runner=runner, space=space)
    first = result.tried[0].record
    assert (first.setup.mode, first.status) == ("eager", "ok") and first.wall_s > 120
    assert runner.limits[0] == pytest.approx(400)
    assert result.winner is not None and result.spent_s <= 400
    # the steps are priced once a step ran: every later process has a bounded limit
    assert all(limit < 400 for limit in runner.limits[1:])


def test_no_budget_is_kept_back_for_a_reference_the_budget_cannot_buy(tmp_path):
    # Seen on a loaded 2-core CPU: the reference's first process ran 11x slower than compiled
    # sdpa's; the guard's reference at the batch compiled sdpa led at, priced from it (200 s),
    # kept half the 3-minute budget back, which the finals could not spend on it either: the
    # tune stopped exploring, and ended, with 32 s unused. What the budget left cannot buy is
    # not kept back.
    clock = Clock()
    runner = FakeRunner(ResultsFile(tmp_path / "slow-eager.jsonl"), clock,
                        spread=lambda s, repeat: 40.0 if s.mode == "eager" else 1.0)
    tuner = Tuner(runner, BASE, dict(NARROW), budget_s=350, objective="tokens",
                  timeout_s=1800, clock=clock)
    tuner.ladder()
    for batch in (4, 8):
        tuner.measure(BASE.replace(mode="compile", batch=batch), "compiled")
    assert tuner.ladder_info["batches"] == [4]
    unaffordable = tuner.price(tuner.reference_setup(8)).total
    assert unaffordable > tuner.left_s() > 0
    # the leaders' second processes (warm compiles) are kept back, the reference is not
    finals = sum(tuner.price(BASE.replace(mode="compile", batch=b)).total for b in (4, 8))
    assert tuner.reserve_s() == pytest.approx(finals)


def test_no_budget_is_kept_back_for_finals_that_are_not_needed(tmp_path):
    # Seen on a loaded 2-core CPU (3-minute budget): the reference's first processes ran 20x
    # slower than later ones; the budget kept back a second process of it for the finals
    # (half the budget), though the compiled setups were told apart from it by far more than
    # identical processes differ, and the tune stopped exploring with that half unused. Kept
    # back only for processes the finals would run, it goes on exploring, and says in one
    # line why it stopped.
    space = dict(SPACE, attn=["sdpa", "eager"], compile_mode=["default"],
                 compile_scope=["model"], dtype=["bf16"], kernels=["none"],
                 optimizer=["fused"], checkpointing=[False])
    runner = FakeRunner(ResultsFile(tmp_path / "disturbed.jsonl"), Clock(),
                        spread=lambda s, repeat: 20.0 if (s.mode, repeat) == ("eager", 0)
                        else 1.0)
    result, _ = tune_with(tmp_path, budget_s=300, runner=runner, space=space)
    assert [t.stage for t in result.tried][:3] == ["ladder", "compiled", "compiled"]
    assert "explore" in {t.stage for t in result.tried}
    assert not any(t.stage == "final" for t in result.tried)
    assert result.winner is not None and result.spent_s <= 300
    assert names(result.ended, "stopped exploring", "budget left", "kept for the finals",
                 "cheapest candidate")
    assert result.to_dict()["ended"] == result.ended
    assert TuneResult.from_dict(json.loads(json.dumps(result.to_dict()))).ended == result.ended


class BusyRunner(FakeRunner):
    """A busy CPU (issue 37, item 2): the processes `busy(setup, repeat)` names ran while other
    processes took CPU time from their timed steps (`busy_cpu`, the report's `‡`)."""

    def __init__(self, *args, busy, **kwargs):
        super().__init__(*args, **kwargs)
        self.busy = busy

    def measure(self, s: Setup, repeat: int, timeout_s: float, tag) -> Record:
        record = super().measure(s, repeat, timeout_s, tag)
        return dataclasses.replace(record, noise_flags=["busy_cpu"]) \
            if self.busy(s, repeat) else record


def test_a_choice_from_disturbed_processes_is_measured_again_and_said(tmp_path):
    # Every first process ran on a busy machine, eager's reading twice as fast as it is: the
    # tune chose eager over compiled sdpa (1.3x eager) from them. The finals measure the two
    # leaders again; their quiet processes decide, and the choice rests on no disturbed one.
    runner = BusyRunner(ResultsFile(tmp_path / "busy.jsonl"), Clock(),
                        spread=lambda s, repeat: 0.5 if (s.mode, repeat) == ("eager", 0)
                        else 1.0, busy=lambda s, repeat: repeat == 0)
    result, _ = tune_with(tmp_path, budget_s=3600, runner=runner, space=NARROW)
    assert result.winner.setup.mode == "compile" and not result.winner.noise_flags
    assert any(t.stage == "final" and t.record.repeat == 1 for t in result.tried)
    assert result.disturbed == [] and result.to_dict()["disturbed"] == []
    # Every process disturbed: measured up to the tune's processes, and the verdict says the
    # choice rests on disturbed measurements (the JSON names the setups).
    from stepbench.report.tune import verdict
    runner = BusyRunner(ResultsFile(tmp_path / "all-busy.jsonl"), Clock(),
                        busy=lambda s, repeat: True)
    result, _ = tune_with(tmp_path, budget_s=3600, runner=runner, space=NARROW)
    assert result.processes["winner"] == 3
    winner = next(t for t in result.tried if t.record.setup == result.winner.setup).record
    assert result.disturbed[0].startswith(f"{winner.setup.name} batch {winner.setup.batch}")
    text = " ".join(verdict(TuneResult.from_dict(json.loads(json.dumps(result.to_dict())))))
    assert names(text, "disturbed measurements", result.disturbed[0], "quiet machine"), text


def tune_saying(tmp_path, gains, name: str):
    """A tune of eager and compiled sdpa on the fake GPU with `gains` as the committed table:
    (result, the lines it said)."""
    space = NARROW
    clock, lines = Clock(), []
    runner = FakeRunner(ResultsFile(tmp_path / name), clock)
    tuner = Tuner(runner, BASE, space, budget_s=3600, objective="tokens", timeout_s=1800,
                  repeats=3, clock=clock, gains=gains, say=lines.append)
    return tuner.run(), lines


def test_priors_from_another_machine_order_the_candidates_and_never_skip_one(tmp_path):
    # The same committed gain (compilation at most 0.5x eager+sdpa) measured on this machine's
    # class prunes compiled sdpa; measured on another machine class it only orders it: the
    # tune measures it here, finds it 1.3x faster, and says where the prior came from.
    from stepbench.report.render import render
    from stepbench.report.tune import FOREIGN_NOTE, tune_document

    key = ("mode", "eager", "compile", "sdpa")
    ours, _ = tune_saying(tmp_path, observed(key, 0.4, 0.5), "ours.jsonl")
    assert not any(t.record.setup.mode == "compile" for t in ours.tried)
    assert ours.winner.setup.mode == "eager"
    assert any(c["why"] == "pruned" and names(c["reason"], "committed", "fake GPU")
               for c in ours.not_measured)
    assert all(g["may_skip"] for g in ours.gains)

    theirs, said = tune_saying(tmp_path, observed(key, 0.4, 0.5, gpu="NVIDIA H200"),
                               "theirs.jsonl")
    assert theirs.winner.setup.mode == "compile"
    assert not any(c["why"] == "pruned" and "H200" in c["reason"] for c in theirs.not_measured)
    [gain] = [g for g in theirs.gains if g["kind"] == "mode eager -> compile (sdpa)"]
    assert gain["may_skip"] is False and names(gain["source"], "H200", "(test)")
    assert [o["gpu"] for o in gain["observations"]] == ["NVIDIA H200", "NVIDIA H200"]
    assert any("next compile+sdpa" in line and "another machine's" in line for line in said)
    text = render(tune_document(theirs), "markdown")
    assert any(names(line, "H200", "another machine", "orders only") for line in text.splitlines())
    assert FOREIGN_NOTE in text
    assert_never_slower(theirs)


def test_priors_from_other_models_only_order_a_factorys_candidates(tmp_path):
    # hostqa (issue 37, item 3): the committed gains are HF causal LMs' (Llama shapes); on their
    # own machine class they pruned a user factory's candidates as if its model were one.
    from stepbench.search.gains import GainTable, prior

    key = ("mode", "eager", "compile", "sdpa")
    gains = observed(key, 0.4, 0.5)
    assert GainTable(gains).with_machine([], "fake GPU").lookup(key).decides
    gain = GainTable(gains, other_models=True).with_machine([], "fake GPU").lookup(key)
    assert not gain.decides and gain.to_dict()["elsewhere"] == "other models"
    assert names(prior(gain), "other models'", "orders the candidates")
    factory = BASE.replace(model="net.py:make")
    tuner = Tuner(FakeRunner(ResultsFile(tmp_path / "f.jsonl"), Clock()), factory, dict(NARROW),
                  budget_s=3600, objective="tokens", timeout_s=1800, gains=gains)
    assert not tuner.gains.with_machine([], "fake GPU").lookup(key).decides
    tuner = Tuner(FakeRunner(ResultsFile(tmp_path / "l.jsonl"), Clock()), BASE, dict(NARROW),
                  budget_s=3600, objective="tokens", timeout_s=1800, gains=gains)
    assert tuner.gains.with_machine([], "fake GPU").lookup(key).decides


def test_a_setup_above_the_ladder_gets_its_reference_before_it_can_win(tmp_path, monkeypatch):
    # The ladder stops at 16 (eager mode needs 5 GB a sequence here); compiled flex_attention
    # grows to 32, where eager mode does not fit (160 GB): its reference there is measured with
    # activation checkpointing.
    monkeypatch.setitem(GB_PER_SEQUENCE, "eager", 5.0)
    gains = committed() + observed(("batch", 2.0, "compile", 16), 1.2)
    result, runner = tune_with(tmp_path, budget_s=3600, gains=gains)
    refs = [(t.stage, t.record.setup.batch, t.record.setup.checkpointing, t.record.status)
            for t in result.tried if t.record.setup.mode == "eager" and t.record.setup.batch == 32]
    assert refs == [("ladder", 32, False, "oom"), ("reference", 32, True, "ok")]
    assert result.winner.setup.batch == 32
    assert result.reference.setup.checkpointing and result.reference.setup.batch == 32


def test_float8_in_full_departs_and_never_wins_though_faster(tmp_path, monkeypatch):
    monkeypatch.setitem(FLOAT8, "runs", True)
    gains = committed() + observed(("dtype", "bf16", "float8", None), 1.1)
    result, runner = tune_with(tmp_path, budget_s=3600, gains=gains)
    float8 = [t.record for t in result.tried if t.record.setup.dtype == "float8"]
    assert float8 and all(r.ok for r in float8)
    assert max(r.tokens_per_s for r in float8) > result.winner.tokens_per_s
    from stepbench.guard import loss_verdicts
    verdict = loss_verdicts([t.record for t in result.tried])[
        (float8[0].setup.key(), "fake GPU")]
    assert verdict.status == DEPARTS and verdict.steps == 25
    assert result.winner.setup.dtype == "bf16"
    assert result.runner_up is None or result.runner_up.setup.dtype == "bf16"


def test_fit_finds_the_fastest_setup_that_fits_the_batch_with_checkpointing_if_need_be(tmp_path):
    # Batch 48 fits no setup without recomputing activations (144 GB and more against 100).
    result, runner = tune_with(tmp_path, budget_s=3600, objective="fit",
                               base=dataclasses.replace(BASE, batch=48))
    assert {r.setup.batch for r in runner.new} == {48}          # the batch is not searched
    assert not any(r.status == "ok" and not r.setup.checkpointing for r in runner.new)
    w = result.winner.setup
    assert w.checkpointing and (w.mode, w.attn, w.batch) == ("compile", "flex_attention", 48)


def test_one_slow_step_does_not_stop_a_batch_from_growing(tmp_path):
    # On the H200 (llama-135m), a batch-32 probe timed 201, 198, 208, 205 and 1351 ms: its mean
    # was 2.1x its median. Here the ladder's batch-16 rung has such a last step: by its mean it
    # is slower than batch 8, by its median (which the search goes by) 11% faster, and the
    # ladder goes on to 32.
    class Hiccup(FakeRunner):
        def measure(self, s, repeat, timeout_s, tag):
            r = super().measure(s, repeat, timeout_s, tag)
            if (s.mode, s.attn, s.batch, repeat) == ("eager", "sdpa", 16, 0) and r.ok:
                r.step_times_ms[-1] *= 30
                r.step_ms = statistics.fmean(r.step_times_ms)
                r.tokens_per_s = s.tokens_per_step / r.step_ms * 1e3
            return r

    lines: list[str] = []
    runner = Hiccup(ResultsFile(tmp_path / "t.jsonl"), Clock())
    tuner = Tuner(runner, BASE, dict(SPACE), budget_s=3600, objective="tokens", timeout_s=1800,
                  clock=runner.clock, say=lines.append)
    result = tuner.run()
    ladder = [t.record for t in result.tried if t.stage == "ladder"]
    assert [r.setup.batch for r in ladder] == [4, 8, 16, 32]
    assert ladder[2].tokens_per_s < ladder[1].tokens_per_s      # by its mean: slower
    # the line of batch 16 gives the rate by its median step too, which the search goes by
    from stepbench.search.gains import rate
    by_median = f"{rate(ladder[2]):,.0f} tokens/s"
    assert any(names(line, f"{ladder[2].tokens_per_s:,.0f} tokens/s", by_median, "median")
               for line in lines)


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
    assert runner.new == []     # every measurement came from the file
    assert again.winner.setup == first.winner.setup
    assert [t.record.setup for t in again.tried] == [t.record.setup for t in first.tried]
    # The stored measurements count against the budget: a resumed tune has no more time than
    # one, and knows it from the start, before it replays anything.
    assert again.spent_s >= sum(t.record.wall_s for t in first.tried)
    store = ResultsFile(tmp_path / "tune.jsonl")
    fresh = Tuner(FakeRunner(store, Clock(), "third"), BASE, dict(SPACE), budget_s=3600,
                  objective="tokens", timeout_s=1800, repeats=3, clock=Clock())
    assert fresh.spent_s() == pytest.approx(sum(r.wall_s for r in store.latest()))
    other = Tuner(FakeRunner(store, Clock(), "fourth"), dataclasses.replace(BASE, seq=1024),
                  dict(SPACE), budget_s=3600, objective="tokens", timeout_s=1800, repeats=3,
                  clock=Clock())
    assert other.spent_s() == 0       # another tune (here another sequence length) in the file


def test_an_earlier_tunes_file_is_named_and_searched_again(tmp_path):
    # The committed H200 tune of llama-135m, by stepbench's earlier tune: short probes (2 + 5
    # steps) and finals in full. A tune of the same model on it searches again with a budget of
    # its own, reuses the earlier finals it measures again, and says so.
    path = tmp_path / "tune.jsonl"
    path.write_bytes(replay.COMMITTED_TUNE.read_bytes())
    earlier = ResultsFile(path).read()
    grid = replay.Grid(replay.grid_records())
    clock = Clock()
    machine = replay.ReplayMachine(grid, replay.fast_host(), ResultsFile(path), clock)
    base = dataclasses.replace(earlier[0].setup, warmup=4, steps=20)
    tuner = Tuner(machine, base, dict(SPACE, attn=["sdpa", "flex_attention"], dtype=["bf16"],
                                      kernels=["none"], compile_scope=["model"],
                                      compile_mode=["default"], optimizer=["fused"]),
                  budget_s=480, objective="tokens", timeout_s=1800, clock=clock)
    assert tuner.spent_s() == 0
    result = tuner.run()
    assert names(result.earlier, f"{len(earlier)} records", "stepbench tune")
    assert result.earlier in result.skipped
    reused = [t.record for t in result.tried if t.record.run_id != machine.run_id]
    assert reused and all((r.setup.warmup, r.setup.steps) == (4, 20) for r in reused)
    assert TuneResult.from_dict(json.loads(json.dumps(result.to_dict()))).earlier == \
        result.earlier


@pytest.mark.parametrize("profile", [replay.slow_host, replay.fast_host],
                         ids=["slow host", "fast host"])
def test_a_replay_of_a_measured_host_reaches_95_percent_of_the_best_within_8_minutes(
        profile, tmp_path):
    result, grid, machine = replay.replay(profile(), tmp_path)
    best_setup, best = grid.best()
    assert result.spent_s <= 8 * 60
    assert grid.rate(result.winner.setup) >= 0.95 * best, (result.winner.setup.name,
                                                             result.winner.setup.batch)
    # It asked only for what a tune can run (every record in full), and said what it did.
    assert all((s.warmup, s.steps) == (4, 20) for s in machine.asked)
    assert result.ladder["saturating_batch"] in result.ladder["batches"]


def test_the_committed_gain_table_is_what_the_committed_results_give():
    # The shipped data file is byte for byte what benchmarks/gain_table.py writes from the
    # committed results, and the package's loader reads back every observation it holds.
    from importlib.resources import files

    from stepbench.search.gains import COMMITTED_DATA, COMMITTED_FILES, committed_observations

    gain_table = load_benchmark("gain_table")
    shipped = files("stepbench.search").joinpath(COMMITTED_DATA).read_text()
    assert gain_table.source() == shipped
    results = Path(__file__).parent.parent / "benchmarks" / "results"
    expected = committed_observations(results)
    assert committed() == expected and len(expected) > 100
    assert {o.gpu for o in expected} == {"NVIDIA H200"}
    assert json.loads(shipped)["files"] == list(COMMITTED_FILES)


def test_the_gain_table_is_declared_package_data():
    # A wheel carries only the data files pyproject.toml declares: the gain table must be one.
    import fnmatch
    import tomllib

    from stepbench.search.gains import COMMITTED_DATA

    config = tomllib.loads((Path(__file__).parent.parent / "pyproject.toml").read_text())
    patterns = config["tool"]["setuptools"]["package-data"]["stepbench.search"]
    assert any(fnmatch.fnmatch(COMMITTED_DATA, p) for p in patterns)


def load_benchmark(name: str):
    import importlib.util

    path = Path(__file__).parent.parent / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_gain_is_looked_up_on_this_machine_first_then_in_the_committed_results():
    from stepbench.search.gains import GainTable, THIS_MACHINE

    key = ("attn", "sdpa", "flex_attention", "compile")
    table = GainTable(observed(key, 1.1, 1.2))
    gain = table.lookup(key)
    assert (gain.lo, gain.hi) == (1.1, 1.2)
    assert gain.source == "committed fake GPU results (test)"       # the source's golden
    mine = table.with_machine(observed(("attn", "sdpa", "flex_attention", "eager"), 0.7))
    # This machine's observation of the same change in another mode comes first.
    assert mine.lookup(key).source == THIS_MACHINE and mine.lookup(key).hi == 0.7
    # A change nobody measured: a range that neither prunes nor favours it.
    unknown = table.lookup(("attn", "sdpa", "flash_attention_3", "compile"))
    assert (unknown.lo, unknown.hi) == (0.8, 1.25) and "no measurement" in unknown.source
    # A chain: compile, then another kernel.
    eager = BASE
    chained = GainTable(observed(("mode", "eager", "compile", "sdpa"), 2.0) +
                        observed(key, 1.1)).chain(eager, eager.replace(mode="compile",
                                                                       attn="flex_attention"))
    assert chained.hi == pytest.approx(2.2) and chained.kind.startswith("mode eager -> compile")


def test_a_batch_change_gains_no_more_than_its_factor_allows_however_it_was_measured():
    from stepbench.search.gains import GainTable

    doubling, halving = ("batch", 2.0, "eager", 4), ("batch", 0.5, "eager", 8)
    # A busy machine's disturbed pair: 80x from doubling the batch, 0.01x from halving it.
    table = GainTable(observed(doubling, 1.6, 80.0) + observed(halving, 0.01, 0.7))
    assert (table.lookup(doubling).lo, table.lookup(doubling).hi) == (1.6, 2.0)
    assert (table.lookup(halving).lo, table.lookup(halving).hi) == (0.5, 0.7)
    # Seven doublings chained from the nearest one: at most 2^7, not 80^7.
    chained = table.chain(BASE.replace(batch=4), BASE.replace(batch=512))
    assert chained.hi == pytest.approx(2.0 ** 7)
    # Other changes keep what was measured.
    compile_key = ("mode", "eager", "compile", "sdpa")
    assert GainTable(observed(compile_key, 9.0)).lookup(compile_key).hi == 9.0


def test_a_resumed_tune_counts_an_earlier_invocation_by_its_span_not_only_its_walls():
    from stepbench.record import Record
    from stepbench.search.tune.budget import spent_by

    def record(run_id, start, end, wall):
        return Record(run_id=run_id, repeat=0, setup=BASE, status="ok", wall_s=wall,
                      started_at=f"2026-12-05T03:40:{start:02d}Z",
                      finished_at=f"2026-12-05T03:40:{end:02d}Z")

    # Its two measurements took 3 s of 20: the server's start and the search between them
    # were the tune's time too (a loaded CPU's 60 s tune: 47.6 s of walls in a 53.0 s span).
    earlier = [record("a", 0, 2, 2.0), record("a", 19, 20, 1.0)]
    assert spent_by(earlier) == 20.0
    assert spent_by(earlier + [record("b", 30, 35, 4.0)]) == 25.0      # each invocation's own
    # Without their times, or where the walls add up to more, the walls.
    assert spent_by([Record(run_id="c", repeat=0, setup=BASE, status="ok", wall_s=2.5)]) == 2.5
    assert spent_by([record("d", 0, 1, 4.0)]) == 4.0
    # From the invocation's budget start where its records say it (the search's pricing and
    # first decisions came before its first measurement).
    late = [dataclasses.replace(r, search={"kind": "tune", "began_at": "2026-12-05T03:39:58Z"})
            for r in earlier]
    assert spent_by(late) == 22.0


def test_a_pair_that_other_work_disturbed_is_no_observation():
    from stepbench.record import Machine, Record
    from stepbench.search.gains import observations

    def record(mode, tokens_per_s, flags=()):
        return Record(run_id="r", repeat=0, setup=BASE.replace(mode=mode), status="ok",
                      step_ms=100.0, step_ms_median=100.0, tokens_per_s=tokens_per_s,
                      noise_flags=list(flags), machine=Machine(gpu="cpu"))

    quiet = [record("eager", 1000.0), record("compile", 1500.0)]
    assert sorted(o.ratio for o in observations(quiet)) == [pytest.approx(1 / 1.5, rel=1e-3), 1.5]
    # Another process took the CPU while compile ran: its 0.004x says nothing of compile.
    busy = [record("eager", 1000.0), record("compile", 4.0, ["busy_cpu"])]
    assert observations(busy) == []
    # Spread within one process's steps is the setup's own: still an observation.
    assert len(observations([record("eager", 1000.0), record("compile", 1500.0, ["high_cv"])])) == 2


def test_the_json_names_the_stages_and_reads_back(tmp_path):
    result, _ = tune_with(tmp_path, budget_s=3600)
    data = json.loads(json.dumps(result.to_dict(), default=str))
    assert data["stages"] == STAGES
    assert {r["search"]["stage"] for r in data["tried"]} <= set(STAGES)
    again = TuneResult.from_dict(data)
    assert [t.stage for t in again.tried] == [t.stage for t in result.tried]
    assert again.ladder == result.ladder and again.gains == result.gains
    assert again.winner.setup == result.winner.setup


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


def test_a_budget_below_one_measurement_is_refused_with_the_least_it_needs(capsys, tmp_path):
    from stepbench.search.prices import PRIORS

    out = tmp_path / "t.jsonl"
    code = main(["tune", "--device", "cpu", "--budget", "5s", "--out", str(out)])
    err = capsys.readouterr().err
    least = math.ceil(PRIORS["cpu"].server_start_s + PRIORS["cpu"].overhead_s[("server",
                                                                              "eager")]
                      + PRIORS["cpu"].first_step_s[("eager", "sdpa")])
    assert code == 2 and len(err.strip().splitlines()) == 1
    # The golden of tune's budget refusal, word for word.
    assert "--budget 5s is less than the tune's first measurement here: eager+sdpa batch 4 " \
        f"bf16 takes at least {least} s (server start 7 s" in err
    assert err.rstrip().endswith(f"give --budget {least}s or more")
    assert not out.exists()         # nothing written


@pytest.mark.parametrize("argv, message", [
    (["--attn", "sdpa,flex_attention"], "--attn flex_attention cannot run here: its backward "
     "pass needs a CUDA GPU (FlexAttention does not support backward on CPU); drop it from "
     "--attn"),
    (["--precision", "float8"], "--precision float8 cannot run here: float8 training needs a "
     "CUDA GPU of compute capability 8.9 or newer; use --device cuda or another --precision"),
    (["--kernels", "liger"], "--kernels liger cannot run here: --kernels liger: liger-kernel's "
     "Triton kernels need a CUDA GPU"),
])
def test_a_value_this_machine_cannot_run_is_refused_when_named(argv, message, capsys, tmp_path):
    code = main(["tune", "--device", "cpu", "--budget", "5m", "--out", str(tmp_path / "t.jsonl"),
                 *argv])
    err = capsys.readouterr().err
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1


def test_a_param_of_a_transformers_model_is_refused_as_run_refuses_it(capsys, tmp_path):
    out = tmp_path / "t.jsonl"
    code = main(["tune", "--device", "cpu", "--budget", "5m", "--param", "width=8",
                 "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and error_line(err, "tune") and names(err, "--param", "FILE.py:FUNCTION")
    assert not out.exists()


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
    lines = text.rstrip().splitlines()
    assert "128*" in text and any(line.startswith("* ") and names(line, "5%") for line in lines)
    assert names(lines[-1], "16 min 0 s", "14 min 54 s", "19 measurements")
    print_result(stored_tune, "markdown")
    markdown = capsys.readouterr().out
    assert markdown.startswith("**Tried**\n\n")
    assert table_rows(markdown)[0][:5] == ["Stage", "Setup", "Batch", "Precision", "Status"]
    assert any(line.startswith("Winner") and names(line, "compile+flex_attention batch 16 bf16",
                                                   "310,854 tokens/s")
               for line in markdown.splitlines())
    print_result(stored_tune, "html")
    page = capsys.readouterr().out
    assert names(page, "<h1>Tried</h1>", '<p class="note">', "stepbench run")
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
    assert names(in_report.title, "Tune", "llama-135m", "seq 2048", "NVIDIA H200")
    assert in_report.columns == own.columns and in_report.cells == own.cells


# ---------------------------------------------------------------- one real tune on the CPU

# The budget is most of the test's length: the tune spends up to it (the ladder a quarter). 40 s
# leaves the resumed invocation, after its process server's start, room for the two or more
# measurements the test asks of it on a loaded CPU (2026-12-05, beside a busy loop at load 5:
# the resumed one measured 19; 60 s took the test 61.5 s at load 3.5, 40 s 42.0 s at load 4.4).
BUDGET_S = 40
TUNE = ["tune", "--device", "cpu", "--model", "llama-tiny", "--seq", "32", "--batch", "1",
        "--modes", "eager", "--attn", "sdpa,eager", "--optimizer", "fused",
        "--checkpointing", "off", "--repeats", "2", "--warmup", "1", "--steps", "3",
        "--budget", f"{BUDGET_S}s", "--format", "json"]


@pytest.mark.slow
def test_a_real_tune_keeps_its_budget_and_resumes_with_its_live_progress(tmp_path):
    out = tmp_path / "tune.jsonl"
    env = with_hooks(dict(os.environ))
    command = [sys.executable, "-m", "stepbench", *TUNE, "--out", str(out)]
    # Interrupted once its first measurement is stored, as Ctrl-C would.
    first = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, start_new_session=True)
    wait_for(first, "stepbench tune: ladder: ")   # said once the record is stored
    first.send_signal(signal.SIGINT)
    _, err = first.communicate(timeout=60)
    assert first.returncode == 130, err
    assert names(err, "again", "resume")
    kept = ResultsFile(out).read()
    assert len(kept) >= 1
    # The same command resumes, on a terminal: nothing stored is measured again, and it ends
    # within what the budget has left.
    code, seen, stdout = on_a_terminal(command[3:], env=env, timeout=180)
    assert code == 0 and b"Traceback" not in seen, seen.decode(errors="replace")[-2000:]
    result = json.loads(stdout)
    records = ResultsFile(out).read()
    keys = [(r.setup.key(), r.repeat) for r in records]
    assert len(keys) == len(set(keys)), "a stored measurement was measured again"
    assert {r.run_id for r in kept} & {r.run_id for r in records[len(kept):]} == set()
    # The display belongs to the command, not to a plan: after its first process the live block
    # (each running setup's line with its seconds, "[3 s]") is still drawn for the next. (Not
    # one per process: on a loaded machine a quick process can end between two redraws.)
    assert len(records) - len(kept) >= 2, seen.decode(errors="replace")[-2000:]
    first_ended = re.search(rb": ok, [\d.]+ ms/step", seen)
    assert first_ended, seen.decode(errors="replace")[-2000:]
    live = re.findall(rb"\] eager\+sdpa batch \d+ seq 32: [^\r\n]*? \[\d+ s\]",
                      seen[first_ended.end():])
    assert live, seen.decode(errors="replace")[-2000:]
    # By its own count, within the budget: a process's timeout is what the budget has left (a
    # process stopped at it may take the kill's grace period more).
    assert result["spent_s"] <= BUDGET_S + KILL_GRACE_S + 2
    # The ladder ran first, in full, and every measurement's stage is one of the tune's. The
    # committed gains (the H200's: eager attention at most 0.58x eager+sdpa) come from another
    # machine class: on this CPU they order the candidates and skip none. The winner has the
    # most tokens/s of what the tune measured.
    assert records[0].search["stage"] == "ladder" and records[0].setup.batch == 1
    assert all((r.setup.warmup, r.setup.steps) == (1, 3) for r in records)
    assert not any(c["why"] == "pruned" and "H200" in c["reason"] for c in result["not_measured"])
    assert all(not g["may_skip"] for g in result["gains"] if "committed H200" in g["source"])
    assert_never_slower(TuneResult.from_dict(result), by_test=False)
    assert all(r.search["kind"] == "tune" and r.search["stage"] in STAGES for r in records)
    # The command it prints measures the winner's setup.
    settings = settings_of(build_parser().parse_args(result["command"].split()[1:]))
    assert settings.resolved("cpu").plan()[0].key() == \
        Setup.from_dict(result["winner"]["setup"]).key()
    # A third time, everything is stored: the same answer, no process started.
    again = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
    assert json.loads(again.stdout)["winner"] == result["winner"]
    assert len(ResultsFile(out).read()) == len(records)


@pytest.mark.slow
def test_a_tune_without_a_winner_exits_1(tmp_path):
    # A cap no setup's build fits under: every probe runs out of memory, so nothing wins.
    proc = run_cli("tune", "--device", "cpu", "--model", "llama-tiny", "--seq", "32", "--batch",
                   "1", "--modes", "eager", "--attn", "sdpa", "--budget", "60s",
                   "--memory-limit-gb", "0.001", "--format", "json",
                   "--out", tmp_path / "tune.jsonl", timeout=300)
    assert proc.returncode == 1, proc.stderr
    result = json.loads(proc.stdout)
    assert result["winner"] is None and result["tried"]
    assert {t["status"] for t in result["tried"]} == {"oom"}


def test_a_factorys_param_values_are_candidates_each_guarded_against_its_own_eager_run(tmp_path):
    # `--param width=16,64`: two models; the wider one runs twice as fast on the fake GPU. The
    # tune measures both, and the winner's loss guard reference is its own width's eager run.
    factory = tmp_path / "net.py"
    factory.write_text("def make(batch_size, device, width=16):\n    return None\n")
    base = dataclasses.replace(BASE, model=f"{factory}:make", params="width=16")
    runner = FakeRunner(ResultsFile(tmp_path / "p.jsonl"), Clock(),
                        spread=lambda s, repeat: 0.5 if s.params == "width=64" else 1.0)
    space = {name: values[:1] for name, values in SPACE.items()}
    space.update(mode=["eager", "compile"], params=["width=16", "width=64"])
    result, _ = tune_with(tmp_path, 3600, base=base, runner=runner, space=space)
    tried = {t.record.setup.params for t in result.tried}
    assert tried == {"width=16", "width=64"}
    assert result.winner.setup.params == "width=64"
    assert result.reference.setup.params == "width=64" and result.reference.setup.mode == "eager"
    assert "--param width=64" in result.command


def test_a_reference_that_fails_with_an_error_ends_the_search_in_one_line(tmp_path):
    # float8 fails on the fake GPU: as a factory that raises, every setup would fail alike.
    space = dict(SPACE, dtype=["float8"])
    result, runner = tune_with(tmp_path, 3600, space=space)
    assert [(t.stage, t.record.status) for t in result.tried] == [("ladder", "error")]
    assert result.winner is None
    assert any(names(text, "ended error", "nothing else") for text in result.skipped)
    from stepbench.report.tune import verdict
    assert verdict(result)[-1].endswith("; 1 measurement.")


def test_the_verdict_compares_no_disturbed_measurement():
    # Issue 37: a runner-up or reference whose timed steps were disturbed (‡) gets no ratio in
    # the verdict; it is named with the mark and its tokens/s as measured.
    from stepbench.report.tune import verdict
    from stepbench.search.tune import TuneResult

    calm = TuneResult.from_dict(json.loads(STORED.read_text()))
    calm_text = " ".join(verdict(calm))
    assert names(calm_text, "the winner is", "x the tokens/s of")
    data = json.loads(STORED.read_text())
    data["runner_up"]["noise_flags"] = ["busy_cpu"]
    data["reference"]["noise_flags"] = ["busy_cpu"]
    lines = verdict(TuneResult.from_dict(data))
    runner_up = next(line for line in lines if line.startswith("Runner-up"))
    assert names(runner_up, "not compared", "‡") and "the winner is" not in runner_up
    against_reference = next(line for line in lines if "the loss guard's reference" in line)
    assert names(against_reference, "not compared", "‡") and "x the tokens/s" not in against_reference


def test_a_failed_compile_scope_blames_the_scope_not_compilation():
    # A model without repeated blocks: compile/layer is unsupported, compiling whole is not.
    from stepbench.search.tune.measured import Measurements

    seen = Measurements(set())
    eager = BASE.replace(batch=8)
    layer = BASE.replace(mode="compile", compile_scope="layer")
    seen.add("explore", Record(run_id="r", repeat=0, setup=layer, status="unsupported",
                               error="Unsupported: no repeated block", machine=Machine(gpu="cpu")))
    assert seen.failed_change(eager, BASE.replace(mode="compile", batch=8)) is None
    why = seen.failed_change(eager, layer.replace(batch=8))
    assert names(why, "compile", "unsupported", "compile/layer")



def blocks_tune(tmp_path, blocks, objective: str = "tokens", batch: int = 4, **space):
    """A tune of a factory whose every record says `blocks` (FakeRunner), over eager and
    compiled setups and the `space` given."""
    factory = tmp_path / "net.py"
    factory.write_text("def make(batch_size, device):\n    return None\n")
    base = dataclasses.replace(BASE, model=f"{factory}:make", batch=batch)
    full = {name: values[:1] for name, values in SPACE.items()}
    full.update(mode=["eager", "compile"], **space)
    name = f"{(blocks or {}).get('count')}-{objective}.jsonl"
    runner = FakeRunner(ResultsFile(tmp_path / name), Clock(), blocks=blocks)
    result, _ = tune_with(tmp_path, 3600, base=base, runner=runner, space=full,
                          objective=objective)
    said = [text for text in result.skipped if "no repeated block" in text]
    dropped = [entry for entry in result.not_measured if entry["why"] == "blocks"]
    return result, said, dropped, f"{factory}:make"


@pytest.mark.parametrize("blocks", [{"count": 0}, {"count": 12, "class": "Block"}, None],
                         ids=["none", "twelve", "not said"])
def test_a_model_without_repeated_blocks_is_not_compiled_per_layer(tmp_path, blocks):
    # Issue 35: a factory's records say how many repeated blocks its model has. Where the first
    # (the eager reference) counts none, compile/layer takes no process: the tune says so once,
    # with the fix. A model with blocks, or records that do not say (a transformers model's,
    # an older stepbench's), keeps the candidates.
    result, said, dropped, model = blocks_tune(tmp_path, blocks, compile_scope=["model", "layer"])
    layered = [t for t in result.tried if t.record.setup.compile_scope == "layer"]
    if blocks and blocks["count"] == 0:
        assert result.tried[0].record.blocks == {"count": 0}
        assert layered == [] and result.winner is not None
        # every compile/layer candidate (one on each compiled setup) left with its reason
        assert len(dropped) >= 2 and all(names(e["setup"]["name"], "compile/layer") and
                                         names(e["reason"], "--compile-scope layer")
                                         for e in dropped)
        [line] = said                           # one line, not one per candidate
        assert names(line, "not tried", "--compile-scope layer", model, "Workload(block=")
    else:
        assert len(layered) >= 2 and said == [] and dropped == []


def test_a_named_block_the_model_does_not_hold_is_named_in_the_reason():
    # The Workload named a block class and the model holds none of it: the reason names that
    # class and the fix (another class), not "no repeated block; name one".
    from stepbench.search.tune.measured import Measurements

    eager = BASE.replace(model="net.py:make", batch=8)
    for blocks, expected in (({"count": 0, "class": "Block"}, ("holds no Block", "Workload names")),
                             ({"count": 0}, ("no repeated block", "Workload(block="))):
        seen = Measurements(set())
        seen.add("ladder", Record(run_id="r", repeat=0, setup=eager, status="ok", blocks=blocks,
                                  machine=Machine(gpu="cpu")))
        why = seen.blockless(eager.replace(mode="compile", compile_scope="layer"))
        assert names(why, "--compile-scope layer", "net.py:make", *expected)
    assert seen.blockless(eager.replace(mode="compile")) is None


class DrawingRunner(FakeRunner):
    """FakeRunner whose model draws random numbers in its step (dropout): every record says so."""

    def measure(self, s, repeat, timeout_s, tag):
        return dataclasses.replace(super().measure(s, repeat, timeout_s, tag), draws_random=True)


@pytest.mark.parametrize("draws", [True, False])
def test_a_model_that_draws_random_numbers_is_compiled_and_its_unchecked_winner_said(tmp_path,
                                                                                    draws):
    # Dropout: the loss guard cannot compare a compiled setup with eager (guard.py: inductor
    # draws its own masks). Such a setup may still win, since no reference could ever check
    # it and the question is whether to compile; the verdict says its losses were not
    # checked, and the fix. A model that draws nothing keeps the guard's rule.
    runner = (DrawingRunner if draws else FakeRunner)(ResultsFile(tmp_path / "r.jsonl"), Clock())
    result, _ = tune_with(tmp_path, 3600, runner=runner, space=NARROW)
    compiled = [t for t in result.tried if t.record.setup.mode == "compile"]
    assert compiled and result.winner is not None
    from stepbench.report.tune import verdict
    said = [line for line in verdict(result) if "not checked" in line]
    assert result.winner.setup.mode == "compile"          # the fakes' compile is faster
    if draws:
        assert result.unchecked == [label(result.winner.setup)]
        [line] = said
        assert names(line, label(result.winner.setup), "dropout", "--param")
        assert TuneResult.from_dict(result.to_dict()).unchecked == result.unchecked
    else:
        assert result.unchecked == [] and said == []


@pytest.mark.parametrize("count", [0, 12])
def test_a_model_without_repeated_blocks_is_not_checkpointed_where_it_does_not_fit(tmp_path,
                                                                                   count):
    # Fit at batch 48 needs checkpointing (144 GB and more against 100): on a model with blocks
    # the ladder's reference and the compiled setup run checkpointed; without, neither takes a
    # process (the ladder's checkpointed reference is not a candidate: it is asked for alone).
    result, said, dropped, model = blocks_tune(tmp_path, {"count": count}, "fit", 48,
                                               checkpointing=[False, True])
    ran = [(t.record.setup.mode, t.record.setup.checkpointing, t.record.status)
           for t in result.tried]
    if count:
        assert ("eager", True, "ok") in ran and result.winner.setup.checkpointing
        assert said == [] and dropped == []
    else:
        assert ran == [("eager", False, "oom"), ("compile", False, "oom")]
        assert result.winner is None
        [line] = said
        assert names(line, "not tried", "--checkpointing on", model, "Workload(block=")
        assert {e["setup"]["name"] for e in dropped} == {"eager+ckpt", "compile+ckpt"}


@pytest.mark.parametrize("blocks", [{"count": 0}, {"count": 12, "class": "Block"}],
                         ids=["none", "twelve"])
def test_under_fsdp2_the_two_compile_scopes_are_one_candidate(tmp_path, blocks):
    # FSDP2 compiles each repeated block on its own whichever the scope, and a model without
    # one whole (measure/parallel.py): compile and compile/layer are one setup there, as
    # `run` plans it (setup.planned). The tune measures it once, as compile/layer, and says so
    # in one line, where it would have measured both.
    factory = tmp_path / "net.py"
    factory.write_text("def make(batch_size, device):\n    return None\n")
    base = dataclasses.replace(BASE, model=f"{factory}:make", parallel="fsdp2", nproc=2)
    space = {name: values[:1] for name, values in SPACE.items()}
    space.update(mode=["eager", "compile"], compile_scope=["model", "layer"])
    runner = FakeRunner(ResultsFile(tmp_path / f"{blocks['count']}.jsonl"), Clock(),
                        blocks=blocks)
    result, _ = tune_with(tmp_path, 3600, base=base, runner=runner, space=space)
    compiled = [t.record.setup for t in result.tried if t.record.setup.mode == "compile"]
    assert compiled and {s.compile_scope for s in compiled} == {"layer"}
    assert len({s.replace(compile_scope="model") for s in compiled}) == len(set(compiled))
    assert result.winner is not None and result.winner.setup.mode == "compile"
    [line] = [text for text in result.skipped if "FSDP2" in text]
    assert names(line, "--compile-scope model and layer", "one setup", "compile/layer")


def test_a_process_the_tune_cut_short_does_not_fail_what_it_changed(tmp_path):
    # Seen on a loaded 2-core CPU: compiled sdpa at the ladder's batch ran past the limit the
    # budget gave it, and every other compiled sdpa setup was left out as though compilation
    # had failed ("mode compile ended timeout"). The tune ran out of time there: compilation
    # stays a candidate at the other batches.
    space = NARROW
    # the first compiled process runs past whatever limit the tune gives it
    runner = CutRunner(ResultsFile(tmp_path / "slow.jsonl"), Clock(),
                       cut=lambda runner, s, repeat: s.mode == "compile" and not any(
                           r.setup.mode == "compile" for r in runner.new))
    result, _ = tune_with(tmp_path, budget_s=3600, runner=runner, space=space)
    compiled = [t.record for t in result.tried if t.record.setup.mode == "compile"]
    assert compiled[0].status == "timeout"
    assert any(r.ok and r.setup.batch != compiled[0].setup.batch for r in compiled)
    assert not any(e["why"] == "failed" for e in result.not_measured)
    assert result.winner.setup.mode == "compile"


# ---------------------------------------------------------------- host-bound: fewer launches first

LAUNCH_SPACE = dict(NARROW, compile_mode=["default", "reduce-overhead"])
# What main's tune measured of LAUNCH_SPACE on the fake GPU at 1 GB a sequence in eager mode
# (before the host-bound rule): no record host-bound, the same order.
NO_HOST_BOUND_ORDER = [("ladder", "eager+sdpa", 4), ("ladder", "eager+sdpa", 8),
                       ("ladder", "eager+sdpa", 16), ("ladder", "eager+sdpa", 32),
                       ("compiled", "compile+sdpa", 32),
                       ("explore", "compile:reduce-overhead+sdpa", 32),
                       ("final", "compile:reduce-overhead+sdpa", 32), ("final", "compile+sdpa", 32)]


class HostBoundRunner(FakeRunner):
    """The fake GPU on a slow host: the setups `bound(setup)` picks finish each step right after
    the host launched it (a host lead of 0.0 ms, the record's host_bound flag)."""

    def __init__(self, *args, bound=lambda s: False, **kwargs):
        super().__init__(*args, **kwargs)
        self.bound = bound

    def measure(self, s, repeat, timeout_s, tag):
        record = super().measure(s, repeat, timeout_s, tag)
        if record.ok and self.bound(s):
            record.noise_flags, record.host_lead_ms = ["host_bound"], 0.0
        return record


def host_bound_tune(tmp_path, bound, base: Setup = BASE, space=LAUNCH_SPACE):
    """A tune of `space` at 1 GB a sequence in eager mode (the ladder saturates at batch 32
    and batch 64 fits): (result, the lines it said)."""
    clock, lines = Clock(), []
    runner = HostBoundRunner(ResultsFile(tmp_path / "t.jsonl"), clock, bound=bound)
    tuner = Tuner(runner, base, dict(space), budget_s=3600, objective="tokens", timeout_s=1800,
                  clock=clock, say=lines.append)
    return tuner.run(), lines


@pytest.fixture
def light_eager(monkeypatch):
    monkeypatch.setitem(GB_PER_SEQUENCE, "eager", 1.0)


def test_without_a_host_bound_record_the_order_is_the_gains_order(tmp_path, light_eager):
    result, lines = host_bound_tune(tmp_path, bound=lambda s: False)
    assert stages(result) == NO_HOST_BOUND_ORDER
    assert result.host_bound == [] and not any("host-bound" in line for line in lines)


@pytest.fixture
def one_rung(monkeypatch):
    """A ladder of the start batch alone (no share of the budget for a second rung): no
    batch measured above it, so nothing measured here says what a larger one is worth."""
    import stepbench.search.tune.strategy as strategy
    monkeypatch.setattr(strategy, "LADDER_SHARE", 0.0)


def test_a_host_bound_reference_runs_cuda_graphs_and_a_larger_batch_first(tmp_path, one_rung):
    # eager+sdpa at batch 4 is host-bound: its CUDA-graph variant and its doubled batch run
    # before compile+sdpa, which the (another machine's) gains put first.
    result, lines = host_bound_tune(
        tmp_path, bound=lambda s: (s.mode, s.attn, s.batch) == ("eager", "sdpa", 4))
    assert stages(result)[0] == ("ladder", "eager+sdpa", 4)
    assert sorted(stages(result)[1:3]) == [("compiled", "compile:reduce-overhead+sdpa", 4),
                                           ("compiled", "eager+sdpa", 8)]
    assert ("compiled", "compile+sdpa", 4) in stages(result)[3:]        # still measured
    [said] = [line for line in lines if "host-bound" in line]
    assert names(said, "eager+sdpa batch 4 bf16", "host lead 0.0 ms", "CUDA graphs",
                 "compile:reduce-overhead+sdpa batch 4", "larger batch", "eager+sdpa batch 8")
    [entry] = result.host_bound
    assert entry["setup"] == "eager+sdpa batch 4 bf16" and entry["host_lead_ms"] == 0.0
    assert entry["reason"] == said
    assert set(entry["candidates"]) == {"compile:reduce-overhead+sdpa batch 4 bf16",
                                        "eager+sdpa batch 8 bf16"}
    back = TuneResult.from_dict(json.loads(json.dumps(result.to_dict())))
    assert back.host_bound == result.host_bound
    from stepbench.report.render import render
    from stepbench.report.tune import tune_document
    assert said in render(tune_document(back), "markdown")


def test_a_committed_gain_does_not_prune_what_cuts_a_host_bound_setups_launches(tmp_path,
                                                                              light_eager):
    # The committed table of this machine class puts CUDA graphs at 0.97x to 0.99x: on a host
    # that bounds compile+sdpa they are measured all the same (the committed host launched at
    # another rate); where nothing is host-bound they are pruned.
    gains = [o for o in committed() if o.key[0] != "compile_mode"] + \
        observed(("compile_mode", "default", "reduce-overhead", None), 0.97, 0.99)
    for bound, measured in ((lambda s: s.mode == "compile", True), (lambda s: False, False)):
        clock = Clock()
        runner = HostBoundRunner(ResultsFile(tmp_path / f"{measured}.jsonl"), clock, bound=bound)
        Tuner(runner, BASE, dict(LAUNCH_SPACE), budget_s=3600, objective="tokens",
              timeout_s=1800, clock=clock, gains=gains).run()
        assert any(r.setup.compile_mode == "reduce-overhead" for r in runner.new) == measured


def test_on_a_cpu_a_host_bound_setup_moves_only_its_larger_batch(tmp_path, one_rung):
    # A CPU's space compiles in the default mode alone; even a space that names
    # reduce-overhead gets no CUDA graphs from the host-bound rule on a CPU.
    cpu = dataclasses.replace(BASE, device="cpu")
    for space in (NARROW, LAUNCH_SPACE):
        (tmp_path / space["compile_mode"][-1]).mkdir()
        result, lines = host_bound_tune(tmp_path / space["compile_mode"][-1], base=cpu,
                                        space=space, bound=lambda s: s == cpu)
        [entry] = result.host_bound
        assert entry["candidates"] == ["eager+sdpa batch 8 bf16"]
        assert "CUDA graphs" not in entry["reason"] and names(entry["reason"], "larger batch")
        assert stages(result)[1] == ("compiled", "eager+sdpa", 8)
        if space is NARROW:
            assert not any(t.record.setup.compile_mode == "reduce-overhead" for t in result.tried)
            assert not any(c["setup"]["compile_mode"] == "reduce-overhead"
                           for c in result.not_measured)
