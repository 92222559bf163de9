"""The axis registry (stepbench.axes) is the one home of an axis: Setup's fields, the flags of `run`
and `tune`, plan keys, names, the reproduce command, tune's space and the loss guard's order all
come from it. The last test adds a throwaway axis, as a plugin would, and follows it everywhere."""

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from stepbench.axes import AXES
from stepbench.cli import build_parser, main
from stepbench.cli.run import settings_of
from stepbench.guard import can_be_reference
from stepbench.search.tune import default_space
from stepbench.setup import Setup

from conftest import SRC
from says import lines_naming, names

V01 = Path(__file__).parent / "data" / "v0.1"


def test_setup_has_one_field_per_axis_in_the_registry_order():
    assert [f.name for f in dataclasses.fields(Setup)] == [a.name for a in AXES]
    keys = [k for a in AXES for k in (a.key, *a.aliases)]
    assert len(keys) == len(set(keys)), "two axes answer to one key"


SETUPS = [
    Setup(model="llama-tiny", mode="eager", attn="sdpa", device="cpu", seq=64),
    Setup(model="llama-468m", mode="compile", attn="flex_attention", batch=16, seq=2048,
          device="cuda", compile_mode="reduce-overhead", compile_scope="layer",
          kernels="liger-no-flce", checkpointing=True, optimizer="foreach", dtype="float8",
          init="device", warmup=2, steps=5, seed=3, memory_limit_gb=20),
    Setup(model="llama-135m", mode="compile", attn="sdpa", device="cuda", parallel="ddp",
          nproc=2, init="cpu"),
]


@pytest.mark.parametrize("setup", SETUPS, ids=lambda s: s.name)
def test_the_reproduce_command_gives_back_the_same_setup(setup):
    args = build_parser().parse_args(setup.command(repeats=2).split()[1:])
    settings = settings_of(args)
    assert [s.key() for s in settings.resolved(setup.device).plan()] == [setup.key()]
    assert settings.repeats == 2


def test_names_come_from_the_registry():
    assert [s.name for s in SETUPS] == [
        "eager+sdpa", "compile:reduce-overhead/layer+flex_attention+liger-no-flce+ckpt+foreach",
        "compile+sdpa"]
    # A field that does not apply holds its default: eager mode has no compile mode or scope.
    eager = dataclasses.replace(SETUPS[1], mode="eager")
    assert (eager.compile_mode, eager.compile_scope, eager.name) == (
        "default", "model", "eager+flex_attention+liger-no-flce+ckpt+foreach")
    assert SETUPS[1].eager_twin() == eager


def test_tune_space_leaves_out_what_this_machine_cannot_run_with_the_reason():
    space, notes = default_space("cpu")
    assert space["attn"] == ["sdpa", "eager"] and space["mode"] == ["eager", "compile"]
    assert space["compile_mode"] == ["default"] and space["dtype"] == ["bf16"]
    assert space["kernels"] == ["none"]
    assert any(n.startswith("flex_attention: ") and names(n, "not tried", "CUDA GPU")
               for n in notes["attn"])
    assert any(n.startswith("float8: ") and names(n, "not tried", "CUDA GPU")
               for n in notes["dtype"])


def test_the_loss_guard_reads_plainness_from_the_registry():
    assert can_be_reference(SETUPS[0])
    assert not can_be_reference(SETUPS[1])            # compiled, liger, float8
    assert not can_be_reference(dataclasses.replace(SETUPS[0], kernels="liger"))


def test_every_axis_has_a_flag_in_run_and_the_searched_ones_in_tune(capsys):
    for command in ("run", "tune"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        text = capsys.readouterr().out
        for a in AXES:
            if a.name == "device":
                continue
            if command == "run" or a.tune is not None:
                assert a.flag in text, (command, a.flag)
            else:
                assert a.flag not in text, (command, a.flag)


# ---------------------------------------------------------------- a throwaway axis

THROWAWAY = r'''
import json, sys
from pathlib import Path
from stepbench import axes

axes.register(axes.Axis(
    "remat", str, ("off",), "recompute policy: off, selective, full; comma list", many=True,
    choices=("off", "selective", "full"), legacy="off", name_slot=2,
    text=lambda v: "" if v == "off" else f"remat-{v}", variant=True, tune="option",
    tune_values=("off", "selective"), tune_order=45))

import contextlib, io
from stepbench.cli import build_parser, main
from stepbench.cli.run import settings_of
from stepbench.record import ResultsFile
from stepbench.search.tune import Tuner, default_space
from stepbench.setup import Setup

out = {}
def dry(*flags):
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        code = main(["run", "--device", "cpu", *flags, "--dry-run", "--format", "json"])
    return code, json.loads(buffer.getvalue())

help_text = io.StringIO()
with contextlib.redirect_stdout(help_text):
    try:
        main(["run", "--help"])
    except SystemExit:
        pass
out["flag"] = "--remat" in help_text.getvalue()
out["by_flag"] = dry("--modes", "eager", "--attn", "sdpa", "--remat", "off,full")
plan = Path(sys.argv[1]) / "study.toml"
plan.write_text('[axes]\nmodes = ["eager"]\nattn = ["sdpa"]\nremat = ["off", "full"]\n')
out["by_plan"] = dry("--plan", str(plan))
setup = Setup(model="llama-tiny", mode="eager", attn="sdpa", device="cpu", remat="full")
out["name"] = setup.name
out["command"] = setup.command()
again = settings_of(build_parser().parse_args(setup.command().split()[1:]))
out["round_trip"] = [s.key() for s in again.resolved("cpu").plan()] == [setup.key()]
space, _ = default_space("cpu")
out["space"] = space["remat"]
out["bad"] = main(["run", "--device", "cpu", "--remat", "sometimes", "--dry-run"])
old = [r.setup for r in ResultsFile(sys.argv[2]).read()]
out["old_keys"] = [s.key() for s in old]
out["old_remat"] = [s.remat for s in old]
print("RESULT " + json.dumps(out))
'''


@pytest.mark.slow
def test_a_throwaway_axis_is_a_flag_a_plan_key_a_name_a_command_and_a_tune_option(tmp_path):
    env = {"PYTHONPATH": SRC, "PATH": "/usr/bin:/bin"}
    proc = subprocess.run([sys.executable, "-c", THROWAWAY, str(tmp_path),
                           str(V01 / "cpu-results.jsonl")], capture_output=True, text=True,
                          env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.split("RESULT ", 1)[1])
    assert out["flag"]
    code, setups = out["by_flag"]
    assert code == 0 and [s["name"] for s in setups] == ["eager+sdpa", "eager+sdpa+remat-full"]
    # The legacy value leaves the field out of the setup object (and its key); another is in.
    assert "remat" not in setups[0] and setups[1]["remat"] == "full"
    assert out["by_plan"] == out["by_flag"]
    assert out["name"] == "eager+sdpa+remat-full"
    assert "--remat full" in out["command"] and out["round_trip"]
    assert out["space"] == ["off", "selective"]
    assert out["bad"] == 2 and names(proc.stderr, "remat", "'sometimes'", "off, selective, full")
    # stepbench 0.1's records keep their keys (the new field reads as its legacy value)...
    from stepbench.record import ResultsFile
    assert out["old_keys"] == [r.setup.key() for r in ResultsFile(V01 / "cpu-results.jsonl").read()]
    assert set(out["old_remat"]) == {"off"}


@pytest.mark.slow
def test_with_a_throwaway_axis_a_0_1_results_file_still_resumes(tmp_path):
    out = tmp_path / "results.jsonl"
    out.write_bytes((V01 / "cpu-results.jsonl").read_bytes())
    code = THROWAWAY.split("import contextlib")[0] + (
        "from stepbench.cli import main\n"
        f"sys.exit(main(['run', '--device', 'cpu', '--seq', '64', '--warmup', '1', '--steps', "
        f"'3', '--attn', 'sdpa', '--repeats', '1', '--out', {str(out)!r}, '--format', 'json']))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={"PYTHONPATH": SRC, "PATH": "/usr/bin:/bin"}, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert len(lines_naming(proc.stderr, "(ok)", "skipped")) == 2
    assert out.read_bytes() == (V01 / "cpu-results.jsonl").read_bytes()
