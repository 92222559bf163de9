"""What the report says of CPU rows measured on a busy machine, or whose processes disagreed on
peak memory: marks, notes, and comparisons that are listed as untested instead of stated.

The records are the CPU records of stepbench 0.1 (tests/data/v0.1), changed field by field:
their steps, the CPU telemetry a setup's process records and its noise flags."""

import copy
import json
from pathlib import Path

from says import names
from stepbench.cli import main

DATA = Path(__file__).parent / "data"
BASE = {json.loads(line)["setup"]["mode"]: json.loads(line)
        for line in (DATA / "v0.1" / "cpu-results.jsonl").read_text().splitlines()}
BUSY = {"start": {"load_1m": 3.9}, "end": {"load_1m": 4.5}, "cpus": 2, "threads": 2,
        "other_cpu_s": 25.3, "other_cpu_share": 0.75, "contention": 0.75}
# How the report names the machine of these records (machine.cpu, machine.cpu_count).
CPU = "CPU (Intel(R) Xeon(R) Processor, 2 cores)"


def rec(mode: str, repeat: int, steps: list[float], busy: bool = False, peak: float = 0.08) -> dict:
    r = copy.deepcopy(BASE[mode])
    r.update(repeat=repeat, step_times_ms=steps, step_ms=sum(steps) / len(steps),
             peak_memory_gb=peak, peak_memory_source="tensors",
             noise_flags=["busy_cpu"] if busy else [],
             telemetry=BUSY if busy else {**BUSY, "other_cpu_s": 0.1, "other_cpu_share": 0.003,
                                          "contention": 0.003})
    return r


def report(capsys, tmp_path, records, fmt="json"):
    path = tmp_path / "r.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    assert main(["report", str(path), "--format", fmt]) == 0
    out = capsys.readouterr().out
    return json.loads(out) if fmt == "json" else out


def texts(doc, kind) -> str:
    return " ".join(f["text"] for f in doc["findings"] if f["kind"] == kind)


EAGER = [[50.0, 51.0, 49.5, 50.5, 50.2], [50.8, 50.1, 49.9, 50.3, 51.0]]
COMPILED = [[30.0, 30.5, 29.8, 30.2, 30.1], [30.4, 29.9, 30.0, 30.3, 30.6]]


def test_two_setups_measured_on_a_busy_cpu_are_not_compared(capsys, tmp_path):
    records = [rec("eager", i, s, busy=True) for i, s in enumerate(EAGER)] + \
              [rec("compile", i, s, busy=True) for i, s in enumerate(COMPILED)]
    doc = report(capsys, tmp_path, records)
    assert texts(doc, "compile_speed") == "" and texts(doc, "fastest_setup") == ""
    assert texts(doc, "compile_payback") == ""
    assert names(texts(doc, "untested"), "‡", "compile+sdpa", "eager+sdpa", CPU, "30.2",
                 "50.3 ms")
    assert [r["noise_flags"] for r in doc["rows"]] == [["busy_cpu"], ["busy_cpu"]]
    table = report(capsys, tmp_path, records, "markdown")
    assert "| 50.3‡ |" in table and "| 30.2‡ |" in table
    lines = table.splitlines()
    assert any(line.startswith("‡ ") and "other processes" in line for line in lines)
    assert any(names(line, "CPU", "Peak memory", "tensors") for line in lines)


def test_a_busy_cpu_on_one_side_is_not_compared_either(capsys, tmp_path):
    # The eager row's 50.3 ms is the busy CPU's as much as the setup's: no claim rests on it,
    # not even against a quiet row; the fastest setup is named among the quiet rows only.
    records = [rec("eager", i, s, busy=True) for i, s in enumerate(EAGER)] + \
              [rec("compile", i, s) for i, s in enumerate(COMPILED)]
    doc = report(capsys, tmp_path, records)
    assert texts(doc, "compile_speed") == "" and texts(doc, "compile_payback") == ""
    assert names(texts(doc, "untested"), "‡", "eager+sdpa against compile+sdpa", "50.3 vs 30.2",
                 f"eager+sdpa on {CPU} (50.3 ms)")
    assert "eager+sdpa" not in texts(doc, "fastest_setup") + texts(doc, "compile_cost")
    # Quiet on both sides: compared as before.
    quiet = [rec("eager", i, s) for i, s in enumerate(EAGER)] + \
            [rec("compile", i, s) for i, s in enumerate(COMPILED)]
    doc = report(capsys, tmp_path, quiet)
    assert names(texts(doc, "compile_speed"), f"{CPU} 30.2 vs 50.3 ms")
    assert texts(doc, "untested") == ""


def test_processes_that_disagree_on_peak_memory_are_marked_and_not_compared(capsys, tmp_path):
    # The same setup's peak read 0.15 and 0.54 GB in two processes (resident memory on a busy
    # CPU, as stepbench measured it before it counted tensors).
    records = [rec("eager", 0, EAGER[0], peak=0.15), rec("eager", 1, EAGER[1], peak=0.54),
               rec("compile", 0, COMPILED[0], peak=0.30), rec("compile", 1, COMPILED[1], peak=0.40)]
    doc = report(capsys, tmp_path, records)
    assert [r["noise_flags"] for r in doc["rows"]] == [["memory_spread"], ["memory_spread"]]
    assert texts(doc, "compile_memory") == ""
    assert names(texts(doc, "untested"), "Peak memory", "20%", "compile+sdpa", "eager+sdpa",
                 CPU)
    # Step times are compared as ever: the memory's spread says nothing of them.
    assert names(texts(doc, "compile_speed"), CPU, "30.2 vs 50.3 ms")
    table = report(capsys, tmp_path, records, "markdown")
    assert "| 0.54 GB~ |" in table and "| 0.40 GB~ |" in table
    assert any(line.startswith("~ ") and names(line, "Peak memory", "20%")
               for line in table.splitlines())
    # Within 20%: no mark, and compiled against eager is stated.
    records[1]["peak_memory_gb"] = 0.17
    doc = report(capsys, tmp_path, records)
    assert [r["noise_flags"] for r in doc["rows"]] == [[], ["memory_spread"]]
    assert names(texts(doc, "compile_memory"), "peak memory", CPU)


def test_a_memory_change_the_tables_cannot_show_is_no_change(capsys, tmp_path):
    # A tiny model's 84 kB eager and 57 kB compiled: "cut peak memory by 32% (0.00 GB): from
    # 0.00 GB to 0.00 GB" said a change no table can show.
    records = [rec("eager", 0, EAGER[0], peak=0.000084), rec("compile", 0, COMPILED[0],
                                                              peak=0.000057)]
    said = texts(report(capsys, tmp_path, records), "compile_memory")
    assert names(said, "unchanged") and "0.00 GB" not in said and "%" not in said
    records[1]["peak_memory_gb"] = 0.03            # 0.08 GB against 0.03 GB stays a cut
    records[0]["peak_memory_gb"] = 0.08
    assert names(texts(report(capsys, tmp_path, records), "compile_memory"), "cut", "62%")


def test_a_cpu_row_names_the_cpu_model_and_cores_in_every_format(capsys, tmp_path):
    # "cpu" alone named no machine: two CPUs' records were one row. The row names the model and
    # core count the records hold, the same in the table, Markdown, CSV and JSON.
    other = tmp_path / "other.jsonl"
    other.write_text("".join(json.dumps({**r, "machine": {**r["machine"], "cpu": "AMD EPYC",
                                                          "cpu_count": 8}}) + "\n"
                             for r in [rec("eager", i, s) for i, s in enumerate(EAGER)]))
    here = tmp_path / "here.jsonl"
    here.write_text("".join(json.dumps(rec("eager", i, s)) + "\n" for i, s in enumerate(EAGER)))
    outs = {}
    for fmt in ("json", "table", "markdown", "csv"):
        assert main(["report", str(here), str(other), "--format", fmt]) == 0
        outs[fmt] = capsys.readouterr().out
    doc = json.loads(outs.pop("json"))
    assert [(r["gpu"], r["gpu_name"], r["repeats"]) for r in doc["rows"]] == \
        [(CPU, "cpu", 2), ("CPU (AMD EPYC, 8 cores)", "cpu", 2)]
    assert doc["meta"]["gpus"] == [CPU, "CPU (AMD EPYC, 8 cores)"]
    for out in outs.values():
        assert names(out, CPU, "CPU (AMD EPYC, 8 cores)")
        assert not any(line.split("|")[1:2] == [" cpu "] or line.startswith(("cpu,", "  cpu "))
                       for line in out.splitlines())


def test_a_row_adds_host_and_label_to_a_machine_name_without_splicing_a_gpus():
    # A GPU name ending in ")" was cut open like a CPU's "CPU (model, N cores)": "NVIDIA A100
    # (SXM4, gpu-a)". Its host and label now follow it in their own parentheses.
    from types import SimpleNamespace

    from stepbench.record import Machine
    from stepbench.report.rows import machine_labels

    gpu, cpu = Machine(gpu="NVIDIA A100 (SXM4)"), Machine(cpu="AMD EPYC", cpu_count=8)
    records = [SimpleNamespace(machine=m, host=h) for m in (gpu, cpu) for h in ("gpu-a", "gpu-b")]
    label = machine_labels(records, {id(records[0]): "main"})
    assert [label(r) for r in records] == [
        "NVIDIA A100 (SXM4) (gpu-a, main)", "NVIDIA A100 (SXM4) (gpu-b)",
        "CPU (AMD EPYC, 8 cores, gpu-a)", "CPU (AMD EPYC, 8 cores, gpu-b)"]
    assert machine_labels(records[:1])(records[0]) == gpu.name == "NVIDIA A100 (SXM4)"
