"""The report of one H200, six result files and three models, as a reader sees it.

The files: three real H200 runs of llama-468m (benchmarks/results) and three made for layout by
tests/data/report-models/make_records.py, whose records name their model by a long config path
(a .json file, a folder's config.json). Tables, notes, findings and plots must name each model by
its short label, never by its path.
"""

import json
from pathlib import Path

import pytest

from stepbench.cli import main
from says import names

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
SIX_FILES = [RESULTS / f"h200-2026-11-30-{name}.jsonl"
             for name in ("matrix", "repeats3", "sdpa-repeats4")] + \
    sorted((ROOT / "tests" / "data" / "report-models").glob("*.jsonl"))
CONFIG_DIR = "/home/alice/experiments"
MODELS = ("llama-468m", "qwen2.5-0.5b", "smollm2-135m")


def report(capsys, *args) -> str:
    code = main(["report", *map(str, SIX_FILES), "--price", "NVIDIA H200=3.50",
                 "--energy-price", "0.15", *map(str, args)])
    out, err = capsys.readouterr()
    assert code == 0, err
    return out


def test_six_files_three_models():
    assert len(SIX_FILES) == 6
    models = {json.loads(line)["setup"]["model"] for path in SIX_FILES
              for line in path.read_text().splitlines()}
    assert len(models) == 3 and sum(m.startswith(CONFIG_DIR) for m in models) == 2


@pytest.mark.parametrize("fmt", ["table", "markdown", "html"])
def test_no_config_path_in_what_a_reader_sees(capsys, fmt):
    out = report(capsys, "--format", fmt)
    assert CONFIG_DIR not in out and "config.json" not in out
    for model in MODELS:
        assert f"compile+sdpa ({model})" in out


def test_notes_name_the_rows_model(capsys):
    notes = json.loads(report(capsys, "--format", "json"))["notes"]
    runs = [n for n in notes if "runs were combined" in n]
    assert any(names(n, "eager+sdpa (llama-468m)", "3 runs") for n in runs)
    assert any(names(n, "eager+sdpa (qwen2.5-0.5b)", "2 runs") for n in runs)
    assert len(set(runs)) == len(runs)          # each note points at one row
    # One GPU: its name is the report's, not every note's.
    assert not any("NVIDIA H200 eager" in n for n in notes)


def test_plot_labels_are_short(capsys):
    from stepbench.report.document import report_document
    from stepbench.report.plots import bar_labels

    labels = bar_labels(report_document([str(p) for p in SIX_FILES]).rows)
    assert "compile+eager (smollm2-135m)" in labels.values()
    assert all("/" not in label for label in labels.values())
