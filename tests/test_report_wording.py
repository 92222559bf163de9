"""What the findings say where the numbers are thin: comparisons the test could not separate,
untested gaps, compile payback that never came, small memory changes, and compile times under
a shared inductor cache (issue 23)."""

import copy
import csv
import io
import json

import numpy as np

from says import names
from test_report_stats import rec, report_text, run_report, texts


def _steps(rng, mean, spread, n=20):
    return [float(x) for x in rng.normal(mean, spread, n)]


def test_a_gap_the_test_cannot_separate_is_not_called_equally_fast(capsys, tmp_path):
    """Two processes a side whose spread spans a 47% gap (a busy CPU): the hierarchical
    bootstrap cannot tell them apart, which is not the same as showing them equal."""
    rng = np.random.default_rng(0)
    records = [rec("eager", repeat=i, steps=_steps(rng, m, 3.0)) for i, m in enumerate([35, 67])]
    records += [rec("compile", repeat=i, steps=_steps(rng, m, 3.0), first_step_s=30.0)
                for i, m in enumerate([40, 110])]
    doc, _ = run_report(capsys, tmp_path, records)
    fastest = texts(doc, "fastest_setup")
    assert fastest.startswith("Fastest setup: eager+sdpa and compile+sdpa on NVIDIA H200, not "
                              "told apart from the noise (50.8 vs 75.9 ms, p = 0.")
    assert "equally fast" not in fastest and fastest.count("noise") == 1


def test_a_close_pair_within_the_noise_is_equally_fast(capsys, tmp_path):
    rng = np.random.default_rng(1)
    records = [rec("eager", repeat=i, steps=_steps(rng, 100.0, 2.0)) for i in range(2)]
    records += [rec("compile", repeat=i, steps=_steps(rng, 100.3, 2.0), first_step_s=30.0)
                for i in range(2)]
    doc, _ = run_report(capsys, tmp_path, records)
    fastest = texts(doc, "fastest_setup")
    assert " on NVIDIA H200, equally fast within the noise (" in fastest
    assert fastest.count("within the noise") == 1 and ", p = 0." in fastest


def test_an_untested_gap_says_so(capsys, tmp_path):
    doc, _ = run_report(capsys, tmp_path, [rec("eager", step_ms=74.6),
                                           rec("compile", step_ms=50.9, first_step_s=30.0)])
    assert texts(doc, "fastest_setup") == (
        "Fastest setup (untested against noise): compile+sdpa on NVIDIA H200 (160,943 tokens/s, "
        "50.9 ms; 47% faster than the runner-up, eager+sdpa at 74.6 ms).")
    # Where another GPU's pair was tested, the untested one says so itself.
    rng = np.random.default_rng(2)
    tested = [rec(mode, gpu="NVIDIA L40S", repeat=i, steps=_steps(rng, m, 1.0))
              for mode, m in (("eager", 100.0), ("compile", 80.0)) for i in range(2)]
    doc, _ = run_report(capsys, tmp_path, [rec("eager", step_ms=74.6),
                                           rec("compile", step_ms=50.9)] + tested)
    fastest = texts(doc, "fastest_setup")
    assert fastest.startswith("Fastest setup: compile+sdpa on NVIDIA H200 (")
    assert "eager+sdpa at 74.6 ms, untested against noise); compile+sdpa on NVIDIA L40S" in fastest
    assert fastest.endswith("eager+sdpa at 100 ms).")


def test_compile_that_never_paid_back_reads_as_a_sentence(capsys, tmp_path):
    doc, _ = run_report(capsys, tmp_path, [rec("eager", gpu="cpu", step_ms=50.0),
                                           rec("compile", gpu="cpu", step_ms=60.0,
                                               first_step_s=30.0)])
    assert texts(doc, "compile_payback") == (
        "With sdpa attention, torch.compile never paid back its compile time on CPU (unknown model), where "
        "compiled steps were not faster.")


def test_a_third_more_memory_on_a_cpu_is_not_unchanged(capsys, tmp_path):
    """0.05 GB is noise for a GPU's tens of GB but a third of a CPU run's 0.15 GB."""
    doc, _ = run_report(capsys, tmp_path, [rec("eager", gpu="cpu", step_ms=50, peak_memory_gb=0.15),
                                           rec("compile", gpu="cpu", step_ms=40,
                                               peak_memory_gb=0.198)])
    assert texts(doc, "compile_memory") == ("With sdpa attention, torch.compile raised peak "
                                           "memory on CPU (unknown model) by 32% (0.15 to 0.20 GB).")
    for eager_gb, compiled_gb in ((40.0, 40.04), (0.15, 0.152)):      # within 0.05 GB and 5%
        doc, _ = run_report(capsys, tmp_path, [
            rec("eager", step_ms=50, peak_memory_gb=eager_gb),
            rec("compile", step_ms=40, peak_memory_gb=compiled_gb)])
        assert texts(doc, "compile_memory") == ("With sdpa attention, torch.compile left peak "
                                               "memory unchanged on NVIDIA H200.")


# ---------------------------------------------------------------- compile time and caches

def _compiled(repeat, first_step_s, cache, hits=None, misses=None, **fields):
    return rec("compile", repeat=repeat, step_ms=100.0, first_step_s=first_step_s,
               compile={"cache": cache, "cache_hits": hits, "cache_misses": misses,
                        "graph_breaks": 0, "recompiles": 0}, **fields)


def _tune_final(repeat, first_step_s):
    """A tune's final of the same setup: its processes share the tune's inductor cache, which
    its probes filled (inductor's counters: every graph a hit)."""
    return _compiled(repeat, first_step_s, "shared", hits=12, misses=0, run_id="tune-1",
                     search={"kind": "tune", "role": "final", "stage": "final"})


def _report_files(capsys, tmp_path, run, tune):
    (tmp_path / "run.jsonl").write_text("".join(json.dumps(r) + "\n" for r in run))
    (tmp_path / "tune.jsonl").write_text("".join(json.dumps(r) + "\n" for r in tune))
    from stepbench.cli import main

    assert main(["report", str(tmp_path / "run.jsonl"), str(tmp_path / "tune.jsonl"),
                 "--format", "json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_a_run_and_a_tune_combined_keep_the_one_cold_compile_cold(capsys, tmp_path):
    """The issue's report: a run (its own cache: cold, then warm) combined with a tune's
    finals of the same setup (a shared cache, warm by inductor's counters) called the median
    of all, a shared-cache 3.3 s, "cold", where the one cold compile took 20.7 s."""
    run = [rec("eager", step_ms=110.0, first_step_s=0.6),
           _compiled(0, 20.8, "cold", hits=0, misses=12), _compiled(1, 6.0, "warm")]
    tune = [_tune_final(2, 3.4), _tune_final(3, 3.4)]
    doc = _report_files(capsys, tmp_path, run, tune)
    row = next(r for r in doc["rows"] if r["setup"] == "compile+sdpa")
    assert row["repeats"] == 4 and row["first_step_s"] == 20.8
    assert row["first_step_cache"] == "cold" and row["first_step_warm_s"] == 3.4
    cost = texts(doc, "compile_cost")
    assert "Compilation with a cold cache took 21 s" in cost
    assert ("With a warm compile cache (an earlier process's compile of the same graphs) it "
            "took 3.3 s.") in cost


def test_a_run_and_a_tune_sharing_one_cache_are_cold_only_where_the_counters_say(capsys,
                                                                                   tmp_path):
    """run --compile-cache DIR, then tune with the same DIR: every process says "shared"; the
    run's first process found no graph there (no hits), the rest found every one."""
    run = [rec("eager", step_ms=110.0, first_step_s=0.6),
           _compiled(0, 20.8, "shared", hits=0, misses=12),
           _compiled(1, 3.4, "shared", hits=12, misses=0)]
    tune = [_tune_final(2, 3.4), _tune_final(3, 3.4)]
    doc = _report_files(capsys, tmp_path, run, tune)
    row = next(r for r in doc["rows"] if r["setup"] == "compile+sdpa")
    assert (row["first_step_s"], row["first_step_warm_s"]) == (20.8, 3.4)
    assert row["compile_cache"] == "shared"
    cost = texts(doc, "compile_cost")
    assert "Compilation with a cold cache took 21 s" in cost and "3.3 s" in cost
    # Without the run, nothing in the tune's records was a cold compile.
    tune_only = _report_files(capsys, tmp_path, [rec("eager", step_ms=110.0, first_step_s=0.6)],
                              [_tune_final(0, 3.4), _tune_final(1, 3.4)])
    assert "cold cache" not in texts(tune_only, "compile_cost")
    assert "shared by every process (warm from an earlier process's compile of the same " \
        "graphs) it took 3.3 s" in texts(tune_only, "compile_cost")


def test_a_shared_cache_whose_counters_are_missing_is_not_cold(capsys, tmp_path):
    records = [rec("eager", step_ms=110.0, first_step_s=0.6),
               _compiled(0, 3.4, "shared"), _compiled(1, 3.5, "shared")]
    doc, _ = run_report(capsys, tmp_path, copy.deepcopy(records))
    assert "cold" not in texts(doc, "compile_cost").replace("cold for a graph's first", "")


def test_a_workload_counting_images_says_images_in_every_finding_and_energy_header(capsys,
                                                                                 tmp_path):
    """A user's workload that counts images: its fastest setup and GPU, per dollar and energy
    findings, and the energy table's headers and note, count images, never tokens (an H200
    ResNet run read "Most tokens per kWh of GPU energy: 19M")."""
    rng = np.random.default_rng(2)
    records = []
    for gpu, scale in (("NVIDIA H200", 1.0), ("NVIDIA L40S", 2.0)):
        for mode, mean in (("eager", 50.0), ("compile", 20.0)):
            step = _steps(rng, mean * scale, 0.2)
            records.append(rec(mode, gpu=gpu, steps=step, first_step_s=5.0, units="images",
                               units_per_step=128, model="resnet.py:make", batch=128,
                               energy={"joules_per_step": 10.0 * scale,
                                       "tokens_per_kwh": 128 / (10.0 * scale) * 3.6e6}))
    doc, _ = run_report(capsys, tmp_path, records, "--price", "NVIDIA H200=3.5",
                        "--price", "NVIDIA L40S=1.0")
    for kind, token in (("fastest_setup", "images/s"), ("fastest_gpu", "images/s"),
                        ("tokens_per_dollar", "M images per $"),
                        ("energy", "Most images per kWh")):
        text = texts(doc, kind)
        assert token in text and "token" not in text, (kind, text)
    energy = next(n for n in doc["notes"] if n.startswith("Energy ("))
    assert names(energy, "J/image", "M images per kWh") and "token" not in energy
    table = report_text(capsys, "markdown", tmp_path / "results.jsonl")
    assert names(table, "J/image", "M images per kWh") and "J/token" not in table
    # CSV has no header to rename: each row says what its tokens_per_s counts.
    rows = list(csv.DictReader(io.StringIO(report_text(capsys, "csv", tmp_path / "results.jsonl"))))
    assert {r["units"] for r in rows} == {"images"}


def test_two_compiled_twins_on_one_gpu_are_named_and_a_small_p_within_the_noise_says_why(
        capsys, tmp_path):
    """compile+sdpa and compile/layer+sdpa, each against eager+sdpa on one H200: the findings
    said "NVIDIA H200 67.1 vs 93.1 ms ... and NVIDIA H200 85.7 vs 93.1 ms", "on both GPUs" of
    one GPU, and "within the noise, p = 0.00" (a one-process pair whose median ratio's interval
    held 1 while Mann-Whitney's p was 0.0003)."""
    # The H200's step times (h200-2026-12-02-fsdp2-one-call1 and -titan-x1), to 0.1 ms.
    eager = [rec("eager", repeat=0, peak_memory_gb=17.4, steps=[
        97.7, 96.7, 91.4, 93.4, 96.9, 103.7, 91.5, 96.3, 107.2, 101.9, 100.2, 89.6, 89.6, 97.1,
        95.7, 101.2, 100.4, 101.8, 94.5, 100.0]),
        rec("eager", repeat=1, peak_memory_gb=17.4, steps=[91.9] + [88.7, 88.8] * 9 + [88.7])]
    rng = np.random.default_rng(3)
    whole = [rec("compile", repeat=i, steps=_steps(rng, 67.0, 0.3), first_step_s=45.0,
                 peak_memory_gb=13.4) for i in range(2)]
    layer = [rec("compile", first_step_s=20.0, peak_memory_gb=16.3, steps=[
        89.3, 85.1, 92.2, 84.1, 80.6, 89.5, 82.3, 92.7, 82.7, 84.3, 77.7, 79.0, 90.2, 89.4, 90.8,
        91.0, 87.0, 85.6, 83.1, 78.2])]
    layer[0]["setup"].update(compile_scope="layer", name="compile/layer+sdpa")
    doc, _ = run_report(capsys, tmp_path, eager + whole + layer)
    speed = texts(doc, "compile_speed")
    assert names(speed, "compile+sdpa on NVIDIA H200 67.0 vs 93.1 ms",
                 "compile/layer+sdpa on NVIDIA H200")
    assert "p = 0.00" not in speed and names(speed, "within the noise", "p < 0.01",
                                              "95% interval", "holds 1")
    memory = texts(doc, "compile_memory")
    assert "both GPUs" not in memory and names(memory, "for compile+sdpa on NVIDIA H200",
                                               "compile/layer+sdpa on NVIDIA H200")
    payback = texts(doc, "compile_payback")
    assert names(payback, "for compile+sdpa on NVIDIA H200",
                 "not measurably for compile/layer+sdpa on NVIDIA H200")


def test_two_ways_of_testing_are_two_clauses(capsys, tmp_path):
    """Processes on both sides for one pair, one process on a side for another: the testing
    finding joined the two ways with "and" into "... excludes 1 and p < 0.05 and with a
    Mann-Whitney U test and ...", one run-on clause."""
    rng = np.random.default_rng(4)
    records = [rec("eager", repeat=i, steps=_steps(rng, 100.0, 1.0)) for i in range(2)]
    records += [rec("compile", repeat=i, steps=_steps(rng, 80.0, 1.0), first_step_s=30.0)
                for i in range(2)]
    records += [rec("eager", "eager", steps=_steps(rng, 200.0, 1.0))]
    doc, _ = run_report(capsys, tmp_path, records)
    text = texts(doc, "testing")
    assert text.startswith("Differences were tested in 2 ways: by their processes")
    assert names(text, "p < 0.05; with a Mann-Whitney U test", "significant when both agree")
    assert "and with" not in text
