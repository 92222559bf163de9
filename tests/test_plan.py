"""Plan files (`run --plan study.toml`): the same setups as the equivalent flags, flags beside a
plan override it, a bad plan or a combination that can never run is refused before anything
starts; and the plan runs for real (one batch size of it), with the loss guard passing it."""

import json

import pytest

from stepbench.cli import main
from stepbench.guard import REFERENCE, OK, loss_verdicts
from stepbench.record import ResultsFile
from conftest import run_cli
from says import error_line, names, user_error

# One process per setup: run's default (2, and a third where they disagree) would double the
# real run below.
STUDY = """\
model = "llama-tiny"
device = "cpu"
steps = 2
warmup = 1
repeats = 1
[axes]
modes = ["eager"]
attn = ["sdpa", "eager"]
batch = [1, 2]
"""
FLAGS = ["--model", "llama-tiny", "--device", "cpu", "--steps", "2", "--warmup", "1",
         "--modes", "eager", "--attn", "sdpa,eager", "--batch", "1,2"]


@pytest.fixture
def plan_file(tmp_path):
    def make(text: str = STUDY):
        path = tmp_path / "study.toml"
        path.write_text(text)
        return path
    return make


def dry_run(capsys, *args) -> list[dict]:
    assert main(["run", *map(str, args), "--dry-run", "--format", "json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_the_plan_gives_the_same_setups_as_the_flags(plan_file, capsys):
    from_plan = dry_run(capsys, "--plan", plan_file())
    assert from_plan == dry_run(capsys, *FLAGS)
    assert [(s["name"], s["batch"]) for s in from_plan] == [
        ("eager+sdpa", 1), ("eager+eager", 1), ("eager+sdpa", 2), ("eager+eager", 2)]
    assert {(s["steps"], s["warmup"], s["seq"], s["model"]) for s in from_plan} == {(2, 1, 256, "llama-tiny")}


def test_flags_beside_a_plan_override_it(plan_file, capsys):
    setups = dry_run(capsys, "--plan", plan_file(), "--batch", "4", "--precision", "bf16,fp32",
                     "--checkpointing", "on")
    assert {(s["batch"], s["dtype"], s["checkpointing"]) for s in setups} == {
        (4, "bf16", True), (4, "fp32", True)}
    assert len(setups) == 4 and {s["mode"] for s in setups} == {"eager"}


def test_every_axis_can_be_written_in_a_plan(plan_file, capsys):
    text = STUDY.replace('modes = ["eager"]', 'modes = ["compile"]\ncompile-mode = ["default", '
                         '"max-autotune-no-cudagraphs"]\ncompile_scope = ["layer"]\nprecision = "fp32"\n'
                         'kernels = ["none"]\ncheckpointing = [false, true]\noptimizer = "foreach"\n'
                         'seq = 64')
    setups = dry_run(capsys, "--plan", plan_file(text))
    assert len(setups) == 2 * 2 * 2 * 2          # compile modes x checkpointing x attn x batch
    # (on the CPU: reduce-overhead's CUDA graphs are refused there)
    assert {s["name"] for s in setups} == {
        f"compile{mode}/layer+{attn}{ckpt}+foreach" for mode in ("", ":max-autotune-no-cudagraphs")
        for attn in ("sdpa", "eager") for ckpt in ("", "+ckpt")}
    assert {(s["dtype"], s["seq"]) for s in setups} == {("fp32", 64)}


def test_a_factorys_parameters_are_planned_as_a_list_of_param_flags(plan_file, capsys, tmp_path):
    net = tmp_path / "net.py"
    net.write_text("def make(batch_size, device, width=8, bias=True):\n    pass\n")
    text = (f'model = "{net}:make"\ndevice = "cpu"\n[axes]\nmodes = ["eager"]\n'
            'param = ["width=8,16", "bias=off"]\n')
    setups = dry_run(capsys, "--plan", plan_file(text))
    assert [s["params"] for s in setups] == ["bias=false;width=8", "bias=false;width=16"]
    assert setups == dry_run(capsys, "--model", f"{net}:make", "--device", "cpu", "--modes",
                             "eager", "--param", "width=8,16", "--param", "bias=off")
    table = plan_file(text.replace('["width=8,16", "bias=off"]', "{width = [8, 16]}"))
    assert main(["run", "--plan", str(table), "--dry-run"]) == 2
    assert names(capsys.readouterr().err, "param", "NAME=V1,V2")


def test_a_value_given_twice_is_measured_once_and_said(plan_file, capsys, tmp_path):
    # A repeat in a comma list (flag or plan) is dropped, with a warning naming it; a factory's
    # value spelled twice ("16" and "016" are one integer) names both spellings.
    net = tmp_path / "net.py"
    net.write_text("def make(batch_size, device, width=8):\n    pass\n")

    def planned(*args) -> tuple[list[dict], list[str]]:
        assert main(["run", *map(str, args), "--dry-run", "--format", "json"]) == 0
        out, err = capsys.readouterr()
        return json.loads(out), [line for line in err.splitlines() if "warning:" in line]

    setups, said = planned("--model", f"{net}:make", "--device", "cpu", "--modes", "eager,eager",
                           "--batch", "4,4,8", "--param", "width=16,016")
    assert [(s["batch"], s["params"]) for s in setups] == [(4, "width=16"), (8, "width=16")]
    assert len(said) == 3
    assert any(names(m, "--modes", "eager", "once") for m in said)
    assert any(names(m, "--batch", "4", "once") for m in said)
    assert any(names(m, "--param width", "016", "16", "once") for m in said)
    setups, said = planned("--plan", plan_file(STUDY.replace("[1, 2]", "[1, 2, 1]")))
    assert sorted({s["batch"] for s in setups}) == [1, 2] and len(setups) == 4
    assert [names(m, "batch", "1", "once") for m in said] == [True]


def test_where_the_weights_are_drawn_and_the_parallel_style_can_be_planned(plan_file, capsys):
    # On the CPU the weights are always drawn on the CPU, so init is left at its default there;
    # the distributed settings go through the same checks as their flags.
    text = STUDY.replace('steps = 2', 'steps = 2\ninit = "cpu"\nnproc = 2').replace(
        'batch = [1, 2]', 'batch = 1\nparallel = ["none", "ddp"]')
    setups = dry_run(capsys, "--plan", plan_file(text))
    assert [(s["name"], s.get("parallel", "none"), s.get("nproc", 1)) for s in setups] == [
        ("eager+sdpa", "none", 1), ("eager+eager", "none", 1),
        ("eager+sdpa", "ddp", 2), ("eager+eager", "ddp", 2)]
    assert all("init" not in s for s in setups)
    # A flag beside the plan wins over it.
    setups = dry_run(capsys, "--plan", plan_file(text), "--parallel", "none", "--nproc", "1")
    assert {s.get("parallel", "none") for s in setups} == {"none"}
    # none runs first, whatever the order given: a user's model's FLOPs counted there are what
    # its ddp and fsdp2 jobs read on this machine.
    setups = dry_run(capsys, "--plan", plan_file(text), "--parallel", "fsdp2,ddp,none")
    assert [s.get("parallel", "none") for s in setups][::2] == ["none", "fsdp2", "ddp"]


@pytest.mark.parametrize("text, kind, tokens", [
    (STUDY + 'typo = 1\n', "unknown_value", ("'typo'", "modes", "attn")),
    (STUDY.replace("steps = 2\n", "") + "steps = 2\n", None, ("'steps'", "[axes]")),
    (STUDY.replace("steps = 2", 'steps = "two"'), "bad_value", ("steps", "'two'")),
    (STUDY.replace('batch = [1, 2]', 'batch = []'), "bad_value", ("batch",)),
    (STUDY + "[[axes]]\n", None, ("TOML",)),
    (STUDY.replace("repeats = 1", "repeats = 0"), "bad_value", ("repeats", ">= 1", "0")),
    (STUDY.replace('modes = ["eager"]', 'modes = ["eager"]\ncompile_scope = ["layer"]'),
     "conflict", ("compile_scope layer", "torch.compile")),
])
def test_a_bad_plan_is_refused_before_anything_runs(plan_file, capsys, tmp_path, text, kind,
                                                    tokens):
    out = tmp_path / "r.jsonl"
    plan = plan_file(text)
    assert main(["run", "--plan", str(plan), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert names(err, f"plan {plan}", *tokens), err
    assert user_error(["run", "--plan", str(plan), "--out", str(out)]).kind == kind
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert not out.exists()


@pytest.mark.parametrize("line, flags, message", [
    # The key as the plan spells it (a dash, an underscore, an alias), and the fix in its terms.
    ('modes = ["eager"]\ncompile-scope = ["layer"]', [],
     "plan {plan}: compile-scope layer needs torch.compile; eager mode compiles nothing: add "
     "compile to modes or drop compile-scope"),
    ('mode = ["eager"]\ncompile_scope = "layer"', [],
     "plan {plan}: compile_scope layer needs torch.compile; eager mode compiles nothing: add "
     "compile to mode or drop compile_scope"),
    ('attn = ["sdp"]', [], "plan {plan}: unknown attention 'sdp' in attn; choose one of: eager, "
                           "sdpa, flex_attention"),
    ('batch = [2, 0]', [], "plan {plan}: batch must be an integer >= 1, got 0"),
    ('checkpointing = ["maybe"]', [], "plan {plan}: checkpointing takes a comma list of off and "
                                      "on, got 'maybe'"),
    ("probe-steps = 3", [], "plan {plan}: probe-steps sets up the batch search; add max-batch = "
                            "true (or drop it)"),
    ('timeout = 0', [], "plan {plan}: timeout must be > 0 seconds, got 0"),
    ('nproc = 2', [], "plan {plan}: nproc 2 nnodes 1 needs a way to spread the step: add "
                      "parallel ddp or parallel fsdp2"),
    ('max_batch = true', [], "plan {plan}: max_batch on the CPU needs memory-limit-gb"),
    ('nnodes = 2\nparallel = ["ddp"]', [], "plan {plan}: nnodes 2 needs --node-rank"),
    ('model = "nope"', [], "plan {plan}: unknown model 'nope': not a preset"),
    # A flag's error names the flag, and a plan value it mentions names the plan.
    ('compile-scope = ["layer"]', ["--modes", "eager"],
     "plan {plan}: compile-scope layer needs torch.compile; eager mode compiles nothing: add "
     "compile to --modes or drop compile-scope"),
    ('modes = ["eager"]', ["--compile-scope", "layer"],
     "--compile-scope layer needs torch.compile; eager mode compiles nothing: add compile to "
     "modes in plan {plan} or drop --compile-scope"),
    ('attn = ["sdp"]', ["--attn", "sdp"], "error: unknown attention 'sdp'; choose one of"),
    ('nnodes = 1', ["--node-rank", "1"], "error: --node-rank needs nnodes = 2 or more in "
                                         "plan {plan}"),
    ('model = "llama-tiny"', ["--model", "nope"], "error: unknown model 'nope'"),
])
def test_an_error_names_a_plan_value_by_its_key_and_a_flag_by_the_flag(plan_file, capsys, line,
                                                                       flags, message):
    plan = plan_file('device = "cpu"\n' + line + "\n")
    assert main(["run", "--plan", str(plan), *flags, "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert message.format(plan=plan) in err, err
    assert len(err.strip().splitlines()) == 1
    if not message.startswith("plan"):
        assert f"error: plan {plan}" not in err


def test_repeats_default_to_two_and_a_third_unless_a_plan_or_a_flag_fixes_them(plan_file):
    from stepbench.plan import read_plan
    from stepbench.settings import RunSettings

    assert RunSettings.build({}).repeats is None          # 2, and a third where they disagree
    plan = read_plan(plan_file())
    assert RunSettings.build({}, plan).repeats == 1
    assert RunSettings.build({"repeats": 3}, plan).repeats == 3


def test_cuda_graphs_on_the_cpu_are_refused_before_anything_runs(plan_file, capsys, tmp_path):
    # inductor leaves CUDA graphs out on the CPU: a reduce-overhead row would be the default
    # mode's step under another name, so nothing of it is measured (exit 2, one line).
    out = tmp_path / "r.jsonl"
    graphs = ["--modes", "compile", "--compile-mode", "default,reduce-overhead"]
    for argv, tokens in (
            ([*FLAGS[:-6], *graphs, "--out", out], ("--compile-mode reduce-overhead", "cpu",
                                                    "--device cuda")),
            (["--plan", plan_file(STUDY.replace('modes = ["eager"]', 'modes = ["compile"]\n'
                                                'compile_mode = ["reduce-overhead"]')),
              "--out", out], ("plan", "study.toml", "compile_mode reduce-overhead",
                              "--device cuda")),
            (["--device", "cpu", "--budget", "5m", "--compile-mode", "reduce-overhead", "--out",
              out], ("--compile-mode reduce-overhead", "cpu", "--device cuda"))):
        command = "tune" if "--budget" in argv else "run"
        assert main([command, *map(str, argv)]) == 2
        err = capsys.readouterr().err
        assert error_line(err, command) and names(err, *tokens), err
    assert not out.exists()
    # On a GPU it is a run's value (planned here without one).
    from stepbench.settings import RunSettings

    cuda = RunSettings.build({"modes": "compile", "compile_mode": "default,reduce-overhead"})
    assert [s.compile_mode for s in cuda.resolved("cuda").plan()] == ["default",
                                                                       "reduce-overhead"] * 2
    # SSH hosts with --device auto: each host's own device decides, once it is known there.
    from stepbench.errors import UserError
    from stepbench.execute.hosts.fleet import planned

    hosts = RunSettings.build({"host": ["alpha"], "modes": "compile",
                               "compile_mode": "reduce-overhead"})
    assert [s.compile_mode for s in planned(hosts, "cuda")[1]] == ["reduce-overhead"] * 2
    assert hosts.resolved("cpu").device == "cpu"        # the hosts' check before the run
    with pytest.raises(UserError) as caught:
        planned(hosts, "cpu")                           # a host that has no GPU
    assert names(str(caught.value), "--compile-mode reduce-overhead", "--device cuda")
    # tune never searches it on the CPU, whatever values the registry lists there.
    import dataclasses

    from stepbench.axes import axis

    listed = dataclasses.replace(axis("compile_mode"),
                                 tune_values={"cpu": ("default", "reduce-overhead")})
    kept, notes = listed.searched("cpu")
    assert kept == ["default"] and names(notes[0], "reduce-overhead", "not tried")


def test_a_missing_plan_file_says_so(capsys, tmp_path):
    assert main(["run", "--plan", str(tmp_path / "none.toml")]) == 2
    assert names(capsys.readouterr().err, "plan", str(tmp_path / "none.toml"))


@pytest.mark.slow
def test_the_plan_runs_its_setups_and_the_loss_guard_passes_them(plan_file, tmp_path):
    # The study with one batch size (its expansion over both is checked above, without running):
    # two real setups, the eager-attention one checked against the SDPA reference.
    out = tmp_path / "results.jsonl"
    proc = run_cli("run", "--plan", plan_file(STUDY.replace("batch = [1, 2]", "batch = [2]")),
                   "--out", out, "--format", "json", check_json=True)
    ran = [(r["setup"]["name"], r["setup"]["batch"], r["status"]) for r in proc.records]
    assert ran == [("eager+sdpa", 2, "ok"), ("eager+eager", 2, "ok")]
    assert all((r["setup"]["steps"], r["setup"]["warmup"]) == (2, 1) for r in proc.records)
    verdicts = loss_verdicts(ResultsFile(out).read())
    assert sorted(v.status for v in verdicts.values()) == [OK, REFERENCE]
    assert all(v.steps == 4 for v in verdicts.values() if v.status == OK)
