"""The `run` command's table, rendered from stored records and compared with expected text."""

import json
from pathlib import Path

import pytest

from says import names
from stepbench.record import Record
from stepbench.report.document import rows_document, run_document
from stepbench.report.rows import build_rows
from stepbench.report.render import render


def render_records(records: list[dict], fmt: str) -> str:
    return render(run_document([Record.from_dict(r) for r in records]), fmt)

DATA = Path(__file__).parent / "data"


@pytest.fixture
def h200_records():
    # stepbench's default matrix as it ran on an H200 (benchmarks/results/h200-2026-11-30-matrix.jsonl).
    return [json.loads(line) for line in (DATA / "h200-matrix.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("fmt, expected", [("table", "h200-matrix-table.txt"),
                                           ("markdown", "h200-matrix-table.md")])
def test_table_matches_expected_text(h200_records, fmt, expected):
    assert render_records(h200_records, fmt) == (DATA / expected).read_text()


def test_failed_and_noisy_rows(h200_records):
    h200_records[2].update(status="oom", error="OutOfMemoryError: CUDA out of memory", step_ms=None)
    h200_records[0]["noise_flags"] = ["high_cv", "other_processes"]
    text = render_records(h200_records, "markdown")
    assert "| eager+eager | 4 | 2048 | OOM | - | - | - |" in text
    assert "| eager+sdpa | 4 | 2048 | 89.7*‡ |" in text
    # Each status and mark shown is explained in a line of its own (the golden files above
    # keep the wording).
    lines = text.splitlines()
    assert any(line.startswith("OOM ") and "memory" in line for line in lines)
    assert any(line.startswith("\\* ") and "5%" in line for line in lines)
    assert any(line.startswith("‡ ") and "other processes" in line for line in lines)


def test_graph_breaks_and_recompiles_are_marked_and_counted(h200_records):
    h200_records[1]["compile"].update(graph_breaks=2, recompiles=1,
                                      break_reasons=["Unsupported: builtin print (x2)"])
    text = render_records(h200_records, "markdown")
    assert "| compile+sdpa | 4 | 2048 | 67.7¶ |" in text
    assert any(names(line, "graph breaks", "recompile") for line in text.splitlines()
               if line.startswith("¶ "))
    # The report's details carry the counts.
    rows = build_rows([Record.from_dict(r) for r in h200_records], {})
    details = next(t for t in rows_document(rows).tables if t.title == "Details: torch.compile")
    assert {"Graph breaks", "Recompiles"} <= set(details.columns)
    by_setup = {cells[1]: dict(zip(details.columns, cells)) for cells in details.cells}
    assert by_setup["compile+sdpa"]["Graph breaks"] == "2"
    assert by_setup["compile+sdpa"]["Recompiles"] == "1"
    assert by_setup["compile+eager"]["Graph breaks"] == "0"


def test_code_left_eager_at_the_recompile_limit_is_marked_and_said(h200_records):
    # Per-layer compile of a 24-layer model once left 16 layers eager at dynamo's limit of 8,
    # with no graph break and no recompilation after the first step to show it.
    h200_records[1]["compile"].update(graph_breaks=0, recompiles=0, recompile_limit_hits=1,
                                      break_reasons=["dynamo's recompile limit hit (x1): code "
                                                     "past it ran eagerly"])
    text = render_records(h200_records, "markdown")
    assert "| compile+sdpa | 4 | 2048 | 67.7¶ |" in text
    rows = build_rows([Record.from_dict(r) for r in h200_records], {})
    details = next(t for t in rows_document(rows).tables if t.title == "Details: torch.compile")
    by_setup = {cells[1]: dict(zip(details.columns, cells)) for cells in details.cells}
    [limit] = [column for column in details.columns if "recompile limit" in column]
    assert by_setup["compile+sdpa"][limit] == "1"
    rows = json.loads(render_records(h200_records, "json"))["rows"]
    assert [r["recompile_limit_hits"] for r in rows if r["setup"] == "compile+sdpa"] == [1]
