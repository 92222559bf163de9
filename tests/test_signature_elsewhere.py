"""A factory whose package is importable where the setups run but not here
(execute/elsewhere.py): its signature read there and carried back (workload/sigreader.py), or
accepted unchecked where the backend cannot read it, and checked then by the setup's process
(workload/factory.py `check_takes`). The real read over SSH is in test_workload_remote.py."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from says import lines_naming, names
from stepbench.errors import UserError
from stepbench.execute import elsewhere
from stepbench.execute.registry import Backend
from stepbench.settings import RunSettings
from stepbench.workload import sigreader, spec
from stepbench.workload.factory import WorkloadError, check_takes

NET = '''
import functools


def make(pos=0, /, batch_size=2, device="cpu", width=16, *, depth: int = 2, shape=(3, 4), act="relu",
         scale=1e-3, gate=None, wild=float("inf"), needed, **extra):
    return None


def _inner(batch_size, device, flag=True, size=5):
    return None


made = functools.partial(_inner)
'''


@pytest.fixture
def pkg(tmp_path, monkeypatch):
    """rnet.models, importable here (as it would be on the other machine)."""
    (tmp_path / "rnet").mkdir()
    (tmp_path / "rnet" / "__init__.py").write_text("")
    (tmp_path / "rnet" / "models.py").write_text(NET)
    monkeypatch.syspath_prepend(str(tmp_path))
    spec.signature.cache_clear()
    yield tmp_path
    spec.signature.cache_clear()
    spec.forget_elsewhere()
    for name in [n for n in sys.modules if n == "rnet" or n.startswith("rnet.")]:
        del sys.modules[name]


def carried(model: str) -> dict:
    """What the other side prints, among a shell's own lines, read back here."""
    printed = f"motd: welcome\n{sigreader.answer(sigreader.read(model))}\n"
    return sigreader.parse(printed)


@pytest.mark.parametrize("model", ["rnet.models:make", "rnet.models:made"])
def test_a_signature_read_elsewhere_is_the_one_read_here(pkg, model):
    there = spec.from_fields(model, carried(model))
    assert there == spec.signature(model)
    if model.endswith(":make"):
        # Literal defaults keep their type (a tuple stays one); one no literal spells is unread.
        assert dict(there.defaults) == {"pos": 0, "batch_size": 2, "device": "cpu", "width": 16, "depth": 2, "shape": (3, 4),
                                        "act": "relu", "scale": 1e-3, "gate": None}
        assert there.var_keyword and there.required == ("needed",)
        assert "pos" not in there.names             # positional-only: not a keyword
    else:
        assert dict(there.defaults) == {"flag": True, "size": 5}


def test_no_answer_and_an_error_answer_are_told_apart(pkg):
    assert sigreader.parse("bash: python3: command not found\n") is None
    assert sigreader.parse(sigreader.MARK + "{not json") is None
    assert carried("rnet.gone:make")["error"] == "missing"
    assert carried("rnet.models:nothing") == {"error": "nofunc", "defined": ["_inner", "make"],
                                              "path": str(pkg / "rnet" / "models.py")}
    (pkg / "rnet" / "broken.py").write_text("def make(batch_size, device):\n  return (\n")
    assert carried("rnet.broken:make")["error"] == "syntax"


@pytest.mark.parametrize("fields, tokens", [
    ({"error": "missing", "why": ""}, ("rnet.x", "on host alpha", "install it there",
                                       "FILE.py:FUNCTION", "--workload-dir")),
    ({"error": "syntax", "path": "/r/x.py", "line": 3, "msg": "bad"}, ("/r/x.py:3", "host alpha")),
    ({"error": "nofunc", "path": "/r/x.py", "defined": ["build"]}, ("'make'", "build",
                                                                     "host alpha")),
    ({"error": "import", "why": "ImportError: no torch"}, ("rnet.x", "no torch", "host alpha")),
    ({"names": ["device"], "defaults": [], "var_keyword": False, "required": []},
     ("does not take batch_size",)),
])
def test_what_the_other_side_says_is_one_line_naming_the_fix(fields, tokens):
    with pytest.raises(UserError) as caught:
        elsewhere.signature_of("rnet.x:make", "on host alpha", fields)
    assert "\n" not in str(caught.value) and names(str(caught.value), *tokens)


def test_hosts_must_agree_on_a_signature():
    one = {"names": ("batch_size",), "defaults": (), "var_keyword": False, "required": ()}
    assert elsewhere.agreed("p.m:make", [("alpha", one), ("beta", dict(one))]) == \
        ("on hosts alpha and beta", one)
    with pytest.raises(UserError) as caught:
        elsewhere.agreed("p.m:make", [("alpha", one), ("beta", {**one, "names": ()})])
    assert names(str(caught.value), "p.m:make", "alpha", "beta", "same")


class Far(Backend):
    """A remote backend that cannot run a command before its jobs."""

    name, remote = "far", True


def settings(**flags) -> RunSettings:
    return RunSettings.build({"device": "cpu", "modes": "eager", **flags}).resolved("cpu")


def test_a_backend_that_cannot_read_it_takes_it_unchecked_and_says_so_once(pkg):
    said: list[str] = []
    model = "nowhere_pkg.net:make"
    asked = settings(model=model, param=["width=8,16"], attn="eager")
    with elsewhere.factories(Far(), asked, said.append) as away:
        away.read(asked, site=None)
        setups = asked.plan()
    assert [s.params for s in setups] == ["attn=eager;width=8", "attn=eager;width=16"]
    assert len(said) == 1 and lines_naming(said[0], "signature not checked here", "nowhere_pkg.net",
                                           "not importable on this machine",
                                           "where the setups run")
    # Afterwards (and on this machine's own backend) the error that names the fix, unchanged.
    with pytest.raises(spec.NotHere, match="no module 'nowhere_pkg.net' importable here"):
        asked.plan()
    local = Backend()
    with elsewhere.factories(local, asked, said.append) as away:
        assert away.models == []
        with pytest.raises(spec.NotHere):
            asked.plan()


def test_a_signature_read_there_checks_the_plan_as_here(pkg):
    model = "nowhere_pkg.net:make"

    class Reads(Far):
        def reads_signatures(self, settings):
            return "on the far machines"

    class Site:
        def read_signatures(self, settings, models):
            fields = carried("rnet.models:made")
            return {m: ("on the far machines", fields) for m in models}

    said: list[str] = []
    asked = settings(model=model, param=["nope=1"])
    with elsewhere.factories(Reads(), asked, said.append) as away:
        with pytest.raises(UserError) as caught:
            away.read(asked, Site())
            asked.plan()
    assert names(str(caught.value), "--param nope", model, "flag, size")
    assert lines_naming(said[0], "read the signature", model, "on the far machines")
    with elsewhere.factories(Reads(), settings(model=model), said.append) as away:
        away.dry_run()
    assert lines_naming(said[-1], "dry run", "not checked here", "on the far machines",
                        "before any setup starts")


def test_the_setups_process_checks_a_factory_the_parent_could_not_read(pkg):
    def make(batch_size, device, width=16, *, depth):
        return None

    sig = spec.Signature("m.n:make", **sigreader.of_function(make))
    base = {"batch_size": 2, "device": "cpu"}
    check_takes(sig, {**base, "depth": 2})
    for kwargs, tokens in [({**base, "depth": 2, "nope": 1}, ("--param nope", "width, depth")),
                           (base, ("needs `depth`",)),
                           ({**base, "depth": 2, "attn": "sdpa"}, ("--attn", "`attn`"))]:
        with pytest.raises(WorkloadError) as caught:
            check_takes(sig, kwargs)
        assert names(str(caught.value), "m.n:make", *tokens)
    with pytest.raises(WorkloadError, match="does not take batch_size"):
        check_takes(spec.Signature("m.n:make", **sigreader.of_function(lambda device: None)), base)


def test_dry_runs_say_which_happens(tmp_path, monkeypatch, capsys):
    # (SSH hosts' and rented machines' dry runs: test_workload_remote.py; asyncssh starts a
    # process as it loads.)
    from stepbench.cli import main

    monkeypatch.chdir(tmp_path)
    common = ["run", "--model", "nowhere_pkg.net:make", "--device", "cpu", "--modes", "eager",
              "--dry-run"]
    for engine, flags, where in [("ray", ["--ray", "http://127.0.0.1:1"], "on the Ray cluster"),
                                 ("submitit", ["--slurm"], "in a short Slurm job")]:
        if importlib.util.find_spec(engine) is None:
            continue
        assert main([*common, *flags]) == 0
        assert lines_naming(capsys.readouterr().err, "nowhere_pkg.net", "not checked here",
                            where)
    assert main(common) == 2            # this machine: today's error
    assert lines_naming(capsys.readouterr().err, "no module 'nowhere_pkg.net' importable here")


class Machine:
    """A rented machine's executor, as FirstRead sees it: it answers sigreader's line."""

    def __init__(self, name: str, answers: dict):
        self.host, self.answers, self.asked = name, answers, []

    def run_python(self, source: str, model: str) -> str:
        self.asked.append(model)
        return f"motd\n{self.answers[model]}\n"


def test_rented_machines_read_on_the_first_prepared_the_others_wait_then_agree(pkg):
    import threading

    from stepbench.execute.hosts.firstread import FirstRead
    from stepbench.execute.hosts.ssh import HostStopped

    model = "nowhere_pkg.net:make"
    good = sigreader.answer(sigreader.read("rnet.models:made"))
    stops, said, checked = [], [], []
    first = FirstRead([model], lambda: stops.append(1))
    one, two = Machine("rc:A", {model: good}), Machine("rc:B", {model: good})
    waited = []
    waiting = threading.Thread(target=lambda: waited.append(first.before_plan(
        two, said.append, lambda: False, lambda: "plan of rc:B")))

    def plan_of_a():
        checked.append(spec.signature(model))
        return "plan of rc:A"

    # The first machine's plan is made once, with what was read, and is the one it runs.
    assert first.before_plan(one, said.append, lambda: False, plan_of_a) == "plan of rc:A"
    waiting.start()
    waiting.join(5)
    assert one.asked == two.asked == [model] and not stops and first.refused is None
    assert len(checked) == 1 and checked[0].names == ("batch_size", "device", "flag", "size")
    assert waited == ["plan of rc:B"]
    assert lines_naming(said[0], "read the signature", model, "on rented machine rc:A")
    # A refusal (here the plan's check) stops every machine; the others end as stopped.
    refusing = FirstRead([model], lambda: stops.append(1))

    def bad_param():
        raise UserError("--param width: takes no parameter 'width'")

    with pytest.raises(HostStopped):
        refusing.before_plan(Machine("rc:A", {model: good}), said.append, lambda: False,
                             bad_param)
    assert stops == [1] and names(str(refusing.refused), "--param width")
    with pytest.raises(HostStopped):
        refusing.before_plan(two, said.append, lambda: False, lambda: None)
    # No answer: unchecked, said with the machine's name; a missing module: refused.
    silent = FirstRead([model], lambda: None)
    silent.before_plan(Machine("rc:C", {model: "bash: python: not found"}), said.append,
                       lambda: False, lambda: None)
    assert silent.refused is None and lines_naming(said[-1], "not checked here", "rc:C")
    gone = FirstRead([model], lambda: None)
    with pytest.raises(HostStopped):
        gone.before_plan(Machine("rc:D", {model: sigreader.answer({"error": "missing",
                                                                   "why": ""})}),
                         said.append, lambda: False, lambda: None)
    assert names(str(gone.refused), model, "on rented machine rc:D", "install it there")



def test_each_rented_machine_must_agree_with_the_runs_answer(pkg):
    from stepbench.execute.hosts.firstread import FirstRead

    model = "nowhere_pkg.net:make"
    good = sigreader.answer(sigreader.read("rnet.models:made"))
    other = sigreader.answer(sigreader.read("rnet.models:make"))
    missing = sigreader.answer({"error": "missing", "why": ""})
    stops, said = [], []
    first = FirstRead([model], lambda: stops.append(1))
    assert first.before_plan(Machine("rc:A", {model: good}), said.append, lambda: False,
                             lambda: "A") == "A"
    # Another version, or no module there: that machine fails in one line naming it, its plan
    # never made; the run goes on (nothing stopped).
    for name, answer in (("rc:B", other), ("rc:C", missing)):
        made = []
        with pytest.raises(UserError) as caught:
            first.before_plan(Machine(name, {model: answer}), said.append, lambda: False,
                              lambda: made.append(name))
        assert names(str(caught.value), model, "rc:A", name) and not made and not stops
        assert len(str(caught.value).splitlines()) == 1
    assert first.before_plan(Machine("rc:D", {model: good}), said.append, lambda: False,
                             lambda: "D") == "D"
    # No answer on a later machine: said with its name; its setups' processes check.
    assert first.before_plan(Machine("rc:E", {model: "bash: python: not found"}), said.append,
                             lambda: False, lambda: "E") == "E"
    assert lines_naming(said[-1], model, "not read on rc:E")
    # With SSH hosts, their answer is the run's: the first rented machine agrees with it too.
    hosts = FirstRead([], lambda: stops.append(1), {model: ("alpha", sigreader.parse(good))})
    with pytest.raises(UserError) as caught:
        hosts.before_plan(Machine("rc:F", {model: other}), said.append, lambda: False,
                          lambda: "F")
    assert names(str(caught.value), model, "alpha", "rc:F") and not stops
    assert hosts.before_plan(Machine("rc:G", {model: good}), said.append, lambda: False,
                             lambda: "G") == "G"
