"""A user's own model (`--model FILE.py:FUNCTION`, `pkg.module:FUNCTION`): what is checked before
any process starts, and real tiny runs of the examples and of factories that fail in their
process."""

import json
import sys
from pathlib import Path

import pytest

from conftest import run_cli
from says import lines_naming, names
from stepbench.errors import UserError
from stepbench.measure.models import check_models
from stepbench.settings import RunSettings
from stepbench.workload import spec

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
MLP = '''
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, width), nn.ReLU(), nn.Linear(width, 1))

    def forward(self, x, y):
        return nn.functional.mse_loss(self.body(x), y)


def make(batch_size, device, width=16, fail="no"):
    if fail == "raise":
        raise ValueError("the factory says no")
    model = Net(width).to(device)
    x, y = torch.randn(batch_size, 8, device=device), torch.randn(batch_size, 1, device=device)
    if fail == "shape":
        model.forward = lambda x, y: (model.body(x) - y) ** 2
    return model, lambda: (x, y)


def no_batch(device):
    return None


def with_attn(batch_size, device, attn="plain"):
    return None


def needs_depth(batch_size, device, seq_len, attn, *, depth):
    return None
'''


@pytest.fixture
def mlp(tmp_path):
    path = tmp_path / "mlp.py"
    path.write_text(MLP)
    spec.signature.cache_clear()
    return path


def plan(**flags):
    """The setups `stepbench run` would run for these flags (no process starts)."""
    flags.setdefault("device", "cpu")
    settings = RunSettings.build(flags)
    setups = settings.resolved("cpu").plan()
    check_models(setups)
    return setups


def test_a_factory_sweeps_its_own_parameters_and_holds_the_rest(mlp):
    setups = plan(model=f"{mlp}:make", param=["width=4,8", "fail=no"], modes="eager,compile")
    assert [(s.mode, s.params, s.seq, s.attn) for s in setups] == [
        ("eager", "fail=no;width=4", 1, "sdpa"), ("compile", "fail=no;width=4", 1, "sdpa"),
        ("eager", "fail=no;width=8", 1, "sdpa"), ("compile", "fail=no;width=8", 1, "sdpa")]
    # Attention means nothing to this model: not in the name; the parameters are the identity.
    assert setups[0].name == "eager" and setups[0].key() != setups[2].key()
    assert "params" not in plan(model="llama-tiny")[0].to_dict()
    # The reproduce command runs the same setup again.
    flags = setups[3].to_flags()
    again = dict(zip((f.lstrip("-").replace("-", "_") for f in flags[::2]), flags[1::2]))
    again["param"], again["modes"] = [again.pop("param")], again.pop("mode", "compile")
    assert plan(**again) == [setups[3]]


def test_a_parameter_value_has_one_spelling(mlp):
    """`08` and `8`, an API's `False` and a command line's `off`: one setup each, so a resume and
    a compare match them; text stays as given."""
    mlp.write_text(MLP.replace('fail="no"', 'fail="no", lr=0.1, bias=True, tag=None'))
    setups = plan(model=f"{mlp}:make", param=["width=08,8", "lr=1e-1", "bias=False,off,0",
                                              "tag=Off"], modes="eager")
    assert [s.params for s in setups] == ["bias=false;lr=0.1;tag=Off;width=8"]
    assert plan(model=f"{mlp}:make", param=["lr=1"])[0].params == "lr=1.0"


@pytest.mark.parametrize("model, flags, message", [
    ("missing.py:make", {}, "no such file missing.py"),
    ("{mlp}:nothing", {}, "has no function 'nothing'; it defines: make, needs_depth, no_batch, "
                          "with_attn"),
    ("{mlp}:no_batch", {}, "does not take batch_size; add a `batch_size` keyword"),
    ("{mlp}:make", {"param": ["depth=2"]}, "takes no parameter 'depth' (its own parameters: "
                                           "width, fail)"),
    ("{mlp}:make", {"param": ["width"]}, "--param takes NAME=V1,V2"),
    ("{mlp}:make", {"param": ["width=a"]}, "--param width=a: not an integer"),
    ("{mlp}:needs_depth", {}, "needs `depth`, which has no default; give --param depth="),
    ("{mlp}:make", {"attn": "eager"}, "--attn does not apply to"),
    ("{mlp}:make", {"seq": "128"}, "--seq does not apply to"),
    ("no_such_pkg_xyz.mod:make", {}, "no module 'no_such_pkg_xyz.mod' importable here"),
    ("llama-tiny", {"param": ["width=2"]}, "--param sets a parameter of your own model's"),
])
def test_bad_factory_input_is_one_line_naming_the_fix(mlp, model, flags, message):
    with pytest.raises(UserError) as err:
        plan(model=model.format(mlp=mlp), **flags)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_a_syntax_error_names_the_file_and_line(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def make(batch_size, device):\n    return (\n\nx = 1 +\n")
    with pytest.raises(UserError, match=rf"^{bad}:\d+: syntax error"):
        plan(model=f"{bad}:make")


def test_a_declared_axis_is_passed_to_the_factory(mlp):
    setups = plan(model=f"{mlp}:with_attn", attn="eager,sdpa", modes="eager")
    assert [s.params for s in setups] == ["attn=eager", "attn=sdpa"]


def test_a_package_module_is_read_from_its_source(tmp_path, monkeypatch):
    package = tmp_path / "mypkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "nets.py").write_text(MLP)
    monkeypatch.syspath_prepend(str(tmp_path))
    setups = plan(model="mypkg.nets:make", param=["width=3"])
    assert setups[0].params == "width=3"
    assert "mypkg" in sys.modules and "mypkg.nets" not in sys.modules   # read, not run


def test_a_python_file_without_a_function_says_how_to_name_it(tmp_path):
    path = tmp_path / "net.py"
    path.write_text(MLP)
    with pytest.raises(UserError, match=r"name the function that builds the model: --model "):
        plan(model=str(path))


@pytest.mark.slow
def test_the_gpt_example_runs_eager_and_compiled_and_the_loss_guard_compares_them(tmp_path):
    out = tmp_path / "gpt.jsonl"
    tiny = ["--param", "n_layer=1", "--param", "n_embd=32", "--param", "n_head=2",
            "--param", "vocab_size=128"]
    proc = run_cli("run", "--model", f"{EXAMPLES}/gpt.py:make", "--device", "cpu", "--seq", "16",
                   "--batch", "2", "--warmup", "1", "--steps", "3", "--repeats", "1", *tiny,
                   "--compile-cache", tmp_path / "inductor", "--out", out, "--format", "json",
                   check_json=True)
    eager, compiled = proc.records
    assert [r["status"] for r in proc.records] == ["ok", "ok"], proc.stderr
    assert eager["setup"]["params"] == "n_embd=32;n_head=2;n_layer=1;vocab_size=128"
    assert eager["units"] == "tokens" and eager["units_per_step"] == 2 * 16
    assert eager["tokens_per_s"] == pytest.approx(32 / (eager["step_ms"] / 1000))
    assert eager["flops_source"] == "flop_counter" and eager["flops_per_step"] > 0
    assert eager["flops_per_token"] is None
    assert abs(compiled["loss_first"] - eager["loss_first"]) < 0.02 * eager["loss_first"]
    report = json.loads(run_cli("report", out, "--format", "json").stdout)
    assert [r["loss_guard"] for r in report["rows"]] == ["reference", "ok"]


@pytest.mark.slow
def test_failures_inside_the_process_are_failed_setups_with_their_traceback(mlp, tmp_path):
    out = tmp_path / "fail.jsonl"
    proc = run_cli("run", "--model", f"{mlp}:make", "--param", "fail=raise,shape",
                   "--modes", "eager", "--device", "cpu", "--warmup", "1", "--steps", "2",
                   "--repeats", "1", "--out", out, "--format", "json", check_json=True, code=1)
    raised, shape = proc.records
    assert raised["status"] == "error"
    assert raised["error"] == "ValueError: the factory says no"   # the traceback: its own field
    assert 'raise ValueError("the factory says no")' in raised["traceback"]
    assert shape["status"] == "error" and names(shape["error"], "scalar")
    assert "Traceback" not in proc.stderr
    assert len(out.read_text().splitlines()) == 2


@pytest.mark.parametrize("extra, tokens", [
    ('block="Linear"', ("block='Linear'", "not a class", "block=Block")),
    ("loss_fn=1.0", ("loss_fn", "float", "not a function")),
    ("optimizer=torch.optim.SGD([torch.zeros(1, requires_grad=True)])",
     ("optimizer", "SGD", "not a function")),
    ("units_per_batch=-5", ("units_per_batch=-5", "whole number above 0")),
    ("units_per_batch=2.5", ("units_per_batch=2.5", "whole number above 0")),
    ("flops_per_step=-1.0", ("flops_per_step=-1.0", "number above 0")),
    ("units=''", ("units=''", 'units="images"')),
])
def test_a_workload_part_of_the_wrong_kind_is_named_with_its_fix(tmp_path, extra, tokens):
    said = workload_error(tmp_path, "stepbench.Workload(model=torch.nn.Linear(4, 1), "
                                    f"make_batch=lambda: x, {extra})")
    assert names(said, f"{tmp_path / 'made.py'}:make", *tokens) and "\n" not in said


def workload_error(tmp_path, returned: str) -> str:
    """The WorkloadError's text of a factory that makes x (batch_size x 4) and returns
    `returned`, built as a setup's process builds it."""
    import torch

    from stepbench.measure import step
    from stepbench.setup import Setup
    from stepbench.workload.factory import WorkloadError

    path = tmp_path / "made.py"
    path.write_text("import torch, stepbench\n\ndef make(batch_size, device):\n"
                    "    x = torch.randn(batch_size, 4, device=device)\n"
                    f"    return {returned}\n")
    setup = Setup(model=f"{path}:make", mode="eager", attn="sdpa", batch=2, seq=1,
                  device="cpu", dtype="fp32")
    with pytest.raises(WorkloadError) as err:
        step.build_workload(setup, torch.device("cpu"))
    return str(err.value)


@pytest.mark.parametrize("batch, tokens", [
    ("(x, x[:, 0])", ("Linear.forward(input)", "tuple of 2", "model(*batch)", "loss_fn")),
    ('{"x": x}', ("Linear.forward(input)", "dict of 1", "model(**batch)", "'input'")),
])
def test_a_batch_the_forward_cannot_take_is_named_before_the_step(tmp_path, batch, tokens):
    # An (images, labels) tuple for forward(x) failed inside the first step with torch's
    # "forward() takes 2 positional arguments but 3 were given".
    said = workload_error(tmp_path, f"torch.nn.Linear(4, 1), lambda: {batch}")
    assert names(said, *tokens) and "\n" not in said


def test_a_workloads_own_optimizer_is_not_labelled_as_another(tmp_path):
    import dataclasses

    import torch

    from stepbench.measure import step
    from stepbench.measure.options import Unsupported
    from stepbench.setup import Setup

    path = tmp_path / "sgd.py"
    path.write_text("import torch, stepbench\n\ndef make(batch_size, device):\n"
                    "    x = torch.randn(batch_size, 4, device=device)\n"
                    "    return stepbench.Workload(model=torch.nn.Linear(4, 1), "
                    "make_batch=lambda: x, loss_fn=lambda out, _: out.sum(), "
                    "optimizer=lambda p: torch.optim.SGD(p, lr=0.1))\n")
    setup = Setup(model=f"{path}:make", mode="eager", attn="sdpa", batch=2, seq=1,
                  device="cpu", dtype="fp32")
    _, _, optimizer = step.build_workload(setup, torch.device("cpu"))
    assert type(optimizer).__name__ == "SGD"
    with pytest.raises(Unsupported) as err:
        step.build_workload(dataclasses.replace(setup, optimizer="foreach"), torch.device("cpu"))
    assert names(str(err.value), "--optimizer foreach", "own optimizer", "drop --optimizer")


def gpt_setup(**fields):
    from stepbench.setup import Setup

    params = "n_embd=32;n_head=2;n_layer=2;vocab_size=64"
    return Setup(model=f"{EXAMPLES}/gpt.py:make", mode="eager", attn="sdpa", batch=2, seq=8,
                 device="cpu", dtype="fp32", params=params, **fields)


def test_checkpointing_wraps_the_blocks_and_trains_the_same_model():
    # In this process: the workload is built as a setup's process builds it.
    import torch

    from stepbench.measure import step

    losses, flops = {}, {}
    for checkpointing in (False, True):
        work, run, _ = step.build_workload(gpt_setup(checkpointing=checkpointing), torch.device("cpu"))
        assert len(work.layers("test")) == 2 and type(work.layers("test")[0]).__name__ == "Block"
        assert work.record_fields()["blocks"] == {"count": 2, "class": "Block"}
        losses[checkpointing] = [run().item() for _ in range(3)]
        flops[checkpointing] = work.count_flops()
    assert losses[True] == pytest.approx(losses[False], rel=1e-5)
    # MFU counts the model's FLOPs: not the checkpointed blocks' recomputed forward.
    assert flops[True] == flops[False] > 0


LAZY = """
import torch
from torch import nn

import stepbench


def make(batch_size, device):
    model = nn.Sequential(nn.LazyLinear(16), nn.ReLU(), nn.Linear(16, 1))
    x = torch.randn(batch_size, 8, device=device)
    return stepbench.Workload(model=model, make_batch=lambda: x,
                              loss_fn=lambda out, _: out.float().pow(2).mean())
"""


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_a_lazy_modules_weights_are_made_before_the_step(tmp_path, dtype):
    # nn.LazyLinear has no weights until a forward: counting or optimizing them raised
    # "Attempted to use an uninitialized parameter" in every setup.
    import torch

    from stepbench.measure import step
    from stepbench.setup import Setup

    (tmp_path / "lazy.py").write_text(LAZY)
    setup = Setup(model=f"{tmp_path}/lazy.py:make", mode="eager", attn="sdpa", batch=4, seq=1,
                  device="cpu",
                  dtype=dtype)
    work, run, optimizer = step.build_workload(setup, torch.device("cpu"))
    weights = list(work.model.parameters())
    assert sum(p.numel() for p in weights) == 8 * 16 + 16 + 16 + 1
    assert {p.dtype for p in weights} == {torch.bfloat16 if dtype == "bf16" else torch.float32}
    assert len(optimizer.param_groups[0]["params"]) == len(weights)
    before = weights[0].detach().clone()
    assert torch.isfinite(run())
    assert not torch.equal(before, weights[0].detach())    # the made weights are the trained ones


@pytest.mark.parametrize("params, defaults", [("width=32", {"fail": "no"}),
                                                 (None, {"width": 16, "fail": "no"}),
                                                 ("fail=no;width=32", None)])
def test_the_record_holds_the_factorys_defaults_that_no_param_gave(mlp, params, defaults):
    # setup.params names only what --param gave: without this, a record of `make(width=16)`
    # did not say its width, and an edit of the default left no trace.
    import torch

    from stepbench.measure import step
    from stepbench.setup import Setup

    setup = Setup(model=f"{mlp}:make", mode="eager", attn="sdpa", batch=2, seq=1,
                  device="cpu", params=params)
    work, _, _ = step.build_workload(setup, torch.device("cpu"))
    assert work.record_fields().get("param_defaults") == defaults


FROZEN_NORM = """
import torch
from torch import nn


def make(batch_size, device, handed="train"):
    model = nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8), nn.Dropout(0.5), nn.Linear(8, 1))
    model[1].eval()                      # fine-tuning: the norm's statistics stay frozen
    if handed == "eval":
        model.eval()                     # as from_pretrained hands a model over
    x = torch.randn(batch_size, 8, device=device)
    return model, lambda: x
"""


@pytest.mark.parametrize("handed", ["train", "eval"])
def test_a_models_own_eval_parts_are_kept_and_an_eval_model_trains(tmp_path, handed):
    # model.train() on the whole model flipped a frozen BatchNorm back to updating its
    # statistics: another step than the one the user trains.
    import torch

    from stepbench.measure import step
    from stepbench.setup import Setup

    (tmp_path / "frozen.py").write_text(FROZEN_NORM)
    setup = Setup(model=f"{tmp_path}/frozen.py:make", mode="eager", attn="sdpa", batch=4, seq=1,
                  device="cpu", dtype="fp32", params=f"handed={handed}")
    work, _, _ = step.build_workload(setup, torch.device("cpu"))
    assert [m.training for m in work.model] == (
        [True, False, True, True] if handed == "train" else [True] * 4)


def flop_fields(setup, count=True) -> dict:
    """The FLOP fields a setup's process would record, built and counted in this process."""
    import torch

    from stepbench.measure import step

    work, _, _ = step.build_workload(setup, torch.device("cpu"))
    return work.flop_fields(setup, 100.0, None, count=count)


def test_a_factorys_flop_count_is_cached_for_its_code_and_setup(mlp, tmp_path, monkeypatch):
    from stepbench.measure import cache

    monkeypatch.setenv(cache.CACHE_ENV, str(tmp_path / "cache"))
    path = tmp_path / "cache" / "factory_flops.json"
    eager, compiled, wide, _ = plan(model=f"{mlp}:make", param=["width=4,8"],
                                    modes="eager,compile")
    assert "flops_per_step" not in flop_fields(eager, count=False)   # a probe counts nothing
    first = flop_fields(eager)
    counted = first["flops_per_step"]
    assert counted > 0 and first["flops_source"] == "flop_counter"
    data = json.loads(path.read_text())
    data["entries"][0]["value"] = 12345.0          # a value no count gives: read, not counted
    path.write_text(json.dumps(data))
    for setup, count in ((eager, True), (compiled, True), (eager, False)):
        assert flop_fields(setup, count)["flops_per_step"] == 12345.0
    assert flop_fields(wide)["flops_per_step"] > counted    # another parameter: counted
    # The file changed since it was imported: counted, and not stored under either content.
    mlp.write_text(MLP + "\n# changed\n")
    assert flop_fields(eager)["flops_per_step"] == counted
    assert len(json.loads(path.read_text())["entries"]) == 2
    # Imported again (a new process): another key, counted and stored.
    for name in [n for n, m in sys.modules.items() if getattr(m, "__file__", None) == str(mlp)]:
        del sys.modules[name]
    assert flop_fields(eager)["flops_per_step"] == counted
    assert len(json.loads(path.read_text())["entries"]) == 3
    # A factory without a source file to key by: no key (counted, never stored), no failure.
    import functools

    from stepbench.workload import flopcache
    assert flopcache.key(eager, functools.partial(print), None, None) is None


def test_a_model_without_a_repeated_block_cannot_be_checkpointed(mlp):
    import torch

    from stepbench.measure import options, step
    from stepbench.setup import Setup

    setup = Setup(model=f"{mlp}:make", mode="eager", attn="sdpa", batch=2, seq=1, device="cpu",
                  checkpointing=True)
    with pytest.raises(options.Unsupported, match="has no repeated block; return "
                                                  "stepbench.Workload"):
        step.build_workload(setup, torch.device("cpu"))
    work, _, _ = step.build_workload(setup.replace(checkpointing=False), torch.device("cpu"))
    assert work.record_fields()["blocks"] == {"count": 0}      # what tune reads (issue 35)


def _torchvision_works() -> bool:
    try:
        import torchvision  # noqa: F401
    except Exception:  # noqa: BLE001 - a build that does not match torch fails at import
        return False
    return True


@pytest.mark.slow
@pytest.mark.skipif(not _torchvision_works(), reason="torchvision is not installed (or does not "
                                                     "match this torch)")
def test_the_resnet_example_runs_and_counts_images(tmp_path):
    proc = run_cli("run", "--model", f"{EXAMPLES}/resnet.py:make", "--device", "cpu",
                   "--batch", "2", "--param", "image_size=32", "--param", "arch=resnet18",
                   "--modes", "eager", "--warmup", "1", "--steps", "2", "--repeats", "1",
                   "--out", tmp_path / "r.jsonl", "--format", "json", check_json=True)
    (record,) = proc.records
    assert record["status"] == "ok" and record["units"] == "images"
    assert record["units_per_step"] == 2 and record["setup"]["seq"] == 1



@pytest.mark.slow
def test_the_python_api_runs_the_command_and_returns_its_records(mlp, tmp_path):
    import torch

    from stepbench import api
    from stepbench.measure import step
    from stepbench.workload import flopcache

    out = tmp_path / "api.jsonl"
    # The FLOP cache across processes: batch 2's count stored by this process (a value no count
    # gives) is what its setup's process reads; batch 3's is another key, counted there.
    setup = plan(model=f"{mlp}:make", modes="eager", batch="2", warmup="1", steps="2",
                 param=["width=4"])[0]
    work, _, _ = step.build_workload(setup, torch.device("cpu"))
    flopcache._cache().put(flopcache.key(setup, work.factory, work.work, work.inputs), 12345.0)
    results = api.run(model=f"{mlp}:make", device="cpu", modes=["eager"], batch=[2, 3],
                            warmup=1, steps=2, repeats=1, param={"width": 4}, out=out)
    assert [(r["status"], r["setup"]["batch"], r["units"]) for r in results] == [
        ("ok", 2, "samples"), ("ok", 3, "samples")]
    assert results[0]["flops_per_step"] == 12345.0
    assert results[1]["flops_per_step"] not in (None, 12345.0)
    assert len(out.read_text().splitlines()) == 2
    frame = results.frame()
    assert list(frame["setup.params"]) == ["width=4"] * 2
    report = api.report(out)
    assert [row["status"] for row in report["rows"]] == ["ok", "ok"]
    with pytest.raises(UserError, match="takes no parameter 'depth'"):
        api.run(model=f"{mlp}:make", device="cpu", param={"depth": 2}, out=out)
    # The factory's defaults that no param gave travel into the record.
    assert results[0]["param_defaults"] == {"fail": "no"}
    # A misspelled keyword is named as the script wrote it, not as "--stpes 2".
    with pytest.raises(UserError) as err:
        api.run(model=f"{mlp}:make", device="cpu", stpes=2, out=out)
    assert names(str(err.value), "stepbench.api.run()", "stpes", "--help")
    assert "--stpes" not in str(err.value)


def test_an_unknown_api_keyword_is_named_as_a_keyword():
    from stepbench.api import _as_keywords

    said = _as_keywords("tune", "stepbench: error: unrecognized arguments: --bogus-kw 3 "
                                "--other; see stepbench --help")
    assert names(said, "stepbench.api.tune()", "bogus_kw, other", "stepbench tune --help")
    assert _as_keywords("run", "--batch needs comma-separated integers, got 'x'") == \
        "--batch needs comma-separated integers, got 'x'"


def test_tune_starts_a_factory_from_its_own_parameters_and_searches_what_applies(mlp):
    from stepbench.cli import build_parser
    from stepbench.cli.base import given
    from stepbench.search import tune
    from stepbench.settings import TuneSettings

    def tuned(*flags):
        args = build_parser().parse_args(["tune", "--model", f"{mlp}:make", "--budget", "1m",
                                          "--device", "cpu", *flags])
        settings = TuneSettings.build(given(args)).resolved("cpu")
        space, _ = tune.space_for(settings)
        return space, tune.start(settings, space)

    # Every --param is passed, as run passes them (not the last one alone).
    space, base = tuned("--param", "width=8", "--param", "fail=no")
    assert space["attn"] == ["sdpa"] and space["kernels"] == ["none"]
    assert (base.params, base.seq, base.mode, base.name) == ("fail=no;width=8", 1, "eager", "eager")
    # Several values: each combination a candidate, the first where the search starts.
    space, base = tuned("--param", "width=8,16", "--param", "fail=no")
    assert space["params"] == ["fail=no;width=8", "fail=no;width=16"]
    assert base.params == "fail=no;width=8"
    with pytest.raises(UserError, match="takes no parameter 'depth'"):
        tuned("--param", "width=8", "--param", "depth=2")


@pytest.mark.slow
def test_a_real_tune_measures_each_param_value_against_its_own_reference(mlp, tmp_path):
    # Two widths: two models, each guarded against an eager run of its own width; the lines
    # and the table count the factory's unit, samples. The batch ladder starts at 1024: from
    # 4, each width's ladder doubled its batch ten times (the MLP's step costs the same up to
    # 4096) and the tune measured 22 processes, not 6.
    proc = run_cli("tune", "--model", f"{mlp}:make", "--param", "width=4,64", "--device", "cpu",
                   "--modes", "eager", "--optimizer", "fused", "--checkpointing", "off",
                   "--batch", "1024", "--repeats", "1", "--warmup", "1", "--steps", "2", "--budget", "40s",
                   "--format", "json", "--out", tmp_path / "tune.jsonl", timeout=300)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    tried = {t["setup"]["params"] for t in result["tried"] if t["status"] == "ok"}
    assert tried == {"width=4", "width=64"}, result["tried"]
    # Each process that ran found the MLP's blocks: none (one Sequential of leaf layers; issue
    # 35). One the budget's end stopped (a timeout under the tune's shortened limit, on a busy
    # machine) sent no record body, so no blocks.
    ran = [t for t in result["tried"] if t["status"] == "ok"]
    assert len(ran) >= 2 and [t.get("blocks") for t in ran] == [{"count": 0}] * len(ran)
    assert all(t["status"] in ("ok", "timeout") for t in result["tried"]), result["tried"]
    assert result["winner"]["setup"]["params"] in tried
    assert "tokens/s" not in proc.stderr and "samples/s" in proc.stderr, proc.stderr[-2000:]


@pytest.mark.slow
def test_max_batch_grows_the_factorys_batch_size(mlp, tmp_path):
    proc = run_cli("run", "--model", f"{mlp}:make", "--device", "cpu", "--modes", "eager",
                   "--warmup", "1", "--steps", "3", "--repeats", "1", "--max-batch",
                   "--memory-limit-gb", "2", "--max-batch-limit", "8",
                   "--out", tmp_path / "mb.jsonl", "--format", "json", check_json=True)
    final = [r for r in proc.records if r["search"]["role"] == "final"]
    assert [(r["status"], r["setup"]["batch"], r["units_per_step"]) for r in final] == [
        ("ok", 8, 8)]


def test_the_loss_guard_pairs_a_declared_attn_as_a_transformers_models_attention(mlp):
    # with_attn declares `attn`: its values are passed to it, and they choose how the step runs,
    # not which model it trains. Each compiled setup is checked against the eager setup of its
    # own attn; the other eager setup against the plainest (sdpa); a broken kernel departs.
    from stepbench.guard import DEPARTS, OK, REFERENCE, loss_verdicts
    from stepbench.record import Machine, Record
    from stepbench.setup import Setup

    def record(mode, attn, drift=0.0):
        setup = Setup(model=f"{mlp}:with_attn", mode=mode, attn="sdpa", batch=2, seq=1,
                      device="cpu", params=f"attn={attn}")
        losses = [2.0 * (1 + drift * i) for i in range(4)]
        return Record(run_id="r", repeat=0, setup=setup, status="ok", losses=losses,
                      loss_first=losses[0], machine=Machine(gpu="cpu"))

    records = [record("eager", "plain"), record("eager", "sdpa"), record("compile", "sdpa"),
               record("compile", "plain", drift=0.1)]
    judged = loss_verdicts(records)
    verdicts = {(r.setup.mode, r.setup.params): judged[(r.setup.key(), "cpu")] for r in records}
    said = {key: (v.status, v.reference) for key, v in verdicts.items()}
    assert said == {("eager", "attn=sdpa"): (REFERENCE, None),
                    ("eager", "attn=plain"): (OK, "eager attn=sdpa"),
                    ("compile", "attn=sdpa"): (OK, "eager attn=sdpa"),
                    ("compile", "attn=plain"): (DEPARTS, "eager attn=plain")}


DROPOUT = """
import torch
from torch import nn

import stepbench


def make(batch_size, device, p=0.5):
    model = nn.Sequential(nn.Linear(8, 16), nn.Dropout(p), nn.Linear(16, 1))
    x = torch.randn(batch_size, 8, device=device)
    return stepbench.Workload(model=model, make_batch=lambda: x,
                              loss_fn=lambda out, _: out.pow(2).mean())
"""


@pytest.mark.parametrize("p, draws", [(0.5, True), (0.0, None)])
def test_a_step_that_draws_random_numbers_says_so_in_its_record(tmp_path, p, draws):
    from stepbench.measure import step
    from stepbench.setup import Setup

    (tmp_path / "drop.py").write_text(DROPOUT)
    setup = Setup(model=f"{tmp_path}/drop.py:make", mode="eager", attn="sdpa", batch=4, seq=1,
                  device="cpu", dtype="fp32", warmup=0, steps=1, params=f"p={p}")
    result: dict = {}
    step.measure(setup, result, lambda *a, **k: None)
    assert result.get("draws_random") is draws


def test_the_loss_guard_does_not_compare_compiled_and_eager_steps_that_draw_random_numbers(mlp):
    # Dropout: inductor draws its masks from its own generator, so a compiled step's losses
    # differ from eager's by the draw, not by a fault: "departs 55%" was a false alarm. Eager
    # setups draw alike and are still compared.
    from stepbench.guard import DEPARTS, REFERENCE, UNCHECKED, loss_verdicts
    from stepbench.record import Machine, Record
    from stepbench.setup import Setup

    def record(mode, optimizer="fused", drift=0.0, draws=True):
        setup = Setup(model=f"{mlp}:make", mode=mode, attn="sdpa", batch=2, seq=1,
                      device="cpu", optimizer=optimizer)
        losses = [2.0 * (1 + drift * i) for i in range(4)]
        return Record(run_id="r", repeat=0, setup=setup, status="ok", losses=losses,
                      loss_first=losses[0], machine=Machine(gpu="cpu"),
                      draws_random=draws or None)

    for draws in (True, False):
        records = [record("eager", draws=draws), record("compile", drift=0.3, draws=draws),
                   record("eager", "foreach", drift=0.3, draws=draws)]
        judged = loss_verdicts(records)
        said = [judged[(r.setup.key(), "cpu")] for r in records]
        assert [v.status for v in said] == [REFERENCE, UNCHECKED if draws else DEPARTS, DEPARTS]
        assert said[1].random is draws
        if draws:
            assert names(said[1].describe("compile"), "compile", "eager", "random", "dropout")


def test_one_parser_reads_params_for_the_factory_strictly_and_for_the_loss_guard_tolerantly():
    from stepbench.guard import _declared, peers_key
    from stepbench.setup import Setup
    from stepbench.workload.spec import param_parts, params_of

    assert param_parts("attn=sdpa;eq=a=b;junk") == [("attn", "sdpa"), ("eq", "a=b"), ("junk", None)]
    assert param_parts(None) == param_parts("") == []
    assert params_of("attn=sdpa;width=3") == {"attn": "sdpa", "width": "3"}
    with pytest.raises(ValueError, match="junk"):
        params_of("junk;width=3")
    # A hand-edited record's part without "=" stays in the guard's identity and passes nothing.
    setup = Setup(model="m.py:make", mode="eager", attn="sdpa", batch=2, seq=1, device="cpu",
                  params="attn=plain;junk;width=3")
    assert _declared(setup) == {"attn": "plain"}
    assert "junk;width=3" in peers_key(setup, "cpu")


MLP_RECORDS = Path(__file__).parent / "data" / "cpu-factory-mlp.jsonl"


def test_a_factory_without_seq_len_shows_no_seq_and_its_rows_say_their_units(mlp, capsys,
                                                                             tmp_path):
    from stepbench.cli import main
    from stepbench.execute.progress import job_name
    from stepbench.execute.protocol import Job

    # Two parameter values: two lines that say which (no "x 1", no "seq 1").
    assert main(["run", "--model", f"{mlp}:make", "--device", "cpu", "--modes", "eager",
                 "--param", "width=16,32", "--dry-run"]) == 0
    lines = capsys.readouterr().out.splitlines()[:2]
    assert len(set(lines)) == 2 and all("batch 4  bf16" in line for line in lines)
    assert [("width=16" in line, "width=32" in line) for line in lines] == [(True, False),
                                                                           (False, True)]
    (setup,) = plan(model=f"{mlp}:make", param=["width=16"], modes="eager")
    assert job_name(Job(setup)) == "eager batch 4 width=16"
    assert job_name(Job(plan(model="llama-tiny", modes="eager")[0])).endswith("seq 256")
    # The records of such a run (two widths, real CPU records): units in every JSON row.
    assert main(["report", str(MLP_RECORDS), "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    # The parameters say which row is which width, in JSON, CSV and compare's rows.
    assert [(r["setup"], r["units"], r["params"]) for r in rows] == [
        ("eager", "samples", "width=16"), ("eager", "samples", "width=32")]
    assert main(["report", str(MLP_RECORDS), "--format", "csv"]) == 0
    import csv
    assert [r["params"] for r in csv.DictReader(capsys.readouterr().out.splitlines())] == [
        "width=16", "width=32"]
    again = tmp_path / "again.jsonl"
    again.write_text(MLP_RECORDS.read_text())
    assert main(["compare", str(MLP_RECORDS), str(again), "--format", "json"]) == 0
    compared = json.loads(capsys.readouterr().out)["rows"]
    assert [r["params"] for r in compared] == ["width=16", "width=32"]
    assert main(["report", str(MLP_RECORDS)]) == 0
    text = capsys.readouterr().out
    assert "Samples/s" in text and "x 1" not in text and "seq 1" not in text
    # Its FLOPs are FlopCounterMode's count, not the transformers convention (no attention).
    assert "FlopCounterMode counted one step" in text and "non-causal" not in text
    assert "same model, parameters, seed and batch" in text and "sequence length" not in text
    # The plots' labels count its unit too.
    from stepbench.report.plots import plot_captions
    from stepbench.report.rows import build_rows
    from stepbench.record import ResultsFile

    captions = plot_captions(build_rows(ResultsFile(MLP_RECORDS).read(), {}))
    assert captions["tokens_per_s"].startswith("Samples/s") and \
        captions["tokens_per_dollar"].startswith("M samples per $")
    # A transformers model's rows count tokens.
    assert main(["report", str(MLP_RECORDS.parent / "h200-matrix.jsonl"), "--format", "json"]) == 0
    assert {r["units"] for r in json.loads(capsys.readouterr().out)["rows"]} == {"tokens"}


def test_a_report_of_several_units_names_units_not_tokens(capsys):
    # A transformers model (tokens) and a factory (samples) in one report: a "Tokens/s" column
    # over the factory's samples misnamed them; each model's unit is named in the notes.
    from stepbench.cli import main

    assert main(["report", str(MLP_RECORDS), str(MLP_RECORDS.parent / "h200-matrix.jsonl"),
                 "--price", "cpu=1"]) == 0
    text = capsys.readouterr().out
    assert "Units/s" in text and "M units per $" in text and "Tokens/s" not in text
    (said,) = lines_naming(text, "Units/s counts")
    assert names(said, "tokens (llama-468m)", "samples (", "mlp.py:make")


def test_a_nan_loss_is_named_and_failed_rows_still_count_their_units(capsys, tmp_path):
    from stepbench.cli import main

    records = [json.loads(line) for line in MLP_RECORDS.read_text().splitlines()]
    records[0]["loss_first"] = records[0]["loss_last"] = float("nan")
    path = tmp_path / "nan.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    assert main(["report", str(path)]) == 0
    said = lines_naming(capsys.readouterr().out, "not finite")
    assert len(said) == 1 and names(said[0], "width=16", "NaN") and "width=32" not in said[0]
    for r in records:
        r.update(status="error", error="ValueError: no", step_ms=None, tokens_per_s=None)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    main(["report", str(path)])
    text = capsys.readouterr().out
    assert "Samples/s is" in text and "Tokens/s" not in text and "not finite" not in text


def test_runs_table_says_why_a_factory_failed_in_one_line(mlp):
    from stepbench.record import Machine, Record
    from stepbench.report.document import run_document
    from stepbench.report.render import render
    from stepbench.setup import Setup

    setup = Setup(model=f"{mlp}:make", mode="eager", attn="sdpa", batch=2, seq=1, device="cpu",
                  params="fail=raise")
    failed = Record(run_id="r", repeat=0, setup=setup, status="error", phase="building",
                    error="ValueError: the factory says no\n(stderr tail)",
                    machine=Machine(gpu="cpu"))
    text = render(run_document([failed]), "table")
    assert lines_naming(text, "eager", "error", "ValueError: the factory says no")
    assert "stderr tail" not in text
    # Nothing ran: the rate column still counts a factory's unit (its default), not tokens,
    # and so does the report's note on what the column is.
    assert "Samples/s" in text and "Tokens/s" not in text
    from stepbench.report.document import rows_document
    from stepbench.report.rows import build_rows

    report = render(rows_document(build_rows([failed], {})), "markdown")
    assert "Samples/s is the samples one step trains" in report and "Tokens/s" not in report


def test_tunes_table_counts_a_factorys_own_unit():
    from stepbench.record import ResultsFile
    from stepbench.report.tune import gains_table, ladder_text, tried_table

    records = ResultsFile(MLP_RECORDS).read()
    table = tried_table([("ladder", r) for r in records])
    assert "Samples/s" in table.columns and "Tokens/s" not in table.columns
    assert [row[1] for row in table.cells] == ["eager (width=16)", "eager (width=32)"]
    ladder = {"batches": [4, 8], "tokens_per_s": [100, 180], "saturating_batch": 8,
              "stopped": "the budget", "gb_per_sequence": 0.01}
    assert names(ladder_text(ladder, "samples"), "4 (100 samples/s)", "GB a sample")
    assert "tokens" not in ladder_text(ladder, "samples")
    gain = {"kind": "optimizer fused -> foreach", "smallest": 0.9, "largest": 1.1,
            "source": "this machine"}
    assert "multiply samples/s by" in gains_table([gain], "samples").notes[0]


def test_compare_counts_a_factorys_own_unit(capsys, tmp_path):
    from stepbench.cli import main

    after = tmp_path / "after.jsonl"
    after.write_text(MLP_RECORDS.read_text())
    assert main(["compare", str(MLP_RECORDS), str(after)]) == 0
    text = capsys.readouterr().out
    assert "Samples/s ratio" in text and "Tokens/s" not in text


def test_findings_on_a_factory_name_no_attention_and_count_its_unit(tmp_path, capsys):
    # A compiled twin of a real record (step time halved): the findings on an MLP speak of
    # torch.compile, not of "sdpa attention" it does not have, and of samples, not tokens.
    from stepbench.cli import main

    eager = json.loads(MLP_RECORDS.read_text().splitlines()[0])
    compiled = json.loads(json.dumps(eager))
    compiled["setup"].update(name="compile", mode="compile")
    compiled["step_times_ms"] = [t / 2 for t in eager["step_times_ms"]]
    for field in ("step_ms", "step_ms_median", "step_ms_min", "step_ms_max"):
        compiled[field] = eager[field] / 2
    compiled["tokens_per_s"] = eager["tokens_per_s"] * 2
    path = tmp_path / "pair.jsonl"
    path.write_text(json.dumps(eager) + "\n" + json.dumps(compiled) + "\n")
    assert main(["report", str(path), "--format", "json"]) == 0
    texts = [f["text"] for f in json.loads(capsys.readouterr().out)["findings"]]
    assert texts and not any("attention" in t or "tokens" in t for t in texts), texts
    assert any("samples per dollar" in t for t in texts), texts   # its steps were disturbed


def test_a_factorys_max_batch_search_table_shows_no_seq():
    # A real record of the MLP as a max-batch probe: the search's table has no Seq column
    # (the factory takes no seq_len), a transformers model's keeps it.
    import dataclasses

    from stepbench.record import ResultsFile
    from stepbench.report.searches import details_table

    probe = dataclasses.replace(ResultsFile(MLP_RECORDS).read()[0], search={
        "kind": "max_batch", "role": "probe", "start_batch": 4, "step": "start"})
    assert "Seq" not in details_table([probe]).columns
    hf = dataclasses.replace(probe, setup=probe.setup.replace(model="llama-tiny", params=None,
                                                              seq=64))
    assert "Seq" in details_table([hf]).columns
