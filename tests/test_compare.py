"""`stepbench compare BEFORE AFTER`, and the report's --model/--setup/--gpu filters and --label
(issue 23).

Before is tests/data/report-h200 (real H200 step times: 4 eager+sdpa and 2 compile+sdpa
processes); after is the same records changed here.
"""

import copy
import csv
import io
import json
import re
from pathlib import Path

import pytest

from stepbench.axes import AXES
from stepbench.cli import main
from stepbench.setup import Setup

from says import error_line, missing, names

DATA = Path(__file__).parent / "data"
BEFORE = DATA / "report-h200" / "h200-repeats.jsonl"
POST = DATA / "post"
RECORDS = [json.loads(line) for line in BEFORE.read_text().splitlines()]


def write(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def after(tmp_path, compile_factor=1.08, extra=(), edit=None) -> Path:
    """The H200 records with compile+sdpa's steps `compile_factor` times as long."""
    out = []
    for r in copy.deepcopy(RECORDS):
        if r["setup"]["mode"] == "compile":
            r["step_times_ms"] = [t * compile_factor for t in r["step_times_ms"]]
            r["step_ms"] *= compile_factor
        r["started_at"] = "2026-12-02T09:00:00Z"
        out.append(edit(r) if edit else r)
    return write(tmp_path / "after.jsonl", out + list(extra))


def compare(capsys, *args) -> tuple[int, str, str]:
    try:
        code = main(["compare", *map(str, args)])
    except SystemExit as exc:                 # argparse's errors
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


def compared(capsys, *args) -> dict:
    code, out, err = compare(capsys, *args, "--format", "json")
    assert code == 0, err
    return json.loads(out)


def by_setup(doc: dict) -> dict:
    return {r["setup"]: r for r in doc["rows"]}


# ---------------------------------------------------------------- matching and verdicts

def test_setups_match_by_every_axis_but_warmup_and_steps():
    assert {a.name for a in AXES if a.timing} == {"warmup", "steps"}
    base = Setup(model="llama-468m", mode="compile", attn="sdpa")
    assert base.replace(warmup=1, steps=5).match_key() == base.match_key()
    for change in ({"seed": 1}, {"batch": 8}, {"dtype": "fp32"}, {"compile_mode": "max-autotune"}):
        assert base.replace(**change).match_key() != base.match_key()


def test_a_pair_reads_the_same_size_either_way_round(capsys, tmp_path):
    # One convention for a speed difference (findings.change): the slower step time over the
    # faster's. Steps 1.25 times as long are "25% slower"; the same pair the other way round is
    # "25% faster" (not "20% faster", the drop in step time), in the text and in change_pct.
    slow = after(tmp_path, compile_factor=1.25)
    forward = by_setup(compared(capsys, BEFORE, slow))["compile+sdpa"]
    backward = by_setup(compared(capsys, slow, BEFORE))["compile+sdpa"]
    assert (forward["verdict_text"], backward["verdict_text"]) == ("25% slower", "25% faster")
    assert (forward["change_pct"], backward["change_pct"]) == (pytest.approx(25), pytest.approx(-25))


def test_a_slower_setup_outside_the_noise_and_an_unchanged_one(capsys, tmp_path):
    doc = compared(capsys, BEFORE, after(tmp_path))
    rows = by_setup(doc)
    slower, same = rows["compile+sdpa"], rows["eager+sdpa"]
    assert (slower["verdict"], slower["verdict_text"]) == ("slower", "8% slower")
    assert slower["ratio"] == pytest.approx(1.08) and slower["significant"] is True
    low, high = slower["ratio_ci"]
    assert 1.0 < low < 1.08 < high
    assert slower["tokens_per_s_ratio"] == pytest.approx(1 / 1.08)
    assert slower["tokens_per_s_ratio_ci"] == pytest.approx([1 / high, 1 / low])
    assert slower["method"] == "processes"
    assert same["verdict"] == "noise" and names(same["verdict_text"], "p = ")
    # The golden of a row within the noise, word for word but its p-value.
    assert re.fullmatch(r"within the noise, p = \d\.\d\d", same["verdict_text"])
    [verdict] = [f["text"] for f in doc["findings"] if f["kind"] == "verdict"]
    # The golden of compare's verdict line, word for word.
    assert verdict == ("after against before, setup by setup: 1 of 2 setups slower outside the "
                       "noise (compile+sdpa on NVIDIA H200 by 8%); 1 of 2 setups within the "
                       "noise.")
    assert set(doc) == {"rows", "findings", "notes", "meta", "unmatched", "fail_above", "failed",
                        "inconclusive"}
    assert doc["meta"]["before"]["label"] == "before"
    assert doc["meta"]["after"]["started_first"] == "2026-12-02T09:00:00Z"


def test_other_step_counts_still_match_and_unmatched_setups_are_listed(capsys, tmp_path):
    def fewer_steps(r):
        r["setup"]["steps"], r["setup"]["warmup"] = 20, 2
        return r

    other_seed = copy.deepcopy(RECORDS[0])
    other_seed["setup"]["seed"] = 7
    doc = compared(capsys, BEFORE, after(tmp_path, 1.0, [other_seed], edit=fewer_steps))
    assert [r["setup"] for r in doc["rows"]] == ["eager+sdpa", "compile+sdpa"]
    assert (doc["rows"][0]["before_steps"], doc["rows"][0]["after_steps"]) == (40, 20)
    assert doc["unmatched"] == {"before": [], "after": [{
        "gpu": "NVIDIA H200", "setup": "eager+sdpa", "model": "llama-468m", "params": None,
        "batch": 4, "seq": 2048, "dtype": "bf16", "status": "ok", "step_ms": other_seed["step_ms"]}]}
    code, out, _ = compare(capsys, BEFORE, tmp_path / "after.jsonl")
    assert names(out, "Only in after", "eager+sdpa (seed 7)")


def test_untested_failing_and_newly_running_setups(capsys, tmp_path):
    one = copy.deepcopy(RECORDS[0])
    one["setup"].update(name="eager+eager", attn="eager")
    one["step_times_ms"] = []                              # one process, no step times
    oom = copy.deepcopy(one)
    oom.update(status="oom", step_ms=None)
    before = write(tmp_path / "before.jsonl", RECORDS + [one, _as(one, "compile")])
    later = after(tmp_path, 1.0, [_as(one, "eager", step_ms=one["step_ms"] * 1.3),
                                  _as(oom, "compile")])
    rows = by_setup(compared(capsys, before, later))
    assert rows["eager+eager"]["verdict"] == "untested"
    assert rows["eager+eager"]["verdict_text"] == "untested: 30% slower"
    assert rows["compile+eager"]["verdict"] == "fails_now"
    assert names(rows["compile+eager"]["verdict_text"], "OOM")
    reverse = by_setup(compared(capsys, later, before))
    assert reverse["compile+eager"]["verdict"] == "runs_now"
    assert names(reverse["compile+eager"]["verdict_text"], "OOM")
    # The goldens of the per-row verdicts, word for word.
    assert rows["compile+eager"]["verdict_text"] == "fails now: OOM"
    assert reverse["compile+eager"]["verdict_text"] == "runs now (was OOM)"


def _as(record: dict, mode: str, **fields) -> dict:
    r = copy.deepcopy(record)
    r["setup"].update(mode=mode, name=f"{mode}+{r['setup']['attn']}")
    r.update(fields)
    return r


# ---------------------------------------------------------------- --fail-above

def test_fail_above_fails_a_slowdown_beyond_it_outside_the_noise(capsys, tmp_path):
    path = after(tmp_path)
    code, out, err = compare(capsys, BEFORE, path, "--fail-above", "5")
    assert code == 1
    # The golden of --fail-above's failure, word for word.
    assert err.strip() == ("stepbench compare: failed --fail-above 5: 1 setup slower by more "
                           "than 5% outside the noise or failing now (compile+sdpa on NVIDIA "
                           "H200 +8.0%)")
    assert any(names(line, "--fail-above 5", "compile+sdpa on NVIDIA H200 +8.0%")
               for line in out.splitlines())
    code, out, err = compare(capsys, BEFORE, path, "--fail-above", "10")
    assert code == 0 and err == ""
    assert "Passes --fail-above 10" in out


def test_fail_above_ignores_a_slowdown_inside_the_noise(capsys, tmp_path):
    # eager+sdpa's own processes span 92-97 ms: 2% slower is within their noise.
    def slower_eager(r):
        if r["setup"]["mode"] == "eager":
            r["step_times_ms"] = [t * 1.02 for t in r["step_times_ms"]]
            r["step_ms"] *= 1.02
        return r

    code, out, err = compare(capsys, BEFORE, after(tmp_path, 1.0, edit=slower_eager),
                             "--fail-above", "1", "--format", "json")
    assert code == 0, err
    assert by_setup(json.loads(out))["eager+sdpa"]["verdict"] == "noise"


def test_fail_above_fails_a_setup_that_no_longer_runs(capsys, tmp_path):
    def oom(r):
        if r["setup"]["mode"] == "compile":
            r.update(status="oom", step_ms=None, step_times_ms=[])
        return r

    code, _, err = compare(capsys, BEFORE, after(tmp_path, edit=oom), "--fail-above", "50")
    assert code == 1 and names(err, "--fail-above 50", "compile+sdpa on NVIDIA H200", "OOM")


# ---------------------------------------------------------------- disturbed steps (issue 37)

def _busy(flag="busy_cpu", mode="compile"):
    """An edit that marks `mode`'s records as the runner marks steps that another process
    disturbed (measure/telemetry.py: `busy_cpu`, `‡` in the tables)."""
    def edit(r):
        if r["setup"]["mode"] == mode:
            r["noise_flags"] = [*r.get("noise_flags", []), flag]
        return r
    return edit


@pytest.mark.parametrize("flag", ["busy_cpu", "other_processes"])
def test_a_disturbed_side_gets_no_verdict(capsys, tmp_path, flag):
    """compile+sdpa 3.7x faster, but measured while other processes held the CPU (or GPU):
    not called faster, the change shown as measured, the verdict line saying why."""
    doc = compared(capsys, BEFORE, after(tmp_path, 0.27, edit=_busy(flag)))
    rows = by_setup(doc)
    disturbed = rows["compile+sdpa"]
    assert disturbed["verdict"] == "disturbed"
    assert names(disturbed["verdict_text"], "(‡)", "3.7x faster")
    # The golden of a disturbed row's verdict, word for word.
    assert disturbed["verdict_text"] == "not compared, disturbed (‡): 3.7x faster as measured"
    assert disturbed["after_noise_flags"] == [flag]
    assert rows["eager+sdpa"]["verdict"] == "noise"             # the quiet setup is tested
    [verdict] = [f["text"] for f in doc["findings"] if f["kind"] == "verdict"]
    assert "faster outside" not in verdict
    assert names(verdict, "1 of 2 setups", "disturbed", "compile+sdpa on NVIDIA H200 (‡)")
    # Disturbed before, quiet after: the same.
    reverse = by_setup(compared(capsys, after(tmp_path, 0.27, edit=_busy(flag)), BEFORE))
    assert reverse["compile+sdpa"]["verdict"] == "disturbed"


def test_fail_above_is_inconclusive_on_a_disturbed_setup(capsys, tmp_path):
    """8% slower beyond --fail-above 5, but disturbed: neither a pass nor a failure, exit 3;
    a real failure elsewhere still fails (exit 1)."""
    path = after(tmp_path, 1.08, edit=_busy())
    code, out, err = compare(capsys, BEFORE, path, "--fail-above", "5")
    assert code == 3
    # The golden of --fail-above's inconclusive line, word for word.
    assert err.strip() == ("stepbench compare: inconclusive for --fail-above 5: 1 setup not "
                           "compared because something disturbed their timed steps "
                           "(compile+sdpa on NVIDIA H200: 8% slower as measured (‡)); measure again on a quiet "
                           "machine")
    assert any(names(line, "--fail-above 5", "exit 3") for line in out.splitlines())
    doc = json.loads(compare(capsys, BEFORE, path, "--fail-above", "5", "--format", "json")[1])
    [inconclusive] = doc["inconclusive"]
    assert doc["failed"] == [] and names(inconclusive, "compile+sdpa", "NVIDIA H200", "8% slower", "(‡)")

    def oom_eager(r):
        if r["setup"]["mode"] == "eager":
            r.update(status="oom", step_ms=None, step_times_ms=[])
        return _busy()(r)

    code, _, err = compare(capsys, BEFORE, after(tmp_path, 1.08, edit=oom_eager),
                           "--fail-above", "5")
    assert code == 1 and names(err, "--fail-above 5", "eager+sdpa on NVIDIA H200", "OOM")
    assert compare(capsys, BEFORE, path)[0] == 0          # without the flag: exit 0
    # A large speed-up as measured is worded, not a percentage ("-180.0%" for 2.8x faster).
    code, _, err = compare(capsys, BEFORE, after(tmp_path, 1 / 2.8, edit=_busy()),
                           "--fail-above", "5")
    assert code == 3 and names(err, "2.8x faster as measured") and "%" not in err


# (flags, what the one line must name: the flag, the value, what the records hold)
@pytest.mark.parametrize("args, tokens", [
    (["--fail-above", "-3"], ("--fail-above", "0 or more", "-3")),
    (["--fail-above", "inf"], ("--fail-above", "0 or more", "inf")),
    (["--fail-above", "five"], ("--fail-above", "'five'")),
    (["--label", "a", "--label", "b", "--label", "c"], ("--label", "per file")),
    (["--label", "same", "--label", "same"], ("--label", "'same'")),
    (["--gpu", "H300"], ("--gpu 'H300'", "NVIDIA H200")),
])
def test_bad_flags_are_one_line_and_exit_2(capsys, tmp_path, args, tokens):
    code, out, err = compare(capsys, BEFORE, after(tmp_path), *args)
    assert code == 2 and out == ""
    assert error_line(err, "compare") and err.count("\n") == 1
    assert not missing(err, *tokens), err


def test_the_same_file_on_both_sides_is_an_error(capsys, tmp_path):
    # Every setup would be "within the noise": a comparison of a run with itself says nothing.
    path = after(tmp_path)
    for before in (path, tmp_path):                  # the file, or a folder that holds it
        code, out, err = compare(capsys, before, path)
        assert code == 2 and out == ""
        # The golden of compare's own errors, word for word.
        assert err == (f"stepbench compare: error: {path} is in both before and after; compare "
                       "the results files of two runs, before and after a change\n")


def test_files_without_a_common_setup_are_an_error(capsys, tmp_path):
    code, _, err = compare(capsys, BEFORE, POST / "4-h100.jsonl")
    assert code == 2
    assert err.count("\n") == 1 and names(err, "before (2 setups)", "after (4)")


def test_a_ratio_of_means_against_the_medians_shown_gets_a_note_with_the_means(capsys,
                                                                              tmp_path):
    """One after process far slower, the others a little faster: the ms columns (medians of
    per-process means) fall while the ratio (of their means) rises; the H200's eager+sdpa read
    90.3 -> 90.8 ms beside 0.961 with nothing to say why."""
    def one_slow(r):
        if r["setup"]["mode"] == "eager":
            factor = 1.35 if r["repeat"] == 2 else 0.99
            r["step_times_ms"] = [t * factor for t in r["step_times_ms"]]
            r["step_ms"] *= factor
        return r
    code, out, err = compare(capsys, BEFORE, after(tmp_path, compile_factor=1.0, edit=one_slow))
    assert code == 0, err
    [note] = [line for line in out.splitlines() if "ratio is of the means" in line]
    assert names(note, "eager+sdpa on NVIDIA H200", "95.2 ms in before", "other way", "medians")
    assert "compile+sdpa" not in note


def test_no_common_setup_names_what_the_closest_pair_differs_in(capsys, tmp_path):
    """Records from before `init` existed (their weights were drawn on the CPU) against a run of
    today's default (drawn on the GPU): the error says which setting kept them apart, which
    neither file shows (an H200 matrix of 2026-11-30 against the default run of 12-02)."""
    def drawn_on_device(r):
        r["setup"]["init"] = "device"
        return r
    code, _, err = compare(capsys, BEFORE, after(tmp_path, edit=drawn_on_device))
    assert code == 2 and err.count("\n") == 1
    assert names(err, "no setup ran in both", "init (cpu in before, device in after)")
    # Otherwise equal setups on two GPUs: the GPU is what differs.
    def elsewhere(r):
        r["machine"]["gpu"] = "NVIDIA L40S"
        return r
    code, _, err = compare(capsys, BEFORE, after(tmp_path, edit=elsewhere))
    assert code == 2 and names(err, "gpu (NVIDIA H200 in before, NVIDIA L40S in after)")
    assert "init" not in err


@pytest.mark.slow
def test_fail_above_is_the_exit_code_of_a_real_process(tmp_path):
    """As CI runs it: `python -m stepbench compare ... --fail-above` in its own process exits 1
    with one line on stderr for a slowdown beyond PCT, 0 for one within the noise."""
    from conftest import run_cli

    def slower_eager(r):
        if r["setup"]["mode"] == "eager":
            r["step_times_ms"] = [t * 1.02 for t in r["step_times_ms"]]
        return r

    failing = run_cli("compare", BEFORE, after(tmp_path), "--fail-above", "5", timeout=120)
    assert failing.returncode == 1 and "8% slower" in failing.stdout
    assert failing.stderr.count("\n") == 1 and "failed --fail-above 5" in failing.stderr
    within = run_cli("compare", BEFORE, after(tmp_path, 1.0, edit=slower_eager),
                     "--fail-above", "1", timeout=120)
    assert within.returncode == 0 and within.stderr == ""
    assert names(within.stdout, "noise", "--fail-above 1")


# ---------------------------------------------------------------- labels, filters, formats

def test_labels_name_the_sides(capsys, tmp_path):
    path = after(tmp_path)
    code, out, _ = compare(capsys, BEFORE, path, "--label", "main", "--label", "pr-42")
    assert code == 0
    # the columns, the header and the verdict name each side by its label
    assert names(out, "main (ms)", "pr-42 / main")
    header = out.splitlines()[0]
    assert header.startswith("Before (main):") and names(header, "llama-468m", "NVIDIA H200")
    [verdict] = [line for line in out.splitlines() if "setup by setup" in line]
    assert names(verdict, "pr-42", "main") and verdict.index("pr-42") < verdict.index("main")
    doc = compared(capsys, BEFORE, path, "--label", "after=pr-42")
    assert (doc["meta"]["before"]["label"], doc["meta"]["after"]["label"]) == ("before", "pr-42")


def test_filters_choose_the_setups_compared(capsys, tmp_path):
    doc = compared(capsys, BEFORE, after(tmp_path), "--setup", "compile*")
    assert [r["setup"] for r in doc["rows"]] == ["compile+sdpa"]
    assert doc["unmatched"] == {"before": [], "after": []}


def test_every_format(capsys, tmp_path):
    path = after(tmp_path)
    _, out, _ = compare(capsys, BEFORE, path, "--format", "csv")
    rows = list(csv.DictReader(io.StringIO(out)))
    assert [(r["setup"], r["verdict"]) for r in rows] == [("eager+sdpa", "noise"),
                                                          ("compile+sdpa", "slower")]
    assert float(rows[1]["ratio_ci_low"]) > 1 and rows[1]["after_started_last"]
    _, out, _ = compare(capsys, BEFORE, path, "--format", "markdown")
    before, _, before_software = out.split("\n")[:3]
    assert before.startswith("**Before:**") and before_software.startswith("**Before software:**")
    assert names(before, "llama-468m", "4 x 2048", "bf16", "NVIDIA H200", "6 records",
                 "2026-11-30 10:15 UTC") and names(before_software, "torch 2.11.0+cu130")
    [after_line] = [line for line in out.splitlines() if line.startswith("**After:**")]
    assert names(after_line, "6 records", "2026-12-02 09:00 UTC")
    assert any(line.startswith("## ") and "after" in line for line in out.splitlines())
    assert "| NVIDIA H200 | compile+sdpa | 69.4 | 75.0 | 1.080 (" in out
    _, out, _ = compare(capsys, BEFORE, path, "--format", "html")
    assert names(out, "<h1>", "before -&gt; after", "8% slower")
    target = tmp_path / "out" / "compare.md"
    code, out, err = compare(capsys, BEFORE, path, "--format", "markdown", "--out", target)
    assert code == 0 and out == "" and f"wrote {target}" in err and target.exists()


# ---------------------------------------------------------------- the report's filters, labels

def report_json(capsys, *args) -> dict:
    code = main(["report", *map(str, args), "--format", "json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out)


def test_report_filters_by_gpu_setup_and_model(capsys):
    doc = report_json(capsys, POST, "--gpu", "h100 pcie,*L40S", "--setup", "compile*")
    assert [(r["gpu"], r["setup"]) for r in doc["rows"]] == [
        ("NVIDIA L40S", "compile+sdpa"), ("NVIDIA L40S", "compile+eager"),
        ("NVIDIA H100 PCIe", "compile+sdpa"), ("NVIDIA H100 PCIe", "compile+eager")]
    assert doc["meta"]["records"] == 4
    assert len(report_json(capsys, POST, "--model", "LLAMA-*")["rows"]) == 16


@pytest.mark.parametrize("args, tokens", [
    (["--model", "qwen*"], ("--model 'qwen*'", "llama-468m")),
    ([str(BEFORE), "--gpu", "H200", "--setup", "eager+eager"],
     ("--setup eager+eager --gpu H200",)),
    (["--setup", "eager,"], ("--setup", "comma")),
    (["--label", "a", "--label", "b"], ("--label", "2 times", "1 FILE")),
])
def test_report_filter_errors(capsys, args, tokens):
    code = main(["report", str(POST / "2-l40s.jsonl"), *args])
    _, err = capsys.readouterr()
    assert code == 2 and error_line(err, "report") and err.count("\n") == 1
    assert not missing(err, *tokens), err


def test_report_labels_keep_each_inputs_records_apart(capsys, tmp_path):
    later = after(tmp_path)
    doc = report_json(capsys, BEFORE, later, "--label", "main", "--label", "pr-42")
    assert [(r["gpu"], r["setup"], r["label"], r["repeats"]) for r in doc["rows"]] == [
        ("NVIDIA H200 (main)", "eager+sdpa", "main", 4),
        ("NVIDIA H200 (main)", "compile+sdpa", "main", 2),
        ("NVIDIA H200 (pr-42)", "eager+sdpa", "pr-42", 4),
        ("NVIDIA H200 (pr-42)", "compile+sdpa", "pr-42", 2)]
    assert doc["meta"]["labels"] == ["main", "pr-42"]
    # Without labels the two files' records of a setup are repeats of one row.
    assert [r["repeats"] for r in report_json(capsys, BEFORE, later)["rows"]] == [8, 4]
