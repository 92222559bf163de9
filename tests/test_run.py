"""Real runs of real tiny models in real child processes, including a real inductor compile."""

import math

import pytest

from conftest import SMALL, read_jsonl, run_cli
from says import lines_naming, names

pytestmark = pytest.mark.slow     # every test here starts child processes


@pytest.fixture(scope="module")
def matrix_run(tmp_path_factory):
    """The default matrix (eager/compile x sdpa/eager) twice, interleaved, shared by the checks
    below: each compiled setup compiles cold in its first process and finds its cache warm in the
    second (the only real compiles of the suite, about 20 s each on 2 cores)."""
    out = tmp_path_factory.mktemp("matrix") / "results.jsonl"
    proc = run_cli("run", *SMALL, "--repeats", "2", "--out", out, "--format", "json",
                   check_json=True)
    return proc, out


def test_default_matrix_runs_all_four_setups(matrix_run):
    proc, out = matrix_run
    names = [r["setup"]["name"] for r in proc.records]
    assert names == ["eager+sdpa", "compile+sdpa", "eager+eager", "compile+eager"] * 2
    assert [r["repeat"] for r in proc.records] == [0] * 4 + [1] * 4
    assert [r["status"] for r in proc.records] == ["ok"] * 8, [r["error"] for r in proc.records]
    # stdout held the records and nothing else; the file holds the same records.
    assert read_jsonl(out) == proc.records
    assert "no CUDA GPU found" not in proc.stderr  # --device cpu was explicit


def test_records_are_consistent(matrix_run):
    for r in matrix_run[0].records:
        s = r["setup"]
        assert r["schema"] == 1 and r["phase"] == "done" and r["error"] is None
        assert len(r["step_times_ms"]) == s["steps"] == 5
        assert r["step_ms"] == pytest.approx(sum(r["step_times_ms"]) / 5)
        assert r["tokens_per_s"] == pytest.approx(s["batch"] * s["seq"] / (r["step_ms"] / 1000))
        assert r["step_ms_min"] <= r["step_ms_median"] <= r["step_ms_max"]
        assert r["first_step_s"] > 0 and r["peak_memory_gb"] > 0 and r["peak_reserved_gb"] > 0
        # On a CPU: the step's tensors, and the CPU time other processes took from the steps.
        assert r["peak_memory_source"] == "tensors"
        assert r["telemetry"]["cpus"] >= 1 and r["telemetry"]["other_cpu_s"] >= 0
        assert ("busy_cpu" in r["noise_flags"]) == (r["telemetry"]["contention"] > 0.1)
        assert r["telemetry"]["threads"] == 1      # OMP_NUM_THREADS=1 (conftest)
        assert r["timed_wall_s"] == pytest.approx(sum(r["step_times_ms"]) / 1000, rel=0.2)
        # A CPU step is synchronous: no host lead is recorded, and no row is host-bound.
        assert r.get("host_lead_ms") is None and not r.get("host_lead_steps_ms")
        assert "host_bound" not in r["noise_flags"]
        assert len(r["losses"]) == 1 + 2 + 5
        assert all(math.isfinite(v) for v in r["losses"])
        assert r["loss_first"] == r["losses"][0] and r["loss_last"] == r["losses"][-1]
        # Random init on a 4096-token vocabulary: the first loss is near ln(4096) = 8.3.
        assert 7.0 < r["loss_first"] < 9.5
        assert r["params"] == 1_573_504
        assert r["machine"]["gpu"] == "cpu" and r["machine"]["cpu_count"] >= 1
        assert r["software"]["torch"] and r["software"]["transformers"]


def test_phases_account_for_the_process_wall_time(matrix_run):
    from stepbench.measure.phases import PHASES

    for r in matrix_run[0].records:
        phases = r["phases"]
        # Every phase, in order, but "profile" (the extra profiled step, only with --profile).
        assert list(phases) == [p for p in PHASES if p not in ("profile", "exit")] + ["exit"]
        assert all(v >= 0 for v in phases.values()) and phases["first_step"] > 0
        assert phases["first_step"] == pytest.approx(r["first_step_s"], abs=0.01)
        assert phases["timed"] >= r["timed_wall_s"]
        # One clock in the child, the parent's for "exit": together the process's whole life,
        # short of the parent's own work around the spawn and the pipe (and give or take the
        # process start's 10 ms clock tick and the rounding to ms).
        assert -0.05 <= r["wall_s"] - sum(phases.values()) < 0.5, (r["wall_s"], phases)
        # On the CPU the device is the CPU: init is "cpu", its default, left out as 0.1 wrote it.
        assert "init" not in r["setup"]


def test_same_seed_gives_same_first_loss_in_every_setup(matrix_run):
    # Weights and tokens come from the seed, so the setups train the same model on the same data.
    firsts = [r["loss_first"] for r in matrix_run[0].records]
    assert max(firsts) - min(firsts) < 0.05, firsts


def test_compiled_setups_compile_cold_then_warm(matrix_run):
    # Without --compile-cache each compiled setup gets a fresh cache: the first process compiles
    # cold, the second (a repeat) finds the cache warm.
    records = matrix_run[0].records
    assert all(r["compile"] is None for r in records if r["setup"]["mode"] == "eager")
    for attn in ("sdpa", "eager"):
        cold, warm = [r for r in records if r["setup"]["name"] == f"compile+{attn}"]
        assert cold["compile"]["cache"] == "cold" and warm["compile"]["cache"] == "warm"
        assert cold["compile"]["cache_misses"] > 0 and warm["compile"]["cache_hits"] > 0
        assert warm["first_step_s"] < cold["first_step_s"] / 2, (cold["first_step_s"], warm["first_step_s"])
        assert cold["compile"]["graphs"] >= 1 and cold["compile"]["recompiles_in_timed"] == 0


def test_table_output(tmp_path, matrix_run):
    # A rerun with the same --out resumes: everything is skipped and the table is printed at once.
    proc = run_cli("run", *SMALL, "--repeats", "2", "--out", matrix_run[1])
    assert proc.returncode == 0, proc.stderr
    assert len(lines_naming(proc.stderr, "(ok)", "skipped")) == 8
    lines = proc.stdout.splitlines()
    assert names(lines[0], "llama-tiny", "bf16", "CPU")
    header = next(line for line in lines if "Setup" in line)
    assert header.split() == ["Setup", "Batch", "Seq", "Step", "(ms)", "Tokens/s", "Peak", "memory",
                              "First", "step", "(s)"]
    assert [line.split()[0] for line in lines if "+" in line] == [
        "eager+sdpa", "compile+sdpa", "eager+eager", "compile+eager"]
    # One row per setup, the two processes combined as the report combines them.
    assert any(names(line, "2 repeats combined", "every row") for line in lines)


def test_compiled_and_eager_losses_agree(matrix_run):
    # Same seed, same weights, same tokens: after 1 + 2 + 5 steps the compiled setup's loss is
    # within bf16 tolerance of eager's (numerical parity).
    by_name = {r["setup"]["name"]: r for r in matrix_run[0].records if r["repeat"] == 0}
    for attn in ("sdpa", "eager"):
        eager, compiled = by_name[f"eager+{attn}"], by_name[f"compile+{attn}"]
        for k, (a, b) in enumerate(zip(eager["losses"], compiled["losses"])):
            assert abs(b - a) / abs(a) < 2e-2, (attn, k, a, b)


def test_flop_count_cross_check_is_recorded(matrix_run):
    for r in matrix_run[0].records:
        tokens = r["setup"]["batch"] * r["setup"]["seq"]
        convention = r["flops_per_token"] * tokens
        assert r["flops_per_token_causal"] < r["flops_per_token"]
        assert "6*N'" in r["flops_convention"]
        # FlopCounterMode counts matmuls only and fused attention's backward recompute: within 5%.
        assert r["flop_counter_per_step"] == pytest.approx(convention, rel=0.05)
        assert r["achieved_tflops"] == pytest.approx(r["flops_per_token"] * r["tokens_per_s"] / 1e12)
        # No GPU: no datasheet peak, so no MFU (never a made-up number).
        assert r["mfu_datasheet"] is None and r["mfu_measured"] is None
