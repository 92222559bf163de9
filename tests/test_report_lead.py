"""The key findings: the few a reader sees first, chosen by kind and by what a finding says.

The lead holds a compiled setup whose loss left eager's, the fastest setup per GPU, the fastest
GPU (with the caveat when GPUs ran different software), the most tokens per dollar across GPUs,
setups that fit only when compiled, and comparisons that could not be told from noise; at most
findings.LEAD_MAX of them. Each stays
in its workload's list too; JSON marks it with "key": true.
"""

import json
from pathlib import Path

import numpy as np

from stepbench.cli import main
from stepbench.report.findings import LEAD_MAX
from test_report_layout import SIX_FILES
from test_report_stats import rec, run_report
from says import names

POST = Path(__file__).parent / "data" / "post"
PRICES = POST / "prices.toml"


def report(capsys, *args) -> str:
    code = main(["report", *map(str, args)])
    out, err = capsys.readouterr()
    assert code == 0, err
    return out


def test_post_lead_is_fastest_cheapest_and_fits_only_compiled(capsys):
    findings = json.loads(report(capsys, POST, "--prices", PRICES, "--format", "json"))["findings"]
    assert all(set(f) == {"kind", "text", "group", "key"} for f in findings)
    assert sorted(f["kind"] for f in findings if f["key"]) == ["fastest_gpu", "fastest_setup",
                                                               "fit", "tokens_per_dollar"]
    assert sum(not f["key"] for f in findings) > 5                  # the rest keep their place


def test_lead_comes_first_in_every_text_format(capsys):
    fastest = ("Fastest setup (untested against noise): eager+sdpa on NVIDIA GeForce RTX 5090 "
               "(41,870 tokens/s")
    md = report(capsys, POST, "--prices", PRICES, "--format", "markdown")
    assert md.startswith("**Measured:** ")                          # what was measured, then
    assert md.split("\n\n", 2)[2].startswith("## Key findings\n\n- " + fastest)
    assert md.index("## Key findings") < md.index("## Results") < md.index("## What the numbers say")
    assert md.count(fastest) == 2                                   # lead, and its own place
    terminal = report(capsys, POST, "--prices", PRICES)
    assert terminal.startswith("Measured: ")
    assert terminal.split("\n\n", 1)[1].startswith("Key findings\n\n- " + fastest)
    page = report(capsys, POST, "--prices", PRICES, "--format", "html")
    lead = page.split('<section class="lead">')[1].split("</section>")[0]
    assert "<h2>Key findings</h2>" in lead and lead.count("<li>") == 4 and fastest in lead
    assert page.index('<section class="lead">') < page.index("<h2>Results</h2>")


def test_comparison_within_the_noise_is_a_key_finding(capsys, tmp_path):
    rng = np.random.default_rng(3)
    doc, _ = run_report(capsys, tmp_path, [
        rec("eager", steps=list(rng.normal(100.0, 6.0, 40)), first_step_s=0.5),
        rec("compile", steps=list(rng.normal(101.0, 6.0, 40)), first_step_s=30.0)])
    key = [f for f in doc["findings"] if f["key"]]
    assert [f["kind"] for f in key] == ["fastest_setup", "compile_speed"]
    assert all(names(f["text"], "noise") for f in key)
    assert names(key[0]["text"], "equally fast")          # its wording: test_report_wording.py
    # compile_payback says the same again ("not measurably"): not a second key finding.
    assert "not measurably" in next(f["text"] for f in doc["findings"]
                                    if f["kind"] == "compile_payback")


def test_a_clear_difference_leads_only_as_the_fastest_setup(capsys, tmp_path):
    eager = [rec("eager", repeat=i, step_ms=m) for i, m in enumerate([100, 101, 99, 100.5, 99.5])]
    comp = [rec("compile", repeat=i, step_ms=m) for i, m in enumerate([80, 81, 79, 80.5, 79.5])]
    doc, _ = run_report(capsys, tmp_path, eager + comp)
    key = [f for f in doc["findings"] if f["key"]]
    assert [f["kind"] for f in key] == ["fastest_setup"]
    assert names(key[0]["text"], "compile+sdpa on NVIDIA H200", "102,400 tokens/s", "80.0 ms",
                 "25% faster", "eager+sdpa", "100 ms")


def test_one_setup_has_no_lead(capsys, tmp_path):
    run_report(capsys, tmp_path, [rec("eager", step_ms=100)])
    md = report(capsys, tmp_path / "results.jsonl", "--format", "markdown")
    assert "Key findings" not in md                                 # no empty section


def test_lead_names_the_model_and_stays_short(capsys):
    md = report(capsys, *SIX_FILES, "--price", "NVIDIA H200=3.50", "--format", "markdown")
    lead = md.split("## Key findings\n\n")[1].split("\n\n")[0].splitlines()
    assert [line.split(": Fastest setup: ")[0] for line in lead] == [
        "- **llama-468m**", "- **qwen2.5-0.5b**", "- **smollm2-135m**"]
    assert names(lead[0], "compile+sdpa", "NVIDIA H200", "119,199 tokens/s")
    assert len(lead) <= LEAD_MAX


def test_lead_is_capped(capsys, tmp_path):
    # Three models on two GPUs: a fastest GPU and a cheapest one for each, six candidates.
    records = [rec(mode, gpu=gpu, step_ms=ms * scale, model=model)
               for model, scale in (("llama-tiny", 1), ("llama-small", 2), ("llama-468m", 4))
               for gpu, ms in (("NVIDIA H200", 50), ("NVIDIA L40S", 200))
               for mode in ("eager", "compile")]
    doc, _ = run_report(capsys, tmp_path, records, "--price", "NVIDIA H200=3.5",
                        "--price", "NVIDIA L40S=0.5")
    key = [f["kind"] for f in doc["findings"] if f["key"]]
    assert len(key) == LEAD_MAX
    assert sorted(key) == ["fastest_gpu"] * 2 + ["fastest_setup"] * 3


def test_a_factorys_findings_count_its_own_units(capsys, tmp_path):
    # Two hosts' records of a user's factory (units "samples"): its findings count samples, as
    # its table's columns do, never tokens.
    records = [rec(mode, gpu=gpu, step_ms=ms, units="samples", model="nets/mlp.py:make")
               for gpu, ms in (("NVIDIA H200", 50), ("NVIDIA L40S", 200))
               for mode in ("eager", "compile")]
    doc, _ = run_report(capsys, tmp_path, records, "--price", "NVIDIA H200=3.5",
                        "--price", "NVIDIA L40S=0.5")
    texts = {f["kind"]: f["text"] for f in doc["findings"]}
    assert names(texts["fastest_gpu"], "samples/s") and names(texts["fastest_setup"], "samples/s")
    assert names(texts["tokens_per_dollar"], "most samples", "M samples per $")
    assert not [t for t in texts.values() if "tokens" in t]
