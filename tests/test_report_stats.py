"""Repeats, significance, noise flags and the details (MFU, compile cache, energy, the loss guard).

tests/data/report-h200 holds real step times of 4 eager+sdpa and 2 compile+sdpa processes on
an H200 (written by its make_records.py from the shared anchors); the other cases are records
built here from one of the post's records, changed field by field.
"""

import copy
import json
import statistics
from pathlib import Path

import numpy as np
import pytest

from says import names, table_rows
from stepbench.cli import main

DATA = Path(__file__).parent / "data"
H200 = DATA / "report-h200" / "h200-repeats.jsonl"
BASE = json.loads((DATA / "post" / "4-h100.jsonl").read_text().splitlines()[0])


def rec(mode="eager", attn="sdpa", *, gpu="NVIDIA H200", repeat=0, steps=None, step_ms=None,
        status="ok", **fields) -> dict:
    """A schema-1 record; step_ms is the mean of `steps` when given."""
    r = copy.deepcopy(BASE)
    r["setup"].update(name=f"{mode}+{attn}", mode=mode, attn=attn)
    r["machine"]["gpu"] = gpu
    r["repeat"], r["status"] = repeat, status
    r["step_times_ms"] = list(steps or [])
    r["step_ms"] = statistics.fmean(steps) if steps else step_ms
    if status != "ok":
        r.update(step_ms=None, peak_memory_gb=None, first_step_s=None)
    for key, value in fields.items():
        if key in r["setup"]:
            r["setup"][key] = value
        else:
            r[key] = value
    return r


def run_report(capsys, tmp_path, records, *args, files=1) -> tuple[dict, str]:
    """Report on `records` written to one results file (or spread over `files` files)."""
    paths = [tmp_path / ("results.jsonl" if files == 1 else f"results-{i}.jsonl") for i in range(files)]
    for i, path in enumerate(paths):
        path.write_text("".join(json.dumps(r) + "\n" for r in records[i::files]))
    code = main(["report", *map(str, paths), "--format", "json", *args])
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out), err


def report_text(capsys, fmt, *paths) -> str:
    assert main(["report", *map(str, paths), "--format", fmt]) == 0
    return capsys.readouterr().out


def row(doc, setup, gpu="NVIDIA H200") -> dict:
    return next(r for r in doc["rows"] if r["setup"] == setup and r["gpu"] == gpu)


def texts(doc, kind) -> str:
    return " ".join(f["text"] for f in doc["findings"] if f["kind"] == kind)


# ---------------------------------------------------------------- repeats on a real H200

@pytest.fixture
def h200(capsys) -> dict:
    assert main(["report", str(H200), "--format", "json", "--price", "NVIDIA H200=3.50"]) == 0
    return json.loads(capsys.readouterr().out)


def test_repeats_combine_to_median_of_process_means_with_bootstrap_ci(h200):
    records = [json.loads(line) for line in H200.read_text().splitlines()]
    means = [r["step_ms"] for r in records if r["setup"]["mode"] == "eager"]
    eager = row(h200, "eager+sdpa")
    assert eager["repeats"] == 4
    assert eager["step_ms"] == pytest.approx(statistics.median(means))
    assert eager["tokens_per_s"] == pytest.approx(8192 / (statistics.median(means) / 1000))
    lo, hi = eager["step_ms_ci"]
    assert min(means) <= lo <= eager["step_ms"] <= hi <= max(means)
    assert names(eager["step_ms_ci_method"], "median", "4 per-process means", "bootstrap",
                 "processes")
    assert eager["noise_flags"] == ["high_cv"]          # every eager process had CV > 5%


def test_compile_cache_cold_and_warm_are_kept_apart(h200):
    comp = row(h200, "compile+sdpa")
    assert comp["first_step_s"] == pytest.approx(70.81)
    assert comp["first_step_warm_s"] == pytest.approx(6.57)
    assert comp["compile_cache"] == "1 cold, 1 warm"
    assert names(texts(h200, "compile_cost"), "cold", "71 s", "warm", "6.5 s")


def test_real_compile_speedup_is_significant_and_stated(h200):
    # 2 against 4 processes: the processes are compared (a hierarchical bootstrap), which a
    # rank test on 2 against 4 means could not make significant.
    speed = texts(h200, "compile_speed")
    assert names(speed, "NVIDIA H200", "69.4", "95.8 ms", "38% faster")
    assert "hierarchical bootstrap" in texts(h200, "testing")
    assert "per-step times" not in texts(h200, "testing")
    assert "could not" not in texts(h200, "testing")


def test_mfu_names_its_peak(h200):
    comp = row(h200, "compile+sdpa")
    assert comp["mfu_source"] == "measured"
    assert comp["mfu"] == pytest.approx(0.48, abs=0.01)
    assert names(texts(h200, "mfu"), "48%", "NVIDIA H200", "compile+sdpa", "measured")


def test_markdown_marks_noisy_rows_and_explains_marks_and_repeats(capsys):
    out = report_text(capsys, "markdown", H200)
    eager_line = next(line for line in out.splitlines() if "| eager+sdpa |" in line)
    assert "| 95.8* |" in eager_line
    assert any(line.startswith("\\* ") and "5%" in line for line in out.splitlines())
    assert any(names(line, "4 repeats", "eager+sdpa", "median", "bootstrap")
               for line in out.splitlines())
    assert "## Details" in out
    # TFLOP/s and MFU are the medians of the 4 processes' (275.6, 274.7, 285.4, 272.4);
    # the records carry no datasheet peak.
    repeats = out.split("## Details: repeats and noise")[1].split("## ")[0]
    assert ["NVIDIA H200", "eager+sdpa", "4", "92.3-96.7", "high_cv"] in table_rows(repeats)
    flops = out.split("## Details: FLOPs and MFU")[1].split("## ")[0]
    assert "| NVIDIA H200 | eager+sdpa | 275 | 35% | - |" in flops
    assert "†" not in out                                 # no mark explained that is not used


# ---------------------------------------------------------------- significance in findings

def test_difference_inside_the_spread_is_called_noise(capsys, tmp_path):
    rng = np.random.default_rng(3)
    eager = list(rng.normal(100.0, 6.0, 40))
    comp = list(rng.normal(101.0, 6.0, 40))
    doc, _ = run_report(capsys, tmp_path, [rec("eager", steps=eager, first_step_s=0.5),
                                           rec("compile", steps=comp, first_step_s=30.0)])
    speed = texts(doc, "compile_speed")
    assert names(speed, "noise", "p = ")
    assert "faster" not in speed and "slower" not in speed
    assert names(texts(doc, "compile_payback"), "sdpa", "NVIDIA H200", "not", "noise")


def test_clear_difference_between_processes_is_tested_per_process(capsys, tmp_path):
    # 5 processes each, no per-step times: the per-process means carry the test.
    eager = [rec("eager", repeat=i, step_ms=m) for i, m in enumerate([100, 101, 99, 100.5, 99.5])]
    comp = [rec("compile", repeat=i, step_ms=m) for i, m in enumerate([80, 81, 79, 80.5, 79.5])]
    doc, _ = run_report(capsys, tmp_path, eager + comp)
    assert names(texts(doc, "compile_speed"), "NVIDIA H200", "80.0", "100 ms", "25% faster")
    assert "could not" not in texts(doc, "testing") and "untested" not in texts(doc, "testing")


def test_overlapping_processes_are_noise_even_when_medians_differ(capsys, tmp_path):
    eager = [rec("eager", repeat=i, step_ms=m) for i, m in enumerate([100, 92, 104, 97, 95])]
    comp = [rec("compile", repeat=i, step_ms=m) for i, m in enumerate([98, 91, 103, 94, 99])]
    doc, _ = run_report(capsys, tmp_path, eager + comp)
    assert names(texts(doc, "compile_speed"), "NVIDIA H200", "98.0", "97.0 ms", "noise", "p = ")


def test_too_few_processes_and_no_steps_is_stated_as_untested(capsys, tmp_path):
    records = [rec("eager", repeat=0, step_ms=100), rec("eager", repeat=1, step_ms=101),
               rec("compile", repeat=0, step_ms=90), rec("compile", repeat=1, step_ms=91)]
    doc, _ = run_report(capsys, tmp_path, records)
    assert "(11% faster)" in texts(doc, "compile_speed")
    assert names(texts(doc, "testing"), "untested", "noise")


def test_payback_time_includes_the_compiling_first_step(capsys, tmp_path):
    # 4 s more first step, 50 ms gained per step: paid back after 81 steps (80 warm ones), when
    # the compiled run has taken 5 s + 80 x 50 ms = 9 s of wall time, not 81 x 50 ms = 4 s.
    records = [rec("eager", step_ms=100, first_step_s=1.0),
               rec("compile", step_ms=50, first_step_s=5.0)]
    doc, _ = run_report(capsys, tmp_path, records)
    assert names(texts(doc, "compile_payback"), "81 steps", "9 s", "NVIDIA H200")


def test_payback_on_the_first_step_is_one_step(capsys, tmp_path):
    records = [rec("eager", step_ms=100, first_step_s=2.0),
               rec("compile", step_ms=50, first_step_s=1.0)]
    doc, _ = run_report(capsys, tmp_path, records)
    assert names(texts(doc, "compile_payback"), "1 step ", "1 s", "NVIDIA H200")


# ---------------------------------------------------------------- combining and marking

def test_failed_repeat_keeps_the_row_and_is_footnoted(capsys, tmp_path):
    records = [rec("eager", repeat=0, step_ms=100), rec("eager", repeat=1, status="oom"),
               rec("eager", repeat=2, step_ms=102)]
    doc, _ = run_report(capsys, tmp_path, records)
    eager = row(doc, "eager+sdpa")
    assert eager["status"] == "ok" and eager["statuses"] == {"ok": 2, "oom": 1}
    assert eager["step_ms"] == pytest.approx(101)
    assert any(names(n, "eager+sdpa", "1 OOM", "3 repeats") for n in doc["notes"])


def test_records_from_two_runs_are_combined_and_said_so(capsys, tmp_path):
    # Two results files with the same setup (as from two machines' runs, or two --out files).
    records = [rec("eager", step_ms=100, run_id="a"), rec("eager", step_ms=104, run_id="b")]
    doc, _ = run_report(capsys, tmp_path, records, files=2)
    assert row(doc, "eager+sdpa")["repeats"] == 2
    assert any(names(n, "eager+sdpa", "2 runs", "repeats") for n in doc["notes"])
    assert any(names(n, "2 repeats combined", "every row") for n in doc["notes"])


def test_within_one_file_the_latest_record_of_a_setup_wins(capsys, tmp_path):
    # `run --rerun` appends a new record of the same setup and repeat: it replaces the old one.
    records = [rec("eager", step_ms=100, run_id="a"), rec("compile", step_ms=80, run_id="a"),
               rec("eager", step_ms=120, run_id="b")]
    doc, _ = run_report(capsys, tmp_path, records)
    assert row(doc, "eager+sdpa")["repeats"] == 1
    assert row(doc, "eager+sdpa")["step_ms"] == 120
    assert [r["setup"] for r in doc["rows"]] == ["eager+sdpa", "compile+sdpa"]


def test_crash_keeps_its_place_and_error_line(capsys, tmp_path):
    records = [rec("eager", step_ms=100),
               rec("compile", status="crashed",
                   error="Traceback...\nRuntimeError: CUDA error: an illegal memory access")]
    out_doc, _ = run_report(capsys, tmp_path, records)
    assert [r["status"] for r in out_doc["rows"]] == ["ok", "crashed"]
    assert any(names(n, "compile+sdpa", "crashed",
                     "RuntimeError: CUDA error: an illegal memory access")
               for n in out_doc["notes"])
    # One GPU: the table names it; a note names the setup alone.
    assert not any("NVIDIA H200 compile" in n for n in out_doc["notes"])
    assert any(n.startswith("crashed means") for n in out_doc["notes"])


def test_each_noise_flag_gets_its_mark_and_footnote(capsys, tmp_path):
    records = [rec("eager", step_ms=100, noise_flags=["throttled"]),
               rec("compile", step_ms=90, noise_flags=["other_processes", "recompiled"]),
               rec("eager", "eager", step_ms=200, noise_flags=["new_flag"])]
    path = tmp_path / "r.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    out = report_text(capsys, "markdown", path)
    assert "| 100† |" in out and "| 90.0‡§ |" in out
    assert "| 200 |" in out                               # unknown flags get no mark
    # Each mark used is explained once, in a line of its own; an unknown flag by its name.
    lines = out.splitlines()
    for mark, word in (("†", "throttl"), ("‡", "other processes"), ("§", "recompiled")):
        assert sum(line.startswith(mark) and word in line for line in lines) == 1, mark
    assert any("new_flag" in line for line in lines)
    assert "*" not in out.split("## Details")[0].replace("**", "")


def test_processes_that_disagree_mark_the_row_with_their_own_flag(capsys, tmp_path):
    # Two processes of each setup: eager's 90 and 110 ms, each steady (CV about 1%): apart
    # beyond their noise; compiled's 70 and 71 ms agree.
    def steps(ms):
        return [ms * (1 + 0.01 * (-1) ** i) for i in range(20)]
    records = [rec("eager", repeat=0, steps=steps(90)), rec("compile", repeat=0, steps=steps(70)),
               rec("eager", repeat=1, steps=steps(110)), rec("compile", repeat=1, steps=steps(71))]
    path = tmp_path / "r.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    doc, _ = run_report(capsys, tmp_path, records)
    assert row(doc, "eager+sdpa")["noise_flags"] == ["process_spread"]
    assert row(doc, "compile+sdpa")["noise_flags"] == []
    out = report_text(capsys, "markdown", path)
    assert "| 100~ |" in out and "| 70.5 |" in out
    assert any(line.startswith("~ ") and names(line, "3%", "median") for line in out.splitlines())
    assert "high_cv" not in out                          # the spread is between processes only


def test_rows_follow_the_posts_order_whatever_the_file_order(capsys, tmp_path):
    records = [rec("compile", "flex_attention", step_ms=50), rec("compile", step_ms=60),
               rec("eager", step_ms=70), rec("eager", "flex_attention", step_ms=80),
               rec("eager", gpu="NVIDIA L4", step_ms=300)]
    doc, _ = run_report(capsys, tmp_path, records)
    assert [(r["gpu"], r["setup"]) for r in doc["rows"]] == [
        ("NVIDIA H200", "eager+flex_attention"), ("NVIDIA H200", "compile+flex_attention"),
        ("NVIDIA H200", "eager+sdpa"), ("NVIDIA H200", "compile+sdpa"),
        ("NVIDIA L4", "eager+sdpa")]


def test_memory_and_fit_findings_name_their_subject_when_compile_did_not_lead(capsys, tmp_path):
    # Compile raised the peak and fit only without it: no clause may start with a bare "it".
    records = [rec("eager", step_ms=100, peak_memory_gb=10.0),
               rec("compile", step_ms=90, peak_memory_gb=12.0),
               rec("eager", "eager", step_ms=200, peak_memory_gb=30.0),
               rec("compile", "eager", status="oom")]
    doc, _ = run_report(capsys, tmp_path, records)
    assert names(texts(doc, "compile_memory"), "sdpa", "raised", "NVIDIA H200", "20%",
                 "10.0", "12.0 GB")
    assert names(texts(doc, "fit"), "eager attention", "without torch.compile", "NVIDIA H200")
    assert not any(f["text"].startswith("It") or ", it " in f["text"] for f in doc["findings"]
                   if f["kind"] in ("compile_memory", "fit"))


def test_two_batch_sizes_are_kept_apart_and_labelled(capsys, tmp_path):
    records = [rec("eager", step_ms=100), rec("compile", step_ms=90),
               rec("eager", step_ms=190, batch=8), rec("compile", step_ms=150, batch=8)]
    doc, _ = run_report(capsys, tmp_path, records)
    assert len(doc["rows"]) == 4
    speed = [f for f in doc["findings"] if f["kind"] == "compile_speed"]
    assert len(speed) == 2 and all(names(f["group"], "llama-468m", f"batch {b} x 2048", "bf16")
                                   for f, b in zip(speed, (4, 8)))
    assert all("sdpa" in f["text"] for f in speed)
    assert "27% faster" in speed[1]["text"]
    path = tmp_path / "results.jsonl"
    assert "| compile+sdpa (8x2048) |" in report_text(capsys, "markdown", path)


# ---------------------------------------------------------------- details

LOSSES_EAGER = [10.45, 10.30, 10.12, 9.95, 9.81]


def test_a_compiled_setup_is_checked_against_its_eager_twin_within_bf16_tolerance(capsys,
                                                                                tmp_path):
    records = [rec("eager", step_ms=100, losses=LOSSES_EAGER),
               rec("compile", step_ms=90, losses=LOSSES_EAGER[:-1] + [9.86])]
    doc, _ = run_report(capsys, tmp_path, records)
    comp = row(doc, "compile+sdpa")
    assert comp["loss_guard"] == "ok" and comp["loss_guard_reference"] == "eager+sdpa"
    assert comp["loss_guard_rel_diff"] == pytest.approx(0.05 / 9.81)
    assert comp["loss_guard_tolerance"] == 0.02
    assert row(doc, "eager+sdpa")["loss_guard"] == "reference"
    assert "parity_ok" not in comp                   # one loss check: the guard's
    assert names(texts(doc, "loss_guard"), "one setup", "agreed", "0.51%", "compile+sdpa",
                 "NVIDIA H200", "eager+sdpa", "2%", "bf16")
    assert not any(f["key"] for f in doc["findings"] if f["kind"] == "loss_guard")
    markdown = report_text(capsys, "markdown", tmp_path / "results.jsonl")
    details = markdown.split("## Details: losses")[1].split("## ")[0]
    assert ["NVIDIA H200", "eager+sdpa", "reference"] in table_rows(details)
    [compiled] = [r for r in table_rows(details) if r[:2] == ["NVIDIA H200", "compile+sdpa"]]
    assert names(compiled[2], "ok", "0.51%", "eager+sdpa")


def test_a_compiled_setup_is_checked_against_its_twin_not_the_plainest_setup(capsys, tmp_path):
    # eager attention rounds in another order than sdpa: 1% apart, within bf16's 2%. Compiled
    # eager attention is compared with eager attention, what compilation alone changes.
    drifted = [x * 1.01 for x in LOSSES_EAGER]
    records = [rec("eager", step_ms=100, losses=LOSSES_EAGER),
               rec("eager", "eager", step_ms=200, losses=drifted),
               rec("compile", "eager", step_ms=120, losses=drifted)]
    doc, _ = run_report(capsys, tmp_path, records)
    comp = row(doc, "compile+eager")
    assert comp["loss_guard_reference"] == "eager+eager" and comp["loss_guard_rel_diff"] == 0
    assert row(doc, "eager+eager")["loss_guard_reference"] == "eager+sdpa"
    assert names(texts(doc, "loss_guard"), "1%", "eager+eager on NVIDIA H200", "eager+sdpa")


def test_a_compiled_setup_beyond_tolerance_of_its_eager_twin_departs(capsys, tmp_path):
    records = [rec("eager", step_ms=100, losses=LOSSES_EAGER),
               rec("compile", step_ms=90, losses=LOSSES_EAGER[:-1] + [10.2])]
    doc, _ = run_report(capsys, tmp_path, records)
    assert row(doc, "compile+sdpa")["loss_guard"] == "departs"
    [finding] = [f for f in doc["findings"] if f["kind"] == "loss_guard"]
    assert finding["key"] and names(finding["text"], "compile+sdpa", "NVIDIA H200", "step 5",
                                    "10.2", "9.81", "eager+sdpa", "4%", "2%")
    # The setup is named once, by the row it leads with ("compile+sdpa (batch ...) on ...: its
    # loss at step 5 ..."), not again in the guard's sentence.
    assert finding["text"].count("compile+sdpa") == 1 and names(finding["text"], "its loss")
    # It names every ranking that leaves the row out: a reader sees its MFU and energy in the
    # details, better than the "best" a finding names (an H200 ResNet run's 15% against 6%).
    assert names(finding["text"], "rankings", "fastest setup and GPU", "per dollar", "MFU",
                 "energy", "compile payback")
    # Its speed is still compared, marked; a step that trains something else pays back nothing.
    assert names(texts(doc, "compile_speed"), "90.0 vs 100 ms", "its loss departs, !")
    assert texts(doc, "compile_payback") == ""
    path = tmp_path / "results.jsonl"
    [departs] = [r for r in table_rows(report_text(capsys, "markdown", path))
                 if r[:2] == ["NVIDIA H200", "compile+sdpa"] and "departs" in r[-1]]
    assert names(departs[-1], "4%", "2%", "eager+sdpa")


def test_the_twin_check_holds_fp32_to_its_tolerance_and_needs_the_same_seed(capsys, tmp_path):
    fp32 = [rec("eager", step_ms=100, losses=[10.0, 9.0], dtype="fp32"),
            rec("compile", step_ms=90, losses=[10.0, 9.001], dtype="fp32")]
    doc, _ = run_report(capsys, tmp_path, fp32)
    comp = row(doc, "compile+sdpa")
    assert comp["loss_guard"] == "departs"                      # 1.1e-4 over 1e-4
    assert comp["loss_guard_tolerance"] == 1e-4
    other_seed = [rec("eager", step_ms=100, losses=[10.0, 9.0]),
                  rec("compile", step_ms=90, losses=[10.0, 9.5], seed=1)]
    doc, _ = run_report(capsys, tmp_path, other_seed)
    assert row(doc, "compile+sdpa")["loss_guard"] == "unchecked"   # no twin, no peers
    assert row(doc, "compile+sdpa")["loss_guard_rel_diff"] is None
    assert texts(doc, "loss_guard") == ""


def test_a_compiled_setup_whose_twin_cannot_be_a_reference_is_checked_as_before(capsys,
                                                                                tmp_path):
    # eager+sdpa+liger uses other kernels than the model's: the compiled liger setup is
    # checked against the plainest eager setup, like every other setup.
    records = [rec("eager", step_ms=100, losses=LOSSES_EAGER),
               rec("eager", step_ms=95, losses=LOSSES_EAGER),
               rec("compile", step_ms=90, losses=LOSSES_EAGER)]
    for r in records[1:]:
        r["setup"].update(name=r["setup"]["name"] + "+liger", kernels="liger")
    doc, _ = run_report(capsys, tmp_path, records)
    assert row(doc, "compile+sdpa+liger")["loss_guard_reference"] == "eager+sdpa"


def test_energy_and_datasheet_mfu_are_shown_as_details(capsys, tmp_path):
    records = [rec("eager", step_ms=100, mfu_datasheet=0.31,
                   energy={"joules_per_step": 50.0, "avg_watts": 500.0,
                           "tokens_per_kwh": 5.9e8}),
               rec("compile", step_ms=80, mfu_datasheet=0.39, mfu_measured=0.45,
                   energy={"joules_per_step": 40.0, "avg_watts": 500.0,
                           "tokens_per_kwh": 7.4e8})]
    doc, _ = run_report(capsys, tmp_path, records)
    assert row(doc, "eager+sdpa")["mfu_source"] == "datasheet"
    assert row(doc, "compile+sdpa")["mfu_source"] == "measured"   # measured wins when present
    assert names(texts(doc, "energy"), "kWh", "740M", "NVIDIA H200", "compile+sdpa")
    path = tmp_path / "results.jsonl"
    out = report_text(capsys, "markdown", path)
    # eager: no measured peak, so its MFU (measured) cell is "-"; J/token = 50 / (4 x 2048).
    flops = table_rows(out.split("## Details: FLOPs and MFU")[1].split("## ")[0])
    assert ["NVIDIA H200", "eager+sdpa", "-", "31%"] in [r[:4] for r in flops]
    assert "| NVIDIA H200 | eager+sdpa | 0.0061 | 590 |" in out.split("## Details: energy")[1]
    results_table = out.split("## Results\n\n")[1].split("\n\n")[0]   # its notes may name them
    assert "MFU" not in results_table and "kWh" not in results_table


def test_terminal_table_prints_error_text_with_brackets_verbatim(capsys, tmp_path):
    records = [rec("eager", step_ms=100),
               rec("compile", status="error", error="[rank0]: RuntimeError: [bold]boom")]
    path = tmp_path / "r.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    out = report_text(capsys, "table", path)
    assert names(out, "compile+sdpa", "[rank0]: RuntimeError: [bold]boom")


def test_an_errors_note_names_the_exception_not_the_stderr_tails_last_line(capsys, tmp_path):
    # The executor appends the child's stderr tail to an error's summary; on the H200 that tail
    # ended in a CUDAEvent warning, which the note showed instead of the exception.
    tail = "Traceback (most recent call last):\n  ...\n[W1201 CUDAEvent.h:57] Warning: CUDA warning"
    records = [rec("eager", step_ms=100),
               rec("compile", status="error",
                   error=f"AcceleratorError: CUDA error: an illegal memory access\n{tail}")]
    path = tmp_path / "r.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    out = report_text(capsys, "table", path)
    assert names(out, "compile+sdpa", "AcceleratorError: CUDA error: an illegal memory access")
    assert "CUDAEvent" not in out


def test_a_shared_compile_cache_is_called_neither_cold_nor_warm(capsys):
    # tune's processes share one inductor cache (compile.cache "shared"): the H200 tune of
    # llama-135m compiled in 53-74 s in its probes and 6-12 s in its finals.
    tune = Path(__file__).parent.parent / "benchmarks/results/h200-2026-12-01-tune-135m.jsonl"
    assert main(["report", str(tune), "--format", "json"]) == 0
    text = texts(json.loads(capsys.readouterr().out), "compile_cost")
    assert names(text, "shared") and "cold cache" not in text


def test_a_shared_cache_row_with_a_record_that_has_no_compile_details_still_combines():
    # A setup's processes where one record carries no compile details (an older stepbench's)
    # and the rest share tune's cache: the row is combined, judged by those that say.
    from stepbench.record import Record
    from stepbench.report.rows import combine

    tune = Path(__file__).parent.parent / "benchmarks/results/h200-2026-12-01-tune-135m.jsonl"
    finals = [Record.from_dict(json.loads(line)) for line in tune.read_text().splitlines()]
    finals = [r for r in finals if (r.search or {}).get("role") == "final"
              and r.setup.attn == "flex_attention"]
    bare = copy.deepcopy(finals[0])
    bare.compile, bare.repeat = None, len(finals)
    row = combine(finals + [bare], None)
    assert row.compile_cache == "shared" and row.shared_cache == "warm"
    assert row.repeats == len(finals) + 1
