"""stepbench tune: the search's decisions against a model of a GPU (fast, exact), and one real
tune of a tiny model on this CPU (budget, loss guard, resume after an interruption)."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import signal
import subprocess
import sys
import time

import pytest

from stepbench.cli import build_parser, build_plan, main, run_settings
from stepbench.guard import DEPARTS, UNCHECKED
from stepbench.record import Record, ResultsFile, resume_key
from stepbench.search.tune import Space, Tuner, parse_budget, run_command
from stepbench.setup import Setup

# ---------------------------------------------------------------- a model of a GPU

SPEED = {("eager", "sdpa"): 90e3, ("eager", "eager"): 60e3, ("eager", "flex_attention"): 30e3,
         ("compile", "sdpa"): 120e3, ("compile", "flex_attention"): 140e3,
         ("compile", "eager"): 100e3}
GB_PER_SEQUENCE = {"eager": 5.0, "compile": 3.0}
CAPACITY_GB = 100.0


def gpu_model(s: Setup) -> tuple[str, float | None, float, float]:
    """(status, tokens/s, first loss, process wall s) of a setup on an imaginary GPU."""
    wall = 400.0 if s.compile_mode.startswith("max-autotune") else 60.0 if s.mode == "compile" \
        else 15.0
    memory = s.batch * GB_PER_SEQUENCE[s.mode] * (2 if s.attn == "eager" else 1) * \
        (0.4 if s.checkpointing else 1)
    if memory > CAPACITY_GB:
        return "oom", None, math.nan, wall
    if s.dtype == "float8":
        return "error", None, math.nan, wall
    tokens = SPEED[(s.mode, s.attn)] * (1 + 0.1 * math.log2(s.batch / 4))
    tokens *= {"none": 1, "liger-no-flce": 1.05, "liger": 1.2}[s.kernels]
    tokens *= {"default": 1, "reduce-overhead": 1.01, "max-autotune-no-cudagraphs": 1.005}[
        s.compile_mode]
    tokens *= (0.98 if s.optimizer == "foreach" else 1) * (0.8 if s.compile_scope == "layer"
                                                           else 1) * (0.75 if s.checkpointing else 1)
    loss = 111.5 if s.kernels == "liger" else 10.575   # liger's fused cross-entropy departs
    return "ok", tokens, loss, wall + (s.warmup + s.steps) * s.batch * s.seq / tokens


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class FakeRunner:
    """The Runner's interface (run, run_id, timeout_s, store), measuring with gpu_model."""

    def __init__(self, store: ResultsFile, clock: Clock, run_id: str = "fake"):
        self.store, self.clock, self.run_id, self.timeout_s = store, clock, run_id, 0.0
        self.new: list[Record] = []

    def run(self, plan, repeats=1, search=None):
        done = {r.resume_key(): r for r in self.store.latest()}
        out = []
        for repeat in range(repeats):
            for s in plan:
                key = resume_key(s, repeat, "cpu")
                if key in done:
                    out.append(done[key])
                    continue
                status, tokens, loss, wall = gpu_model(s)
                if wall > self.timeout_s:
                    status, tokens, wall = "timeout", None, self.timeout_s
                self.clock.now += wall
                ms = s.batch * s.seq / tokens * 1e3 if tokens else None
                steps = [ms * (1 + 0.002 * ((i + repeat) % 5)) for i in range(s.steps)] if ms else []
                record = Record(run_id=self.run_id, repeat=repeat, setup=s, status=status,
                                step_ms=sum(steps) / len(steps) if steps else None,
                                step_times_ms=steps, tokens_per_s=tokens,
                                peak_memory_gb=None if status != "ok" else 1.0,
                                losses=[loss] * (s.warmup + s.steps + 1) if tokens else [],
                                loss_first=loss if tokens else None, wall_s=wall,
                                search=search)
                self.store.append(record)
                self.new.append(record)
                out.append(record)
        return out


SPACE = dict(modes=["eager", "compile"], attns=["sdpa", "flex_attention", "eager"],
             compile_modes=["default", "reduce-overhead", "max-autotune-no-cudagraphs"],
             compile_scopes=["model", "layer"], precisions=["bf16", "float8"],
             kernels=["none", "liger-no-flce", "liger"], optimizers=["fused", "foreach"],
             checkpointing=[False, True])
BASE = Setup(model="llama-468m", mode="eager", attn="sdpa", batch=4, seq=2048, device="cuda",
             init="device")


def tune_with(tmp_path, budget_s: float, name: str = "tune.jsonl", run_id: str = "fake",
              objective: str = "tokens", base: Setup = BASE):
    store = ResultsFile(tmp_path / name)
    clock = Clock()
    runner = FakeRunner(store, clock, run_id)
    tuner = Tuner(runner, base, Space(**SPACE), budget_s=budget_s, objective=objective,
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


def test_a_tune_resumes_from_its_records_and_decides_the_same(tmp_path):
    first, _ = tune_with(tmp_path, budget_s=3600)
    again, runner = tune_with(tmp_path, budget_s=3600, run_id="second")
    assert runner.new == []     # every probe and final measurement came from the file
    assert again.winner.setup == first.winner.setup
    assert [t.record.setup for t in again.tried] == [t.record.setup for t in first.tried]
    # The stored probes count against the budget: a resumed tune has no more time than one.
    assert again.spent_s >= sum(t.record.wall_s for t in first.tried)


def test_the_command_measures_the_winner_again():
    winner = Setup(model="llama-468m", mode="compile", attn="flex_attention", batch=32, seq=2048,
                   device="cuda", compile_mode="reduce-overhead", kernels="liger-no-flce",
                   optimizer="foreach", checkpointing=True, init="device", warmup=4, steps=20)
    command = run_command(winner, repeats=3)
    args = build_parser().parse_args(command.split()[1:])
    settings = run_settings(args)
    assert [s.key() for s in build_plan(settings, "cuda")] == [winner.key()]
    assert settings.repeats == 3


@pytest.mark.parametrize("text, seconds", [("20m", 1200), ("90s", 90), ("1h30m", 5400),
                                           ("45", 45), ("1.5m", 90)])
def test_budget_durations(text, seconds):
    assert parse_budget(text) == seconds


@pytest.mark.parametrize("argv, message", [
    (["--budget", "soon"], "--budget takes a duration like 20m"),
    (["--budget", "0s"], "--budget must be more than 0 seconds"),
    (["--budget", "1m", "--objective", "fit"], "--objective fit needs --memory-limit-gb"),
    (["--budget", "1m", "--attn", "sdp"], "unknown attn 'sdp'"),
])
def test_bad_tune_input_is_one_line_and_exit_2(argv, message, capsys, tmp_path):
    code = main(["tune", "--device", "cpu", "--out", str(tmp_path / "t.jsonl"), *argv])
    err = capsys.readouterr().err
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1


# ---------------------------------------------------------------- one real tune on the CPU

TUNE = ["tune", "--device", "cpu", "--model", "llama-tiny", "--seq", "32", "--batch", "1",
        "--modes", "eager", "--attn", "sdpa,eager", "--optimizer", "fused",
        "--checkpointing", "off", "--repeats", "2", "--warmup", "1", "--steps", "3",
        "--budget", "60s", "--format", "json"]


def test_a_real_tune_keeps_its_budget_skips_a_departing_setup_and_resumes(tmp_path):
    out = tmp_path / "tune.jsonl"
    env = {**os.environ, "STEPBENCH_TEST_DIVERGE": "eager+eager"}
    command = [sys.executable, "-m", "stepbench", *TUNE, "--out", str(out)]
    # Interrupted once its first probe is stored, as Ctrl-C would.
    first = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, start_new_session=True)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and not (out.exists() and out.read_text().strip()):
        time.sleep(0.2)
    first.send_signal(signal.SIGINT)
    _, err = first.communicate(timeout=60)
    assert first.returncode == 130, err
    assert "run the same command again to resume" in err
    kept = ResultsFile(out).read()
    assert len(kept) >= 1
    # The same command resumes: nothing stored is measured again, and it ends within what the
    # budget has left.
    started = time.monotonic()
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=180)
    elapsed = time.monotonic() - started
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    records = ResultsFile(out).read()
    keys = [(r.setup.key(), r.repeat) for r in records]
    assert len(keys) == len(set(keys)), "a stored probe was measured again"
    assert {r.run_id for r in kept} & {r.run_id for r in records[len(kept):]} == set()
    assert result["spent_s"] <= 60 + 3 and elapsed <= 60 + 10
    # eager+eager's weights were spoiled: its losses depart and it is never the winner.
    assert result["winner"]["setup"]["name"] == "eager+sdpa"
    assert all(r["setup"]["name"] != "eager+eager" for r in [result["winner"],
                                                             result["runner_up"] or {"setup": {}}])
    assert any(t["setup"]["name"] == "eager+eager" for t in result["tried"])
    assert all(r.search and r.search["kind"] == "tune" for r in records)
    # The command it prints measures the winner's setup.
    settings = run_settings(build_parser().parse_args(result["command"].split()[1:]))
    assert build_plan(settings, "cpu")[0].key() == \
        Setup.from_dict(result["winner"]["setup"]).key()
    # A third time, everything is stored: the same answer, no process started.
    replay = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
    assert json.loads(replay.stdout)["winner"] == result["winner"]
    assert len(ResultsFile(out).read()) == len(records)


