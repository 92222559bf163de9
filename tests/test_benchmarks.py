"""Scripts under benchmarks/ that read stored results, run on the committed H200 files."""

import importlib.util
import json
from pathlib import Path

import pytest
from says import names, table_rows

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
MATRIX = RESULTS / "h200-2026-11-30-matrix.jsonl"
SEED = RESULTS / "h200-2026-11-30-seed-script.jsonl"
REPEATS = RESULTS / "h200-2026-11-30-repeats3.jsonl"


def load(name: str):
    """A benchmarks/ script as a module (benchmarks/ is not a package)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def compare_seed():
    return load("compare_seed")


def test_compare_seed_pairs_each_setup_with_the_script(compare_seed):
    ours, theirs = compare_seed.read_jsonl(MATRIX), compare_seed.read_jsonl(SEED)
    rows = compare_seed.pair(ours, theirs)
    assert [r["key"] for r in rows] == [("eager", "sdpa", 4), ("compile", "sdpa", 4),
                                        ("eager", "eager", 4), ("compile", "eager", 4)]
    for row in rows:
        mode, attn, batch = row["key"]
        record = next(r for r in ours if (r["setup"]["mode"], r["setup"]["attn"]) == (mode, attn))
        line = next(s for s in theirs if (s["mode"], s["attn"], s["B"]) == row["key"])
        assert row["stepbench"]["step_ms"] == record["step_ms"]
        assert row["script"]["step_ms"] == line["step_ms"]
        assert row["ratio"] == record["step_ms"] / line["step_ms"]
        assert row["stepbench"]["peak_gb"] == record["peak_memory_gb"]
        assert row["script"]["first_step_s"] == line["first_step_s"]


def test_compare_seed_prints_markdown_table(compare_seed, capsys):
    assert compare_seed.main([str(MATRIX), str(SEED)]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = table_rows(lines[0])[0]
    assert header[0] == "setup" and names(header[1], "stepbench", "ms")
    assert names(header[2], "script", "ms") and header[3].startswith("ratio")
    assert len(lines) == 2 + 4
    eager_sdpa = lines[2].split(" | ")
    assert eager_sdpa[0] == "| eager+sdpa"
    ratio = float(eager_sdpa[3])
    assert ratio == pytest.approx(float(eager_sdpa[1]) / float(eager_sdpa[2]), abs=2e-3)


def test_compare_seed_repeats_use_the_median_and_the_cold_first_step(compare_seed):
    ours = compare_seed.read_jsonl(REPEATS)
    rows = compare_seed.pair(ours, compare_seed.read_jsonl(SEED))
    compiled = next(r for r in rows if r["key"] == ("compile", "sdpa", 4))
    records = [r for r in ours if r["setup"]["name"] == "compile+sdpa"]
    assert compiled["stepbench"]["processes"] == 3
    assert compiled["stepbench"]["step_ms"] == sorted(r["step_ms"] for r in records)[1]
    assert records[0]["compile"]["cache"] == "cold"
    assert compiled["stepbench"]["first_step_s"] == records[0]["first_step_s"]
    assert compare_seed._label(compiled) == "compile+sdpa (3 / 1 processes)"


def test_compare_seed_shows_a_failed_or_missing_side(compare_seed, tmp_path):
    seed = tmp_path / "seed.jsonl"
    seed.write_text(json.dumps({"mode": "eager", "attn": "eager", "B": 4, "oom": True}) + "\n"
                    + json.dumps({"mode": "eager", "attn": "flex_attention", "B": 8,
                                  "first_step_s": 1.0, "step_ms": 100.0, "peak_gb": 20.0}) + "\n")
    rows = compare_seed.pair(compare_seed.read_jsonl(MATRIX), compare_seed.read_jsonl(seed))
    table = compare_seed.markdown(rows)
    assert ["eager+eager", "243.0", "OOM", "-"] in [r[:4] for r in table_rows(table)]
    [flex] = [r for r in table_rows(table) if r[0] == "eager+flex_attention (batch 8)"]
    assert flex[2:4] == ["100.0", "-"] and flex[1] not in ("", "-", "100.0")    # said not run


# ---------------------------------------------------------------- summarize_repeats.py

def test_summarize_repeats_prints_the_files_statistics(capsys):
    from stepbench import stats

    summarize = load("summarize_repeats")
    assert summarize.main([str(REPEATS)]) == 0
    out = capsys.readouterr().out
    records = [json.loads(line) for line in REPEATS.read_text().splitlines()]
    means = [r["step_ms"] for r in records if r["setup"]["name"] == "eager+sdpa"]
    lo, hi = stats.median_ci(means)
    line = next(ln for ln in out.splitlines() if ln.startswith("| eager+sdpa | "))
    assert f"| {sorted(means)[1]:.1f} | {lo:.1f}-{hi:.1f} |" in line
    comp = [r["step_ms"] for r in records if r["setup"]["name"] == "compile+sdpa"]
    assert names(out, "cannot tell", "p = 0.10")        # 3 against 3: the smallest possible p
    pooled = stats.compare([t for r in records if r["setup"]["name"] == "compile+sdpa"
                            for t in r["step_times_ms"]],
                           [t for r in records if r["setup"]["name"] == "eager+sdpa"
                            for t in r["step_times_ms"]])
    [row] = [r for r in table_rows(out) if r[0] == "compile+sdpa vs eager+sdpa"
             and "pooled" in r[1]]
    assert row[2:4] == ["60 vs 60", f"{pooled.ratio:.3f}"]
    assert stats.compare(comp, means).significant is None


# ---------------------------------------------------------------- the example report's wording

@pytest.fixture(scope="module")
def example_report() -> dict:
    """Findings of benchmarks/report: the H200 repeats plus the post's four GPUs."""
    import contextlib
    import io

    from stepbench.cli import main

    post = sorted((ROOT / "tests" / "data" / "post").glob("*.jsonl"))
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        assert main(["report", str(REPEATS), *map(str, post), "--prices",
                     str(ROOT / "benchmarks" / "prices.toml"), "--format", "json"]) == 0
    return json.loads(out.getvalue())


def findings_of(doc: dict, kind: str) -> str:
    return " ".join(f["text"] for f in doc["findings"] if f["kind"] == kind)


def test_two_gpus_read_both_not_all_2(example_report):
    text = " ".join(f["text"] for f in example_report["findings"])
    assert "all 2 " not in text
    assert names(findings_of(example_report, "compile_speed"), "faster", "both GPUs")
    assert names(findings_of(example_report, "compile_memory"), "both GPUs", "30%")
    assert names(findings_of(example_report, "loss_guard"), "all 3 setups", "agreed")


def test_warm_compile_names_the_gpu_that_had_a_warm_cache(example_report):
    warm = [s for s in findings_of(example_report, "compile_cost").split(". ")
            if "5.7-6.5 s" in s]
    assert len(warm) == 1 and names(warm[0], "warm", "NVIDIA H200"), warm


def test_untested_comparisons_are_said_to_lack_data_not_spread(example_report):
    testing = findings_of(example_report, "testing")
    assert names(testing, "10 of 14 comparisons", "too few")
    assert "too little spread" not in testing


def test_example_report_markdown_is_what_the_code_writes_now(capsys):
    """benchmarks/report/report.md, by benchmarks/README.md's command: regenerate both (and
    report.html, the PNGs) after a deliberate change to the report."""
    from stepbench.cli import main

    post = sorted((ROOT / "tests" / "data" / "post").glob("*.jsonl"))
    assert main(["report", str(REPEATS), *map(str, post), "--prices",
                 str(ROOT / "benchmarks" / "prices.toml"), "--energy-price", "0.15",
                 "--format", "markdown"]) == 0
    assert capsys.readouterr().out == (ROOT / "benchmarks" / "report" / "report.md").read_text()


@pytest.mark.parametrize("name", ["468m", "135m"])
def test_the_tunes_printed_in_the_readmes_are_what_their_json_renders_now(name, capsys):
    """docs/tune.md's example and benchmarks/README.md section g are tune_table.py's output
    for the stored H200 tunes: rerun it after a deliberate change to the tune's output."""
    tune_table = load("tune_table")
    path = str(RESULTS / f"h200-2026-12-01-tune-{name}.json")
    assert tune_table.main([path, "--format", "markdown"]) == 0
    markdown = capsys.readouterr().out
    assert markdown.startswith("**Tried**\n\n| Stage |")
    section_g = (ROOT / "benchmarks" / "README.md").read_text()
    assert markdown.replace("**Tried**\n\n", "").rstrip("\n") in section_g
    assert tune_table.main([path]) == 0
    table = capsys.readouterr().out
    assert any(names(line, "Winner", "compile+flex_attention batch 16 bf16")
               for line in table.splitlines())
    if name == "468m":
        assert "```\n" + table + "```" in (ROOT / "docs" / "tune.md").read_text()
        assert any(names(line, "float8", "compile+flex_attention", "step 25", "1.567")
                   for line in table.splitlines())


def test_the_max_batch_findings_quoted_in_section_g_are_what_the_report_says_now():
    from stepbench.report.document import report_document
    from stepbench.report.render import render

    markdown = render(report_document([str(RESULTS / "h200-2026-12-01-max-batch.jsonl")]),
                      "markdown")
    quoted = [line for line in (ROOT / "benchmarks" / "README.md").read_text().splitlines()
              if "torch.compile lets batch 4 grow to" in line]
    assert len(quoted) == 2 and all(line in markdown for line in quoted)
    assert "stopped before its full measurement" not in markdown


def test_report_scale_records_are_a_report_of_16_setups_a_workload(tmp_path, capsys):
    """benchmarks/report_scale.py's synthetic records read as the records of a run: 16 rows per
    workload, eager attention out of memory in eager mode at 16 x 2048, findings per workload,
    compiled setups faster outside the noise where they were made 20% faster."""
    from stepbench.cli import main

    scale = load("report_scale")
    path = tmp_path / "synthetic.jsonl"
    assert scale.write(path, 10) == 10 * 16 * 2
    assert main(["report", str(path), "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert len(doc["rows"]) == 160
    oom = {(r["batch"], r["seq"], r["setup"]) for r in doc["rows"] if r["status"] == "oom"}
    assert oom == {(16, 2048, name) for name in ("eager+eager", "eager+eager+liger",
                                                  "eager+eager+foreach",
                                                  "eager+eager+liger+foreach")}
    assert len({f["group"] for f in doc["findings"]}) == 10
    faster = [f["text"] for f in doc["findings"] if f["kind"] == "compile_speed"
              and f["group"] == "synth-00, batch 4 x 2048, bf16"]
    assert faster and all(names(t, "torch.compile", "faster") for t in faster)


def test_report_scale_tells_a_changed_finding_from_the_same_report(tmp_path, capsys):
    """`report_scale.py --baseline` compares two versions' JSON reports of one file: the same
    report is the same to the byte; one finding's changed wording is a difference in the
    findings (the benchmark then exits 1)."""
    from stepbench.cli import main

    scale = load("report_scale")
    scale.write(tmp_path / "synthetic.jsonl", 2)
    ours, theirs = tmp_path / "report.json", tmp_path / "baseline.json"
    assert main(["report", str(tmp_path / "synthetic.jsonl"), "--format", "json",
                 "--out", str(ours)]) == 0
    theirs.write_bytes(ours.read_bytes())
    same = scale.same_report(ours, theirs)
    assert same["findings_equal"] and same["json_equal"] and same["bytes_equal"]
    assert same["findings"] > 0 and same["keys_differ"] == []
    changed = json.loads(theirs.read_text())
    changed["findings"][0]["text"] += " (reworded)"
    theirs.write_text(json.dumps(changed, indent=2) + "\n")
    same = scale.same_report(ours, theirs)
    assert not same["findings_equal"] and not same["json_equal"]
    assert same["keys_differ"] == ["findings"]


def test_fsdp2_table_puts_torchtitans_recipe_beside_stepbenchs_jobs_and_their_baselines():
    # A CPU run of gpu_fsdp2_x2.sh (llama-tiny, gloo, eager, torchtitan 0.3.0's wheel carried),
    # and the H200 x2 run of section e.
    fsdp2_table = load("fsdp2_table")
    data = ROOT / "tests" / "data"
    rows = fsdp2_table.rows([data / "cpu-fsdp2-x2.jsonl", data / "cpu-torchtitan-x2.jsonl"])
    (plain,) = [r for r in rows if not r["setup"].distributed]
    (titan,) = [r for r in rows if r["recipe"] == "torchtitan"]
    assert titan["source"] == "torchtitan 0.3.0" and titan["setup"].dtype == "mixed-bf16"
    for row in rows:
        assert row["ok"]
        if row["setup"].distributed:
            # Recorded at run time against the one-process record, by stepbench and the script alike.
            assert row["efficiency"] == pytest.approx(row["per_gpu"] / plain["per_gpu"])
    text = fsdp2_table.table(rows)
    assert "torchtitan (torchtitan 0.3.0)" in text
    # the torchtitan recipe's wrapping, in one row
    assert any(names(line, "per layer + root", "reshard", "explicit prefetch", "bf16 params")
               for line in text.splitlines())
    h200 = fsdp2_table.rows([RESULTS / "h200x2-2026-12-01-one-gpu-ddp-fsdp2.jsonl"])
    efficiency = {(r["setup"].parallel, r["setup"].mode): r["efficiency"] for r in h200
                  if r["setup"].attn == "sdpa" and r["setup"].distributed}
    assert efficiency[("fsdp2", "compile")] == pytest.approx(0.469, abs=5e-4)
    assert efficiency[("fsdp2", "eager")] == pytest.approx(0.506, abs=5e-4)
    assert "46.9%" in fsdp2_table.table(h200)


def test_section_hs_third_host_tables_are_what_the_scripts_print_from_the_stored_records(capsys):
    probe_walls, compare_starts = load("probe_walls"), load("compare_starts")
    ratios = {}
    for model in ("468m", "135m"):
        rows = probe_walls.rows(RESULTS / f"h200-2026-12-02-start-probes-{model}.jsonl")
        cells = [line.split(" | ") for line in rows[4:]]
        ratios[model] = [float(c[7]) for c in cells]
        assert [c[3] for c in cells][-2:] == ["final", "final"]
    assert ratios["468m"][0] == 1.19 and ratios["135m"][0] == 1.23      # the first probes
    assert max(ratios["468m"] + ratios["135m"]) == 1.23                # none above the goal's 1.5
    modes = [str(RESULTS / f"h200-2026-12-02-start-modes-{name}.jsonl")
             for name in ("fresh", "server", "seed-script")]
    assert compare_starts.main(["--processes", *modes]) == 0
    text = capsys.readouterr().out
    assert "| server | 4 | 89.51 | 89.33 | 91.31 | 0.999 |" in text
    assert "| post's script | 4 | 89.86 | 89.23 | 91.27 | 1.003 |" in text
    readme = (ROOT / "benchmarks" / "README.md").read_text()
    assert "| **median** | 89.58 | 89.51 (**0.999** of fresh) | 89.86 (**1.003**) |" in readme


def test_factory_overhead_table_pairs_each_setup_of_the_two_paths():
    # Records as gpu_factory_overhead.sh writes them: the HF path and the factory (whose attn is
    # one of its own parameters), one failed process left out of the means.
    table = load("factory_overhead_table")

    def record(model, wall, flops, status="ok", params=None):
        setup = {"name": "eager+sdpa", "model": model, "mode": "eager", "attn": "sdpa"}
        if params:
            setup["params"] = params
        phases = {"imports": 1.0, "build": 2.0, "first_step": 3.0, "warmup": 1.0, "timed": 2.0,
                  "flops": flops}
        return {"setup": setup, "status": status, "wall_s": wall, "phases": phases, "step_ms": 90.0}

    fac = "benchmarks/configs/llama_factory.py:make"
    records = [record("llama-468m", 10.0, 0.1), record("llama-468m", 12.0, 0.1),
               record(fac, 11.5, 1.6, params="attn=sdpa"),
               record(fac, 13.5, 1.6, params="attn=sdpa"),
               record(fac, 40.0, 0.0, status="timeout", params="attn=sdpa")]
    assert table.overhead(records[0]) == pytest.approx(4.0)
    summary = table.tables(records).split("\n\n")[1].splitlines()[2]
    cells = [c.strip() for c in summary.strip("|").split("|")]
    # Means of the ok processes: HF 5.0 s, factory 6.5 s; the difference above the goal of 1 s.
    assert cells[:5] == ["eager+sdpa", "5.00 (2)", "6.50 (2)", "+1.50", "no"]
    assert cells[5].startswith("flops +1.50")
