"""Each setting is declared once (stepbench.settings: a dataclass field and its metadata): run's
and tune's flags, the plan file's keys, the checks and docs/cli.md's flag table all come from
the declarations. A test adds a setting, and a backend, in a subclass and finds them everywhere;
docs/cli.md's table must be the one the declarations make."""

import dataclasses
import json
import re
from dataclasses import dataclass

import pytest

from stepbench.axes import AXES
from stepbench.cli import doc, main
from stepbench.cli.base import Parser, given
from stepbench.cli.flags import add_settings
from stepbench.errors import UserError
from says import names
from stepbench.plan import read_plan
from stepbench.settings import (Backend, Device, Objective, RunSettings, Start, TuneSettings,
                                declared, setting)


def test_docs_cli_md_has_the_flag_table_the_declarations_make():
    # On failure: python -m stepbench.cli.doc --write
    assert doc.written(doc.DOC.read_text()) == doc.table()
    assert doc.main(["--check"]) == 0


def test_the_plan_files_section_names_every_plan_key():
    from stepbench.plan import _axes, _settings

    text = doc.DOC.read_text().split("### Plan files")[1].split("```toml")[0]
    named = set(re.findall(r"`([a-z_]+)", text))
    keys = {a.key for a in _axes().values()} | set(_settings())
    assert keys - named == set(), "docs/cli.md's Plan files section misses these keys"


def test_every_flag_of_run_is_declared_once():
    dests = [a.dest for a in doc.run_parser()._actions if a.option_strings and a.dest != "help"]
    declared_keys = [s.dest for s in declared(RunSettings)]
    axis_keys = [a.key for a in AXES if a.name != "device"]
    assert sorted(dests) == sorted(["plan", *axis_keys, *declared_keys])
    assert len(set(declared_keys)) == len(declared_keys)
    # Every field of the settings is a declared setting, a part of them, or what build fills.
    for cls, own in ((RunSettings, {"values", "origin"}), (TuneSettings, {"values", "space"})):
        made = {s.path[0] for s in declared(cls)}
        assert {f.name for f in dataclasses.fields(cls)} == made | own, cls


def test_run_and_tune_share_the_common_settings_with_their_own_defaults():
    run = RunSettings.build({})
    tune = TuneSettings.build({"budget": "10m"})
    common = [s.dest for s in declared(TuneSettings)][:-2]
    assert common == ["device", "start", "pin_cpus", "repeats", "timeout", "compile_cache", "out", "format",
                      "ray", "slurm", "gpu_type"]
    assert (run.repeats, tune.repeats) == (None, 3)
    assert (str(run.out), str(tune.out)) == ("stepbench-results.jsonl", "stepbench-tune.jsonl")
    assert tune.budget_s == 600 and tune.objective is Objective.TOKENS


def test_closed_sets_are_enums_that_print_and_dump_as_their_values(tmp_path):
    settings = RunSettings.build({"start": "fresh", "device": "cpu"})
    assert settings.start is Start.FRESH and settings.device is Device.CPU
    assert settings.start == "fresh" and f"--start {settings.start}" == "--start fresh"
    assert json.dumps({"start": settings.start, "device": settings.device}) == \
        '{"start": "fresh", "device": "cpu"}'
    resolved = RunSettings.build({}).resolved("cpu")
    assert resolved.device is Device.CPU and type(resolved.values["device"]) is str
    assert TuneSettings.build({"budget": "1m", "objective": "fit",
                               "memory_limit_gb": 8}).objective is Objective.FIT


def test_a_bad_value_of_an_enum_setting_in_a_plan_names_the_plan_and_the_choices(tmp_path):
    path = tmp_path / "p.toml"
    path.write_text('start = "forked"\n')
    with pytest.raises(UserError) as info:
        RunSettings.build({}, read_plan(path))
    assert info.value.kind == "unknown_value"
    assert names(str(info.value), f"plan {path}", "start", "server, fresh", "'forked'")


# ---------------------------------------------------------------- a setting added in one place

TOY = Backend("toy", "Toy", "--toy NAME", cluster=True)


@dataclass(frozen=True, kw_only=True)
class Extended(RunSettings):
    """RunSettings with one more setting and one more backend, each one declaration."""

    warp: int = setting(3, "how far each step warps", plan=True, least=1, metavar="N",
                        doc="the warp of each step (`--warp 1`: none)")
    toy: str | None = setting(None, "run each setup on this toy cluster", metavar="NAME",
                              backend=TOY, group="cluster")


def extended_args(*argv):
    sub = Parser(prog="stepbench").add_subparsers()
    from stepbench.cli import run

    run.add(sub, Extended)
    return sub.choices["run"].parse_args(list(argv))


def test_a_new_declaration_has_its_flag_plan_key_check_and_doc_row(tmp_path):
    # Its flag, with its help and default:
    settings = Extended.build(given(extended_args("--warp", "5", "--device", "cpu")))
    assert settings.warp == 5 and Extended.build({}).warp == 3
    with pytest.raises(UserError, match=r"^--warp must be an integer >= 1, got 0$"):
        Extended.build(given(extended_args("--warp", "0")))
    # Its plan key, checked and named as the plan spells it:
    path = tmp_path / "p.toml"
    path.write_text("warp = 7\n")
    assert Extended.build({}, read_plan(path, Extended)).warp == 7
    path.write_text("warp = 0\n")
    with pytest.raises(UserError, match=r"^plan .*p.toml: warp must be an integer >= 1, got 0$"):
        Extended.build({}, read_plan(path, Extended))
    with pytest.raises(UserError, match="unknown key 'warp'"):
        read_plan(path)         # RunSettings has no such key
    # Its row in the docs' table:
    rows = doc.rows(doc.run_parser(Extended), Extended)
    assert ("`--warp N`", "`3`", "the warp of each step (`--warp 1`: none)") in rows
    assert ("`--toy NAME`", "", "run each setup on this toy cluster") in rows
    assert "--warp" not in doc.table()


def test_a_new_backend_is_checked_with_the_others_by_its_declaration():
    settings = Extended.build({"toy": "t1"})
    assert settings.backends == ("toy",) and settings.cluster == "--toy"
    with pytest.raises(UserError) as info:
        Extended.build({"toy": "t1", "ray": "auto"})
    assert info.value.kind == "conflict" and names(str(info.value), "--ray", "--toy")
    with pytest.raises(UserError) as info:
        Extended.build({"toy": "t1", "host": ["gpu-a"]})
    assert info.value.kind == "conflict"
    assert names(str(info.value), "--toy", "Toy", "--host", "--hosts-file", "--rent")
    # --gpu-type declares the backends it goes with: ray and slurm, not this one.
    with pytest.raises(UserError, match=r"^--gpu-type chooses a GPU type of a cluster; add "
                                        r"--ray ADDRESS or --slurm \[PARTITION\]"):
        Extended.build({"toy": "t1", "gpu_type": "x"})


def test_the_extended_parser_shows_the_new_flags_in_their_groups(capsys):
    parser = Parser(prog="stepbench run")
    add_settings(parser, Extended)
    text = parser.format_help()
    assert "--warp N" in text and "--toy NAME" in text
    # In the cluster group, after --gpu-type, before the SSH hosts' group.
    assert text.index("a cluster: Ray") < text.index("  --gpu-type NAME") < \
        text.index("  --toy NAME") < text.index("remote machines over SSH")
    with pytest.raises(SystemExit) as info:     # stepbench's own run has no such flag
        main(["run", "--warp", "2"])
    assert info.value.code == 2
    assert names(capsys.readouterr().err, "--warp 2")
