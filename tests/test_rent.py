"""`stepbench run --rent` and `stepbench prices` against a local stand-in of Runcrate's API
(tests/runcrate_standin.py), reached through Runcrate's own SDK; the stand-in's instances are the
real OpenSSH server of tests/sshd.py, so a rented study runs its tiny model for real. Checked:
every instance is deleted whatever happens (done, failed, never ready, refused, Ctrl-C,
SIGTERM), records carry the provider's price, the report prefers a price it is given, the
price file `prices` writes is one `report --prices` reads, and the API key never shows.
"""

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from conftest import SRC, read_jsonl, wait_for
from runcrate_standin import StandIn
from says import names
from stepbench.cli import main
from stepbench.report.prices import load_price_file

pytestmark = pytest.mark.slow     # every test here starts child processes

pytest.importorskip("runcrate")

KEY = "rc_live_" + "T0pS3cret" * 4
TINY = ["--modes", "eager", "--attn", "sdpa", "--seq", "64", "--warmup", "1", "--steps", "2",
        "--repeats", "1"]
POST = Path(__file__).parent / "data" / "post"


@pytest.fixture(scope="module")
def api(sshd):
    standin = StandIn(sshd.port)
    yield standin
    standin.stop()


@pytest.fixture(scope="module")
def remote_dir(tmp_path_factory):
    """One stepbench environment "there" for the module's rented machines (it is installed once)."""
    return tmp_path_factory.mktemp("rented")


def env_for(api) -> dict:
    return dict(os.environ, PYTHONPATH=SRC, RUNCRATE_API_KEY=KEY, RUNCRATE_BASE_URL=api.url)


def stepbench(api, *args, timeout=240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "stepbench", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout, env=env_for(api))


def rent(sshd, remote_dir, *gpus) -> list:
    return [a for g in gpus for a in ("--rent", f"runcrate:{g}")] + [
        "--rent-key", sshd.folder / "user_key", "--remote-python", sys.executable,
        "--remote-dir", remote_dir]


def created(api, gpu: str) -> list[dict]:
    return [i for i in api.instances.values() if i["gpu_type"] == gpu]


def test_a_rented_study_records_prices_and_deletes_every_machine(sshd, api, remote_dir, tmp_path,
                                                                capsys, monkeypatch):
    out = tmp_path / "rented.jsonl"
    proc = stepbench(api, "run", *rent(sshd, remote_dir, "L40S", "H100 PCIe:2"), *TINY,
                     "--out", out, "--format", "json")
    assert proc.returncode == 0, proc.stderr
    records = json.loads(proc.stdout)
    assert sorted((r["host"], r["status"]) for r in records) == [
        ("runcrate:H100 PCIe:2", "ok"), ("runcrate:L40S", "ok")]
    rentals = {r["host"]: r["rental"] for r in records}
    l40s, h100 = created(api, "L40S")[0], created(api, "H100 PCIe")[0]
    assert rentals["runcrate:L40S"] == {"provider": "runcrate", "gpu_type": "L40S", "gpu_count": 1,
                                        "price_per_hour": 0.86, "region": "us-east",
                                        "instance": l40s["id"]}
    assert rentals["runcrate:H100 PCIe:2"]["gpu_count"] == 2
    assert rentals["runcrate:H100 PCIe:2"]["price_per_hour"] == 4.6
    assert read_jsonl(out) == records or sorted(map(json.dumps, read_jsonl(out))) == \
        sorted(map(json.dumps, records))
    # Every machine was created with the safety net and the registered key, and deleted.
    assert api.live() == []
    assert [k["name"].startswith("stepbench-") for k in api.keys] == [True]
    for instance in (l40s, h100):
        assert instance["max_runtime_minutes"] == 120 and instance["ssh_key_id"] == "key_1"
        assert instance["status"] == "terminated"
    err = proc.stderr
    # each machine's key accepted on first contact and pinned, named by its fingerprint
    accepted = [line for line in err.splitlines() if "accepted host key SHA256:" in line]
    assert len(accepted) == 2 and all(names(line, "first contact", "pinned") for line in accepted)
    assert any(line.startswith("stepbench: runcrate:L40S: ") for line in accepted)
    assert any(line.startswith("stepbench: runcrate:L40S: ") and
               names(line, f"deleted instance {l40s['id']}") for line in err.splitlines())
    [cost] = [line for line in err.splitlines() if "rented 2 machines" in line]
    assert cost.startswith("stepbench run: ") and names(cost, "rented 2 machines", "runcrate:L40S")
    assert "at $0.86/h" in cost and "at $4.6/h" in cost and "about $" in cost
    # The key went to the API, and nowhere else.
    assert all(r["auth"] == f"Bearer {KEY}" for r in api.requests)
    assert KEY not in proc.stdout + proc.stderr + out.read_text()
    assert not [f for f in remote_dir.rglob("*") if f.is_file() and KEY.encode() in f.read_bytes()]

    # The report prices each machine at the provider's price, per GPU, and says so; a price
    # given for the GPU's driver name wins; a provider's label is not a GPU name.
    def report(*args) -> tuple[dict | str, str]:
        assert main(["report", *map(str, args)]) == 0
        said = capsys.readouterr()
        return (json.loads(said.out) if "json" in args else said.out), said.err

    rows = {r["host"]: r for r in report(out, "--format", "json")[0]["rows"]}
    assert (rows["runcrate:L40S"]["price_per_hour"], rows["runcrate:L40S"]["price_source"]) == \
        (0.86, "runcrate")
    assert rows["runcrate:H100 PCIe:2"]["price_per_hour"] == pytest.approx(2.3)
    assert rows["runcrate:L40S"]["m_tokens_per_dollar"] is not None
    # the price's source is explained in the report's notes
    assert names(report(out, "--format", "markdown")[0].lower(), "provider", "rented machine",
                 "per gpu")
    given, err = report(out, "--format", "json", "--price", "cpu=1.5", "--price", "L40S=9")
    assert {(r["price_per_hour"], r["price_source"]) for r in given["rows"]} == {(1.5, "given")}
    assert names(err, "'L40S'", "matches no GPU")

    # Today's prices as a price file, which the report reads for the post's four GPUs.
    monkeypatch.setenv("RUNCRATE_API_KEY", KEY)
    monkeypatch.setenv("RUNCRATE_BASE_URL", api.url)
    prices = tmp_path / "prices.toml"
    assert main(["prices", "--from", "runcrate", "--out", str(prices)]) == 0
    assert names(capsys.readouterr().err, f"wrote {prices}", "8 GPU types", "runcrate")
    table = load_price_file(prices)
    assert table["NVIDIA GeForce RTX 5090"] == 0.89 and table["L40S"] == 0.86
    assert table["H100 PCIe"] == 2.3          # the 2-GPU offer is cheaper per GPU
    post, err = report(POST, "--prices", prices, "--format", "json")
    assert "no price" not in err
    assert {r["gpu"]: r["price_per_hour"] for r in post["rows"]} == {
        "NVIDIA GeForce RTX 5090": 0.89, "NVIDIA L40S": 0.86, "NVIDIA RTX A6000": 0.49,
        "NVIDIA H100 PCIe": 2.3}


def test_failed_rentals_are_deleted_each_in_one_line(sshd, api, remote_dir, tmp_path):
    out = tmp_path / "r.jsonl"
    # Never ready (deleted after --rent-timeout), refused at create (nothing to delete), its
    # status refused (deleted); the API's messages echo the key.
    # And one that cannot be deleted: said loudly, in its line and in the cost.
    proc = stepbench(api, "run", *rent(sshd, remote_dir, "NEVER", "POOR", "BROKEN", "STICKY"),
                     *TINY, "--rent-timeout", "2", "--out", out)
    assert proc.returncode == 1, proc.stderr
    lines = {line.split()[3].rstrip(":"): line for line in proc.stderr.splitlines()
             if line.startswith("stepbench run: host ")}
    [never], [broken] = created(api, "NEVER"), created(api, "BROKEN")
    # The golden of a rented machine's failure line, word for word.
    assert lines["runcrate:NEVER"] == (
        f"stepbench run: host runcrate:NEVER: instance {never['id']} was not ready after 2 s "
        "(last status: provisioning); raise --rent-timeout, or try another GPU type")
    # the provider's own words, the key cut to its first 8 characters, the HTTP status
    assert names(lines["runcrate:POOR"], "Not enough credits", f"{KEY[:8]}…", "(HTTP 402)")
    assert KEY not in lines["runcrate:POOR"]
    assert names(lines["runcrate:BROKEN"], "rc_live_…", "(HTTP 403)")
    [sticky] = created(api, "STICKY")
    # The golden of a machine that could not be deleted, word for word.
    assert lines["runcrate:STICKY"].endswith(
        f"; COULD NOT DELETE instance {sticky['id']} (Runcrate delete instance: instance is "
        "locked (HTTP 400)); delete it in the runcrate console now: it bills until its maximum "
        "runtime (120 min) ends")
    [cost] = [line for line in proc.stderr.splitlines() if "runcrate:STICKY 0.1 min" in line]
    assert names(cost, "$0.1/h", "NOT DELETED")
    assert len(lines) == 4
    assert never["status"] == broken["status"] == "terminated" and created(api, "POOR") == []
    assert api.live() == [sticky]
    sticky["status"] = "terminated"     # the console's job, for the next tests
    assert KEY not in proc.stdout + proc.stderr and out.read_text() == ""


@pytest.mark.parametrize("flags, env, said", [
    (["--rent", "runcrate:NOPE"], {}, "runcrate has no GPU type 'NOPE'; choose one of: BROKEN, "
                                      "H100 PCIe, L40S, NEVER, POOR, RTX 5090, RTX A6000, STICKY"),
    (["--rent", "runcrate:L40S:3"], {}, "runcrate has L40S machines of 1 GPU(s), not 3"),
    (["--rent", "aws:L40S"], {}, "unknown provider 'aws'; choose one of: runcrate"),
    (["--rent", "runcrate:L40S"], {"RUNCRATE_API_KEY": ""}, "set RUNCRATE_API_KEY to your API key"),
    (["--rent", "runcrate:L40S"], {"RUNCRATE_API_KEY": "sk-123"}, "is not a Runcrate API key"),
    (["--rent", "runcrate:L40S", "--rent-max-minutes", "2"], {}, "--rent-max-minutes must be from 5"),
])
def test_bad_rentals_fail_before_anything_is_created(sshd, api, tmp_path, monkeypatch, capsys,
                                                      flags, env, said):
    for name, value in {"RUNCRATE_API_KEY": KEY, "RUNCRATE_BASE_URL": api.url, **env}.items():
        monkeypatch.setenv(name, value)
    before = len(api.instances)
    assert main(["run", *flags, "--rent-key", str(sshd.folder / "user_key"),
                 "--out", str(tmp_path / "r.jsonl")]) == 2
    err = capsys.readouterr().err
    assert said in err and len(err.strip().splitlines()) == 1, err
    assert len(api.instances) == before


def test_a_dry_run_contacts_nothing_unless_asked_for_prices(sshd, api, monkeypatch, capsys):
    monkeypatch.setenv("RUNCRATE_API_KEY", KEY)
    monkeypatch.setenv("RUNCRATE_BASE_URL", api.url)
    args = ["run", "--rent", "runcrate:L40S", "--rent", "runcrate:H100 PCIe:2", "--modes",
            "eager", "--rent-key", str(sshd.folder / "user_key"), "--dry-run"]
    before, instances = len(api.requests), len(api.instances)
    assert main(args) == 0
    out = capsys.readouterr()
    assert api.requests[before:] == []
    [said] = [line for line in out.err.splitlines() if line.startswith("stepbench run: dry run")]
    contacted, unchecked = said.split("; not checked: ")
    assert contacted.endswith("contacted nothing") and names(unchecked, "runcrate", "prices")
    # --rent-prices asks the provider (one list of its machines) and creates nothing. The plan
    # of a GPU machine (rented machines have GPUs): the post's model at 2048 tokens.
    assert main([*args, "--rent-prices"]) == 0
    out = capsys.readouterr()
    gpu = [[name, "batch", "4", "x", "2048", "bf16", "llama-468m", "cuda"]
           for name in ("eager+sdpa", "eager+eager")]
    lines = out.out.splitlines()
    assert len(lines) == 6 and [line.split() for line in lines[1:3] + lines[4:]] == gpu + gpu
    # each machine: its provider, GPUs, price and region, and how many setups it runs
    assert names(lines[0], "runcrate:L40S", "1 x L40S", "$0.86/h", "us-east", "2 setups")
    assert names(lines[3], "runcrate:H100 PCIe:2", "2 x H100 PCIe", "$4.6/h", "us-east",
                 "2 setups")
    [said] = [line for line in out.err.splitlines() if line.startswith("stepbench run: dry run")]
    checked, contacted = said.split("; contacted ")
    assert names(checked, "rentals", "SSH key", "prices") and contacted.startswith("only")
    assert [r["path"] for r in api.requests[before:]] == ["/api/v1/instances/types"]
    assert len(api.instances) == instances
    assert main([*args, "--rent-prices", "--rent", "runcrate:NOPE"]) == 2
    assert names(capsys.readouterr().err, "runcrate", "'NOPE'")
    assert main(["prices", "--from", "aws"]) == 2
    assert names(capsys.readouterr().err, "--from 'aws'", "runcrate")


def test_the_host_key_of_first_contact_is_pinned(sshd, api, tmp_path, monkeypatch):
    from stepbench.execute.rent.rentals import Lease, RentSettings, parse_rent, ssh_key
    from stepbench.execute.rent.runcrate import make_provider
    from stepbench.execute.hosts.ssh import EventLoop, HostError, SSHExecutor
    from stepbench.settings import Remote

    monkeypatch.setenv("RUNCRATE_API_KEY", KEY)
    monkeypatch.setenv("RUNCRATE_BASE_URL", api.url)
    provider = make_provider()
    key_path, public = ssh_key(str(sshd.folder / "user_key"))
    loop, notes = EventLoop(), []
    lease = Lease(parse_rent("runcrate:RTX A6000"), provider, provider.register_key(public),
                  RentSettings(key_path, public, ready_timeout_s=30), tmp_path, loop)
    try:
        spec, config, rental = lease.acquire(notes.append)
        assert rental["price_per_hour"] == 0.49 and spec.name == "runcrate:RTX A6000"
        host = SSHExecutor(spec, loop, Remote(ssh_config=config))
        host.connect()          # the pinned key is the server's
        host.close()
        # The machine shows another key later (another machine at the address, or a man in the
        # middle): refused.
        [known] = tmp_path.glob("*.known_hosts")
        other = (sshd.folder / "other_key.pub").read_text().split()
        known.write_text(" ".join(known.read_text().split()[:1] + other[:2]) + "\n")
        with pytest.raises(HostError, match="host key not verified"):
            SSHExecutor(spec, loop, Remote(ssh_config=config)).connect()
    finally:
        assert lease.release() is None
        loop.close()
    assert created(api, "RTX A6000")[0]["status"] == "terminated"
    assert any(names(n, "host key", "SHA256:") for n in notes)


def start(api, args) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "stepbench", "run", *map(str, args)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env_for(api))
    watchdog = threading.Timer(120, proc.kill)      # a hang fails the test, not the suite
    watchdog.daemon = True
    watchdog.start()
    return proc



def test_ctrl_c_and_sigterm_delete_the_machine(sshd, api, remote_dir, tmp_path):
    out = tmp_path / "r.jsonl"
    # Ctrl-C while the machine starts.
    proc = start(api, [*rent(sshd, remote_dir, "NEVER"), *TINY, "--out", out])
    wait_for(proc, "waiting for it to start")
    proc.send_signal(signal.SIGINT)
    rest = proc.stderr.read()
    assert proc.wait(30) == 130, rest
    # The golden of a stopped run on rented machines, word for word.
    assert "interrupted; the running setups were stopped on every host; every rented machine " \
           "was deleted" in rest
    assert "Traceback" not in rest
    assert api.live() == []

    # SIGTERM while stepbench prepares the machine (part 1's tests stop a running setup there).
    proc = start(api, [*rent(sshd, remote_dir, "RTX 5090"), *TINY, "--out", out])
    wait_for(proc, "runcrate:RTX 5090: preparing")
    proc.send_signal(signal.SIGTERM)
    rest = proc.stderr.read()
    assert proc.wait(60) == 143, rest
    [instance] = created(api, "RTX 5090")
    assert any(names(line, "runcrate:RTX 5090", f"deleted instance {instance['id']}")
               for line in rest.splitlines())
    assert any(names(line, "stepbench run", "SIGTERM", "resume") for line in rest.splitlines())
    assert any(names(line, "stepbench run", "rented 1 machine", "runcrate:RTX 5090")
               for line in rest.splitlines())
    assert api.live() == [] and out.read_text() == ""
    assert len(api.keys) == 1           # the key registered once, then found again
