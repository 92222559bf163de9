"""`run --dry-run` with SSH hosts and rented machines: what each would run, after the checks that
need no other machine, with nothing contacted (no provider made, no SSH connection, no socket),
and one line saying what was not checked. tests/test_rent.py asks a stand-in provider for prices
with --rent-prices."""

import json
import socket

import pytest

from stepbench.cli import main
from says import lines_naming, names, user_error

asyncssh = pytest.importorskip("asyncssh")


@pytest.fixture
def offline(monkeypatch):
    """Anything that would contact another machine fails the test."""
    from stepbench.execute.rent import rentals as rent

    def refuse(*args, **kwargs):
        raise AssertionError("a dry run contacted something")

    monkeypatch.setattr(rent, "provider", refuse)
    monkeypatch.setattr(asyncssh, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.delenv("RUNCRATE_API_KEY", raising=False)


@pytest.fixture
def key(tmp_path):
    path = tmp_path / "id_ed25519"
    asyncssh.generate_private_key("ssh-ed25519").write_private_key(str(path))
    return path


def dry_run(capsys, *args) -> tuple[int, str, str]:
    code = main(["run", *map(str, args), "--dry-run"])
    said = capsys.readouterr()
    return code, said.out, said.err


def test_hosts_and_rentals_list_their_setups_and_what_was_not_checked(offline, key, tmp_path,
                                                                      capsys):
    hosts = tmp_path / "hosts.txt"
    hosts.write_text("# the lab\nbeta:2200\n")
    config = tmp_path / "ssh.conf"
    config.write_text("Host alpha beta\n  HostName 10.0.0.7\n")
    code, out, err = dry_run(capsys, "--host", "alice@alpha", "--hosts-file", hosts,
                             "--ssh-config", config, "--rent", "runcrate:L40S", "--rent",
                             "runcrate:H100 PCIe:2", "--rent-key", key, "--modes", "eager")
    assert code == 0, err
    gpu = ["  eager+sdpa  batch 4 x 2048  bf16  llama-468m  cuda",
           "  eager+eager  batch 4 x 2048  bf16  llama-468m  cuda"]
    # The goldens of a dry run's plan per machine and its two notes, word for word.
    assert out.splitlines() == [
        "host alice@alpha (SSH; a GPU's defaults): 2 setups", *gpu,
        "host beta:2200 (SSH; a GPU's defaults): 2 setups", *gpu,
        "rented runcrate:L40S (1 x L40S from runcrate): 2 setups", *gpu,
        "rented runcrate:H100 PCIe:2 (2 x H100 PCIe from runcrate): 2 setups", *gpu]
    lines = err.strip().splitlines()
    assert lines[0] == ("stepbench run: each machine runs the defaults of its own device; shown: "
                        "a GPU's (a host without one runs the CPU's: --device cpu --dry-run lists "
                        "them)")
    assert lines[-1] == (
        f"stepbench run: dry run: checked the host names, the hosts file {hosts}, the SSH config "
        f"file {config}, the rentals and their providers, the SSH key {key}; contacted nothing; "
        "not checked: that the hosts answer (their SSH config entries, keys and host keys) and "
        "what GPU and Python they have; runcrate's GPU types, counts and prices now, and "
        "RUNCRATE_API_KEY (--rent-prices asks, creating nothing)")
    assert len(lines) == 2


def test_json_is_one_object_per_host_and_rental_with_its_setups(offline, key, capsys):
    code, out, err = dry_run(capsys, "--host", "alpha", "--rent", "runcrate:L40S", "--rent-key",
                             key, "--modes", "eager", "--attn", "sdpa", "--device", "cpu",
                             "--format", "json")
    assert code == 0, err
    alpha, l40s = json.loads(out)
    assert {k: alpha[k] for k in ("host", "via", "address", "user", "port", "device",
                                  "defaults_of")} == {
        "host": "alpha", "via": "ssh", "address": "alpha", "user": None, "port": None,
        "device": "cpu", "defaults_of": "cpu"}
    assert {k: l40s[k] for k in ("host", "via", "provider", "gpu_type", "gpu_count",
                                 "price_per_hour")} == {
        "host": "runcrate:L40S", "via": "rent", "provider": "runcrate", "gpu_type": "L40S",
        "gpu_count": 1, "price_per_hour": None}
    for machine in (alpha, l40s):
        assert [(s["name"], s["model"], s["seq"], s["device"]) for s in machine["setups"]] == [
            ("eager+sdpa", "llama-tiny", 256, "cpu")]
    # --device given: every machine runs that device's defaults, and nothing more is said.
    assert "each machine runs the defaults" not in err
    assert names(err.strip().splitlines()[-1], "dry run", "checked", "contacted nothing")


@pytest.mark.parametrize("args, said", [
    (["--host=-oProxyCommand=x"], "--host '-oProxyCommand=x' is not a host"),
    (["--host", "a:99999"], "--host 'a:99999' is not a host"),
    (["--hosts-file", "{tmp}/none.txt"], "cannot read hosts file"),
    (["--host", "a", "--ssh-config", "{tmp}/none.conf"], "SSH config {tmp}/none.conf not found"),
    (["--rent", "runcrate"], "--rent 'runcrate' is not a rental"),
    (["--rent", "aws:L40S"], "unknown provider 'aws'; choose one of: runcrate"),
    (["--rent", "runcrate:L40S", "--rent", "runcrate:L40S"], "is given twice"),
    (["--rent", "runcrate:L40S", "--rent-key", "{tmp}/none"], "no SSH key at {tmp}/none"),
    (["--rent", "runcrate:L40S", "--rent-key", "{tmp}/garbage"], "cannot use SSH key"),
])
def test_what_can_be_checked_offline_is_checked(offline, key, tmp_path, capsys, args, said):
    (tmp_path / "garbage").write_text("not a key\n")
    args = [a.format(tmp=tmp_path) for a in args]
    if "--rent-key" not in args and any(a.startswith("--rent") for a in args):
        args += ["--rent-key", str(key)]
    code, out, err = dry_run(capsys, *args)
    assert code == 2 and said.format(tmp=tmp_path) in err, err
    assert out == "" and len(err.strip().splitlines()) == 1


def test_prices_are_asked_for_only_with_rent_prices_and_a_dry_run(key, capsys):
    for args in (["--rent", "runcrate:L40S", "--rent-key", str(key), "--rent-prices"],
                 ["--host", "a", "--rent-prices", "--dry-run"]):
        assert main(["run", *args]) == 2
        assert names(capsys.readouterr().err, "--rent-prices", "--rent", "--dry-run")
        assert user_error(["run", *args]).kind == "conflict"


def test_a_factory_says_what_would_travel(offline, key, tmp_path, monkeypatch, capsys):
    (tmp_path / "nets").mkdir()
    (tmp_path / "nets" / "net.py").write_text("import helper\n\n\ndef make(batch_size, device):"
                                              "\n    ...\n")
    (tmp_path / "nets" / "helper.py").write_text("WIDTH = 4\n")
    monkeypatch.chdir(tmp_path)
    args = ["--host", "alpha", "--rent", "runcrate:L40S", "--rent-key", key, "--device", "cpu",
            "--modes", "eager", "--model", "nets/net.py:make"]
    # The file alone would leave its import behind: refused, naming the fix.
    code, out, err = dry_run(capsys, *args)
    assert code == 2 and lines_naming(err, "imports helper", "--workload-dir nets")
    code, out, err = dry_run(capsys, *args, "--workload-dir", "nets", "--remote-dir", "/srv/sb")
    assert code == 0, err
    size = sum(p.stat().st_size for p in (tmp_path / "nets").iterdir())
    assert names(err, f"nets (2 files, {size} bytes)", "/srv/sb/workloads/")   # not "0 KiB"
    assert out.splitlines()[0] == "host alpha (SSH; --device cpu): 1 setup"
    code, out, err = dry_run(capsys, *args, "--workload-dir", "nets", "--format", "json")
    for machine in json.loads(out):
        assert machine["carries"] == {"paths": ["nets"], "files": 2, "bytes": sum(
            p.stat().st_size for p in (tmp_path / "nets").iterdir())}
    assert names(err, "~/.cache/stepbench/workloads/")
    # A preset carries nothing.
    code, out, err = dry_run(capsys, "--host", "alpha", "--modes", "eager", "--format", "json")
    assert json.loads(out)[0]["carries"] is None and "is sent" not in err
