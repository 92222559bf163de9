"""`stepbench peak`: the command's output, its JSON, and its errors."""

from __future__ import annotations

import json

import pytest
import torch

from stepbench import cli
from stepbench.report.document import peak_document
from stepbench.report.render import render
from conftest import run_cli
from says import error_line, names


def run_peak(argv, capsys) -> tuple[int, str, str]:
    """Run `stepbench ARGV` through cli.main's real UserError handling."""
    code = cli.main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def render_peak(result: dict) -> str:
    return render(peak_document(result), "table")


def test_json_on_cpu_gives_one_object_with_a_positive_rate(capsys):
    code, out, err = run_peak(["peak", "--device", "cpu", "--size", "256", "--format", "json"],
                              capsys)
    assert code == 0, err
    result = json.loads(out)                 # the whole of stdout is one JSON object
    assert result["device"] == "cpu" and result["gpu"] == "cpu"
    assert result["dtype"] == "bf16" and result["size"] == 256 and result["repeats"] == 5
    assert result["sustained_s"] == 0
    assert result["measured_tflops"] > 0
    assert result["datasheet_tflops"] is None and result["fraction_of_datasheet"] is None
    assert isinstance(result["cpu"], str) and result["cpu"]


def test_table_on_cpu(capsys):
    code, out, _ = run_peak(["peak", "--device", "cpu", "--dtype", "fp32", "--size", "128",
                             "--repeats", "2"], capsys)
    assert code == 0
    header, rule, row = out.splitlines()[1:4]
    assert header.split() == ["device", "dtype", "size", "measured", "TFLOP/s", "datasheet",
                              "TFLOP/s", "of", "datasheet"]
    assert row.strip().startswith("cpu (")
    cells = row.split()[-5:]
    assert cells[:2] == ["fp32", "128"] and float(cells[2]) > 0 and cells[3:] == ["-", "-"]
    assert names(out, "median of 2", "128 x 128 x 128", "burst")


def test_render_with_a_datasheet_peak():
    text = render_peak({"device": "cuda", "gpu": "NVIDIA H200", "cpu": None, "dtype": "bf16",
                             "size": 8192, "repeats": 20, "sustained_s": 5.0,
                             "measured_tflops": 790.14,
                             "datasheet_tflops": 989.4, "fraction_of_datasheet": 790.14 / 989.4})
    row = text.splitlines()[3].split()
    assert row == ["NVIDIA", "H200", "bf16", "8192", "790", "989.4", "80%"]
    assert names(text, "5 s", "sustained")


def test_a_slow_cpu_rate_keeps_its_significant_digits():
    # A busy 2-core CPU measured 0.0004 TFLOP/s: three decimals printed it as 0.000.
    text = render_peak({"device": "cpu", "gpu": "cpu", "cpu": "Xeon", "dtype": "fp32", "size": 128,
                        "repeats": 2, "sustained_s": 0, "measured_tflops": 0.000412,
                        "datasheet_tflops": None, "fraction_of_datasheet": None})
    assert text.splitlines()[3].split()[4] == "0.000412"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on a machine without CUDA")
def test_cuda_without_cuda_is_a_one_line_user_error(capsys):
    code, out, err = run_peak(["peak", "--device", "cuda"], capsys)
    assert code == 2
    assert out == ""
    # The golden of peak's --device cuda refusal, word for word.
    assert err == ("stepbench peak: error: --device cuda was asked for, but torch sees no CUDA "
                   "GPU here; use --device cpu (or install a CUDA build of torch)\n")


@pytest.mark.parametrize("argv, tokens", [
    (["--device", "cpu", "--size", "0"], ("--size", "0")),
    (["--device", "cpu", "--repeats", "-1"], ("--repeats", "-1")),
    (["--device", "cpu", "--dtype", "tf32"], ("tf32", "--dtype fp32", "cpu")),
    (["--device", "cpu", "--sustained", "2"], ("--sustained", "cuda", "2", "cpu")),
    (["--device", "cpu", "--sustained", "nan"], ("--sustained", "nan")),
    # Matrices larger than any address space: the allocation's failure, not its traceback.
    (["--device", "cpu", "--size", str(10**8)], ("--size 100000000", "smaller --size")),
    (["--device", "cpu", "--size", str(10**20)], ("--size", str(10**20))),
    (["--device", "cpu", "--repeats", str(10**20)], ("--repeats", str(10**20))),
])
def test_bad_arguments_are_user_errors(argv, tokens, capsys):
    code, out, err = run_peak(["peak", *argv], capsys)
    assert code == 2 and out == ""
    assert error_line(err, "peak") and err.count("\n") == 1
    assert names(err, *tokens), err


def test_unknown_choice_is_rejected_by_argparse(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.build_parser().parse_args(["peak", "--dtype", "fp8"])
    assert exc.value.code == 2
    assert names(capsys.readouterr().err, "--dtype", "'fp8'")


@pytest.mark.slow
def test_real_cli_in_a_subprocess():
    proc = run_cli("peak", "--device", "cpu", "--size", "128", "--repeats", "1", "--format", "json",
                   timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["measured_tflops"] > 0


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on a machine without CUDA")
def test_real_cli_cuda_error_in_a_subprocess():
    proc = run_cli("peak", "--device", "cuda", timeout=120)
    assert proc.returncode == 2
    assert proc.stdout == ""
    [line] = proc.stderr.strip().splitlines()
    assert error_line(line, "peak") and names(line, "--device cuda", "--device cpu")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_json_has_the_datasheet_peak_of_a_known_gpu(capsys):
    code, out, err = run_peak(["peak", "--device", "cuda", "--format", "json"], capsys)
    assert code == 0, err
    result = json.loads(out)
    assert result["gpu"] == torch.cuda.get_device_name()
    assert result["size"] == 8192 and result["measured_tflops"] > 1
    if result["datasheet_tflops"] is not None:
        assert 0.3 < result["fraction_of_datasheet"] <= 1.02
