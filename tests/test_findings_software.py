"""The software caveat: GPU comparisons across different torch/transformers versions say so."""

import dataclasses
from pathlib import Path

from stepbench.record import ResultsFile, Software
from stepbench.report.findings import findings_for
from stepbench.report.rows import build_rows

DATA = Path(__file__).parent / "data"


def records(*names):
    out = []
    for name in names:
        out += ResultsFile(DATA / name).read()
    return out


def software_findings(recs):
    return [f.text for _, group in findings_for(build_rows(recs, {})) for f in group
            if f.kind == "software"]


def test_mixed_stacks_are_named():
    texts = software_findings(records("h200-matrix.jsonl", "post/4-h100.jsonl"))
    # The software finding's golden, word for word.
    assert texts == ["The results come from different software: NVIDIA H200 on torch 2.11.0, "
                     "transformers 5.17.0; NVIDIA H100 PCIe on torch 2.8.0, transformers "
                     "4.57.1. Differences between these GPUs mix hardware and software versions."]


def test_one_stack_gives_no_caveat():
    assert software_findings(records("post/1-rtx5090.jsonl", "post/4-h100.jsonl")) == []


def test_record_without_software_is_not_a_different_stack():
    recs = records("post/4-h100.jsonl")
    oom = dataclasses.replace(recs[0], status="oom", step_ms=None, software=Software())
    assert software_findings(recs + [oom]) == []


def test_a_build_tag_is_not_another_stack():
    # torch "2.11.0+cu130" (the version torch reports) and "2.11.0" (the package's): one release.
    recs = records("h200-matrix.jsonl")
    tagged = [dataclasses.replace(r, software=dataclasses.replace(r.software, torch="2.11.0+cu130"),
                                  run_id="tagged") for r in recs]
    assert software_findings(recs + tagged) == []
