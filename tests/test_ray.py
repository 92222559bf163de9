"""`run --ray` and `tune --ray` against a real Ray cluster (tests/raynet.py: a head with two fake
GPUs and a second raylet, in a network namespace with loopback only, started once for the file).

The setups are tiny eager CPU setups, real processes in real Ray jobs; the test of GPU placement
runs cuda setups whose processes are short scripts (tests/fakes.py's ProtocolChild) through the
real Runner and Ray executor, since the fake GPUs cannot run a model. The client (stepbench run)
enters the cluster's network namespace only, so it is this test's child and Ctrl-C reaches it.
A user's factory (tests/carried.py) runs here too, as a job with its folder as working_dir.
Skipped, with the reason, where Ray cannot be imported or the namespace cannot be made.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from carried import MODEL, TINY, one_ok, only_the_nodes_have_it, project
from conftest import HOOKS, RAY_POLL_ENV, SMALL, SRC, read_jsonl, resumed_and_timed_out, wait_for, with_hooks
from says import error_line, lines_naming, names

pytestmark = pytest.mark.slow       # every test here starts a Ray cluster's jobs

TESTS = os.path.dirname(os.path.abspath(__file__))


def ray_cli(cluster, *args, timeout=600) -> subprocess.CompletedProcess:
    """`stepbench ARGS` in the cluster's network namespace."""
    return finished(ray_start(cluster, *args), timeout)


def ray_start(cluster, *args) -> subprocess.Popen:
    """`stepbench ARGS` started in the cluster's network namespace (finished(): its end)."""
    return subprocess.Popen(cluster.client_argv([sys.executable, "-m", "stepbench",
                                                 *map(str, args)]),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=client_env())


def finished(proc: subprocess.Popen, timeout=600) -> subprocess.CompletedProcess:
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        proc.kill()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def client_env() -> dict:
    """A client's environment: this stepbench, no token, and tests/hooks with the cluster's
    RAY_POLL_ENV, so that a run waits for its ended jobs' deletion to settle at the pace of the
    test cluster's job manager (0.1 s loops: tests/hooks/stepbench_test_hooks.py), not Ray's
    default second's (about 2 s less at every run's end)."""
    from raynet import POLL_S

    return dict(with_hooks(os.environ), RAY_AUTH_MODE="disabled", **{RAY_POLL_ENV: POLL_S})


def nothing_left(cluster) -> None:
    """No setup's process, torchrun, hostside (a job's, or a process server) or job driver is
    left on the cluster, and no job of ours."""
    for text in ("stepbench.measure", "torch.distributed.run", "stepbench.execute.hosts.hostside",
                 "stepbench.execute.ray"):
        assert cluster.processes(text) == [], text
    assert [j for j in cluster.jobs() if (j["id"] or "").startswith("stepbench-")] == []


# ---------------------------------------------------------------- GPUs

SCRIPTED = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    from fakes import ProtocolChild
    from stepbench.execute.clusters import check_cluster
    from stepbench.execute.ray.cluster import Cluster
    from stepbench.execute.ray.jobs import RayExecutor
    from stepbench.execute.runner import Runner
    from stepbench.record import ResultsFile
    from stepbench.setup import Setup

    address, folder, gpu_type = sys.argv[1:4]
    child = ProtocolChild(Path(folder), sleep_s=1.0, together=2, gpu="fake GPU")

    class Scripted(RayExecutor):
        broken = False      # then a job fails before any setup's process starts

        def command(self, job):     # the scripted child, in torchrun's place too
            return [self.python, "-c", *map(str, child(job))]

        def _entrypoint(self, job, job_id):
            if self.broken:
                return "echo 'no python here' >&2; exit 127"
            return super()._entrypoint(job, job_id)

    cluster = Cluster(address)
    plan = [Setup(model="llama-tiny", mode="eager", attn="sdpa", batch=b, seq=64, device="cuda")
            for b in (1, 2, 3)]
    pair = Setup(model="llama-tiny", mode="eager", attn="sdpa", batch=5, seq=64, device="cuda",
                 parallel="ddp", nproc=2)
    gpus = check_cluster(cluster, "cuda", gpu_type, None, plan + [pair])
    store = ResultsFile(Path(folder) / "r.jsonl")
    # One executor (one run's jobs, deleted while the next runs) for the plan, then --nproc 2,
    # then the broken job, which ends its run.
    executor = Scripted(cluster, "cuda", gpus=gpus, gpu_type=gpu_type, run_id="t0")
    try:
        records = Runner(executor, store, measure_peak=False).run(plan, timeout_s=120)
        print(json.dumps({"gpus": gpus, "records": [r.to_dict() for r in records]}), flush=True)
        # --nproc 2: one job of two GPUs.
        [record] = Runner(executor, ResultsFile(Path(folder) / "pair.jsonl"),
                          measure_peak=False).run([pair], timeout_s=120)
        print(json.dumps(record.to_dict()), flush=True)
        # No GPU type asked: the stored records (of FAKE-GPU) are done; the fourth setup's job
        # fails before its process starts.
        executor.broken, executor.gpu_type = True, None
        records = Runner(executor, store, measure_peak=False).run(
            plan + [Setup(model="llama-tiny", mode="eager", attn="sdpa", batch=4, seq=64,
                          device="cuda")], timeout_s=120)
        print(json.dumps({"lost": executor.lost, "records": len(records)}), flush=True)
    finally:
        executor.close()

    # A rerun resumes: every record is there.
    executor = Scripted(cluster, "cuda", gpus=gpus, gpu_type=gpu_type, run_id="t1")
    try:
        records = Runner(executor, store, measure_peak=False).run(plan, timeout_s=120)
    finally:
        executor.close()
    print(json.dumps({"gpus": gpus, "records": [r.to_dict() for r in records]}), flush=True)
""")


def test_ray_gives_gpus_0_and_1_a_third_waits_a_rerun_resumes_and_nproc_2_gets_both(
        ray_cluster, tmp_path):
    from raynet import GPU_TYPE

    from fakes import ProtocolChild, check_two_gpus_then_a_third_waits

    env = dict(client_env(), PYTHONPATH=os.pathsep.join([HOOKS, TESTS, SRC]))
    proc = subprocess.run(ray_cluster.client_argv(
        [sys.executable, "-c", SCRIPTED, ray_cluster.address, str(tmp_path), GPU_TYPE]),
        capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr
    first, pair, broken, second = (json.loads(line) for line in proc.stdout.splitlines())
    assert first["gpus"] == 2                   # the cluster's GPUs (of the type asked for)
    entries = ProtocolChild(tmp_path).entries()
    log = sorted((e for e in entries if e["batch"] != 5), key=lambda e: e["start"])
    assert len(log) == 3                        # the rerun started no job
    check_two_gpus_then_a_third_waits(log)          # Ray chose the GPUs
    records = first["records"]
    assert [r["setup"]["batch"] for r in records] == [1, 2, 3]
    assert [r["step_ms"] for r in records] == [10.0, 20.0, 30.0]       # results never mixed
    node_ids = {r["placement"]["ray"]["node_id"] for r in records}
    assert len(node_ids) == 1 and None not in node_ids                 # the head has the GPUs
    assert len({r["placement"]["ray"]["job_id"] for r in records}) == 3
    for record in records:
        seen = next(e["seen"] for e in log if e["batch"] == record["setup"]["batch"])
        assert record["placement"]["cuda_visible_devices"] == seen
        assert record["placement"]["gpus"] == [int(seen)]
        assert record["placement"]["ray"]["gpu_type"] == GPU_TYPE
    assert second["records"] == records
    # --nproc 2 is one job that asked Ray for two GPUs: Ray gave its process both (its torchrun
    # would start a rank on each), and the record says which.
    [ran] = [e for e in entries if e["batch"] == 5]
    assert ran["nproc"] == 2 and sorted(ran["seen"].split(",")) == ["0", "1"]
    assert pair["status"] == "ok" and pair["setup"]["nproc"] == 2
    assert pair["placement"]["cuda_visible_devices"] == ran["seen"]
    assert sorted(pair["placement"]["gpus"]) == [0, 1]
    assert pair["placement"]["ray"]["job_id"] == "stepbench-t0-4"
    # A job that ends before its process starts is no measurement: nothing is recorded, no job
    # starts after it, and the run's one line says why.
    assert broken["records"] == 3          # the three stored ones: the fourth was not recorded
    # The golden of a Ray job that ended before its process started, word for word (up to
    # Ray's own message, of which the exit code is the fact).
    assert broken["lost"].startswith("Ray job stepbench-t0-5 ended FAILED before its process "
                                     "started: ")
    assert names(broken["lost"], "exit code 127")
    assert len(read_jsonl(tmp_path / "r.jsonl")) == 3
    nothing_left(ray_cluster)


def test_an_unknown_gpu_type_is_refused_before_anything_runs(ray_cluster, tmp_path):
    proc = ray_cli(ray_cluster, "run", "--ray", ray_cluster.address, "--device", "cuda",
                   "--gpu-type", "A100-80G", "--out", tmp_path / "r.jsonl", timeout=120)
    assert proc.returncode == 2
    # One line naming the flag, the cluster's GPU types and the way out (its golden:
    # test_raycluster.py).
    [line] = proc.stderr.strip().splitlines()
    assert error_line(line, "run") and names(line, "--gpu-type A100-80G", "Ray", "FAKE-GPU",
                                             "drop --gpu-type")
    out = tmp_path / "r.jsonl"
    assert not out.exists() or out.read_text() == ""        # nothing ran, nothing written


# ---------------------------------------------------------------- real setups

MATRIX = [*SMALL, "--modes", "eager", "--attn", "sdpa,eager"]


def test_the_matrix_through_ray_ctrl_c_a_rerun_resumes_and_a_timeout(ray_cluster, tmp_path):
    out = tmp_path / "r.jsonl"
    command = ray_cluster.client_argv([sys.executable, "-m", "stepbench", "run", "--ray",
                                       ray_cluster.address, *MATRIX, "--out", str(out)])
    # SIGINT as a terminal's Ctrl-C sends it (conftest: with its default action, as a foreground
    # job has it, however pytest was started).
    first = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=client_env())
    # Stopped while the second setup's process runs in its job, as Ctrl-C would.
    wait_for(first, "[2/2] eager+eager batch 4 seq 64: building the model")
    first.send_signal(signal.SIGINT)
    _, err = first.communicate(timeout=120)
    assert first.returncode == 130, err
    assert any(names(line, "interrupted", str(out), "resume") for line in err.splitlines())
    nothing_left(ray_cluster)
    [kept] = read_jsonl(out)
    assert kept["setup"]["attn"] == "sdpa"
    # What a local run records, and where Ray ran it.
    assert kept["status"] == "ok" and kept["step_ms"] > 0 and kept["machine"]["gpu"] == "cpu"
    assert len(kept["step_times_ms"]) == 5 and kept["software"]["torch"]
    # Forked by the run's process server on the node (rayservers.py), as a local run's are.
    assert kept["placement"]["start"] == "server"
    ray = kept["placement"]["ray"]
    assert ray["job_id"].startswith("stepbench-") and len(ray["node_id"]) == 56
    # The same command again, with a timeout the second setup cannot keep: the finished setup
    # is resumed (a timeout is not part of a setup, nor is how its process starts), the stopped
    # one runs and is stopped at 1 s. (--start fresh: a setup alone does not pay for starting
    # a process server on every node.)
    again = ray_cli(ray_cluster, "run", "--ray", ray_cluster.address, *MATRIX, "--timeout", "1",
                    "--start", "fresh", "--out", out, "--format", "json")
    resumed_and_timed_out(again, kept, out, "ray")
    nothing_left(ray_cluster)
    # The run's process server took its socket file with it (the nodes' /tmp is shared).
    tag = ray["job_id"].rsplit("-", 1)[0]
    assert not Path(f"/tmp/{tag}.sock").exists()


def test_max_batch_and_tune_go_through_ray(ray_cluster, tmp_path):
    # Both at once, as two users' runs (the cluster has a CPU for each one's job). --start fresh:
    # two jobs and one, where starting a run's process servers costs more than it saves (the
    # matrix's test runs them).
    out, tuned = tmp_path / "mb.jsonl", tmp_path / "tune.jsonl"
    max_batch = ray_start(ray_cluster, "run", "--ray", ray_cluster.address, *SMALL, "--start",
                          "fresh", "--modes", "eager", "--attn", "sdpa", "--batch", "1",
                          "--max-batch", "--max-batch-limit", "1", "--memory-limit-gb", "8",
                          "--out", out, "--format", "json")
    # A search of one setup (the fit objective keeps the batch; one value of every axis; the
    # budget only bounds its process's timeout): what the search decides is
    # tests/test_tune.py's; here, that its processes are Ray jobs.
    tune = ray_start(ray_cluster, "tune", "--ray", ray_cluster.address, "--device", "cpu",
                     "--start", "fresh", "--objective", "fit", "--memory-limit-gb", "8",
                     "--model", "llama-tiny", "--seq", "32", "--batch", "1", "--modes", "eager",
                     "--attn", "sdpa", "--optimizer", "fused", "--checkpointing", "off",
                     "--precision", "bf16", "--repeats", "1", "--warmup", "1", "--steps", "2",
                     "--budget", "60s", "--format", "json", "--out", tuned)
    try:
        proc = finished(max_batch)
        assert proc.returncode == 0, proc.stderr
        records = read_jsonl(out)
        assert [(r["search"]["role"], r["setup"]["batch"]) for r in records] == \
            [("probe", 1), ("final", 1)]
        assert json.loads(proc.stdout) == records[-1:]
        assert all(r["status"] == "ok" and r["placement"]["ray"]["node_id"] for r in records)
        proc = finished(tune)
    finally:
        tune.kill()
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["winner"]["setup"]["attn"] == "sdpa"
    stored = read_jsonl(tuned)
    assert stored and all(r["search"]["kind"] == "tune" and r["placement"]["ray"]["job_id"]
                          for r in stored)
    nothing_left(ray_cluster)


def test_torchrun_jobs_of_nproc_2_on_one_node_and_of_two_nodes(ray_cluster, tmp_path):
    # --nproc 2 after its single-process baseline, as tests/test_distributed.py runs it locally:
    # one Ray job whose torchrun starts two gloo ranks on one node. (A CPU job asks Ray for a
    # CPU; the GPUs a cuda job asks for: the first test above.) --start fresh: the single setup
    # alone would start a process server on every node.
    out = tmp_path / "r.jsonl"
    proc = ray_cli(ray_cluster, "run", "--ray", ray_cluster.address, *SMALL, "--start", "fresh",
                   "--modes", "eager", "--attn", "sdpa", "--parallel", "none,ddp", "--nproc", "2",
                   "--out", out, "--format", "json")
    assert proc.returncode == 0, proc.stderr
    single, job = json.loads(proc.stdout)
    assert single["status"] == "ok" and job["status"] == "ok", job["error"]
    assert "nproc" not in single["setup"] and job["setup"]["nproc"] == 2
    assert any(names(line, "[2/2]", "eager+sdpa batch 4 seq 64 ddp x2", ": ok")
               for line in proc.stderr.splitlines())
    # The records a local --nproc 2 job gives: every rank's numbers, the job's step its slowest
    # rank's, tokens counting the global batch, and the efficiency against the baseline.
    ranks = job["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1] and [r["node"] for r in ranks] == [0, 0]
    assert all(len(r["step_times_ms"]) == 5 and r["peak_memory_gb"] > 0 for r in ranks)
    slowest = max(ranks, key=lambda r: r["step_ms"])
    assert job["step_ms"] == slowest["step_ms"] and job["step_times_ms"] == slowest["step_times_ms"]
    assert job["tokens_per_s"] == pytest.approx(4 * 64 * 2 / (job["step_ms"] / 1000))
    scaling = job["scaling"]
    assert scaling["world_size"] == 2 and scaling["backend"] == "gloo"
    assert scaling["slowest_rank"] == slowest["rank"]
    assert scaling["baseline"]["run_id"] == single["run_id"]
    assert scaling["efficiency"] == pytest.approx(scaling["tokens_per_s_per_gpu"] / single["tokens_per_s"])
    # Same seed: rank 0 trains the single process's weights on its tokens; rank 1 its own.
    assert ranks[0]["loss_first"] == pytest.approx(single["loss_first"], rel=1e-6)
    assert ranks[1]["loss_first"] != pytest.approx(ranks[0]["loss_first"], rel=1e-4)
    # One job of its own on one node (no placement group: that is --nnodes's).
    ray = job["placement"]["ray"]
    assert ray["job_id"] != single["placement"]["ray"]["job_id"] and ray["node_id"]
    assert "nodes" not in ray and job["placement"]["start"] == "fresh"
    # --nnodes 2 into the same file: a placement group of two bundles, one task per node, and
    # its efficiency against the same baseline.
    proc = ray_cli(ray_cluster, "run", "--ray", ray_cluster.address, *SMALL, "--modes", "eager",
                   "--attn", "sdpa", "--parallel", "ddp", "--nnodes", "2", "--out", out,
                   "--format", "json")
    assert proc.returncode == 0, proc.stderr
    [record] = json.loads(proc.stdout)
    assert record["status"] == "ok", record["error"]
    assert record["setup"]["nnodes"] == 2 and len(record["ranks"]) == 2
    nodes = record["placement"]["ray"]["nodes"]
    assert len({n["node_id"] for n in nodes}) == 2      # STRICT_SPREAD: one bundle per node
    assert sorted(r["node"] for r in record["ranks"]) == [0, 1]
    assert record["scaling"]["baseline"]["run_id"] == single["run_id"]
    nothing_left(ray_cluster)


def test_ray_local_starts_a_cluster_for_the_run_and_stops_it(tmp_path):
    from raynet import unavailable

    reason = unavailable()
    if reason:
        pytest.skip(reason)
    out = tmp_path / "r.jsonl"
    # Its own namespaces: PID 1 there is the shell, so what the run leaves behind is listed
    # after it ends.
    # --start fresh: one setup does not pay for a process server (the matrix's test runs them).
    script = (f"ip link set lo up; {sys.executable} -m stepbench run --ray local {' '.join(SMALL)} "
              f"--start fresh --modes eager --attn sdpa --out {out}; echo exit=$?; ps -eo args")
    # Ray's own files (its session logs, the token it makes for a local cluster) go to a folder
    # of the test's (short: Ray's Unix socket paths), not to /tmp/ray and ~/.ray.
    # Its dashboard polls as the test cluster's does (tests/raynet.py, RAY_POLL_ENV).
    home = tempfile.mkdtemp(prefix="sbray-")
    env = dict(client_env(), HOME=home, RAY_TMPDIR=home)
    del env["RAY_AUTH_MODE"]        # as a user runs it: token authentication on
    try:
        proc = subprocess.run(["unshare", "--net", "--pid", "--fork", "--mount-proc",
                               "--kill-child", "sh", "-c", script], capture_output=True, text=True,
                              timeout=400, env=env)
        token = (Path(home) / ".ray" / "auth_token").is_file()
    finally:
        shutil.rmtree(home, ignore_errors=True)
    assert "exit=0" in proc.stdout, proc.stderr
    assert any(names(line, "--ray local", "network address") for line in proc.stderr.splitlines())
    # Left in its namespace once the run ended: the shell and ps, nothing of Ray's (the shell
    # reaps no orphan: an ended one shows as <defunct>).
    left = proc.stdout.split("exit=0", 1)[1].strip().splitlines()[1:]
    assert [line for line in left if not line.startswith(("sh -c", "ps -eo"))
            and not line.endswith("<defunct>")] == [], left
    [record] = read_jsonl(out)
    assert record["status"] == "ok" and record["placement"]["ray"]["node_id"]
    assert token            # the local Ray made a token for its clients (Ray's default)


# ---------------------------------------------------------------- a user's factory

def test_a_factory_runs_as_a_ray_job_with_its_folder_as_working_dir(ray_cluster, tmp_path):
    run = project(tmp_path)
    out = tmp_path / "r.jsonl"
    proc = subprocess.run(ray_cluster.client_argv(
        [sys.executable, "-m", "stepbench", "run", "--ray", ray_cluster.address, "--model",
         MODEL, "--workload-dir", "../proj", *TINY, "--out", str(out), "--format", "json"]),
        cwd=run, capture_output=True, text=True, timeout=600,
        env=client_env())
    assert proc.returncode == 0, proc.stderr
    record = one_ok(json.loads(proc.stdout), "server")
    assert record["placement"]["ray"]["job_id"].startswith("stepbench-")
    assert lines_naming(proc.stderr, "Ray job", "../proj", "2 files")
    # A package the nodes have and this client has not: read in a short Ray job. (--start
    # fresh: its one setup does not pay for a process server on every node; the run above
    # forked its setup from one.)
    only_the_nodes_have_it(ray_cluster, ["--ray", ray_cluster.address, "--start", "fresh"], run,
                           out, client_env(), "on the Ray cluster")

