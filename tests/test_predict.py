"""stepbench predict: a measured H200 step scaled class by class to other GPUs, its fit, tokens
per dollar, its honest limits and its bad inputs."""

import ast
import json
from pathlib import Path

import pytest

from stepbench.cli import main
from stepbench.predict import gpus, model
from stepbench.predict.source import Measured

from says import names

DATA = Path(__file__).parent / "data"
RESULTS = str(DATA / "predict" / "h200-profile-matrix.jsonl")
PRICES = str(Path(__file__).parent.parent / "benchmarks" / "prices.toml")
SRC = Path(__file__).resolve().parent.parent / "src" / "stepbench"


def step(classes, step_ms, busy_ms=None, **kw) -> Measured:
    values = dict(setup="s", model="m", batch=4, seq=2048, dtype="bf16", gpu="NVIDIA H200",
                  torch="2.11.0", status="ok", step_ms=step_ms, tokens_per_step=8192.0,
                  peak_memory_gb=10.0, peak_reserved_gb=10.5, classes_ms=classes,
                  busy_ms=sum(classes.values()) if busy_ms is None else busy_ms,
                  kernel_floor_ms=None, class_kernels=None, repeats=1)
    values.update(kw)
    return Measured(**values)


def run_json(capsys, *args) -> dict:
    assert main(["predict", RESULTS, *args, "--format", "json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_each_class_scales_by_what_bounds_it():
    h200, pcie = gpus.lookup("H200"), gpus.lookup("H100 PCIe")
    matmul = model.predict(step({"matmul": 10.0}, 10.0), h200, pcie)
    assert matmul.step_ms == pytest.approx(10.0 * 989.4 / 756.5)
    memory = model.predict(step({"elementwise": 10.0}, 10.0), h200, pcie)
    assert memory.step_ms == pytest.approx(10.0 * 4800 / 2000)
    assert memory.step_ms_low < memory.step_ms < memory.step_ms_high
    # A kernel's latency floor, measured on the source, is not scaled.
    floored = model.predict(step({"elementwise": 10.0}, 10.0, kernel_floor_ms=0.001,
                                 class_kernels={"elementwise": 1000}), h200, pcie)
    assert floored.step_ms == pytest.approx(1.0 + 9.0 * 4800 / 2000)


def test_tensor_classes_scale_by_measured_matmul_rates_where_the_target_has_one():
    h200, rtx = gpus.lookup("H200"), gpus.lookup("RTX 5090")
    published = rtx.measured["bf16_matmul_tflops"]
    assert "https://" in rtx.measured_sources["bf16_matmul_tflops"]
    classes = {"matmul": 10.0, "attention": 4.0, "elementwise": 6.0}
    rated = model.predict(step(classes, 20.0, matmul_tflops_measured=800.0), h200, rtx)
    assert rated.classes_ms["matmul"] == pytest.approx(10.0 * 800.0 / published)
    assert rated.classes_ms["attention"] == pytest.approx(4.0 * 800.0 / published)
    # Memory-bound classes are untouched by it.
    plain = model.predict(step(classes, 20.0), h200, rtx)
    assert rated.classes_ms["elementwise"] == plain.classes_ms["elementwise"]
    # Without the source's own measured rate, or without a published one for the target, or
    # for fp8 products: the datasheet peaks.
    assert plain.classes_ms["matmul"] == pytest.approx(10.0 * 989.4 / 209.5)
    unmeasured = gpus.Gpu("X", specs=dict(gpus.lookup("H100 PCIe").specs))
    pcie = model.predict(step(classes, 20.0, matmul_tflops_measured=800.0), h200, unmeasured)
    assert pcie.classes_ms["matmul"] == pytest.approx(10.0 * 989.4 / 756.5)
    fp8 = model.predict(step({"matmul": 10.0}, 10.0, dtype="float8",
                             matmul_tflops_measured=800.0), h200, rtx)
    assert fp8.classes_ms["matmul"] == pytest.approx(10.0 * 1978.9 / 419.0)
    # A step measured on the card itself keeps its time there.
    itself = model.predict(step(classes, 20.0, gpu=rtx.name, matmul_tflops_measured=230.0),
                           rtx, rtx)
    assert itself.classes_ms["matmul"] == pytest.approx(10.0)


def test_notes_name_the_measured_rates_and_what_compiled_code_cannot_tell(capsys):
    out = run_json(capsys, "--gpu", "RTX 5090,L40S")
    rate = [n for n in out["notes"] if "measured bf16 matmul rates" in n]
    # One line per target: the source's rate, the target's, the citation.
    assert len(rate) == 2
    assert names(rate[0], "NVIDIA GeForce RTX 5090", "793.2", "239.1", "zzc0721")
    assert names(rate[1], "NVIDIA L40S", "793.2", "zzc0721")
    compiled = [n for n in out["notes"] if n.startswith("Compiled setups")]
    assert len(compiled) == 1 and names(compiled[0], "2.11.0", "H100 PCIe", "2.8")


def test_host_bound_time_scales_by_nothing():
    h200, b200 = gpus.lookup("H200"), gpus.lookup("B200")
    # The GPU busy 50 of 100 ms: the host needs 100 ms a step, on a faster GPU too.
    bound = model.predict(step({"matmul": 50.0}, 100.0), h200, b200)
    assert bound.step_ms == pytest.approx(100.0) and bound.host_ms == 100.0
    # On a slower GPU the kernels take longer than the host: they set the step.
    slow = model.predict(step({"matmul": 50.0}, 100.0), h200, gpus.lookup("L4"))
    assert slow.step_ms == pytest.approx(50.0 * 989.4 / 121.0)
    assert slow.step_ms_high > slow.step_ms * 1.15
    # Busy 94.6% of the step (the H200's compile+sdpa, idle 3.7 of 67.7 ms, as plain profiled
    # steps run): the kernels, not the host, set it, so a faster GPU predicts a faster step, not
    # the source's whole 67.7 ms with a zero-width interval.
    kept_up = model.predict(step({"matmul": 64.07}, 67.7), h200, b200)
    assert kept_up.host_ms == 0.0 and kept_up.step_ms < 50.0
    assert kept_up.step_ms_low < kept_up.step_ms < kept_up.step_ms_high


def test_fp8_on_a_gpu_without_fp8_has_no_basis():
    p = model.predict(step({"matmul": 10.0}, 10.0, dtype="float8"), gpus.lookup("H200"),
                      gpus.lookup("RTX A6000"))
    assert p.step_ms is None and p.tokens_per_s is None
    # the kernel class, the GPU, and the table's missing figure (the note's golden: below)
    assert names(p.no_basis, "matmul", "NVIDIA RTX A6000", "fp8_tflops")
    # Pure fp32 runs on CUDA cores, a figure the table does not hold.
    fp32 = model.predict(step({"matmul": 10.0}, 10.0, dtype="fp32"), gpus.lookup("H200"),
                         gpus.lookup("L40S"))
    assert names(fp32.no_basis, "matmul", "fp32_tflops", "NVIDIA H200", "NVIDIA L40S")
    # Attention under float8 linear layers still computes in bf16: it has a basis.
    attn = model.predict(step({"attention": 10.0}, 10.0, dtype="float8"), gpus.lookup("H200"),
                         gpus.lookup("RTX A6000"))
    assert attn.step_ms == pytest.approx(10.0 * 989.4 / 154.8)


def test_json_rows_carry_the_prediction_and_say_it_is_one(capsys):
    out = run_json(capsys, "--gpu", "L40S,H100 PCIe,RTX 5090", "--price-list", PRICES)
    rows = {(r["gpu"], r["setup"]): r for r in out["rows"]}
    assert len(rows) == 12 and out["predicted"] is True
    for r in rows.values():
        assert r["predicted"] is True and r["source_gpu"] == "NVIDIA H200"
        assert r["step_ms_low"] <= r["step_ms"] <= r["step_ms_high"]
        assert {"gpu", "setup", "step_ms", "step_ms_low", "step_ms_high", "fits",
                "tokens_per_s", "tokens_per_dollar"} <= set(r)
    # eager attention's 56 GB step fits an 80 GB card only; compile+eager's 39 GB not 32 GB.
    assert rows[("NVIDIA L40S", "eager+eager")]["fits"] is False
    assert rows[("NVIDIA H100 PCIe", "eager+eager")]["fits"] is True
    assert rows[("NVIDIA GeForce RTX 5090", "compile+eager")]["fits"] is False
    assert rows[("NVIDIA GeForce RTX 5090", "compile+eager")]["tokens_per_s"] is None
    r = rows[("NVIDIA L40S", "compile+sdpa")]
    assert r["tokens_per_dollar"] == pytest.approx(r["tokens_per_s"] * 3600 / 0.54)
    assert any("torch 2.11.0" in n and "torch 2.8" in n for n in out["notes"])


@pytest.mark.parametrize("edit", [
    lambda record: record["profile"].update(busy_s=None),
    lambda record: record["profile"]["classes_ms"].update(matmul=None),
    # every record's: the tokens of a step are not known, the step time is still predicted
    lambda record: record.update(tokens_per_s=None),
])
def test_a_null_inside_a_profile_is_not_measured_not_a_traceback(tmp_path, capsys, edit):
    lines = Path(RESULTS).read_text().splitlines()
    records = [json.loads(line) for line in lines]
    for r in records:
        edit(r)
    path = tmp_path / "r.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    code = main(["predict", str(path), "--gpu", "L40S", "--format", "json"])
    out, err = capsys.readouterr()
    assert code == 0 and "Traceback" not in err
    assert json.loads(out)["rows"]


def test_a_gpu_without_a_price_leaves_tokens_per_dollar_out_said_once(capsys):
    out = run_json(capsys, "--gpu", "L40S,B200", "--price-list", PRICES)
    b200 = [r for r in out["rows"] if r["gpu"] == "NVIDIA B200"]
    assert b200 and all(r["tokens_per_dollar"] is None for r in b200)
    said = [n for n in out["notes"] if "price" in n.lower()]
    assert len(said) == 1 and names(said[0], "NVIDIA B200", "tokens per dollar")
    # The golden of the missing-price note, word for word.
    assert said[0] == "No price for NVIDIA B200: tokens per dollar left out."


def test_every_format_renders_and_the_table_says_predicted(capsys):
    for fmt in ("table", "markdown", "csv", "html"):
        assert main(["predict", RESULTS, "--gpu", "L40S", "--format", fmt]) == 0
        text = capsys.readouterr().out
        assert "predicted" in text.lower() and "NVIDIA L40S" in text


def test_an_unknown_gpu_is_one_line_with_the_closest_names(capsys):
    assert main(["predict", RESULTS, "--gpu", "L40S,H100 PCI"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    # The family's golden (predict's unknown GPU), word for word.
    assert err == ["stepbench predict: error: unknown GPU 'H100 PCI'; closest: NVIDIA H100 PCIe, "
                   "NVIDIA H100 80GB HBM3 (the table: stepbench/predict/gpus.toml)"]


def test_results_without_a_profile_say_how_to_get_one(capsys):
    assert main(["predict", str(DATA / "h200-matrix.jsonl"), "--gpu", "L40S"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and names(err[0], "h200-matrix.jsonl", "--profile")


def test_cpu_records_say_the_profile_must_come_from_a_gpu(capsys):
    # `run --profile` works on a CPU too; the fix the line names is then a GPU, not --profile.
    assert main(["predict", str(DATA / "cpu-factory-mlp.jsonl"), "--gpu", "L40S"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and names(err[0], "cpu-factory-mlp.jsonl", "CPU", "--profile DIR` on a GPU")


def test_records_without_classes_are_split_from_their_stored_traces(tmp_path):
    from stepbench.predict.source import measured

    records = [json.loads(line) for line in Path(RESULTS).read_text().splitlines()][:1]
    traces = Path(__file__).parent.parent / Path(records[0]["profile"]["trace"]).parent
    for r in records:
        for key in list(r["profile"]):
            if key not in ("trace", "table", "step_s", "device_s"):
                del r["profile"][key]
        r["profile"]["trace"] = "/root/out/traces/" + Path(r["profile"]["trace"]).name
    path = tmp_path / "old.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    [m] = measured([str(path)], [str(traces)])
    assert m.classes_ms["matmul"] > 20 and m.busy_ms > 80


def imports_torch(path: Path) -> bool:
    from test_imports import tree

    for node in ast.walk(tree(path)):
        names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                 [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
        if any(n == "torch" or n.startswith("torch.") for n in names):
            return True
    return False


def test_the_predict_path_never_imports_torch():
    from test_imports import graph

    edges = graph()
    seen, todo = set(), ["stepbench.cli.predict", "stepbench.predict.document"]
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo += edges.get(name, ())
    paths = {name: SRC.parent / (name.replace(".", "/") + ".py") for name in seen}
    paths = {n: p if p.exists() else p.with_suffix("") / "__init__.py" for n, p in paths.items()}
    assert "stepbench.measure.kernels" in seen
    assert [n for n, p in paths.items() if imports_torch(p)] == []


def test_a_setup_without_basis_on_a_gpu_is_not_predicted_and_said_so(tmp_path, capsys):
    records = [json.loads(line) for line in Path(RESULTS).read_text().splitlines()][:1]
    records[0]["setup"]["dtype"] = "float8"
    path = tmp_path / "fp8.jsonl"
    path.write_text(json.dumps(records[0]) + "\n")
    assert main(["predict", str(path), "--gpu", "RTX A6000,L40S", "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    a6000, l40s = out["rows"]
    assert a6000["step_ms"] is None and a6000["no_basis"] and l40s["step_ms"] > 0
    # The golden of the no-basis note, word for word.
    assert "Not predicted: matmul on NVIDIA RTX A6000 has no basis: the GPU table has no " \
           "fp8_tflops for NVIDIA RTX A6000." in out["notes"]
