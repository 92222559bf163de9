"""The details' compute and energy columns: TFLOP/s, MFU against both peaks, the FlopCounterMode
cross-check, joules per token and the cost of a million tokens (hourly price and electricity).

The numbers are those of a real H200 run (benchmarks/results/h200-2026-11-30-matrix.jsonl: the
post's model, batch 4 x 2048, bf16), put into records built here; every expected value is worked
out by hand from them.
"""

import json

import pytest

from stepbench.report import render
from stepbench.cli import main
from says import names
from test_report_errors import assert_user_error
from test_report_stats import DATA, H200, rec, report_text, row, run_report, texts

TOKENS = 4 * 2048
FLOPS_PER_TOKEN = 3216807936.0          # 6*N' + 12*L*d*T, L = 24, d = 1024, T = 2048
FLOPS_PER_TOKEN_CAUSAL = 2914818048.0   # 6*N' + 6*L*d*T
CONVENTION = "6*N' + 12*L*d*T per token (non-causal attention)"
PEAK_MEASURED, PEAK_DATASHEET = 792.52, 989.4


def flop_fields(achieved: float, *, datasheet=True, measured=True) -> dict:
    return {"flops_per_token": FLOPS_PER_TOKEN, "flops_per_token_causal": FLOPS_PER_TOKEN_CAUSAL,
            "flops_convention": CONVENTION, "achieved_tflops": achieved,
            "peak_tflops_measured": PEAK_MEASURED if measured else None,
            "peak_tflops_datasheet": PEAK_DATASHEET if datasheet else None,
            "mfu_measured": achieved / PEAK_MEASURED if measured else None,
            "mfu_datasheet": achieved / PEAK_DATASHEET if datasheet else None}


def energy(joules_per_step: float) -> dict:
    return {"joules_per_step": joules_per_step, "avg_watts": 650.0,
            "tokens_per_kwh": TOKENS / joules_per_step * 3.6e6}


def details_tables(out: str) -> list[list[list[str]]]:
    """The Markdown details tables (one per theme), each as rows of cells, header first."""
    tables = []
    for section in out.split("## Details")[1:]:
        section = section.split("## What")[0]
        lines = [ln for ln in section.splitlines() if ln.startswith("| ") and "---" not in ln]
        tables.append([[c.strip() for c in ln.strip("|").split("|")] for ln in lines])
    return tables


def cell(out: str, setup: str, column: str) -> str:
    """`setup`'s cell in the details table that has `column`."""
    table = next(t for t in details_tables(out) if column in t[0])
    line = next(r for r in table[1:] if r[1] == setup)
    return line[table[0].index(column)]


def write(tmp_path, records) -> str:
    path = tmp_path / "results.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


# ---------------------------------------------------------------- TFLOP/s and MFU

@pytest.fixture
def mfu_records() -> list[dict]:
    # Two eager processes (medians: 294 TFLOP/s) and one compiled process without a datasheet
    # peak (a GPU missing from the datasheet table).
    return [rec("eager", repeat=0, step_ms=89.7, **flop_fields(290.0)),
            rec("eager", repeat=1, step_ms=89.9, **flop_fields(298.0)),
            rec("compile", step_ms=67.7, **flop_fields(389.0, datasheet=False))]


def test_tflops_and_mfu_against_both_peaks_are_medians_of_the_processes(capsys, tmp_path,
                                                                         mfu_records):
    doc, _ = run_report(capsys, tmp_path, mfu_records)
    eager, comp = row(doc, "eager+sdpa"), row(doc, "compile+sdpa")
    assert eager["achieved_tflops"] == pytest.approx(294.0)
    assert eager["mfu_measured"] == pytest.approx(294.0 / PEAK_MEASURED)        # 0.371
    assert eager["mfu_datasheet"] == pytest.approx(294.0 / PEAK_DATASHEET)      # 0.297
    assert comp["mfu_measured"] == pytest.approx(389.0 / PEAK_MEASURED)         # 0.491
    assert comp["mfu_datasheet"] is None
    # The old keys stay: the preferred peak (measured) and its name.
    assert (eager["mfu"], eager["mfu_source"]) == (eager["mfu_measured"], "measured")

    out = report_text(capsys, "markdown", write(tmp_path, mfu_records))
    assert cell(out, "eager+sdpa", "TFLOP/s") == "294"
    assert cell(out, "eager+sdpa", "MFU (measured)") == "37%"
    assert cell(out, "eager+sdpa", "MFU (datasheet)") == "30%"
    assert cell(out, "compile+sdpa", "TFLOP/s") == "389"
    assert cell(out, "compile+sdpa", "MFU (measured)") == "49%"
    assert cell(out, "compile+sdpa", "MFU (datasheet)") == "-"


def test_notes_name_the_convention_its_causal_scale_and_the_peaks(capsys, tmp_path, mfu_records):
    doc, _ = run_report(capsys, tmp_path, mfu_records)
    flops_note = next(n for n in doc["notes"] if n.startswith("TFLOP/s and MFU"))
    assert CONVENTION in flops_note
    assert flops_note.count(CONVENTION) == 1                  # named once, not per row
    # 2914818048 / 3216807936 = 0.9061
    # the convention (non-causal), the causal scale, its model and length
    assert names(flops_note, "non-causal", "0.906", "llama-468m", "2048 tokens")
    # each peak MFU is against: the measured matmul rate and the datasheet's, on their GPU
    [peaks] = [n for n in doc["notes"] if n.startswith("MFU (measured peak)")]
    assert names(peaks, "MFU (datasheet peak)", "793 TFLOP/s", "989 TFLOP/s", "NVIDIA H200")
    assert peaks.index("793") < peaks.index("MFU (datasheet peak)") < peaks.index("989")


def test_h200_repeats_show_measured_mfu_and_a_dash_for_the_unknown_datasheet_peak(capsys):
    out = report_text(capsys, "markdown", H200)
    # Medians of the compiled processes' 381.1 and 377.0 TFLOP/s; MFU against 796.4.
    assert cell(out, "compile+sdpa", "TFLOP/s") == "379"
    assert cell(out, "compile+sdpa", "MFU (measured)") == "48%"
    assert cell(out, "compile+sdpa", "MFU (datasheet)") == "-"
    assert any(names(line, "6*N' + 12*L*d*T", "non-causal") for line in out.splitlines())


def test_rows_without_flop_fields_add_no_columns_or_notes(capsys):
    out = report_text(capsys, "markdown", DATA / "post")
    assert "## Details" not in out and "TFLOP/s" not in out and "FLOP counter" not in out


# ---------------------------------------------------------------- FlopCounterMode cross-check

# FlopCounterMode on the real H200 run: sdpa 27174258606080 and eager 26349624885248 FLOPs per
# step, against the convention's 3216807936 x 8192 = 26352090611712.
COUNTED = {"sdpa": 27174258606080.0, "eager": 26349624885248.0}


def test_flop_counter_difference_is_shown_and_explained(capsys, tmp_path):
    records = [rec("eager", attn, step_ms=ms, flop_counter_per_step=COUNTED[attn],
                   **flop_fields(tflops))
               for attn, ms, tflops in (("sdpa", 89.7, 294.0), ("eager", 243.0, 108.4))]
    doc, _ = run_report(capsys, tmp_path, records)
    convention_per_step = FLOPS_PER_TOKEN * TOKENS
    assert row(doc, "eager+sdpa")["flop_counter_diff"] == pytest.approx(
        COUNTED["sdpa"] / convention_per_step - 1)                               # +0.031199
    assert row(doc, "eager+eager")["flop_counter_diff"] == pytest.approx(
        COUNTED["eager"] / convention_per_step - 1)                              # -0.0000936
    out = report_text(capsys, "markdown", write(tmp_path, records))
    assert cell(out, "eager+sdpa", "FLOP counter diff") == "+3.1%"
    assert cell(out, "eager+eager", "FLOP counter diff") == "0.0%"             # not "-0.0%"
    note = next(n for n in doc["notes"] if n.startswith("FLOP counter diff"))
    # The expected recompute, (3216807936 - 2914818048) / 3 / 3216807936 = 3.13%.
    assert names(note, "sdpa, flex_attention", "+3.1%", "llama-468m", "2048", "Q @ K^T",
                 "eager attention")


def test_flop_counter_difference_is_the_median_over_processes(capsys, tmp_path):
    counts = [1.02, 1.04, 1.03]       # times the convention's count
    records = [rec("eager", repeat=i, step_ms=90.0, flop_counter_per_step=c * FLOPS_PER_TOKEN *
                   TOKENS, **flop_fields(290.0)) for i, c in enumerate(counts)]
    doc, _ = run_report(capsys, tmp_path, records)
    assert row(doc, "eager+sdpa")["flop_counter_diff"] == pytest.approx(0.03)


def test_no_flop_counter_no_column(capsys, tmp_path):
    records = [rec("eager", step_ms=90.0, flop_counter_per_step=None, **flop_fields(290.0))]
    doc, _ = run_report(capsys, tmp_path, records)
    assert row(doc, "eager+sdpa")["flop_counter_diff"] is None
    assert not any(n.startswith("FLOP counter") for n in doc["notes"])


# ---------------------------------------------------------------- energy and cost

@pytest.fixture
def energy_records() -> list[dict]:
    # Joules per step of the real run; two compiled processes, so their numbers are medians.
    return [rec("eager", step_ms=89.7, energy=energy(58.17)),
            rec("compile", repeat=0, step_ms=67.5, energy=energy(48.0)),
            rec("compile", repeat=1, step_ms=67.9, energy=energy(48.6))]


def test_energy_cost_and_hourly_cost_per_million_tokens(capsys, tmp_path, energy_records):
    doc, _ = run_report(capsys, tmp_path, energy_records, "--price", "NVIDIA H200=3.50",
                        "--energy-price", "0.15")
    eager, comp = row(doc, "eager+sdpa"), row(doc, "compile+sdpa")
    tokens_per_s = TOKENS / 0.0897                                   # 91,327
    assert eager["dollars_per_m_tokens"] == pytest.approx(3.50 / (tokens_per_s * 3600 / 1e6))
    assert eager["joules_per_token"] == pytest.approx(58.17 / TOKENS)
    tokens_per_kwh = TOKENS / 58.17 * 3.6e6                          # 507 M
    assert eager["energy_cost_per_m_tokens"] == pytest.approx(1e6 / tokens_per_kwh * 0.15)
    assert eager["energy_price_per_kwh"] == 0.15
    # Compiled: step 67.7 ms (median of 67.5 and 67.9), J per step 48.3 (median).
    assert comp["dollars_per_m_tokens"] == pytest.approx(
        3.50 / (TOKENS / 0.0677 * 3600 / 1e6))
    assert comp["joules_per_token"] == pytest.approx(48.3 / TOKENS)
    # Tokens per kWh is the median of the processes' (here the mean of two), not 1 / median J.
    comp_tokens_per_kwh = (TOKENS / 48.0 * 3.6e6 + TOKENS / 48.6 * 3.6e6) / 2
    assert comp["energy_cost_per_m_tokens"] == pytest.approx(1e6 / comp_tokens_per_kwh * 0.15)

    out = report_text(capsys, "markdown", write(tmp_path, energy_records))   # no prices
    assert "$/M tokens" not in out                                  # cost only when asked
    assert cell(out, "eager+sdpa", "J/token") == "0.0071"           # 58.17 / 8192
    assert main(["report", write(tmp_path, energy_records), "--format", "markdown",
                 "--price", "NVIDIA H200=3.50", "--energy-price", "0.15"]) == 0
    out = capsys.readouterr().out
    assert cell(out, "eager+sdpa", "$/M tokens (hourly)") == "$0.011"       # 0.01065
    assert cell(out, "eager+sdpa", "$/M tokens (energy)") == "$0.00030"     # 0.000296
    assert cell(out, "compile+sdpa", "$/M tokens (hourly)") == "$0.0080"    # 0.00804
    assert cell(out, "compile+sdpa", "$/M tokens (energy)") == "$0.00025"   # 0.000246
    # the energy column's note names its price
    [energy] = [line for line in out.splitlines() if '"$/M tokens (energy)" is' in line]
    assert names(energy, "$0.15 per kWh")


def test_energy_cost_without_hourly_price_leaves_that_cell_blank(capsys, tmp_path,
                                                                energy_records):
    doc, _ = run_report(capsys, tmp_path, energy_records, "--energy-price", "0.15")
    assert row(doc, "eager+sdpa")["dollars_per_m_tokens"] is None
    assert row(doc, "eager+sdpa")["energy_cost_per_m_tokens"] is not None
    assert main(["report", write(tmp_path, energy_records), "--format", "markdown",
                 "--energy-price", "0.15"]) == 0
    out = capsys.readouterr().out
    assert cell(out, "eager+sdpa", "$/M tokens (hourly)") == "-"


def test_energy_price_without_energy_records_is_warned(capsys, tmp_path):
    doc, err = run_report(capsys, tmp_path, [rec("eager", step_ms=90.0)],
                          "--energy-price", "0.15")
    assert any(names(line, "warning:", "--energy-price", "energy") for line in err.splitlines())
    assert row(doc, "eager+sdpa")["energy_cost_per_m_tokens"] is None


@pytest.mark.parametrize("value", ["-0.1", "abc", "nan", "inf", "0", ""])
def test_bad_energy_price_is_one_line_and_exit_2(capsys, value):
    code = main(["report", str(H200), f"--energy-price={value}"])
    out, err = capsys.readouterr()
    assert_user_error(code, err, f"--energy-price {value!r}", "kWh")
    assert out == ""


# ---------------------------------------------------------------- every format carries them

def test_csv_and_html_carry_the_new_values(capsys, tmp_path, energy_records):
    records = [dict(r, flop_counter_per_step=COUNTED["sdpa"], **flop_fields(294.0))
               for r in energy_records]
    path = write(tmp_path, records)
    args = ["--price", "NVIDIA H200=3.50", "--energy-price", "0.15"]
    assert main(["report", path, "--format", "csv", *args]) == 0
    header, first = capsys.readouterr().out.splitlines()[:2]
    values = dict(zip(header.split(","), first.split(",")))
    assert float(values["achieved_tflops"]) == pytest.approx(294.0)
    assert float(values["flop_counter_diff"]) == pytest.approx(0.031199, abs=1e-6)
    assert float(values["joules_per_token"]) == pytest.approx(58.17 / TOKENS, abs=1e-6)
    for key in ("mfu_measured", "mfu_datasheet", "dollars_per_m_tokens",
                "energy_cost_per_m_tokens"):
        assert values[key]
    assert main(["report", path, "--format", "html", *args]) == 0
    page = capsys.readouterr().out
    for text in ("<th class=\"r\">MFU (datasheet)</th>", "<td class=\"r\">+3.1%</td>",
                 "$/M tokens (energy)", "FLOP counter diff compares"):
        assert text in page


def test_details_are_tables_by_theme_each_inside_a_terminal(capsys, tmp_path, energy_records):
    records = [dict(r, flop_counter_per_step=COUNTED["sdpa"], **flop_fields(294.0))
               for r in energy_records]
    assert main(["report", write(tmp_path, records), "--price", "NVIDIA H200=3.50",
                 "--energy-price", "0.15"]) == 0
    out = capsys.readouterr().out
    titles = [ln.strip() for ln in out.splitlines() if ln.startswith("Details")]
    assert titles == ["Details: repeats and noise", "Details: FLOPs and MFU",
                      "Details: energy and cost"]          # no compile numbers in these records
    # Table lines (notes are one long line each, for the terminal to wrap).
    tables = [ln for ln in out.splitlines() if ln.lstrip().startswith(("NVIDIA H200  ", "GPU  "))]
    assert max(len(line) for line in tables) <= render.TERMINAL_WIDTH
    assert "(continued)" not in out


def test_terminal_splits_a_table_wider_than_itself():
    from stepbench.report.document import Document, Table

    columns = ["GPU", "Setup"] + [f"column number {i}" for i in range(12)]
    cells = [["NVIDIA H200", "compile+sdpa"] + [f"{i}.0" for i in range(12)]]
    out = render.render(Document(None, [Table(columns, cells, "ll" + "r" * 12, "Wide",
                                              ["a note"])]), "table")
    assert "Wide (continued)" in out
    assert max(len(line) for line in out.splitlines()) <= render.TERMINAL_WIDTH
    assert out.count("NVIDIA H200   compile+sdpa") == 2          # GPU and setup repeated
    assert out.count("a note") == 1 and out.rstrip().endswith("a note")


def test_gpu_busy_from_run_profile_tells_the_steps_that_waited_for_the_host(capsys, tmp_path):
    """`run --profile`'s kernel time against the median step, per row, and the finding: real H200
    runs, one of FSDP2 at world size 1 beside plain setups, one of eager+sdpa's five processes
    (two of them slow)."""
    results = DATA.parent.parent / "benchmarks" / "results"
    out = report_text(capsys, "markdown", results / "h200-2026-12-02-fsdp2-one-call3.jsonl")
    (busy,) = [t for t in details_tables(out) if t[0][-1] == "GPU busy (profiled)"]
    cells = {r[1]: r[2] for r in busy[1:]}
    assert cells["compile+sdpa (1 process)"] == "95%"
    assert cells["compile/layer+sdpa (fsdp2 x1)"] == "38%"
    # Only the rows under 85% are named: the plain setups (95-96%) and unit 24 eager (90%) not.
    doc, _ = run_report(capsys, tmp_path, [json.loads(line) for line in (
        results / "h200-2026-12-02-fsdp2-one-call3.jsonl").read_text().splitlines()])
    finding = texts(doc, "host_bound")
    assert names(finding, "compile/layer+sdpa (fsdp2 x1) 38%", "eager+sdpa (fsdp2 x1) 62%")
    assert "(1 process)" not in finding and "eager+sdpa+unit24" not in finding
    assert any("compile/layer+sdpa (fsdp2 x1) 38%" in line for line in out.splitlines()
               if "|" not in line)                       # the markdown states it too

    doc, _ = run_report(capsys, tmp_path, [json.loads(line) for line in (
        results / "h200-2026-12-02-eager-sdpa-wander.jsonl").read_text().splitlines()])
    (only,) = doc["rows"]
    assert only["gpu_busy"] == pytest.approx(0.95, abs=0.005)      # median of five processes
    assert only["gpu_busy_low"] == pytest.approx(86.03 / 109.8, abs=0.005)   # the slowest
    assert names(texts(doc, "host_bound"), "eager+sdpa 95%", "78%", "slowest")

    # CUDA graphs' kernels reach the profiler: compile mode reduce-overhead reads busy, and the
    # smaller model's eager step waits for the host half its time.
    doc, _ = run_report(capsys, tmp_path, [json.loads(line) for line in (
        results / "h200-2026-12-02-gpu-busy-135m.jsonl").read_text().splitlines()])
    busy = {r["setup"]: round(r["gpu_busy"], 2) for r in doc["rows"]}
    assert busy == {"eager+sdpa": 0.5, "compile+sdpa": 0.92, "compile:reduce-overhead+sdpa": 0.98}
    assert names(texts(doc, "host_bound"), "NVIDIA H200", "eager+sdpa 50%")

    # Without a profile: no column, no finding.
    plain = report_text(capsys, "markdown", results / "h200-2026-12-02-default-run.jsonl")
    assert "GPU busy" not in plain and "waited for the host" not in plain
