"""The report's handling of a search's records (report/searches.py).

tests/data/max-batch-h200.jsonl is made up in the shape of `run --max-batch` on an H200 for the
post's model (no real GPU run behind it): a plain eager + SDPA record at batch 4, then the
searches of eager+sdpa (batch 4 grew to 24) and compile+sdpa (probes fit up to 40, but the full
measurement at 40 ran out of memory, so the search measured 32), each probe 1 warm-up + 2 steps.
"""

import pytest
import csv
import io
import json
from dataclasses import replace
from pathlib import Path

from stepbench.record import ResultsFile
from stepbench.report.document import report_document, rows_document
from stepbench.report.render import render
from stepbench.report.rows import build_rows
from stepbench.report.searches import split

from conftest import run_cli
from says import names, table_rows

DATA = Path(__file__).parent / "data" / "max-batch-h200.jsonl"
FINDING = ("On NVIDIA H200, with sdpa attention: torch.compile lets batch 4 grow to 32 (eager: "
           "24) and raises tokens/s by 19% over eager at its own largest batch (and 23% over "
           "eager at batch 4).")


def report(fmt: str) -> str:
    """The report in `fmt`, made in this process (the HTML page without its plots)."""
    return render(report_document([str(DATA)]), fmt)


@pytest.mark.slow
def test_probes_and_attempts_stay_out_of_the_results_and_the_finding_says_what_compile_buys():
    proc = run_cli("report", DATA, "--format", "json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert [(r["setup"], r["batch"], r["steps"]) for r in data["rows"]] == [
        ("eager+sdpa", 4, 20), ("eager+sdpa", 24, 20), ("compile+sdpa", 32, 20)]
    assert all(r["status"] == "ok" for r in data["rows"])     # the OOM attempt at 40 is not a row
    [finding] = [f for f in data["findings"] if f["kind"] == "max_batch"]
    assert finding["text"] == FINDING and finding["key"]
    assert names(finding["group"], "llama-468m", "largest batch", "seq 2048", "bf16")
    # Every record the searches asked for is listed, the probes and the attempt included.
    searches = data["searches"]
    assert len(searches) == 19
    assert [s["search"] for s in searches].count("max_batch attempt") == 1
    assert searches[-1]["tag"]["stepped_down_from"] == [40]
    # No finding draws on a probe (1 warm-up + 2 steps): the only workloads are the rows'.
    assert not any("1+2" in f["text"] or "batch 8 " in f["text"] for f in data["findings"])


def test_every_format_shows_the_searches_details():
    table = report("table")
    assert FINDING in table
    results = table[table.index("Results"):table.index("Details: repeats")]
    assert "compile+sdpa (32x2048)" in results and "40x2048" not in results
    details = table[table.index("Details: searches"):]
    attempt = ["compile+sdpa", "max_batch", "attempt", "40", "2048", "4+20", "OOM"]
    assert any(words[i:i + len(attempt)] == attempt for words in map(str.split, details.splitlines())
               for i in range(len(words)))
    # Both searches measured in full (4+20) after their probes (1+2): neither is called stopped.
    assert "stopped" not in details
    # The golden of a search's note, word for word.
    assert ("NVIDIA H200 compile+sdpa at seq 2048: batch 4 grew to 32 (largest seen to fit 40, "
            "smallest out of memory 44; chosen to leave 5% of 143.8 GB free); the full "
            "measurement ran out of memory at 40 first.") in details
    markdown = report("markdown")
    assert "## Details: searches" in markdown
    assert ["NVIDIA H200", "eager+sdpa", "max_batch probe (bisect)", "25", "2048", "1+2",
            "OOM"] in [r[:7] for r in table_rows(markdown)]
    html = report("html")
    assert names(html, "<h2>Details: searches</h2>", "max_batch probe (double)")
    rows = list(csv.DictReader(io.StringIO(report("csv"))))
    assert [r["search"] for r in rows[:3]] == ["", "", ""]
    assert sum(r["search"].startswith("max_batch probe") for r in rows) == 16
    assert {r["batch"] for r in rows if r["search"] == "max_batch attempt"} == {"40"}


def test_a_gain_inside_the_noise_is_called_so():
    records = ResultsFile(DATA).read()
    measured, _ = split(records)
    eager = next(r for r in measured if r.setup.batch == 24)
    compiled = next(r for r in measured if r.setup.batch == 32)
    # The compiled setup at eager's tokens/s: the same time per token, step for step.
    compiled.step_times_ms = [t * 32 / 24 for t in eager.step_times_ms]
    compiled.step_ms = eager.step_ms * 32 / 24
    compiled.tokens_per_s = eager.tokens_per_s
    doc = rows_document(build_rows(measured, {}), searched=records)
    [text] = [f.text for _, found in doc.findings for f in found if f.kind == "max_batch"]
    # the GPU, the attention, the batches each mode reached, the test's p; no gain claimed
    assert names(text, "NVIDIA H200", "sdpa", "batch 4", "32", "(eager: 24)", "within the noise",
                 "(p = 1.00)")
    assert "faster" not in text


def test_no_finding_without_the_eager_twins_search():
    records = [r for r in ResultsFile(DATA).read() if r.setup.mode == "compile"]
    doc = rows_document(build_rows(split(records)[0], {}), searched=records)
    assert not [f for _, found in doc.findings for f in found if f.kind == "max_batch"]
    # A tune's probes (any search kind) are not rows either.
    tuned = [replace(r, search={"kind": "tune", "role": "probe"}) for r in records[:2]]
    measured, listed = split(tuned + records)
    assert len(listed) == 2 + 8 + 1 and all(r.search["role"] == "final" for r in measured)


def test_a_search_without_a_full_measurement_says_why():
    records = [r for r in ResultsFile(DATA).read() if r.search and r.search["role"] == "probe"]
    eager = [r for r in records if r.setup.mode == "eager"]
    compiled = [r for r in records if r.setup.mode == "compile"]
    compiled[-1] = replace(compiled[-1], status="error", error="RuntimeError: boom\ntail")
    table = rows_document([], searched=eager[:3] + compiled).tables[-1]
    assert table.title == "Details: searches" and len(table.cells) == 3 + len(compiled)
    stopped, failed = table.notes[1:]
    # a search stopped (resumable), and one ended by its probe: the batch, status and error
    assert names(stopped.split(": ")[0], "NVIDIA H200", "eager+sdpa", "seq 2048")
    assert names(stopped, "stopped", "resume")
    assert names(failed.split(": ")[0], "NVIDIA H200", "compile+sdpa", "seq 2048")
    assert names(failed, "batch 44", "error", "RuntimeError: boom") and "tail" not in failed


# ---------------------------------------------------------------- a tune's records

TUNE = Path(__file__).parent.parent / "benchmarks" / "results" / "h200-2026-12-01-tune-468m.jsonl"


def test_a_tunes_records_are_its_own_table_and_not_listed_again_in_details_searches():
    records = ResultsFile(TUNE).read()
    tuned = [r for r in records if r.search["kind"] == "tune"]
    # With a max-batch search beside it: its records stay in "Details: searches".
    max_batch = ResultsFile(DATA).read()
    doc = report_document([str(TUNE), str(DATA)])
    titles = [t.title for t in doc.tables]
    assert any(names(t, "Tune", "llama-468m", "seq 2048", "NVIDIA H200") for t in titles)
    [tune] = [t for t in doc.tables if t.title.startswith("Tune")]
    assert len(tune.cells) == len(tuned)
    assert tune.cells[0][:5] == ["screen", "eager+sdpa", "4", "bf16", "ok"]
    assert sum(cells[0].startswith("final #") for cells in tune.cells) == \
        sum(r.search["role"] == "final" for r in tuned)
    [details] = [t for t in doc.tables if t.title == "Details: searches"]
    assert not any(c[2].startswith("tune") for c in details.cells)
    assert len(details.cells) == len([r for r in max_batch if r.search])
    # Every format shows the tune's table under its title.
    assert f"## {tune.title}" in render(doc, "markdown")
    assert f"<h2>{tune.title}</h2>" in render(doc, "html")
    assert tune.title in render(doc, "table")
    # As data: "tunes" in JSON (none of its records under "searches"), its rows in CSV.
    data = json.loads(render(doc, "json"))
    [entry] = data["tunes"]
    assert (entry["model"], entry["seq"], entry["gpu"]) == ("llama-468m", 2048, "NVIDIA H200")
    assert [t["stage"] for t in entry["tried"]][:2] == ["screen", "screen"]
    assert not any(s["search"].startswith("tune") for s in data["searches"])
    rows = list(csv.DictReader(io.StringIO(render(doc, "csv"))))
    assert sum(r["search"].startswith("tune ") for r in rows) == len(tuned)


CPU_TUNE = TUNE.parent / "cpu-2core-2026-12-05-tunes-loaded-3m-final" / "tune-1.jsonl"


def test_a_cpu_tunes_table_prints_memory_as_the_results_do_and_its_own_flop_share():
    """A CPU tune of llama-tiny: its table printed peaks of 0.03-0.08 GB as "0.0 GB" and
    "0.1 GB" beside the Results' 0.03 GB, and the FLOP note said "about 3% more (+1.9% ...)"
    beside a column of +1.8%: 3% is llama-468m's share at 2048 tokens."""
    doc = report_document([str(CPU_TUNE)])
    [tune] = [t for t in doc.tables if t.title.startswith("Tune")]
    peaks = [cells[7] for cells in tune.cells]
    assert "0.0 GB" not in peaks and "0.03 GB" in peaks and "0.08 GB" in peaks
    note = next(n for t in doc.tables for n in t.notes if n.startswith("FLOP counter diff"))
    assert names(note, "+1.9% for llama-tiny at 256 tokens") and "3%" not in note


def test_a_disturbed_side_gets_no_gain_only_the_batches_it_reached():
    # Issue 37: no claim rests on a row whose timed steps something outside the step disturbed
    # (‡): the finding still says how far each batch grew, and names the mark instead of a gain.
    records = ResultsFile(DATA).read()
    measured, _ = split(records)
    eager = next(r for r in measured if r.setup.batch == 24)
    eager.noise_flags = [*eager.noise_flags, "busy_cpu"]
    doc = rows_document(build_rows(measured, {}), searched=records)
    [text] = [f.text for _, found in doc.findings for f in found if f.kind == "max_batch"]
    assert names(text, "NVIDIA H200", "32", "(eager: 24)", "not compared", "‡")
    assert "19%" not in text and "raises" not in text
    # The side at the start batch was steady: that comparison is still stated.
    assert names(text, "23% over eager at batch 4")
