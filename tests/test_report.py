"""`stepbench report` on the post's published table: numbers, findings and every output format.

tests/data/post holds the post's 16 rows (4 GPUs x 4 setups, batch 4 x 2048) as result records,
one file per machine, and its prices (tests/data/post/make_records.py wrote them). The report
must give back the post's tokens/s and M tokens per $ to their rounding, state the post's
directions, and render the Markdown in tests/data/post-report.md (regenerate it with
STEPBENCH_UPDATE_GOLDEN=1 after a deliberate change, and read the diff).
"""

import base64
import csv
import html
import io
import json
import os
import re
from html.parser import HTMLParser
from pathlib import Path

import pytest

from says import names
from stepbench.cli import main

DATA = Path(__file__).parent / "data"
POST = DATA / "post"
PRICES = POST / "prices.toml"
GOLDEN = DATA / "post-report.md"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

# The post's "Results" table, as published: GPU, setup, step ms, tokens/s, peak GB,
# first step s, M tokens per $; None where the post prints OOM.
PUBLISHED = [
    ("NVIDIA GeForce RTX 5090", "eager+sdpa", 196, 41870, 17.3, 0.6, 131),
    ("NVIDIA GeForce RTX 5090", "compile+sdpa", 215, 38040, 13.3, 21.6, 119),
    ("NVIDIA GeForce RTX 5090", "eager+eager", None),
    ("NVIDIA GeForce RTX 5090", "compile+eager", None),
    ("NVIDIA L40S", "eager+sdpa", 244, 33581, 17.3, 0.6, 224),
    ("NVIDIA L40S", "compile+sdpa", 236, 34691, 13.3, 34.2, 231),
    ("NVIDIA L40S", "eager+eager", None),
    ("NVIDIA L40S", "compile+eager", 391, 20973, 39.1, 38.9, 140),
    ("NVIDIA RTX A6000", "eager+sdpa", 457, 17942, 17.3, 0.7, 99),
    ("NVIDIA RTX A6000", "compile+sdpa", 455, 18005, 13.3, 39.2, 100),
    ("NVIDIA RTX A6000", "eager+eager", None),
    ("NVIDIA RTX A6000", "compile+eager", 546, 15017, 39.1, 47.1, 83),
    ("NVIDIA H100 PCIe", "eager+sdpa", 152, 54022, 17.4, 0.4, 50),
    ("NVIDIA H100 PCIe", "compile+sdpa", 160, 51055, 13.4, 36.4, 48),
    ("NVIDIA H100 PCIe", "eager+eager", 435, 18813, 56.0, 0.7, 18),
    ("NVIDIA H100 PCIe", "compile+eager", 169, 48469, 39.1, 43.9, 45),
]
POST_PRICES = {"NVIDIA GeForce RTX 5090": 1.15, "NVIDIA L40S": 0.54, "NVIDIA RTX A6000": 0.65,
               "NVIDIA H100 PCIe": 3.86}


def report(capsys, *args) -> tuple[int, str, str]:
    code = main(["report", *map(str, args)])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def post_json(capsys) -> dict:
    code, out, err = report(capsys, POST, "--prices", PRICES, "--format", "json")
    assert code == 0, err
    return json.loads(out)


def finding(doc: dict, kind: str, contains: str = "") -> str:
    texts = [f["text"] for f in doc["findings"] if f["kind"] == kind and contains in f["text"]]
    assert len(texts) == 1, (kind, contains, [f["text"] for f in doc["findings"]])
    return texts[0]


def direction(text: str, gpu: str) -> str:
    match = re.search(re.escape(gpu) + r" [\d.]+ vs [\d.]+ ms \(([\d.]+(?:%|x)) (faster|slower)\)",
                      text)
    assert match, (gpu, text)
    return match.group(2)


# ---------------------------------------------------------------- the post's numbers

def test_rows_reproduce_the_published_table(post_json):
    rows = post_json["rows"]
    assert [(r["gpu"], r["setup"]) for r in rows] == [(p[0], p[1]) for p in PUBLISHED]
    for row, published in zip(rows, PUBLISHED):
        assert row["price_per_hour"] == POST_PRICES[row["gpu"]]
        if published[2] is None:
            assert row["status"] == "oom"
            assert row["step_ms"] is None and row["m_tokens_per_dollar"] is None
            continue
        _, _, step_ms, tokens, peak, first, m_per_dollar = published
        assert row["status"] == "ok"
        assert round(row["step_ms"]) == step_ms
        assert round(row["tokens_per_s"]) == tokens
        assert round(row["m_tokens_per_dollar"]) == m_per_dollar
        assert row["peak_memory_gb"] == pytest.approx(peak)
        assert row["first_step_s"] == pytest.approx(first)


def test_json_rows_have_the_contract_keys(post_json):
    keys = {"gpu", "price_per_hour", "setup", "status", "step_ms", "tokens_per_s",
            "peak_memory_gb", "first_step_s", "m_tokens_per_dollar"}
    assert all(keys <= set(row) for row in post_json["rows"])
    assert all(set(f) == {"kind", "text", "group", "key"} for f in post_json["findings"])


def test_findings_state_the_posts_directions(post_json):
    sdpa = finding(post_json, "compile_speed", "With sdpa attention")
    assert direction(sdpa, "NVIDIA GeForce RTX 5090") == "slower"
    assert direction(sdpa, "NVIDIA H100 PCIe") == "slower"
    assert direction(sdpa, "NVIDIA L40S") == "faster"
    # The numbers and names each finding must state; its wording is pinned by the golden
    # markdown (test_markdown_matches_expected_file).
    assert names(sdpa, "10% slower", "NVIDIA GeForce RTX 5090", "3% faster", "NVIDIA L40S")
    eager = finding(post_json, "compile_speed", "With eager attention")
    assert names(eager, "NVIDIA H100 PCIe", "169", "435 ms", "2.6x faster")

    memory = finding(post_json, "compile_memory", "With sdpa attention")
    assert names(memory, "4 GPUs", "23%", "4.0 GB")

    fit = finding(post_json, "fit")
    assert names(fit, "only with torch.compile", "NVIDIA L40S (48 GB)", "NVIDIA RTX A6000 (51 GB)",
                 "NVIDIA GeForce RTX 5090")

    payback = finding(post_json, "compile_payback")
    assert names(payback, "never", "NVIDIA GeForce RTX 5090", "NVIDIA H100 PCIe")

    assert names(finding(post_json, "attention_speed", "In eager mode"), "sdpa", "eager",
                 "NVIDIA H100 PCIe", "152", "435 ms", "2.9x faster")
    assert names(finding(post_json, "attention_vs_compile"), "sdpa", "torch.compile", "3 GPUs")

    assert names(finding(post_json, "tokens_per_dollar"), "NVIDIA L40S", "231M",
                 "compile+sdpa")
    fastest = finding(post_json, "fastest_gpu")
    assert names(fastest, "NVIDIA H100 PCIe", "54,022 tokens/s", "1.3x",
                 "NVIDIA GeForce RTX 5090", "3.4x")


def test_findings_without_spread_say_direction_and_claim_no_noise(post_json):
    texts = " ".join(f["text"] for f in post_json["findings"])
    assert "within the noise" not in texts
    assert names(finding(post_json, "testing"), "untested", "noise")


def test_markdown_matches_expected_file(capsys):
    code, out, err = report(capsys, POST, "--prices", PRICES, "--format", "markdown")
    assert code == 0, err
    if os.environ.get("STEPBENCH_UPDATE_GOLDEN"):
        GOLDEN.write_text(out)
    assert out == GOLDEN.read_text()


def test_files_in_argument_order_give_the_same_rows_as_the_folder(capsys, post_json):
    files = sorted(POST.glob("*.jsonl"))
    code, out, _ = report(capsys, *files, "--prices", PRICES, "--format", "json")
    assert code == 0
    assert json.loads(out)["rows"] == post_json["rows"]


# ---------------------------------------------------------------- findings follow the numbers

def test_findings_change_when_the_numbers_change(tmp_path, capsys):
    """Nothing is hard-coded: slow the L40S's compiled step and make the H100 cheap."""
    for path in POST.glob("*.jsonl"):
        lines = []
        for line in path.read_text().splitlines():
            rec = json.loads(line)
            if rec["machine"]["gpu"] == "NVIDIA L40S" and rec["setup"]["name"] == "compile+sdpa":
                rec["step_ms"] *= 1.2
            lines.append(json.dumps(rec))
        (tmp_path / path.name).write_text("\n".join(lines) + "\n")
    code, out, err = report(capsys, tmp_path, "--prices", PRICES, "--price",
                            "NVIDIA H100 PCIe=0.30", "--format", "json")
    assert code == 0, err
    doc = json.loads(out)
    sdpa = finding(doc, "compile_speed", "With sdpa attention")
    assert direction(sdpa, "NVIDIA L40S") == "slower"
    assert names(sdpa, "NVIDIA L40S", "283", "244 ms", "16% slower")
    best = max((r for r in doc["rows"] if r["m_tokens_per_dollar"]),
               key=lambda r: r["m_tokens_per_dollar"])
    per_dollar = finding(doc, "tokens_per_dollar")
    assert best["gpu"] == "NVIDIA H100 PCIe"             # the finding names the winner first
    assert 0 <= per_dollar.find("NVIDIA H100 PCIe") < per_dollar.find("NVIDIA L40S")
    l40s = next(r for r in doc["rows"]
                if r["gpu"] == "NVIDIA L40S" and r["setup"] == "compile+sdpa")
    assert round(l40s["m_tokens_per_dollar"]) == round(231.27 / 1.2)


def test_one_gpu_gives_no_cross_gpu_findings(capsys):
    code, out, _ = report(capsys, POST / "4-h100.jsonl", "--price", "NVIDIA H100 PCIe=3.86",
                          "--format", "json")
    assert code == 0
    kinds = {f["kind"] for f in json.loads(out)["findings"]}
    assert "fastest_gpu" not in kinds and "fit" not in kinds
    assert names(finding(json.loads(out), "tokens_per_dollar"), "NVIDIA H100 PCIe",
                 "eager+sdpa", "50M")


# ---------------------------------------------------------------- formats

def test_terminal_table_has_posts_columns_and_oom_rows(capsys):
    code, out, err = report(capsys, POST, "--prices", PRICES)
    assert code == 0, err
    header = next(line for line in out.splitlines() if "GPU" in line and "$/hour" in line)
    assert re.findall(r"\S+(?: \S+)*", header.strip()) == [
        "GPU", "$/hour", "Setup", "Step (ms)", "Tokens/s", "Peak memory", "First step (s)",
        "M tokens per $"]
    l40s_compile_eager = next(line for line in out.splitlines()
                              if "NVIDIA L40S" in line and "compile+eager" in line)
    assert l40s_compile_eager.split()[-6:] == ["391", "20,973", "39.1", "GB", "38.9", "140"]
    assert sum("OOM" in line for line in out.splitlines()) == 5
    assert "What the numbers say" in out


def test_csv_parses_back_to_the_rows(capsys, post_json):
    code, out, _ = report(capsys, POST, "--prices", PRICES, "--format", "csv")
    assert code == 0
    rows = list(csv.DictReader(io.StringIO(out)))
    assert len(rows) == 16
    for row, expected in zip(rows, post_json["rows"]):
        assert (row["gpu"], row["setup"], row["status"]) == \
            (expected["gpu"], expected["setup"], expected["status"])
        if expected["tokens_per_s"] is None:
            assert row["tokens_per_s"] == ""
        else:
            assert float(row["tokens_per_s"]) == pytest.approx(expected["tokens_per_s"])
            assert float(row["m_tokens_per_dollar"]) == pytest.approx(
                expected["m_tokens_per_dollar"], rel=1e-6)


def test_json_stdout_holds_only_json_and_warnings_go_to_stderr(capsys):
    code, out, err = report(capsys, POST, "--format", "json")       # no prices: a warning
    assert code == 0
    doc = json.loads(out)
    assert set(doc) == {"rows", "findings", "notes", "meta"}
    # the GPUs without a price, on stderr
    assert names(err.lower(), "price", "nvidia l40s", "nvidia h100 pcie")


class _Page(HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags, self.images, self.cells, self._in_cell = [], [], [], False

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        if tag == "img":
            self.images.append(dict(attrs)["src"])
        self._in_cell = tag in ("td", "th")

    def handle_endtag(self, tag):
        self._in_cell = False

    def handle_data(self, data):
        if self._in_cell:
            self.cells.append(data)


def test_html_is_one_file_with_table_findings_and_embedded_plots(tmp_path, capsys):
    out_path = tmp_path / "report.html"
    code, out, err = report(capsys, POST, "--prices", PRICES, "--format", "html", "--out",
                            out_path)
    assert code == 0 and out == ""
    assert f"wrote {out_path}" in err
    page = _Page()
    page.feed(out_path.read_text())
    assert page.tags.count("tr") == 17                     # header + 16 rows
    assert page.tags.count("li") >= 6                      # the findings
    for cell in ("NVIDIA L40S", "compile+eager", "20,973", "OOM", "231"):
        assert cell in page.cells
    assert len(page.images) == 4                           # step time, tokens/s, memory, $
    for src in page.images:
        assert src.startswith("data:image/png;base64,")
        assert base64.b64decode(src.split(",", 1)[1]).startswith(PNG_SIGNATURE)
    assert "http://" not in out_path.read_text() and "https://" not in out_path.read_text()


def test_plots_are_valid_pngs(tmp_path, capsys):
    import matplotlib.image

    code, _, err = report(capsys, POST, "--prices", PRICES, "--plots", tmp_path / "plots")
    assert code == 0, err
    names = sorted(p.name for p in (tmp_path / "plots").iterdir())
    assert names == ["peak_memory.png", "step_time.png", "tokens_per_dollar.png",
                     "tokens_per_s.png"]
    for path in (tmp_path / "plots").iterdir():
        assert path.read_bytes().startswith(PNG_SIGNATURE)
        image = matplotlib.image.imread(path)
        assert image.shape[0] > 100 and image.shape[1] > 100
        assert image.std() > 0                             # not a blank canvas


def test_plots_without_prices_leave_out_tokens_per_dollar(tmp_path, capsys):
    report(capsys, POST, "--plots", tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["peak_memory.png", "step_time.png",
                                                          "tokens_per_s.png"]


def test_out_writes_the_file_and_nothing_to_stdout(tmp_path, capsys):
    target = tmp_path / "sub" / "report.md"
    code, out, _ = report(capsys, POST, "--prices", PRICES, "--format", "markdown", "--out",
                          target)
    assert code == 0 and out == ""
    assert target.read_text() == GOLDEN.read_text()


# ---------------------------------------------------------------- error bars

def _post_with(tmp_path: Path, edit) -> Path:
    """The post's files in tmp_path, each ok record passed through `edit(record)`."""
    for path in POST.glob("*.jsonl"):
        records = [json.loads(line) for line in path.read_text().splitlines()]
        (tmp_path / path.name).write_text("".join(
            json.dumps(edit(r) if r["status"] == "ok" else r) + "\n" for r in records))
    return tmp_path


def _html_report(capsys, folder: Path) -> str:
    code, out, err = report(capsys, folder, "--prices", PRICES, "--format", "html")
    assert code == 0, err
    assert out.count('src="data:image/png;base64,') == 4
    return out


def test_html_of_the_posts_records_with_only_their_means_as_step_times(tmp_path, capsys):
    """A published table gives one number per setup; repeated as its step times, the interval
    has zero width and its bootstrap mean lies a rounding error off it. Was: "'yerr' must not
    contain negative values"."""
    _html_report(capsys, _post_with(tmp_path, lambda r: {**r, "step_times_ms": [r["step_ms"]] * 20}))


def test_html_when_the_interval_does_not_contain_the_step_time(tmp_path, capsys):
    # step_ms from the published tokens/s, step times from elsewhere: all above it.
    _html_report(capsys, _post_with(tmp_path, lambda r: {
        **r, "step_times_ms": [r["step_ms"] * 1.05, r["step_ms"] * 1.06]}))


def test_html_of_records_with_one_timed_step(tmp_path, capsys):
    # One step time gives no interval (nothing to bootstrap), so no error bar is drawn.
    _html_report(capsys, _post_with(tmp_path, lambda r: {
        **r, "step_times_ms": [r["step_ms"] * 1.01], "setup": {**r["setup"], "steps": 1}}))


def test_error_bars_are_never_negative():
    from stepbench.report.plots import error_bar

    below, above = error_bar(10.0, (10.000000000000002, 10.000000000000002))
    assert below == [0.0] and 0 <= above[0] < 1e-14
    assert error_bar(10.0, (11.0, 12.0)) == [[0.0], [2.0]]
    assert error_bar(10.0, (8.0, 9.0)) == [[2.0], [0.0]]
    assert error_bar(10.0, (9.0, 12.0)) == [[1.0], [2.0]]
    assert error_bar(10.0, (float("nan"), float("nan"))) is None
    assert error_bar(10.0, None) is None


# ---------------------------------------------------------------- tokens/s and many setups

def test_tokens_per_s_interval_is_the_step_times_turned_over():
    from stepbench.report.plots import tokens_per_s_ci
    from stepbench.report.rows import Row
    from stepbench.setup import Setup

    row = Row(gpu="g", setup=Setup(model="m", mode="eager", attn="sdpa", batch=4, seq=1000),
              status="ok", statuses={"ok": 2}, repeats=2, runs=1, step_ms=100.0,
              tokens_per_s=40_000.0, step_ms_ci=(80.0, 125.0))
    assert tokens_per_s_ci(row) == pytest.approx((32_000.0, 50_000.0))
    row.step_ms_ci = None
    assert tokens_per_s_ci(row) is None


def test_plots_of_many_setups_show_the_first_and_say_so(tmp_path, capsys, monkeypatch):
    """A plot of thousands of bars is taller than a PNG may be (2^16 px) and unreadable: the
    plots keep the first MAX_BARS bars, in table order, and a note says what they left out."""
    from stepbench.report import plots

    monkeypatch.setattr(plots, "MAX_BARS", 6)     # 4 GPUs: one setup's bars fit
    code, out, err = report(capsys, POST, "--prices", PRICES, "--format", "html",
                            "--plots", tmp_path)
    assert code == 0, err
    note = "The plots show the first 1 of 4 setups, in the tables' order (at most 6 bars a plot)"
    assert note in err and note in html.unescape(out)
    from stepbench.report.document import report_document

    rows = report_document([str(POST)]).rows
    assert {r.name for r in plots.plotted(rows)} == {"eager+sdpa"}
    monkeypatch.setattr(plots, "MAX_BARS", 16)
    assert plots.plots_note(rows) is None and plots.plotted(rows) == rows


def test_report_leaves_the_garbage_collector_as_it_found_it(capsys, tmp_path):
    """The report runs with the cyclic garbage collector off (cli/report.py) and gives it back
    as it was: on after a report, an error too, and off where the caller had it off."""
    import gc

    assert gc.isenabled()
    assert report(capsys, POST, "--format", "json")[0] == 0
    assert gc.isenabled()
    assert report(capsys, tmp_path / "none.jsonl", "--format", "json")[0] != 0
    assert gc.isenabled()
    gc.disable()
    try:
        assert report(capsys, POST, "--format", "json")[0] == 0
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_every_json_row_key_is_named_in_report_mds_json_section(post_json):
    text = (Path(__file__).parent.parent / "docs" / "report.md").read_text()
    section = text.split("\n## JSON\n")[1].split("\n## ")[0]
    named = set(re.findall(r"`([a-z_]+)`", section))
    keys = set().union(*(row.keys() for row in post_json["rows"]))
    assert keys - named == set(), "docs/report.md's JSON section misses these row keys"
