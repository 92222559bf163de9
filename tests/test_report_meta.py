"""Every format says what was measured: models, batch x sequence, precision, machines,
software versions and the records' dates (issue 23)."""

import csv
import io
import json
import re
from pathlib import Path

import pytest

from stepbench.cli import main
from stepbench.report import jsontext, meta
from says import names
from test_report_stats import rec

POST = Path(__file__).parent / "data" / "post"
GPUS = ["NVIDIA GeForce RTX 5090", "NVIDIA L40S", "NVIDIA RTX A6000", "NVIDIA H100 PCIe"]


def report(capsys, *args) -> str:
    assert main(["report", *map(str, args)]) == 0
    return capsys.readouterr().out


def test_json_meta_of_the_posts_records(capsys):
    doc = json.loads(report(capsys, POST, "--format", "json"))
    assert doc["meta"] == {
        "models": ["llama-468m"], "batch_seq": ["4 x 2048"], "dtypes": ["bf16"], "gpus": GPUS,
        "torch": ["2.8.0+cu128"], "transformers": ["4.57.1"], "stepbench": [],
        "started_first": "2026-10-29T12:00:00Z", "started_last": "2026-10-29T12:00:00Z",
        "records": 16, "unrecorded": {"stepbench": 16}}


HEADER = ("Measured: llama-468m, batch 4 x 2048, bf16, on NVIDIA GeForce RTX 5090, NVIDIA L40S, "
          "NVIDIA RTX A6000 and NVIDIA H100 PCIe (16 records, 2026-10-29 12:00 UTC)\n"
          "Software: torch 2.8.0+cu128, transformers 4.57.1, stepbench not recorded\n")


def test_the_table_markdown_and_html_open_with_what_was_measured(capsys):
    # The header family's golden: the table's and Markdown's header, word for word.
    assert report(capsys, POST).startswith(HEADER + "\n")
    markdown = report(capsys, POST, "--format", "markdown")
    assert markdown.startswith(HEADER.replace("Measured:", "**Measured:**").replace(
        "\nSoftware:", "\n\n**Software:**") + "\n")
    page = report(capsys, POST, "--format", "html")
    measured, software = [line for line in page.splitlines() if '<p class="meta">' in line][:2]
    assert page.index("<h1>stepbench report</h1>") < page.index(measured)
    assert names(measured, "<strong>Measured:</strong>", "llama-468m", "4 x 2048", "bf16", *GPUS,
                 "16 records", "2026-10-29 12:00 UTC")
    assert names(software, "<strong>Software:</strong>", "torch 2.8.0+cu128", "4.57.1")


def test_a_searchs_batch_sizes_read_as_a_range_in_numeric_order(capsys):
    """A max-batch search wrote its probes as they came (4, 8, 16, 32, 64, 48, ...): the header
    said "batch 4 x 2048, 8 x 2048, 16 x 2048, 32 x 2048, 64 x 2048, 48 x 2048, ..." (15 on
    the H200 run of 2026-12-01); its range and count instead, in every format."""
    data = Path(__file__).parent / "data" / "max-batch-h200.jsonl"
    assert report(capsys, data).startswith(
        "Measured: llama-468m, batch 4 to 64 x 2048 (12 sizes), bf16, on NVIDIA H200 ")
    assert "batch 4 to 64 x 2048 (12 sizes)" in report(capsys, data, "--format", "html")
    # A few sizes are listed, in numeric order; shapes of several lengths keep the models'.
    assert meta.shapes(["8 x 2048", "4 x 2048", "16 x 2048"]) == \
        "4 x 2048, 8 x 2048 and 16 x 2048"
    assert meta.shapes(["8 x 1024", "128"]) == "8 x 1024 and 128"


def test_csv_rows_carry_their_versions_and_dates(capsys):
    rows = list(csv.DictReader(io.StringIO(report(capsys, POST, "--format", "csv"))))
    assert {(r["torch"], r["transformers"], r["stepbench_version"]) for r in rows} == \
        {("2.8.0+cu128", "4.57.1", "")}
    assert {(r["started_first"], r["started_last"]) for r in rows} == \
        {("2026-10-29T12:00:00Z", "2026-10-29T12:00:00Z")}


def test_several_workloads_versions_and_days(capsys, tmp_path):
    records = [rec("eager", step_ms=100, started_at="2026-11-30T10:15:00Z"),
               rec("eager", step_ms=50, batch=2, dtype="fp32", started_at="2026-12-01T08:05:00Z",
                   software={"torch": "2.11.0", "transformers": "5.17.0", "stepbench": "0.1.0"}),
               rec("eager", step_ms=60, gpu="cpu", model="llama-tiny", started_at="bad",
                   machine={"gpu": "cpu", "cpu": "AMD EPYC 9654"})]
    path = tmp_path / "r.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    doc = json.loads(report(capsys, path, "--format", "json"))
    assert doc["meta"]["batch_seq"] == ["4 x 2048", "2 x 2048"]
    assert doc["meta"]["gpus"] == ["NVIDIA H200", "CPU (AMD EPYC 9654)"]
    lines = meta.header(doc["meta"])
    assert lines[0].startswith("Measured:") and lines[1].startswith("Software:")
    assert names(lines[0], "llama-468m", "llama-tiny", "4 x 2048", "2 x 2048", "bf16", "fp32",
                 "NVIDIA H200", "CPU (AMD EPYC 9654)", "3 records", "2026-11-30 10:15 UTC",
                 "2026-12-01 08:05 UTC")
    assert names(lines[1], "torch 2.8.0+cu128", "2.11.0", "transformers 4.57.1", "5.17.0")
    # stepbench's version, and how many records did not record it
    assert re.search(r"stepbench 0\.1\.0 \(\D*\b2\)$", lines[1]), lines[1]


def test_dates():
    assert meta.dates("2026-11-30T10:15:00Z", "2026-11-30T10:17:30+00:00") == \
        "2026-11-30 10:15-10:17 UTC"
    assert meta.dates("2026-11-30T12:15:00+02:00", "2026-11-30T10:15:00") == \
        "2026-11-30 10:15 UTC"
    assert meta.dates(None, None) == "start times not recorded"          # golden


def test_json_writes_a_diverged_loss_as_null(capsys, tmp_path):
    """A NaN loss (a diverged run) is null in the JSON, which has no NaN: strict parsers read it."""
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps(rec("eager", step_ms=100, loss_last=float("nan"))) + "\n" +
                    json.dumps(rec("compile", step_ms=80, loss_last=2.5)) + "\n")
    text = report(capsys, path, "--format", "json")

    def refuse(constant):
        raise AssertionError(f"{constant} in the JSON")

    rows = json.loads(text, parse_constant=refuse)["rows"]
    assert [(r["setup"], r["loss_last"]) for r in rows] == [("eager+sdpa", None),
                                                           ("compile+sdpa", 2.5)]


def test_json_text_is_json_dumps_indent_2(capsys):
    """The JSON report is written as json.dumps(indent=2) writes it (report/jsontext.py: runs
    of one-line values by the C encoder): the post's report, and values whose writing has
    rules of its own, character for character; a NaN and an unknown type refused alike."""
    text = report(capsys, POST, "--format", "json")
    assert text == json.dumps(json.loads(text), indent=2) + "\n"
    tricky = {"a": [], "b": {}, "c": (1, 2.5, -0.0, 1e-300, 10**30), "é ☃": "\"\\\n\x00✓",
              1: None, 2.5: True, None: False, "d": [[], {}, [[3]], {"x": ()}, "s"],
              "e": {"nested": {"deeper": [1, {"z": [None]}]}}, "f": [{}] * 2}
    for value in (tricky, [tricky, 1], {3: [1]}, [], {}, "plain", 7, None, ([1], [2, [3]])):
        assert jsontext.dumps(value) == json.dumps(value, indent=2, allow_nan=False), value
    for bad, error in ((float("nan"), ValueError), ({"x": [float("inf")]}, ValueError),
                       ({"x": object()}, TypeError), ([{1: [object()]}], TypeError)):
        with pytest.raises(error):
            jsontext.dumps(bad)
        with pytest.raises(error):
            json.dumps(bad, indent=2, allow_nan=False)


def test_the_commands_json_on_stdout_is_standard_json_a_nan_is_null():
    """run's and tune's --format json (jsontext.strict): Python writes a NaN loss as NaN, which
    strict parsers (a browser's JSON.parse) refuse; null there, the rest as json.dumps writes."""
    def refuse(name):
        raise ValueError(f"not standard JSON: {name}")

    value = [{"loss_last": float("nan"), "losses": [1.0, float("inf"), -float("inf")],
              "step_ms": 12.5, "setup": {"name": "eager"}}]
    text = jsontext.strict(value, indent=1)
    assert json.loads(text, parse_constant=refuse) == [
        {"loss_last": None, "losses": [1.0, None, None], "step_ms": 12.5,
         "setup": {"name": "eager"}}]
    plain = [{"step_ms": 12.5}]
    assert jsontext.strict(plain, indent=1) == json.dumps(plain, indent=1)
