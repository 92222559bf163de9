"""No finding rests on a row whose timed steps something outside the step disturbed (‡ † §,
report/marks.DISTURBED): each family of report/findings/ on the H200 matrix's records
(tests/data/h200-matrix.jsonl) with the fastest setup marked as having shared the GPU with
other processes, and the cheap host-bound mark (stepbench.hostlead) said as a finding."""

import json
from pathlib import Path

import pytest

from says import names
from stepbench.cli import main

DATA = Path(__file__).parent / "data"


@pytest.fixture
def records():
    return [json.loads(line) for line in (DATA / "h200-matrix.jsonl").read_text().splitlines()]


def report(capsys, tmp_path, records) -> dict:
    path = tmp_path / "r.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    assert main(["report", str(path), "--format", "json", "--price", "NVIDIA H200=3.5"]) == 0
    return json.loads(capsys.readouterr().out)


def by_kind(doc) -> dict[str, str]:
    out: dict[str, str] = {}
    for f in doc["findings"]:
        out[f["kind"]] = out.get(f["kind"], "") + f["text"]
    return out


@pytest.mark.parametrize("flag, mark", [("other_processes", "‡"), ("throttled", "†"),
                                        ("recompiled", "§")])
def test_a_disturbed_row_is_in_no_finding_but_untested(capsys, tmp_path, records, flag, mark):
    quiet = by_kind(report(capsys, tmp_path, records))
    assert "compile+sdpa" in quiet["fastest_setup"] + quiet["mfu"] + quiet["energy"]
    fastest = next(r for r in records if r["setup"]["name"] == "compile+sdpa")
    fastest["noise_flags"] = [flag]
    found = by_kind(report(capsys, tmp_path, records))
    # Rankings name the quiet rows' best; comparisons with it are not stated.
    assert names(found["fastest_setup"], "eager+sdpa", "compile+eager")
    for kind in ("fastest_setup", "mfu", "energy", "tokens_per_dollar", "compile_cost",
                 "compile_payback", "attention_speed", "attention_vs_compile"):
        assert "67.7" not in found.get(kind, "") and "compile+sdpa" not in found.get(kind, ""), \
            kind
    assert "sdpa attention, compiled against eager" not in found.get("compile_speed", "")
    # Each left-out comparison and row is named, with the mark that says why.
    assert names(found["untested"], mark, "eager+sdpa against compile+sdpa", "67.7",
                 "compile+sdpa on NVIDIA H200 (67.7 ms)")


def test_the_cheap_host_bound_mark_is_a_finding_unless_disturbed(capsys, tmp_path, records):
    eager = next(r for r in records if r["setup"]["name"] == "eager+sdpa")
    eager.update(host_lead_ms=0.4, host_lead_steps_ms=[0.4] * 20, host_lead_offset_ms=0.005,
                 noise_flags=["host_bound"])
    found = by_kind(report(capsys, tmp_path, records))
    assert names(found["host_bound"], "^", "eager+sdpa (89.7 ms)", "NVIDIA H200", "5%", "host")
    # host_bound is not a disturbance: eager+sdpa is still compared and ranked.
    assert names(found["compile_speed"], "67.7 vs 89.7") and "untested" not in found
    eager["noise_flags"] = ["host_bound", "other_processes"]
    found = by_kind(report(capsys, tmp_path, records))
    assert "host_bound" not in found and names(found["untested"], "eager+sdpa on NVIDIA H200")
