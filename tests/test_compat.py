"""Results files written by stepbench 0.1 keep working: they resume, and they report as before.

tests/data/v0.1/cpu-results.jsonl was written by stepbench 0.1 (`run --device cpu --seq 64
--warmup 1 --steps 3 --attn sdpa`); report-0.1.json is what 0.1's `report --format json` made of
it. The records of tests/data/h200-matrix.jsonl and tests/data/post are 0.1's too.
"""

import pytest
import dataclasses
import json
import shutil
from pathlib import Path

from stepbench.cli import main
from stepbench.record import Record, ResultsFile

from conftest import run_cli
from says import lines_naming, names, process_lines

DATA = Path(__file__).parent / "data"
V01 = DATA / "v0.1"


@pytest.mark.slow
def test_a_0_1_results_file_resumes_without_running_anything(tmp_path):
    out = tmp_path / "results.jsonl"
    shutil.copy(V01 / "cpu-results.jsonl", out)
    before = out.read_bytes()
    # One process per setup, as 0.1 ran them (the default would add a second).
    proc = run_cli("run", "--device", "cpu", "--seq", "64", "--warmup", "1", "--steps", "3",
                   "--attn", "sdpa", "--repeats", "1", "--out", out, "--format", "json",
                   timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert len(lines_naming(proc.stderr, "(ok)", "skipped")) == 2
    assert all("skipped" in line for line in process_lines(proc.stderr))     # none started
    assert out.read_bytes() == before
    assert [r["setup"]["name"] for r in json.loads(proc.stdout)] == ["eager+sdpa", "compile+sdpa"]


# 0.1's compiled-vs-eager "parity" (last losses) became the loss guard's verdict against the
# eager twin: its row fields and its finding are the guard's now (loss_guard_*, "loss_guard").
# 0.1 named a CPU row's machine "cpu"; now by the record's CPU model and cores.
CPU = "CPU (Intel(R) Xeon(R) Processor, 2 cores)"
PARITY_FIELDS = {"parity_rel_diff", "parity_tolerance", "parity_ok", "gpu"}


def test_a_0_1_results_file_reports_the_same_rows_and_findings(capsys):
    assert main(["report", str(V01 / "cpu-results.jsonl"), "--format", "json"]) == 0
    new = json.loads(capsys.readouterr().out)
    old = json.loads((V01 / "report-0.1.json").read_text())
    for old_row, new_row in zip(old["rows"], new["rows"], strict=True):
        assert (old_row["gpu"], new_row["gpu"]) == ("cpu", CPU)
        assert {k: new_row[k] for k in old_row if k not in PARITY_FIELDS} == \
            {k: v for k, v in old_row.items() if k not in PARITY_FIELDS}
        if old_row["parity_ok"] is not None:     # the compiled row: the guard agrees with 0.1
            assert old_row["parity_ok"] and new_row["loss_guard"] == "ok"
            assert new_row["loss_guard_reference"] == "eager+sdpa"
            assert new_row["loss_guard_tolerance"] == old_row["parity_tolerance"]
    # Every finding 0.1 wrote, in its order; new rules (the fastest setup) may add their own.
    # The memory finding now gives the change and the GB as the table does (two decimals below
    # 1 GB): 0.1's "raised peak memory on cpu (0.2 to 0.3 GB)".
    new_texts = iter(f["text"].replace(CPU, "cpu") for f in new["findings"])
    assert all(any(f["text"] == t for t in new_texts) for f in old["findings"]
               if f["kind"] not in ("parity", "compile_memory", "compile_speed"))
    # 0.1's "24% faster" was the drop in step time; a difference is now the slower's step time
    # over the faster's, either way round (findings.change).
    assert names(" ".join(f["text"] for f in new["findings"] if f["kind"] == "compile_speed"),
                 "23.6 vs 30.9 ms", "31% faster")
    assert names(" ".join(f["text"] for f in new["findings"] if f["kind"] == "compile_memory"),
                 "raised", CPU, "44%", "0.22", "0.32 GB")
    [parity] = [f for f in old["findings"] if f["kind"] == "parity"]
    [guard] = [f for f in new["findings"] if f["kind"] == "loss_guard"]
    assert "within tolerance" in parity["text"] and "within tolerance" in guard["text"]
    kinds = {f["kind"] for f in new["findings"]} - {f["kind"] for f in old["findings"]}
    assert kinds <= {"fastest_setup", "loss_guard"}


def test_0_1_records_read_and_write_back_unchanged():
    # The typed Record holds every field 0.1 wrote, under the same names, with the same values;
    # fields added since are left out while unused (setup.LATER_FIELDS, record.LATER_FIELDS).
    for path in [V01 / "cpu-results.jsonl", DATA / "h200-matrix.jsonl", *sorted((DATA / "post").glob("*.jsonl"))]:
        raw = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        assert [r.to_dict() for r in ResultsFile(path).read()] == raw, path


def test_a_record_without_later_fields_reads_as_their_defaults():
    raw = json.loads((V01 / "cpu-results.jsonl").read_text().splitlines()[0])
    del raw["setup"]["memory_limit_gb"], raw["setup"]["seed"], raw["energy"], raw["machine"]["cpu"]
    record = Record.from_dict(raw)
    assert record.setup.memory_limit_gb is None and record.setup.seed == 0
    assert record.energy is None and record.machine.cpu is None
    # ... and it is the same setup as the full record, for resume and for the report.
    full = ResultsFile(V01 / "cpu-results.jsonl").read()[0]
    assert record.setup.key() == full.setup.key() and record.resume_key() == full.resume_key()


def test_weights_drawn_on_the_gpu_are_another_setup_than_0_1s():
    # 0.1 drew every model's weights on the CPU; `run` now draws them on the device, which gives
    # other weights for the same seed. A GPU record of 0.1 reads as init "cpu", so its losses are
    # never taken for those of a new run (`--init cpu` measures the 0.1 setup again).
    old = ResultsFile(DATA / "h200-matrix.jsonl").read()[0]
    assert old.setup.device == "cuda" and old.setup.init == "cpu"
    new = dataclasses.replace(old.setup, init="device")
    assert new.key() != old.setup.key() and new.eager_twin().init == "device"
    # On the CPU the device is the CPU: one setup, whichever way it is asked for.
    cpu = ResultsFile(V01 / "cpu-results.jsonl").read()[0].setup
    assert dataclasses.replace(cpu, init="device").key() == cpu.key()


@pytest.mark.slow
def test_a_run_on_a_terminal_shows_its_live_progress(tmp_path):
    # On a terminal the runner's display is rich's Live block; a resumed 0.1 file is the quickest
    # real run that makes one (it once crashed as it was made: AttributeError).
    from conftest import on_a_terminal

    out = tmp_path / "r.jsonl"
    shutil.copy(V01 / "cpu-results.jsonl", out)
    code, seen, stdout = on_a_terminal(["run", "--device", "cpu", "--seq", "64", "--warmup", "1",
                                        "--steps", "3", "--attn", "sdpa", "--repeats", "1",
                                        "--out", out])
    assert code == 0, seen.decode(errors="replace")[-2000:]
    assert b"Traceback" not in seen and b"skipped" in seen
    assert b"eager+sdpa" in stdout
