"""`stepbench run --host`: the tiny CPU matrix run "remotely" through a real OpenSSH server on
127.0.0.1 (tests/sshd.py) for two host aliases at once, into one results file; resume; hosts that
cannot be reached or verified. The "remote" Python is this one: the run installs its own
stepbench into an environment there that uses this Python's torch, as it would on a GPU host.
"""

import json
import re
import sys
from pathlib import Path

import pytest

from conftest import read_jsonl, run_cli
from says import lines_naming, names, process_lines
from stepbench.cli import main
from stepbench.errors import UserError
from stepbench.execute.hosts.ssh import parse_host, quote_command
from stepbench.settings import read_hosts_file

QWEN = str(Path(__file__).parent / "data" / "tiny-qwen2")
# Eager only, 1 warm-up and 2 timed steps: the remote path, not the measurement, is under test.
TINY = ["--modes", "eager", "--attn", "sdpa,eager", "--seq", "64", "--warmup", "1", "--steps", "2",
        "--repeats", "1"]


def remote(sshd, remote_dir, *hosts, python=sys.executable):
    return [a for h in hosts for a in ("--host", h)] + [
        "--ssh-config", sshd.config, "--remote-python", python, "--remote-dir", remote_dir]


@pytest.mark.slow
def test_two_hosts_run_at_once_into_one_file_tagged_and_resume(sshd, tmp_path):
    out = tmp_path / "results.jsonl"
    # Spaces, $ and quotes in a value that reaches the remote shell: created literally.
    remote_dir = tmp_path / "remote dir $HOME 'q'"
    # No --device: each host works out its own (the CPU here). --model: the config is copied.
    command = ["run", *remote(sshd, remote_dir, "alpha", "beta", "closed"), "--model", QWEN, *TINY,
               "--out", out]
    proc = run_cli(*command, "--format", "json", timeout=300)
    assert proc.returncode == 1, proc.stderr      # one host could not run
    records = json.loads(proc.stdout)
    assert [(r["host"], r["setup"]["name"]) for r in records] == [
        ("alpha", "eager+sdpa"), ("alpha", "eager+eager"),
        ("beta", "eager+sdpa"), ("beta", "eager+eager")]
    for r in records:
        assert r["status"] == "ok", r["error"]
        assert r["setup"]["model"] == QWEN and r["setup"]["device"] == "cpu"
        assert len(r["step_times_ms"]) == 2 and len(r["losses"]) == 1 + 1 + 2
        assert 6.0 < r["loss_first"] < 8.0          # the Qwen2 config's vocabulary: ln(1024)
        assert r["machine"]["gpu"] == "cpu" and r["machine"]["hostname"]
        assert r["software"]["stepbench"] and r["software"]["torch"]
        # Forked by the host's own process server (hostside serve), as a local run's are.
        assert r["placement"]["start"] == "server", proc.stderr
    assert any(line.startswith("stepbench: alpha: ") and "process server" in line
               for line in proc.stderr.splitlines())
    assert len({r["run_id"] for r in records}) == 1
    # Each record was appended as it finished (finish order), and the file holds them all.
    assert sorted(map(json.dumps, read_jsonl(out))) == sorted(map(json.dumps, records))
    assert lines_naming(proc.stderr, "stepbench: alpha:", "CPU")
    closed = [line for line in proc.stderr.splitlines() if "host closed" in line]
    # The golden of a host's one line, word for word.
    assert closed == [f"stepbench run: host closed: cannot connect to 127.0.0.1 port "
                      f"{closed[0].split(' port ')[1].split()[0]} (connection refused); check "
                      "the name and that sshd runs there"]
    # The quoted folder exists as named; the model config went there; the work folder is gone.
    assert (remote_dir / "envs").is_dir()
    [config] = (remote_dir / "models").glob("*/config.json")
    assert config.read_text() == (Path(QWEN) / "config.json").read_text()
    assert list((remote_dir / "runs").iterdir()) == []

    # The report keeps the hosts apart (same GPU name, two machines) and names them; machines
    # come in the file's order, which is the order the hosts finished in.
    report = run_cli("report", out, "--format", "json")
    rows = json.loads(report.stdout)["rows"]
    cpu = read_jsonl(out)[0]["machine"]      # both hosts are this machine
    alpha, beta = (f"CPU ({cpu['cpu']}, {cpu['cpu_count']} cores, {h})" for h in ("alpha", "beta"))
    assert sorted((r["gpu"], r["host"], r["setup"], r["repeats"]) for r in rows) == [
        (alpha, "alpha", "eager+eager", 1), (alpha, "alpha", "eager+sdpa", 1),
        (beta, "beta", "eager+eager", 1), (beta, "beta", "eager+sdpa", 1)]
    assert [r["setup"] for r in rows] == ["eager+sdpa", "eager+eager"] * 2
    assert all(r["gpu_name"] == "cpu" for r in rows)

    # The same command again resumes per host: nothing runs, nothing is appended.
    before = out.read_bytes()
    again = run_cli(*command[:command.index("closed") - 1], *command[command.index("closed") + 1:],
                    timeout=300)
    assert again.returncode == 0, again.stderr
    assert len(lines_naming(again.stderr, "(ok)", "skipped")) == 4
    # Numbered within each host's plan, as a local run's are.
    assert re.search(r"stepbench: alpha: \[\d/2\] eager\+sdpa batch 4 seq 64: already in the "
                     r"results file", again.stderr), again.stderr
    assert all("skipped" in line for line in process_lines(again.stderr))    # none started
    assert out.read_bytes() == before
    lines = again.stdout.splitlines()
    assert names(lines[0], "tiny-qwen2", "bf16", "2 machines")
    # run's own table lists the hosts in the order named.
    table = [line.strip() for line in lines if "+" in line]
    assert [next((h, line[len(h):].split()[0]) for h in (alpha, beta) if line.startswith(h))
            for line in table] == [
        (alpha, "eager+sdpa"), (alpha, "eager+eager"), (beta, "eager+sdpa"), (beta, "eager+eager")]


@pytest.mark.slow
def test_hosts_that_cannot_be_trusted_or_logged_into_each_get_one_line(sshd, tmp_path):
    out = tmp_path / "r.jsonl"
    proc = run_cli("run", *remote(sshd, tmp_path / "rd", "stranger", "refused", "trusting"),
                   *TINY, "--out", out, timeout=120)
    assert proc.returncode == 1
    lines = {line.split()[3].rstrip(":"): line for line in proc.stderr.splitlines()
             if line.startswith("stepbench run: host ")}
    # what failed and the fix: the unknown key and the command that accepts it; the address
    # that refused every key and the file that grants one; the setting that turns checking off
    assert names(lines["stranger"], "host key", "`ssh stranger`")
    assert names(lines["refused"], f"127.0.0.1 port {sshd.port}", "key", "authorized_keys")
    assert names(lines["trusting"], "UserKnownHostsFile none")
    assert len(lines) == 3 and proc.stdout == "" and out.read_text() == ""
    assert not (tmp_path / "rd").exists()       # nothing ran there


def test_host_names_files_and_quoting():
    assert parse_host("gpu-a") == parse_host("gpu-a")
    assert (parse_host("alice@10.0.0.5:2222").user, parse_host("alice@10.0.0.5:2222").port) == \
        ("alice", 2222)
    spec = parse_host("bob@[fe80::1]:22")
    assert (spec.name, spec.host, spec.user, spec.port) == ("bob@[fe80::1]:22", "fe80::1", "bob", 22)
    assert parse_host("gpu-b").port is None and parse_host("gpu-b").user is None
    for bad in ("", "gpu:99999", "gpu:x", "-oProxyCommand=x", "a b", "@gpu"):
        with pytest.raises(UserError, match="is not a host"):
            parse_host(bad)
    # Every value is quoted; a ~/ program stays expandable; the setup code runs first.
    assert quote_command(["~/venv/bin/python", "-c", "print('$HOME; rm -rf /')"]) == \
        """exec "$HOME"/venv/bin/python -c 'print('"'"'$HOME; rm -rf /'"'"')'"""
    assert quote_command(["python3", "-V"], "module load cuda") == \
        "{ module load cuda\n} && exec python3 -V"


def test_a_lost_connection_is_the_hosts_one_line():
    """What the host's line says when the connection goes while a setup runs (test_remote_stops
    loses one for real and checks the facts; here, its golden). Nothing is recorded for it."""
    from stepbench.execute.hosts.ssh import SSHExecutor, _Exit
    from stepbench.execute.protocol import Job
    from stepbench.settings.run import Remote
    from stepbench.setup import Setup

    class Gone:
        def call(self, coro, timeout=None):
            coro.close()                  # the remote command never ran: the host is gone
            return _Exit(lost="the connection closed")

    host = SSHExecutor(parse_host("alpha"), Gone(), Remote())
    host.info = {"models": {}, "python": "python3"}
    setup = Setup(model="llama-tiny", mode="eager", attn="sdpa", batch=48, seq=64, device="cpu")
    outcome = host.run(Job(setup), "alpha", 60.0, lambda message: None)
    assert outcome.stopped and host.running is None
    # The golden of a host's lost-connection line, word for word.
    assert host.lost == ("lost the connection while eager+sdpa batch 48 seq 64 ran (the "
                         "connection closed)")
    # A factory's setups that differ only in --param: the line names which one was running.
    mlp = Setup(model="nets/mlp.py:make", mode="eager", attn="sdpa", batch=2, seq=1, device="cpu",
                params="width=16")
    host.lost = None                  # (a lost host runs nothing more)
    host.run(Job(mlp), "alpha", 60.0, lambda message: None)
    assert names(host.lost, "eager batch 2 width=16 ran")


def test_hosts_file(tmp_path):
    hosts = tmp_path / "hosts"
    hosts.write_text("# the lab's GPUs\ngpu-a\n\n  alice@gpu-b:2222  # the new one\n")
    assert read_hosts_file(hosts) == ["gpu-a", "alice@gpu-b:2222"]
    hosts.write_text("# nothing\n")
    with pytest.raises(UserError, match="names no host"):
        read_hosts_file(hosts)


@pytest.mark.parametrize("flags, said", [
    (["--host", "a", "--host", "a"], "host 'a' is given twice"),
    (["--host", "a:0"], "--host 'a:0' is not a host"),
    (["--host", "a", "--ssh-config", "/nonexistent/config"], "SSH config /nonexistent/config not found"),
    (["--hosts-file", "/nonexistent/hosts"], "cannot read hosts file /nonexistent/hosts"),
    (["--host", "a", "--attn", "sdp"], "unknown attention 'sdp'"),
])
def test_bad_remote_flags_fail_before_any_host_is_contacted(tmp_path, capsys, flags, said):
    assert main(["run", *flags, "--out", str(tmp_path / "r.jsonl")]) == 2
    err = capsys.readouterr().err
    assert said in err and len(err.strip().splitlines()) == 1, err


def test_without_asyncssh_the_error_names_the_extra(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "asyncssh", None)      # as if it were not installed
    assert main(["run", "--host", "gpu-a", "--out", str(tmp_path / "r.jsonl")]) == 2
    assert names(capsys.readouterr().err, "'stepbench[fleet]'", "asyncssh")


@pytest.mark.slow
def test_a_remote_python_that_is_not_there_is_one_line(sshd, tmp_path):
    proc = run_cli("run", *remote(sshd, tmp_path / "rd", "alpha", python="/nonexistent/python3"),
                   *TINY, "--out", tmp_path / "r.jsonl", timeout=120)
    assert proc.returncode == 1
    [line] = [line for line in proc.stderr.splitlines() if line.startswith("stepbench run:")]
    assert names(line, "host alpha")
    assert names(line, "`/nonexistent/python3`", "127", "--remote-python")


def test_the_report_names_the_host_only_where_one_gpu_ran_on_several(tmp_path, capsys):
    # The post's four GPUs, with the H100's records run twice, on hosts h100-a and h100-b (the
    # second 10% slower): those rows keep apart and name their host; the others are as before.
    post = Path(__file__).parent / "data" / "post"
    for path in sorted(post.glob("*.jsonl")):
        (tmp_path / path.name).write_text(path.read_text())
    h100 = read_jsonl(post / "4-h100.jsonl")
    slower = [dict(r, host="h100-b", step_ms=r["step_ms"] and r["step_ms"] * 1.1,
                   tokens_per_s=r["tokens_per_s"] and r["tokens_per_s"] / 1.1) for r in h100]
    (tmp_path / "4-h100.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in [dict(r, host="h100-a") for r in h100] + slower))
    assert main(["report", str(tmp_path), "--prices", str(post / "prices.toml"),
                 "--format", "json"]) == 0
    out = capsys.readouterr()
    assert "no price" not in out.err                  # priced by the GPU's name, host or not
    rows = json.loads(out.out)["rows"]
    machines = list(dict.fromkeys(r["gpu"] for r in rows))
    assert machines == ["NVIDIA GeForce RTX 5090", "NVIDIA L40S", "NVIDIA RTX A6000",
                        "NVIDIA H100 PCIe (h100-a)", "NVIDIA H100 PCIe (h100-b)"]
    a, b = ([r for r in rows if r["host"] == h and r["setup"] == "eager+sdpa"] for h in
            ("h100-a", "h100-b"))
    assert a[0]["repeats"] == b[0]["repeats"] == 1 and a[0]["gpu_name"] == "NVIDIA H100 PCIe"
    assert b[0]["step_ms"] == pytest.approx(a[0]["step_ms"] * 1.1)
    assert a[0]["price_per_hour"] == b[0]["price_per_hour"] is not None
    assert all(r["host"] is None for r in rows if "H100" not in r["gpu"])
