"""Real runs that end otherwise than a plain success: resume and --rerun, out of memory, a
memory limit too small, an unsupported kernel, a config from a folder, and the signals that stop
a run (Ctrl-C, SIGTERM, SIGHUP) with nothing left running. Each runs real tiny models in real
child processes."""

import json
import os
import shutil
import signal
import subprocess
import sys
import uuid

import psutil
import pytest

from conftest import SMALL, SRC, read_jsonl, run_cli, wait_for
from says import lines_naming, names

pytestmark = pytest.mark.slow     # every test here starts child processes


def test_resume_runs_only_the_missing_setups_and_rerun_measures_again(tmp_path):
    out = tmp_path / "r.jsonl"
    first = run_cli("run", *SMALL, "--modes", "eager", "--attn", "sdpa", "--out", out)
    assert first.returncode == 0, first.stderr
    second = run_cli("run", *SMALL, "--modes", "eager", "--attn", "sdpa,eager", "--out", out,
                     "--format", "json", "--pin-cpus", "auto", check_json=True)
    lines = second.stderr.splitlines()
    [found] = [line for line in lines if "[1/2]" in line and "skipped" in line]
    assert names(found, "eager+sdpa batch 4 seq 64", "(ok)")
    assert any(names(line, "[2/2]", "eager+eager batch 4 seq 64: ok") for line in lines)
    records = read_jsonl(out)
    assert [r["setup"]["name"] for r in records] == ["eager+sdpa", "eager+eager"]
    # --pin-cpus auto on a CPU setup: recorded, not bound (no GPU to be near); off: nothing.
    assert records[0].get("cpu_pinning") is None
    pinning = records[1]["cpu_pinning"]
    assert pinning["mode"] == "auto" and pinning["pinned"] is False and "CPU" in pinning["why"]
    assert [r["setup"]["name"] for r in second.records] == ["eager+sdpa", "eager+eager"]
    # --rerun measures again; the new record is appended and is the one that counts.
    third = run_cli("run", *SMALL, "--modes", "eager", "--attn", "sdpa", "--out", out, "--rerun",
                    "--format", "json", check_json=True)
    assert lines_naming(third.stderr, "[1/1]", "eager+sdpa batch 4 seq 64", ": ok")
    records = read_jsonl(out)
    assert [r["setup"]["name"] for r in records] == ["eager+sdpa", "eager+eager", "eager+sdpa"]
    assert third.records == records[2:]
    report = run_cli("report", out, "--format", "json")
    rows = json.loads(report.stdout)["rows"]
    assert [(r["setup"], r["repeats"]) for r in rows] == [("eager+sdpa", 1), ("eager+eager", 1)]
    assert rows[0]["step_ms"] == pytest.approx(records[2]["step_ms"])


def test_by_default_a_setup_runs_in_two_processes_and_a_third_where_they_disagree(tmp_path):
    from stepbench.noise import processes_disagree
    from stepbench.record import Record

    assert SMALL[-2:] == ["--repeats", "1"]
    default = SMALL[:-2]             # SMALL without its --repeats 1: run's own default
    out = tmp_path / "r.jsonl"
    proc = run_cli("run", *default, "--modes", "eager", "--attn", "sdpa", "--out", out,
                   "--format", "json", check_json=True)
    records = [Record.from_dict(r) for r in proc.records]
    assert [r.repeat for r in records[:2]] == [0, 1] and all(r.ok for r in records)
    # A third exactly when the first two disagree (on a busy CPU, either can happen).
    third = processes_disagree(records[:2])
    assert [r.repeat for r in records] == ([0, 1, 2] if third else [0, 1])
    assert bool(lines_naming(proc.stderr, "third process", "eager+sdpa batch 4 seq 64")) == third
    # Done: the same command resumes with nothing to run and points at the report.
    again = run_cli("run", *default, "--modes", "eager", "--attn", "sdpa", "--out", out)
    assert again.returncode == 0, again.stderr
    assert len(lines_naming(again.stderr, "(ok)", "skipped")) == len(records)
    results, report = again.stderr.strip().splitlines()[-2:]
    assert results == f"results: {out}"
    assert names(report, f"stepbench report {out} --format html --out {out.with_suffix('.html')}")


def test_real_oom_gives_an_oom_row_and_the_other_setup_finishes(tmp_path):
    # A 1 GB cap on what each child adds to its address space: SDPA attention fits (it fits
    # under 0.7 GB), the naive attention's 4 x 4 x 2048 x 2048 score matrices do not (it needs
    # about 1.5 GB).
    out = tmp_path / "r.jsonl"
    args = ["--device", "cpu", "--modes", "eager", "--attn", "eager,sdpa", "--batch", "4",
            "--seq", "2048", "--warmup", "0", "--steps", "1", "--memory-limit-gb", "1",
            "--repeats", "1", "--out", out]
    proc = run_cli("run", *args, "--format", "json", check_json=True)
    oom, ok = proc.records
    assert oom["setup"]["name"] == "eager+eager" and oom["status"] == "oom"
    assert "can't allocate memory" in oom["error"]
    assert oom["oom_memory_gb"] > 0.1
    assert oom["step_ms"] is None and oom["phase"] == "first_step"
    assert ok["status"] == "ok" and ok["setup"]["memory_limit_gb"] == 1
    proc = run_cli("run", *args)        # resumed: the table
    assert any(line.split()[:4] == ["eager+eager", "4", "2048", "OOM"] for line in proc.stdout.splitlines())


def test_a_memory_limit_too_small_is_oom_and_flex_attention_on_cpu_is_unsupported(tmp_path):
    # Two setups that cannot run, each recorded with its reason: the cap counts from the
    # process's imports, so even a tiny one leaves torch running, and the model's build does not
    # fit; flex attention's backward on a CPU is refused before the model is built (the registry
    # knows, stepbench.axes), whatever the cap. (That the setups after an unsupported, failed or
    # crashed one still run: the oom test above, tests/test_runner.py and tests/test_axes.py.)
    # No setup ran ok: exit 1, with one line (docs/cli.md); the records are kept all the same.
    out = tmp_path / "r.jsonl"
    args = [*SMALL, "--modes", "eager", "--attn", "sdpa,flex_attention", "--memory-limit-gb",
            "0.001", "--out", out]
    proc = run_cli("run", *args, "--format", "json", check_json=True, code=1)
    capped, flex = proc.records
    assert capped["status"] == "oom" and capped["phase"] == "building", capped["error"]
    assert flex["status"] == "unsupported" and flex["phase"] == "building", flex["error"]
    assert "backward on CPU" in flex["error"]
    [said] = [line for line in proc.stderr.splitlines() if "(1 oom, 1 unsupported)" in line]
    assert said.startswith("stepbench run: ") and names(said, str(out))
    # Everything resumed from the file: nothing failed now, exit 0.
    again = run_cli("run", *args, "--format", "markdown")
    assert again.returncode == 0, again.stderr
    # the status note says which memory the step did not fit: the cap, not the machine's
    assert lines_naming(again.stdout, "OOM", "--memory-limit-gb", "allocated memory")


def test_processes_of_one_setup_on_a_busy_cpu_agree_on_peak_memory(tmp_path):
    # Two processes of one setup, with two torch threads each, while a busy loop spins beside
    # them (one: on CI's two cores the other test worker runs too): resident memory read 0.15-0.54 GB for one setup under load (glibc's heaps),
    # the tensors the step allocates do not change with load. (Nor with the start method:
    # test_server.py, a forked process against a fresh one.)
    from stepbench.measure.footprint import estimate
    from stepbench.record import Record

    # The loop starts once the process server is ready, before the setups' processes: it would
    # take a core from the other test worker for the server's imports too.
    env = {**os.environ, "OMP_NUM_THREADS": "2", "PYTHONPATH": SRC}
    proc = subprocess.Popen([sys.executable, "-m", "stepbench", "run", "--device", "cpu", "--seq",
                             "64", "--warmup", "0", "--steps", "2", "--modes", "eager", "--attn",
                             "sdpa", "--repeats", "2", "--out", str(tmp_path / "r.jsonl")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    loops = []
    try:
        wait_for(proc, "process server ready")
        loops.append(subprocess.Popen([sys.executable, "-c", "while True: pass"]))
        _, err = proc.communicate(timeout=300)
    finally:
        proc.kill()
        for loop in loops:
            loop.kill()
            loop.wait()
    assert proc.returncode == 0, err
    records = [Record.from_dict(r) for r in read_jsonl(tmp_path / "r.jsonl")]
    assert [r.repeat for r in records] == [0, 1]
    # The busy loop was seen: other processes took CPU time in every process's timed steps.
    assert all("busy_cpu" in r.noise_flags and r.telemetry["contention"] > 0.1
               and r.telemetry["threads"] == 2 for r in records), [r.telemetry for r in records]
    peaks = [r.peak_memory_gb for r in records]
    assert all(r.peak_memory_source == "tensors" for r in records)
    assert max(peaks) <= 1.01 * min(peaks), peaks
    # The floor `run` refuses a setup by lies below what the step needed.
    assert estimate(records[0].setup).total / 1e9 <= min(peaks)
    report = run_cli("report", tmp_path / "r.jsonl", "--format", "json")
    [row] = json.loads(report.stdout)["rows"]
    assert "memory_spread" not in row["noise_flags"] and "busy_cpu" in row["noise_flags"]


def test_model_from_a_config_folder(tmp_path):
    # A different architecture (Qwen2, grouped-query attention, tied embeddings) from a config.json.
    # One setup here; tests/test_remote.py runs this config with both attentions.
    folder = os.path.join(os.path.dirname(__file__), "data", "tiny-qwen2")
    proc = run_cli("run", *SMALL, "--model", folder, "--modes", "eager", "--attn", "sdpa",
                   "--out", tmp_path / "r.jsonl", "--format", "json", check_json=True)
    assert [r["status"] for r in proc.records] == ["ok"]
    assert proc.records[0]["setup"]["model"] == folder       # the record keeps the path
    assert 6.0 < proc.records[0]["loss_first"] < 8.0  # ln(1024) = 6.9
    # Tables name the model by its folder; without --device the CPU notice does not claim
    # that the llama-tiny preset runs. (Resumed: nothing runs again.)
    again = run_cli("run", "--seq", "64", "--warmup", "2", "--steps", "5", "--model", folder,
                    "--modes", "eager", "--attn", "sdpa", "--repeats", "1",
                    "--out", tmp_path / "r.jsonl")
    assert names(again.stdout.splitlines()[0], "tiny-qwen2", "bf16", "CPU")
    assert folder not in again.stdout
    assert names(again.stderr, "CUDA", "CPU", "--device cuda")


def test_the_suites_commands_get_sigint_as_a_terminals_foreground_job_does():
    # pytest started as a shell's background job inherits SIGINT ignored: conftest catches it
    # again, or every command the Ctrl-C tests start would ignore their SIGINT too.
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


@pytest.mark.parametrize("sig, code, said", [
    (signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "stopped by SIGTERM"),
    (signal.SIGHUP, 129, "stopped by SIGHUP")])
def test_a_signal_stops_the_run_keeps_finished_results_and_leaves_no_process(tmp_path, sig, code,
                                                                             said):
    # Ctrl-C, `timeout 120 stepbench run ...` (SIGTERM) and a closed terminal (SIGHUP) alike.
    # Ctrl-C comes after a setup of this run finished (batch 1 x 50 steps takes a second; batch 64
    # x 50 steps would take half a minute: interrupt it): the finished setup's row is on stdout, before the
    # one line on stderr. SIGTERM and SIGHUP come to a run of batch 64 alone whose results file
    # already holds finished records (0.1's): they stay as they were. Every process the run
    # started (its process server, the setup's process forked from it) carries a mark in its
    # environment, and none is left after.
    out = tmp_path / "r.jsonl"
    fresh = sig == signal.SIGINT
    if not fresh:
        shutil.copy(os.path.join(os.path.dirname(__file__), "data", "v0.1", "cpu-results.jsonl"), out)
    before = out.read_bytes() if out.exists() else b""
    mark = uuid.uuid4().hex
    env = dict(os.environ, PYTHONPATH=SRC, STEPBENCH_TEST_MARK=mark)
    proc = subprocess.Popen([sys.executable, "-m", "stepbench", "run", "--device", "cpu", "--seq", "64",
                             "--modes", "eager", "--attn", "sdpa", "--batch", "1,64" if fresh else "64",
                             "--warmup", "2", "--steps", "50", "--repeats", "1", "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        seen = wait_for(proc, f"{'[2/2]' if fresh else '[1/1]'} eager+sdpa batch 64 seq 64: warm-up")
        marked = [p for p in psutil.process_iter() if _marked(p, mark) and p.pid != proc.pid]
        assert len(marked) >= 2, seen       # the process server and the running setup's process
        proc.send_signal(sig)
        rest = proc.stderr.read()
        stdout = proc.stdout.read()
        assert proc.wait(timeout=60) == code, rest
    finally:
        proc.kill()
    [last] = [line for line in rest.splitlines() if line.startswith(f"stepbench run: {said};")]
    assert names(last, str(out), "resume")
    assert "Traceback" not in rest
    if fresh:
        assert lines_naming(seen, "[1/2]", "eager+sdpa batch 1 seq 64", ": ok")
        records = read_jsonl(out)
        assert [(r["setup"]["batch"], r["status"]) for r in records] == [(1, "ok")]
        rows = [line.split()[:4] for line in stdout.splitlines() if line.strip().startswith("eager")]
        assert rows == [["eager+sdpa", "1", "64", rows[0][3]]] and rows[0][3][0].isdigit(), stdout
        assert rest.strip().splitlines()[-1] == last
    else:
        assert out.read_bytes() == before
    gone, alive = psutil.wait_procs(marked, timeout=30)
    assert alive == [], [p.cmdline() for p in alive]
    assert not [p for p in psutil.process_iter() if _marked(p, mark)]


def _marked(process: psutil.Process, mark: str) -> bool:
    try:
        return process.environ().get("STEPBENCH_TEST_MARK") == mark and \
            process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


@pytest.mark.slow
def test_two_runs_on_one_results_file_measure_each_setup_once(tmp_path):
    """Two `run`s of the same plan into one file, the second started while the first measures:
    every setup is measured once (claims.py), and a run that waited for the other's record
    said so in one line."""
    import time

    out = tmp_path / "r.jsonl"
    args = [sys.executable, "-m", "stepbench", "run", "--device", "cpu", "--model", "llama-tiny",
            "--modes", "eager", "--attn", "sdpa,eager", "--batch", "1", "--seq", "64",
            "--warmup", "0", "--steps", "2", "--repeats", "1", "--out", str(out)]
    env = dict(os.environ, PYTHONPATH=SRC)
    first = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=env)
    claims = out.with_name(out.name + ".claims")
    deadline = time.monotonic() + 120
    while not claims.exists() and time.monotonic() < deadline and first.poll() is None:
        time.sleep(0.05)
    second = subprocess.run(args, capture_output=True, text=True, env=env, timeout=300)
    _, first_err = first.communicate(timeout=300)
    assert first.returncode == 0 and second.returncode == 0, first_err + second.stderr
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(r["setup"]["name"] for r in records) == ["eager+eager", "eager+sdpa"]
    waited = [line for line in (first_err + second.stderr).splitlines()
              if "waiting for its record" in line]
    # Whether the second run waited depends on timing (on a loaded machine the first can store
    # both setups before the second has imported): the line itself is test_claims.py's, here
    # only that what was said names the other run and the file.
    assert all(names(line, "(pid ", str(out)) for line in waited)
    assert not claims.exists()


def test_a_failed_count_of_the_steps_tensors_leaves_a_note():
    # hostqa: under a --memory-limit-gb cap just above a step's need, the profiled step that
    # counts its tensors failed to allocate in some processes (not in others): their peak
    # memory was the resident growth (0.19-0.21 GB against 0.14 GB) with nothing said.
    import torch

    from stepbench.measure.step import CpuMemory

    def step():
        raise RuntimeError("DefaultCPUAllocator: can't allocate memory\nmore")

    counted = CpuMemory.tensors_peak(step, [torch.zeros(4)])
    assert "peak_memory_gb" not in counted and "peak_memory_source" not in counted
    [note] = counted["notes"]
    assert names(note, "resident growth", "RuntimeError", "can't allocate") and "\n" not in note

    def fine():
        torch.ones(1024).sum()

    counted = CpuMemory.tensors_peak(fine, [torch.zeros(4)])
    assert counted["peak_memory_source"] == "tensors" and "notes" not in counted
