"""`stepbench report FILES --predict GPUS`: predict's table as a section of the report, in
every format, its rows marked predicted and kept apart from the measured ones."""

import csv
import io
import json
from pathlib import Path

from stepbench.cli import main
from says import names, user_error

DATA = Path(__file__).parent / "data"
RESULTS = str(DATA / "predict" / "h200-profile-matrix.jsonl")
PRICES = str(Path(__file__).parent.parent / "benchmarks" / "prices.toml")
TITLE = "Predicted (not measured)"


def report(capsys, *args) -> str:
    assert main(["report", RESULTS, "--prices", PRICES, *args]) == 0
    return capsys.readouterr().out


def test_json_keeps_the_measured_rows_and_adds_the_predictions_apart(capsys):
    plain = json.loads(report(capsys, "--format", "json"))
    out = json.loads(report(capsys, "--predict", "L40S, H100 PCIe", "--format", "json"))
    assert out["rows"] == plain["rows"]
    predicted = out["predictions"]
    assert {(p["gpu"], p["setup"]) for p in predicted} == {
        (gpu, setup) for gpu in ("NVIDIA L40S", "NVIDIA H100 PCIe")
        for setup in ("eager+sdpa", "compile+sdpa", "eager+eager", "compile+eager")}
    assert all(p["predicted"] is True and p["source_gpu"] == "NVIDIA H200" for p in predicted)
    # The report's prices: the L40S's from the price file.
    l40s = next(p for p in predicted if p["gpu"] == "NVIDIA L40S" and p["setup"] == "compile+sdpa")
    assert l40s["price_per_hour"] == 0.54 and l40s["tokens_per_dollar"] > 0
    assert any("torch 2.8" in n for n in out["notes"])


def test_every_format_shows_the_section(capsys):
    for fmt in ("table", "markdown", "html"):
        text = report(capsys, "--predict", "L40S", "--format", fmt)
        assert names(text, TITLE, "NVIDIA L40S", "Predicted step (ms)")
    assert TITLE not in report(capsys, "--format", "table")


def test_csv_gives_predictions_columns_of_their_own(capsys):
    rows = list(csv.DictReader(io.StringIO(report(capsys, "--predict", "L40S", "--format",
                                                  "csv"))))
    measured = [r for r in rows if r["predicted"] != "True"]
    predicted = [r for r in rows if r["predicted"] == "True"]
    assert len(predicted) == 4 and measured
    assert all(r["gpu"] == "NVIDIA L40S" and r["step_ms"] == "" and r["tokens_per_s"] == ""
               and float(r["predicted_step_ms"]) > 0 for r in predicted)
    assert all(r["predicted_step_ms"] == "" and r["step_ms"] for r in measured)


def test_the_reports_filters_choose_the_setups_predicted(capsys):
    out = json.loads(report(capsys, "--predict", "L40S", "--setup", "compile*", "--format",
                            "json"))
    assert {p["setup"] for p in out["predictions"]} == {"compile+sdpa", "compile+eager"}


def test_an_unknown_gpu_is_refused_before_any_file_is_read(tmp_path):
    error = user_error(["report", str(tmp_path / "none.jsonl"), "--predict", "L40S,H100 PCI"])
    assert names(str(error), "H100 PCI", "NVIDIA H100 PCIe")


def test_an_empty_list_names_the_flag():
    error = user_error(["report", RESULTS, "--predict", " , "])
    assert error.kind == "bad_value" and names(str(error), "--predict")


def test_records_without_a_profile_say_how_to_get_one(capsys):
    assert main(["report", str(DATA / "h200-matrix.jsonl"), "--predict", "L40S"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and names(err[0], "--profile")
