"""Bad input to `stepbench report`: a clear message, the right exit code, nothing silently dropped.

A user error is one line on stderr and exit code 2 with no traceback; a damaged line or an
unpriced GPU is a warning that names the file and line (or the GPU), and the rest is reported.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from says import error_line, missing, names
from stepbench.cli import main

POST = Path(__file__).parent / "data" / "post"
PRICES = POST / "prices.toml"
SRC = Path(__file__).resolve().parent.parent / "src"


def report(capsys, *args) -> tuple[int, str, str]:
    code = main(["report", *map(str, args)])
    out, err = capsys.readouterr()
    return code, out, err


def assert_user_error(code: int, err: str, *tokens: str) -> None:
    """A user error's one line, naming every one of `tokens` (the flag, the path, the value)."""
    assert code == 2
    assert not missing(err, *tokens), err
    assert error_line(err, "report"), err
    assert "Traceback" not in err


def copy_post(tmp_path: Path, edit=None) -> Path:
    """The post's files in tmp_path; `edit(name, lines)` may change a file's lines."""
    for path in sorted(POST.glob("*.jsonl")):
        lines = path.read_text().splitlines()
        if edit:
            lines = edit(path.name, lines)
        (tmp_path / path.name).write_text("\n".join(lines) + "\n")
    return tmp_path


# ---------------------------------------------------------------- results files

def test_missing_results_file(capsys, tmp_path):
    code, out, err = report(capsys, POST / "1-rtx5090.jsonl", tmp_path / "nope.jsonl")
    assert_user_error(code, err, f"results file '{tmp_path / 'nope.jsonl'}' not found; pass "
                                 "results files (*.jsonl) or folders of them")
    assert out == ""


def test_folder_without_results_files(capsys, tmp_path):
    code, _, err = report(capsys, tmp_path)
    assert_user_error(code, err, f"'{tmp_path}'", "*.jsonl")


def test_truncated_and_garbled_lines_are_named_and_the_rest_kept(capsys, tmp_path):
    def damage(name, lines):
        if name == "2-l40s.jsonl":
            lines[1] = lines[1][: len(lines[1]) // 2]          # truncated mid-record
            lines.insert(3, "\x00\x00garbage{")                # garbled
        return lines

    folder = copy_post(tmp_path, damage)
    code, out, err = report(capsys, folder, "--prices", PRICES, "--format", "json")
    assert code == 0
    path = folder / "2-l40s.jsonl"
    assert f"{path}:2: " in err and f"{path}:4: " in err
    assert err.count("warning") == 2
    rows = json.loads(out)["rows"]
    assert len(rows) == 15                                       # only the truncated one lost
    l40s = [r["setup"] for r in rows if r["gpu"] == "NVIDIA L40S"]
    assert l40s == ["eager+sdpa", "eager+eager", "compile+eager"]


def test_unknown_schema_version_is_warned_named_and_skipped(capsys, tmp_path):
    def future(name, lines):
        if name == "4-h100.jsonl":
            rec = json.loads(lines[2])
            rec["schema"] = 2
            lines[2] = json.dumps(rec)
        return lines

    folder = copy_post(tmp_path, future)
    code, out, err = report(capsys, folder, "--prices", PRICES, "--format", "json")
    assert code == 0
    assert f"{folder / '4-h100.jsonl'}:3:" in err
    assert "schema 2" in err
    rows = json.loads(out)["rows"]
    assert ("NVIDIA H100 PCIe", "eager+eager") not in [(r["gpu"], r["setup"]) for r in rows]
    assert len(rows) == 15


@pytest.mark.parametrize("schema", [None, "1", 0])
def test_a_record_without_stepbenchs_schema_is_not_told_to_upgrade(capsys, tmp_path, schema):
    # Another tool's line with a `setup` object (a torchtitan script's): no newer stepbench
    # reads it either.
    def other(name, lines):
        if name == "4-h100.jsonl":
            rec = json.loads(lines[2])
            rec["schema"] = schema
            lines[2] = json.dumps(rec)
        return lines

    folder = copy_post(tmp_path, other)
    code, out, err = report(capsys, folder, "--prices", PRICES, "--format", "json")
    assert code == 0 and len(json.loads(out)["rows"]) == 15
    [line] = [line for line in err.splitlines() if "4-h100.jsonl:3:" in line]
    assert names(line, "skipped", "not a stepbench record", repr(schema)) and "upgrade" not in line


def test_a_file_that_is_no_results_file_is_one_warning_not_one_per_line(capsys, tmp_path):
    # A gzip of a results file (thousands of lines of bytes), a binary file: one line says so.
    import gzip

    packed = tmp_path / "r.jsonl.gz"
    packed.write_bytes(gzip.compress((POST / "4-h100.jsonl").read_bytes() * 50))
    noise = tmp_path / "noise.jsonl"
    noise.write_bytes(bytes(range(256)) * 400)
    code, out, err = report(capsys, packed, noise)
    assert code == 2 and out == ""
    assert [line.split(": ")[1:3] for line in err.splitlines()][:2] == [
        ["warning", f"{packed}"], ["warning", f"{noise}"]], err
    assert len(err.splitlines()) == 3 and error_line(err.splitlines()[2], "report"), err
    assert all(names(line, "not a stepbench results file") for line in err.splitlines()[:2])
    # Beside a results file: that one is reported.
    code, out, err = report(capsys, packed, POST / "4-h100.jsonl", "--format", "json")
    assert code == 0 and len(json.loads(out)["rows"]) == 4
    assert [line for line in err.splitlines() if str(packed) in line] == [
        f"stepbench report: warning: {packed}: skipped, not a stepbench results file (none of "
        "its first lines is a record)"]


def test_blank_lines_before_the_records_do_not_hide_them(capsys, tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text("\n" * 40 + (POST / "4-h100.jsonl").read_text())
    code, out, _ = report(capsys, path, "--format", "json")
    assert code == 0 and len(json.loads(out)["rows"]) == 4


def test_a_distributed_job_without_its_peak_memory_still_has_its_scaling_finding(capsys,
                                                                               tmp_path):
    # A value a record may lack (null) is left out of the sentence, not a traceback.
    records = [json.loads(line) for line in
               (POST.parent / "cpu-fsdp2-x2.jsonl").read_text().splitlines()]
    for r in records:
        r["peak_memory_gb"] = None
    path = tmp_path / "r.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    code, out, err = report(capsys, path, "--format", "json")
    assert code == 0 and "Traceback" not in err
    scaling = [f["text"] for f in json.loads(out)["findings"] if f["kind"] == "scaling"]
    assert scaling and all("scaling efficiency" in text and "peak memory" not in text
                           for text in scaling), scaling


def test_record_without_gpu_is_warned_and_skipped(capsys, tmp_path):
    def no_gpu(name, lines):
        if name == "3-a6000.jsonl":
            rec = json.loads(lines[0])
            del rec["machine"]["gpu"]
            lines[0] = json.dumps(rec)
        return lines

    folder = copy_post(tmp_path, no_gpu)
    code, out, err = report(capsys, folder, "--prices", PRICES, "--format", "json")
    assert code == 0
    assert names(err, f"{folder / '3-a6000.jsonl'}:1:", "skipped", "machine.gpu")
    assert len(json.loads(out)["rows"]) == 15


def test_file_with_no_usable_records(capsys, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text("not json\n{\"schema\": 1}\n")
    code, _, err = report(capsys, bad)
    assert code == 2
    assert f"{bad}:1:" in err and f"{bad}:2:" in err
    assert names(err, "error:", "no usable records", str(bad))
    assert "Traceback" not in err


def test_same_file_twice_is_read_once(capsys):
    path = POST / "4-h100.jsonl"
    code, out, err = report(capsys, path, path, "--prices", PRICES, "--format", "json")
    assert code == 0
    assert names(err, "warning:", str(path))
    assert all(r["repeats"] == 1 for r in json.loads(out)["rows"])


# ---------------------------------------------------------------- prices

@pytest.mark.parametrize("name, text, tokens", [
    ("p.toml", '[prices]\n"NVIDIA L40S" = \n', ("TOML",)),
    ("p.toml", '"NVIDIA L40S" = 0.54\n', ("[prices]",)),
    ("p.toml", '[prices]\n"NVIDIA L40S" = "cheap"\n', ("'NVIDIA L40S'", "'cheap'", "positive")),
    ("p.toml", '[prices]\n"NVIDIA L40S" = -1\n', ("'NVIDIA L40S'", "-1")),
    ("p.csv", "name,dollars\nNVIDIA L40S,0.54\n", ("gpu,price_per_hour",)),
    ("p.csv", "gpu,price_per_hour\nNVIDIA L40S,0.54\nNVIDIA H100 PCIe,abc\n",
     ("line 3", "'NVIDIA H100 PCIe'", "'abc'")),
    ("p.yaml", "NVIDIA L40S: 0.54\n", ("'.yaml'", "*.toml", "*.csv")),
])
def test_malformed_price_file(capsys, tmp_path, name, text, tokens):
    path = tmp_path / name
    path.write_text(text)
    code, out, err = report(capsys, POST, "--prices", path)
    assert_user_error(code, err, f"price file '{path}'", *tokens)
    assert out == ""


def test_missing_price_file(capsys, tmp_path):
    code, _, err = report(capsys, POST, "--prices", tmp_path / "prices.toml")
    assert_user_error(code, err, f"price file '{tmp_path / 'prices.toml'}'")


@pytest.mark.parametrize("flag", ["NVIDIA L40S", "=0.54", "NVIDIA L40S=free", "NVIDIA L40S=0"])
def test_bad_price_flag(capsys, flag):
    code, _, err = report(capsys, POST, "--price", flag)
    assert_user_error(code, err, f"--price '{flag}'")


def test_csv_price_file_and_flag_override(capsys, tmp_path):
    path = tmp_path / "prices.csv"
    path.write_text("gpu,price_per_hour\nNVIDIA L40S,0.54\nGeForce RTX 5090,1.15\n"
                    "nvidia rtx a6000,0.65\nNVIDIA H100 PCIe,9.99\n")
    code, out, err = report(capsys, POST, "--prices", path, "--price", "NVIDIA H100 PCIe=3.86",
                            "--format", "json")
    assert code == 0, err
    assert err == ""
    prices = {r["gpu"]: r["price_per_hour"] for r in json.loads(out)["rows"]}
    assert prices == {"NVIDIA GeForce RTX 5090": 1.15, "NVIDIA L40S": 0.54,
                      "NVIDIA RTX A6000": 0.65, "NVIDIA H100 PCIe": 3.86}


def test_gpu_without_price_shows_missing_cost_and_a_warning(capsys, tmp_path):
    path = tmp_path / "prices.toml"
    path.write_text('[prices]\n"NVIDIA L40S" = 0.54\n"NVIDIA RTX A6000" = 0.65\n'
                    '"NVIDIA GeForce RTX 5090" = 1.15\n"NVIDIA H100 SXM" = 2.99\n')
    code, out, err = report(capsys, POST, "--prices", path, "--format", "json")
    assert code == 0
    warnings = [line for line in err.splitlines() if "warning:" in line]
    assert any("'NVIDIA H100 PCIe'" in line for line in warnings)
    assert any(names(line, "'NVIDIA H100 SXM'", "no GPU") for line in warnings)
    doc = json.loads(out)
    h100 = [r for r in doc["rows"] if r["gpu"] == "NVIDIA H100 PCIe"]
    assert all(r["price_per_hour"] is None and r["m_tokens_per_dollar"] is None for r in h100)
    assert all(r["tokens_per_s"] for r in h100)                 # the measurements stay
    assert any(names(n, "price", "NVIDIA H100 PCIe", "M tokens per $") for n in doc["notes"])
    per_dollar = next(f["text"] for f in doc["findings"] if f["kind"] == "tokens_per_dollar")
    assert "NVIDIA H100 PCIe" not in per_dollar


def test_markdown_table_shows_missing_price_as_dash(capsys):
    code, out, _ = report(capsys, POST / "4-h100.jsonl", "--format", "markdown")
    assert code == 0
    row = next(line for line in out.splitlines() if "| eager+sdpa |" in line)
    assert row.split("|")[2].strip() == "-" and row.split("|")[8].strip() == "-"


def test_unknown_format_is_an_argparse_error(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["report", str(POST), "--format", "pdf"])
    assert exc.value.code == 2
    assert names(capsys.readouterr().err, "--format", "'pdf'")


@pytest.mark.slow
def test_module_entry_point_in_a_subprocess(tmp_path):
    """The same error through `python -m stepbench`, as a user sees it."""
    proc = subprocess.run([sys.executable, "-m", "stepbench", "report", str(tmp_path / "x.jsonl")],
                          capture_output=True, text=True, env={"PYTHONPATH": str(SRC)},
                          timeout=120)
    assert proc.returncode == 2
    assert proc.stdout == ""
    # (The wording is pinned by test_missing_results_file.)
    assert error_line(proc.stderr, "report")
    assert names(proc.stderr, f"'{tmp_path / 'x.jsonl'}'", "*.jsonl")


# ---------------------------------------------------------------- output paths

def test_unwritable_out_path_is_one_line_naming_it(capsys):
    code, out, err = report(capsys, POST, "--prices", PRICES, "--format", "html", "--out",
                            "/proc/nope/r.html")
    assert_user_error(code, err, "/proc/nope/r.html (", "--out")
    assert out == ""


def test_out_path_that_is_a_folder_is_one_line_naming_it(capsys, tmp_path):
    code, _, err = report(capsys, POST, "--prices", PRICES, "--format", "markdown", "--out",
                          tmp_path)
    assert_user_error(code, err, f"{tmp_path} (")


@pytest.mark.parametrize("folder", ["/proc/nope", "/proc"])
def test_unwritable_plots_folder_is_one_line_naming_it(capsys, folder):
    # /proc/nope cannot be made; /proc exists but takes no files.
    code, out, err = report(capsys, POST, "--prices", PRICES, "--plots", folder)
    assert_user_error(code, err, f"{folder} (", "--plots")


def test_plots_path_that_is_a_file_is_one_line_naming_it(capsys, tmp_path):
    path = tmp_path / "plots"
    path.write_text("")
    code, _, err = report(capsys, POST, "--prices", PRICES, "--plots", path)
    assert_user_error(code, err, f"--plots {path}", "folder")


def test_a_job_of_one_process_is_the_wrappers_own_cost_not_scaling(capsys):
    # The H100 lease's examples/gpt.py at --nproc 1 --parallel none,ddp,fsdp2: a job of one
    # process has nothing to scale over; its finding says what the wrapper alone cost, that
    # the host set the pace (the records' host_bound), and names its job once.
    path = (Path(__file__).resolve().parent.parent / "benchmarks" / "results"
            / "h100-2026-12-05-gpt-nproc1.jsonl")
    code, out, _ = report(capsys, path, "--format", "json")
    doc = json.loads(out)
    scaling = {f["text"].split("(")[1].split(",")[0]: f["text"] for f in doc["findings"]
               if f["kind"] == "scaling"}
    assert sorted(scaling) == ["ddp x1", "fsdp2 x1"]
    assert names(scaling["ddp x1"], "wrapper's own cost", "0.84x", "unwrapped", "host-bound")
    assert names(scaling["fsdp2 x1"], "0.39x", "host-bound")
    assert not any("scaling efficiency" in text for text in scaling.values())
    code, out, _ = report(capsys, path)
    lead = out[out.index("Key findings"):out.index("Results")]
    assert "- The ddp wrapper's own cost" in lead and "ddp x1: The" not in lead
