"""A user's factory (`--model FILE.py:FUNCTION`) on the remote backends: what a job carries
(execute/bundle.py) and where it is unpacked (hostprep), fast; and one real tiny run on an SSH host
(tests/sshd.py) and one on a rented machine, of the project in tests/carried.py. Its real runs as
a Ray and a Slurm job are in tests/test_ray.py and tests/test_slurm.py, on the cluster each of
those files starts anyway (a cluster of its own here cost a second start, 20 to 28 s of a worker).
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from carried import FACTORY, MODEL, TINY, one_ok, project, with_src
from conftest import read_jsonl
from says import error_line, lines_naming, names
from stepbench.errors import UserError
from stepbench.execute import bundle as carry
from stepbench.execute.hosts import hostprep


# ---------------------------------------------------------------- what travels (fast)

def test_a_file_travels_alone_at_its_relative_path(tmp_path, monkeypatch):
    (tmp_path / "examples").mkdir()
    (tmp_path / "examples" / "net.py").write_text("def make(batch_size, device): ...\n")
    (tmp_path / "examples" / "other.py").write_text("x = 1\n")
    monkeypatch.chdir(tmp_path)
    found = carry.gather("examples/net.py:make")
    assert found.files == {"examples/net.py": b"def make(batch_size, device): ...\n"}
    assert found.cwd == "."
    # Presets, configs and installed packages carry nothing.
    assert carry.gather("llama-tiny") is None and carry.gather(None) is None
    assert carry.gather("json.decoder:make") is None
    # Several models: each factory file once.
    both = carry.gather(("llama-tiny", "examples/net.py:make", "examples/other.py:make"))
    assert sorted(both.files) == ["examples/net.py", "examples/other.py"]


def test_a_workload_dir_travels_whole_and_a_path_above_the_folder_maps_below_it(
        tmp_path, monkeypatch):
    monkeypatch.chdir(project(tmp_path))
    found = carry.gather(MODEL, "../proj")
    # Not .git, not __pycache__: the code the file imports from.
    assert sorted(found.files) == ["proj/nets/helper.py", "proj/nets/mlp.py"]
    assert found.cwd == carry.CWD
    assert found.sources == (os.path.join("..", "proj"),)
    # Written out, the model's own path resolves from the job's working folder.
    cwd = found.write(tmp_path / "there")
    assert (cwd / "../proj/nets/mlp.py").resolve() == (tmp_path / "there/proj/nets/mlp.py")
    assert (cwd / "../proj/nets/helper.py").read_text() == "WIDTH = 16\n"
    # Without --workload-dir, the file alone (one that imports nothing beside it).
    mlp = tmp_path / "proj" / "nets" / "mlp.py"
    mlp.write_text(mlp.read_text().replace("from helper import WIDTH", "WIDTH = 16"))
    alone = carry.gather(MODEL)
    assert sorted(alone.files) == ["proj/nets/mlp.py"] and alone.cwd == carry.CWD
    assert alone.sha != found.sha
    # The same files, the same archive and name (a host unpacks them once).
    mlp.write_text(FACTORY.format(origin=str((tmp_path / "proj").resolve())))
    assert carry.gather(MODEL, "../proj").archive() == found.archive()
    assert carry.gather(MODEL, "../proj").sha == found.sha


def test_an_absolute_path_or_too_big_a_folder_is_refused_in_one_line(tmp_path, monkeypatch):
    run = project(tmp_path)
    monkeypatch.chdir(run)
    absolute = f"{tmp_path}/proj/nets/mlp.py:make"
    with pytest.raises(UserError, match=r"^--model .*/proj/nets/mlp.py: an absolute path does "
                                        r"not travel to SSH hosts; pass it relative to this "
                                        r"folder"):
        carry.gather(absolute, what="SSH hosts")
    # An absolute --workload-dir is fine: the file's path is the relative one.
    assert carry.gather(MODEL, tmp_path / "proj").sources == (os.path.join("..", "proj"),)
    monkeypatch.setattr(carry, "LIMIT_BYTES", 12)
    with pytest.raises(UserError, match=r"holds 0 MiB \(the largest file: \.\./proj/nets/mlp\.py, "
                                        r"0 MiB\); a job carries at most 0 MiB to the Ray "
                                        r"cluster: pass a --workload-dir with the code alone"):
        carry.gather(MODEL, "../proj", "the Ray cluster")


def test_a_file_that_imports_a_module_beside_it_is_refused_alone_naming_workload_dir(
        tmp_path, monkeypatch):
    # Alone, helper.py would not travel and every setup would fail with "No module named".
    monkeypatch.chdir(project(tmp_path))
    with pytest.raises(UserError) as refused:
        carry.gather(MODEL, what="SSH hosts")
    assert lines_naming(str(refused.value), "../proj/nets/mlp.py", "imports helper",
                        "SSH hosts", "--workload-dir ../proj/nets")
    # With the folder it travels; a package folder beside the file counts, a data folder or an
    # import with a fallback (in a try block) does not.
    assert "proj/nets/helper.py" in carry.gather(MODEL, "../proj/nets").files
    nets = tmp_path / "proj" / "nets"
    (nets / "mlp.py").write_text("try:\n    import helper\nexcept ImportError:\n    pass\n"
                                 "import torch\nfrom data import x\n")
    (nets / "data").mkdir()
    assert sorted(carry.gather(MODEL).files) == ["proj/nets/mlp.py"]
    (nets / "data" / "__init__.py").write_text("x = 1\n")
    with pytest.raises(UserError, match="imports data, which sits beside it"):
        carry.gather(MODEL)


def test_a_module_missing_where_the_setup_runs_names_the_fix_and_stays_unsupported(
        tmp_path, monkeypatch):
    # What a setup's process says on the other machine, where the import fails at the build.
    from stepbench.measure.worker import classify_exception
    from stepbench.workload.loader import load_function

    (tmp_path / "eager.py").write_text("import helper_not_here\n\n\ndef make(batch_size, "
                                       "device): ...\n")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "net.py").write_text("import flash_not_here\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    for model, tokens in [("eager.py:make", ("eager.py", "--workload-dir")),
                          ("pkg_not_here.net:make", ("pkg_not_here.net", "PYTHONPATH")),
                          ("pkg.net:make", ("imported by pkg.net", "install it"))]:
        with pytest.raises(ModuleNotFoundError) as caught:
            load_function(model)
        assert caught.value.name in ("helper_not_here", "pkg_not_here", "flash_not_here")
        status, message = classify_exception(caught.value)
        assert status == "unsupported" and lines_naming(message, "No module named", *tokens,
                                                        "--rerun")


def test_hostprep_unpacks_the_archive_once_and_gives_the_folder_the_path_resolves_in(
        tmp_path, monkeypatch):
    monkeypatch.chdir(project(tmp_path))
    found = carry.gather(MODEL, "../proj")
    base = tmp_path / "remote"
    cwd = hostprep.unpack(str(base), {"sha": found.sha, "cwd": found.cwd}, found.archive())
    assert cwd == str(base / "workloads" / found.sha / carry.CWD)
    assert Path(cwd, "../proj/nets/helper.py").read_text() == "WIDTH = 16\n"
    # Again (a later run, another host alias of the machine): reused as it is.
    assert hostprep.unpack(str(base), {"sha": found.sha, "cwd": found.cwd}, b"") == cwd
    # An archive that climbs out is refused.
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        info = tarfile.TarInfo("../evil.py")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"x"))
    with pytest.raises(hostprep.Failed, match="holds '../evil.py'"):
        hostprep.unpack(str(base), {"sha": "other", "cwd": "."}, buffer.getvalue())
    assert not (base / "evil.py").exists() and not (base / "workloads" / "other").exists()


def test_ray_lets_factories_through_and_still_refuses_a_config(tmp_path, monkeypatch):
    from stepbench.execute.ray.cluster import check_model_files

    monkeypatch.chdir(project(tmp_path))
    check_model_files(MODEL, "../proj")
    check_model_files(["llama-tiny", "json.decoder:make"])
    with pytest.raises(UserError, match="a config file stays on this machine"):
        check_model_files(str(tmp_path / "config.json"))
    with pytest.raises(UserError, match="does not travel to the Ray cluster"):
        check_model_files(f"{tmp_path}/proj/nets/mlp.py:make")


def test_a_ray_dry_run_refuses_what_cannot_travel_as_the_run_would(tmp_path, monkeypatch, capsys):
    pytest.importorskip("ray")
    from stepbench.cli import main

    monkeypatch.chdir(project(tmp_path))
    args = ["run", "--ray", "http://127.0.0.1:1", "--device", "cpu", "--modes", "eager",
            "--model", MODEL, "--dry-run"]
    assert main(args) == 2          # the file alone would leave helper.py behind
    assert lines_naming(capsys.readouterr().err, "imports helper", "--workload-dir ../proj/nets")
    # The workload is read once: the precheck's read is what the dry run says travels.
    reads = []
    monkeypatch.setattr(carry, "gather", lambda *a, real=carry.gather: reads.append(a) or real(*a))
    assert main([*args, "--workload-dir", "../proj"]) == 0
    out, err = capsys.readouterr()
    assert "mlp.py:make" in out
    assert lines_naming(err, "each Ray job is sent ../proj (", "files", "working_dir")
    assert len(reads) == 1


def test_slurm_checks_the_factorys_file_or_folder_is_shared(tmp_path, monkeypatch):
    import stepbench
    from stepbench.execute.slurm import cluster as slurmcluster
    from stepbench.execute.slurm.cluster import Cluster, Node, check_shared, gpus_of

    monkeypatch.chdir(project(tmp_path))
    far = Cluster.__new__(Cluster)
    far.partition, far.what = "gpu", "the Slurm partition gpu"
    far.nodes = [Node("n1", "far.example", "10.0.0.9", gpus_of("(null)"), 8)]
    package = Path(stepbench.__file__).resolve().parent
    out = tmp_path / "shared" / "r.jsonl"
    out.parent.mkdir()
    exports = f"{tmp_path / 'shared'}\t*(rw)\n{Path(sys.prefix).resolve()}\t*(rw)\n{package}\t*(rw)\n"
    monkeypatch.setattr(slurmcluster, "EXPORTS", tmp_path / "etab")
    (tmp_path / "etab").write_text(exports)
    check_shared(far, out, models=["llama-tiny", "json.decoder:make"])   # nothing of the user's
    with pytest.raises(UserError, match=r"^--slurm: the factory's file .*/proj/nets/mlp.py is on "
                                        r"this machine's own disk"):
        check_shared(far, out, models=[MODEL])
    with pytest.raises(UserError, match=r"^--slurm: the workload folder .*/run/\.\./proj is on "):
        check_shared(far, out, models=[MODEL], workload_dir=Path("../proj"))
    (tmp_path / "etab").write_text(exports + f"{tmp_path / 'proj'}\t*(rw)\n")
    check_shared(far, out, models=[MODEL], workload_dir=Path("../proj"))


# ---------------------------------------------------------------- real runs (slow)


@pytest.mark.slow
def test_a_factory_runs_on_an_ssh_host_from_its_carried_folder(sshd, tmp_path, capsys):
    run = project(tmp_path)
    out = tmp_path / "r.jsonl"
    proc = subprocess.run(
        [sys.executable, "-m", "stepbench", "run", "--host", "alpha", "--ssh-config",
         str(sshd.config), "--remote-python", sys.executable, "--remote-dir",
         str(tmp_path / "remote"), "--model", MODEL, "--workload-dir", "../proj", *TINY,
         "--out", str(out), "--format", "json"],
        cwd=run, capture_output=True, text=True, timeout=600, env=with_src())
    assert proc.returncode == 0, proc.stderr
    record = one_ok(json.loads(proc.stdout), "server")
    assert record["host"] == "alpha"
    assert lines_naming(proc.stderr, "alpha:", "../proj", "2 files")
    [unpacked] = (tmp_path / "remote" / "workloads").iterdir()
    assert (unpacked / "proj" / "nets" / "helper.py").exists()
    _a_package_only_the_host_has(sshd, tmp_path, capsys)


REMOTE_NET = FACTORY.replace("from helper import WIDTH", "WIDTH = 16").replace(
    "def make(batch_size, device):", "def make(batch_size, device, *, depth=1):")


def _a_package_only_the_host_has(sshd, tmp_path, capsys):
    """`--model rpkg.net:make`, importable on the host (its PYTHONPATH, as --remote-setup sets
    it), not here: its signature is read there before anything is prepared, in this process."""
    from stepbench.cli import main

    folder = tmp_path / "host-site" / "rpkg"
    folder.mkdir(parents=True)
    (folder / "__init__.py").write_text("")
    (folder / "net.py").write_text(REMOTE_NET.format(origin=""))

    def run(model: str, *flags: str, remote: str = "remote") -> tuple[int, str, str]:
        code = main(["run", "--host", "alpha", "--ssh-config", str(sshd.config),
                     "--remote-python", sys.executable, "--remote-dir", str(tmp_path / remote),
                     "--remote-setup", f"export PYTHONPATH={folder.parent}", "--model", model,
                     *TINY, "--out", str(tmp_path / f"{remote}.jsonl"), "--format", "json",
                     *flags])
        out, err = capsys.readouterr()
        return code, out, err

    code, out, err = run("rpkg.net:make", "--param", "depth=2")
    assert code == 0, err
    [record] = json.loads(out)
    assert record["status"] == "ok" and record["setup"]["params"] == "depth=2"
    assert lines_naming(err, "read the signature of rpkg.net:make", "on host alpha")
    # Refused in one line, exit 2, before anything is prepared on the host.
    for model, flags, tokens in [
            ("rpkg.net:make", ("--param", "width=8"), ("--param width", "rpkg.net:make",
                                                       "depth")),
            ("rpkg.gone:make", (), ("rpkg.gone", "on host alpha", "install it there",
                                    "FILE.py:FUNCTION"))]:
        code, out, err = run(model, *flags, remote="untouched")
        last = err.strip().splitlines()[-1]     # (after the line that says what was read)
        assert code == 2 and error_line(last, "run") and names(last, *tokens), err
        assert not (tmp_path / "untouched").exists()
    code, out, err = run("rpkg.net:make", "--dry-run")
    assert code == 0 and lines_naming(err, "rpkg.net", "not checked here", "on the SSH hosts")


@pytest.mark.slow
def test_a_factory_runs_on_a_rented_machine_from_its_carried_file(sshd, tmp_path, capsys,
                                                                  monkeypatch):
    # A rented machine is an SSH host (the stand-in's instances are tests/sshd.py's server).
    pytest.importorskip("runcrate")
    from runcrate_standin import StandIn

    run = project(tmp_path)
    (run.parent / "proj" / "nets" / "mlp.py").write_text(   # the file alone: no helper beside it
        FACTORY.replace("from helper import WIDTH", "WIDTH = 16").format(
            origin=str((tmp_path / "proj").resolve())))
    api = StandIn(sshd.port)
    try:
        key = "rc_live_" + "T0pS3cret" * 4
        proc = subprocess.run(
            [sys.executable, "-m", "stepbench", "run", "--rent", "runcrate:L40S", "--rent-key",
             str(sshd.folder / "user_key"), "--remote-python", sys.executable, "--remote-dir",
             str(tmp_path / "remote"), "--model", MODEL, *TINY, "--out", str(tmp_path / "r.jsonl"),
             "--format", "json"],
            cwd=run, capture_output=True, text=True, timeout=600,
            env=with_src(RUNCRATE_API_KEY=key, RUNCRATE_BASE_URL=api.url))
        assert proc.returncode == 0, proc.stderr
        record = one_ok(json.loads(proc.stdout))
        assert record["host"] == "runcrate:L40S" and api.live() == []
        assert lines_naming(proc.stderr, "runcrate:L40S:", "../proj/nets/mlp.py", "1 file")
        monkeypatch.setenv("RUNCRATE_API_KEY", key)
        monkeypatch.setenv("RUNCRATE_BASE_URL", api.url)
        _a_package_only_the_rented_machine_has(sshd, api, tmp_path, capsys)
    finally:
        api.stop()


def _a_package_only_the_rented_machine_has(sshd, api, tmp_path, capsys):
    """`--model rpkg.net:make`, importable on the rented machines (--remote-setup), not here:
    read on the first machine prepared, before any setup's job; a refusal deletes them all."""
    from stepbench.cli import main

    folder = tmp_path / "rented-site" / "rpkg"
    folder.mkdir(parents=True)
    (folder / "__init__.py").write_text("")
    (folder / "net.py").write_text(REMOTE_NET.format(origin=""))

    def run(*flags: str, gpus=("L40S",)) -> tuple[int, str, str]:
        rent = [a for gpu in gpus for a in ("--rent", f"runcrate:{gpu}")]
        code = main(["run", *rent, "--rent-key", str(sshd.folder / "user_key"),
                     "--remote-python", sys.executable, "--remote-dir", str(tmp_path / "remote"),
                     "--remote-setup", f"export PYTHONPATH={folder.parent}", "--model",
                     "rpkg.net:make", *TINY, "--out", str(tmp_path / "pkg.jsonl"), "--format",
                     "json", *flags])
        out, err = capsys.readouterr()
        return code, out, err

    code, out, err = run("--param", "depth=2")
    assert code == 0, err
    [record] = json.loads(out)
    assert record["status"] == "ok" and record["setup"]["params"] == "depth=2"
    assert lines_naming(err, "read the signature of rpkg.net:make", "on rented machine "
                        "runcrate:L40S")
    # Refused in one line, exit 2, before any setup's job; every rented machine deleted.
    before = len(api.instances)
    code, out, err = run("--param", "width=8", gpus=("L40S", "RTX 5090"))
    last = err.strip().splitlines()[-1]
    assert code == 2 and error_line(last, "run") and names(last, "--param width", "depth"), err
    assert len(api.instances) == before + 2 and api.live() == []
    assert len(read_jsonl(tmp_path / "pkg.jsonl")) == 1         # nothing measured
    code, out, err = run("--dry-run")
    assert code == 0 and lines_naming(err, "rpkg.net", "not checked here",
                                      "on the first rented machine")
