"""The --gpus scheduler: one process per GPU of a pool, each child seeing only its own GPU(s).

The pools here are fake device lists (no GPU is needed): the children are short scripts that
report what CUDA_VISIBLE_DEVICES they were given, so isolation, one job per device and records
that never mix are checked on real processes. One test runs real CPU setups side by side.
"""

import dataclasses

import pytest

from stepbench.cli import main
from stepbench.execute.local.process import LocalProcess
from stepbench.execute.runner import Runner, expected_cost
from stepbench.record import ResultsFile
from stepbench.setup import Setup

from conftest import SMALL
from fakes import ProtocolChild, ScriptedProcesses, overlapping

def cuda_setup(batch, **fields):
    return Setup(model="llama-tiny", mode="eager", attn="sdpa", batch=batch, seq=64, device="cuda",
                 **fields)


def run_pool(tmp_path, gpus, plan, sleep_s=0.6, together=0):
    child = ProtocolChild(tmp_path, sleep_s, together, gpu="fake GPU")
    executor = ScriptedProcesses(child, gpus=gpus, gpu_name="fake GPU")
    try:
        records = Runner(executor, ResultsFile(tmp_path / "r.jsonl"), measure_peak=False).run(
            plan, timeout_s=60)
    finally:
        executor.close()
    return records, child.entries()


@pytest.mark.slow
def test_each_child_sees_one_gpu_of_the_pool_and_never_shares_it(tmp_path, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("TORCHINDUCTOR_COMPILE_THREADS", raising=False)
    records, log = run_pool(tmp_path, [0, 2, 3], [cuda_setup(b) for b in range(1, 7)],
                            sleep_s=0.1, together=3)
    assert [r.setup.batch for r in records] == [1, 2, 3, 4, 5, 6]          # plan order kept
    assert all(e["seen"] in ("0", "2", "3") for e in log)                   # one GPU each
    for a in log:
        for b in log:
            if a is not b and a["seen"] == b["seen"]:
                assert not overlapping(a, b), (a, b)                        # never two on one GPU
    # The pool is used: the first three met at their barrier, all running at once.
    assert sum(e["met"] is True for e in log) == 3 and not any(e["met"] is False for e in log)
    for record in records:                                                  # results never mixed
        assert record.step_ms == 10.0 * record.setup.batch
        seen = next(e["seen"] for e in log if e["batch"] == record.setup.batch)
        assert record.placement["cuda_visible_devices"] == seen
        assert record.placement["gpus"] == [int(seen)] and record.loss_last == int(seen)
    # Three processes compile at once: each gets a third of the CPUs.
    import os

    threads = max(1, len(os.sched_getaffinity(0)) // 3)
    assert {e["threads"] for e in log} == {str(threads)}
    assert {r.placement["compile_threads"] for r in records} == {threads}


@pytest.mark.slow
def test_a_job_of_two_processes_takes_two_gpus_and_others_fill_the_rest(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")   # --gpus indices go through it
    plan = [cuda_setup(1), cuda_setup(2, nproc=2, parallel="ddp"), cuda_setup(3),
            cuda_setup(4, nproc=2, parallel="fsdp2")]
    records, log = run_pool(tmp_path, [0, 1, 2, 3], plan)
    by_batch = {e["batch"]: e for e in log}
    assert len(by_batch[2]["seen"].split(",")) == 2 and len(by_batch[4]["seen"].split(",")) == 2
    assert all(set(e["seen"].split(",")) <= {"4", "5", "6", "7"} for e in log)
    for a in log:
        for b in log:
            if a is not b and overlapping(a, b):
                assert not set(a["seen"].split(",")) & set(b["seen"].split(",")), (a, b)
    # Bigger jobs start first (longest expected first); the two-GPU jobs fill the pool together.
    starts = sorted(log, key=lambda e: e["start"])
    assert {e["batch"] for e in starts[:2]} == {2, 4}
    assert records[1].placement["gpus"] == [int(i) - 4 for i in by_batch[2]["seen"].split(",")]


def test_longest_expected_setups_start_first():
    base = Setup(model="llama-468m", mode="eager", attn="sdpa", batch=4, seq=2048)
    matrix = [base, dataclasses.replace(base, mode="compile"), dataclasses.replace(base, attn="eager"),
              dataclasses.replace(base, mode="compile", attn="eager")]
    ordered = sorted(matrix, key=expected_cost, reverse=True)
    assert [s.name for s in ordered] == ["compile+eager", "compile+sdpa", "eager+eager", "eager+sdpa"]


@pytest.mark.slow
def test_without_a_pool_one_setup_runs_at_a_time_in_plan_order_unpinned(tmp_path, monkeypatch):
    # Nothing is reordered (the post's order, eager before compiled) and the child sees what
    # the parent sees.
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    plan = [cuda_setup(1), dataclasses.replace(cuda_setup(2), mode="compile")]
    records, log = run_pool(tmp_path, None, plan, sleep_s=0.1)
    assert [e["batch"] for e in log] == [1, 2] and [e["seen"] for e in log] == [None, None]
    assert all(r.placement["gpus"] is None and r.placement["concurrent"] == 1 for r in records)


@pytest.mark.slow
def test_real_cpu_setups_run_side_by_side_and_keep_their_own_results(tmp_path):
    out = tmp_path / "r.jsonl"
    plan = [Setup(model="llama-tiny", mode="eager", attn=attn, batch=batch, seq=64, device="cpu",
                  warmup=0, steps=2) for attn, batch in (("sdpa", 2), ("eager", 3))]
    executor = LocalProcess(gpus=[0, 1])
    try:
        records = Runner(executor, ResultsFile(out)).run(plan, timeout_s=300)
    finally:
        executor.close()
    assert [(r.status, r.setup.attn, r.setup.batch) for r in records] == [("ok", "sdpa", 2), ("ok", "eager", 3)]
    assert all(r.placement["gpus"] is None for r in records)   # CPU setups are not pinned
    for r in records:   # each record's tokens/s is its own batch's
        assert r.tokens_per_s == pytest.approx(r.setup.batch * 64 / (r.step_ms / 1000))


@pytest.mark.parametrize("args, message", [
    (["--gpus", "all"], "--gpus needs CUDA GPUs"),
    (["--nproc", "2"], "add --parallel ddp or --parallel fsdp2"),
    (["--nproc", "2", "--parallel", "zero3"], "unknown parallel style (--parallel) 'zero3'; choose one of: none, ddp, fsdp2"),
    (["--nnodes", "2", "--parallel", "ddp"], "--nnodes 2 needs --node-rank"),
])
def test_bad_distributed_flags_name_the_fix(tmp_path, capsys, args, message):
    # In this process: the checks come before anything runs or any config is read.
    assert main(["run", *SMALL, *args, "--out", str(tmp_path / "r.jsonl")]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err
