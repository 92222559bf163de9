"""`run --slurm` against a real Slurm (tests/slurmnet.py: a controller and two nodes, the first with
two fake GPUs, in a network namespace with loopback only, started once for the file).

The setups are tiny eager CPU setups, real processes in real Slurm jobs; the test of GPU placement
(and of a job over two nodes) runs setups whose processes are short scripts (tests/fakes.py's
ProtocolChild) through the real Runner and Slurm executor, since the fake GPUs cannot run a model.
The client (stepbench run, submitit) enters the cluster's network namespace only, so it is this
test's child and Ctrl-C reaches it. A user's factory (tests/carried.py) runs here too, in its own
folder. Skipped, with the reason, where Slurm cannot be started.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from carried import MODEL, TINY, one_ok, only_the_nodes_have_it, project
from conftest import SETUP_FAULT_ENV, SMALL, SRC, read_jsonl, resumed_and_timed_out, wait_for, with_hooks
from says import error_line, names

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]   # every test here runs Slurm jobs

TESTS = os.path.dirname(os.path.abspath(__file__))


def client_env(cluster, hooks: bool = False) -> dict:
    env = dict(cluster.env, PYTHONPATH=os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")]))
    return with_hooks(env) if hooks else env


def slurm_cli(cluster, *args, timeout=300, hooks=False) -> subprocess.CompletedProcess:
    """`stepbench ARGS` in the cluster's network namespace."""
    return subprocess.run(cluster.client_argv([sys.executable, "-m", "stepbench",
                                               *map(str, args)]),
                          capture_output=True, text=True, timeout=timeout,
                          env=client_env(cluster, hooks))


def nothing_left(cluster, results) -> None:
    """No job of ours in Slurm's queue, no setup's process, hostside, torchrun or submitit task
    left in the cluster's namespace, and no job files beside the results."""
    assert cluster.jobs() == []
    for text in ("stepbench.measure", "torch.distributed.run", "stepbench.execute",
                 "submitit"):
        assert cluster.processes(text) == [], text
    assert not (results.parent / ".stepbench-slurm").exists()


# ---------------------------------------------------------------- GPUs, two nodes, refusals

SCRIPTED = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    from fakes import ProtocolChild
    from stepbench.errors import UserError
    from stepbench.execute.clusters import check_cluster
    from stepbench.execute.runner import Runner
    from stepbench.execute.slurm.cluster import Cluster, check_shared
    from stepbench.execute.slurm.jobs import SlurmExecutor
    from stepbench.record import ResultsFile
    from stepbench.setup import Setup

    folder, gpu_type = Path(sys.argv[1]), sys.argv[2]
    child = ProtocolChild(folder, sleep_s=1.0, together=2, gpu="fake GPU")
    # A node of a two-node job: says where it met the other (node 0 reports, as a lead rank).
    NODE = '''
    import os, sys
    from stepbench import protocol
    node, endpoint, folder = sys.argv[1:4]
    with open(os.path.join(folder, "node-" + node), "w") as f:
        f.write(endpoint + " " + os.environ["SLURMD_NODENAME"])
    if node == "0":
        print(protocol.encode("start", machine={"gpu": "cpu", "hostname": "n0"}, software={}), end="")
        print(protocol.encode("result", status="ok", error=None,
                              measured={"phase": "done", "step_ms": 1.0}), end="", flush=True)
    '''

    class Scripted(SlurmExecutor):
        def command(self, job, rendezvous=None):
            if not job.setup.distributed:
                return [self.python, "-c", *map(str, child(job))]
            return [self.python, "-c", NODE, str(rendezvous.node_rank), rendezvous.endpoint,
                    str(folder)]

    def run(plan, device, run_id, store):
        cluster = Cluster("")
        gpus = check_cluster(cluster, device, gpu_type if device == "cuda" else None, None, plan)
        executor = Scripted(cluster, device, gpus=gpus, out=store.path, run_id=run_id,
                            gpu_type=gpu_type if device == "cuda" else None, start="fresh")
        try:
            records = Runner(executor, store, measure_peak=False).run(plan, timeout_s=120)
        finally:
            executor.close()
        return gpus, [r.to_dict() for r in records]

    store = ResultsFile(folder / "r.jsonl")
    plan = [Setup(model="llama-tiny", mode="eager", attn="sdpa", batch=b, seq=64, device="cuda")
            for b in (1, 2, 3)]
    for attempt in range(2):        # the second resumes: every record is there
        gpus, records = run(plan, "cuda", f"t{attempt}", store)
        print(json.dumps({"gpus": gpus, "records": records}), flush=True)
    two = [Setup(model="llama-tiny", mode="eager", attn="sdpa", batch=4, seq=64, device="cpu",
                 parallel="ddp", nnodes=2)]
    print(json.dumps({"records": run(two, "cpu", "t2", ResultsFile(folder / "two.jsonl"))[1]}),
          flush=True)
    try:        # a partition of other machines, and the results on this machine's own disk
        check_shared(Cluster("far"), store.path)
        print(json.dumps({"refused": None}))
    except UserError as exc:
        print(json.dumps({"refused": str(exc)}))
""")


def test_slurm_gives_gpus_0_and_1_a_third_waits_a_rerun_resumes_and_two_nodes_meet(
        slurm_cluster, tmp_path):
    from slurmnet import GPU_TYPE

    from fakes import ProtocolChild, check_two_gpus_then_a_third_waits

    env = dict(client_env(slurm_cluster), PYTHONPATH=os.pathsep.join([TESTS, SRC]))
    proc = subprocess.run(slurm_cluster.client_argv(
        [sys.executable, "-c", SCRIPTED, str(tmp_path), GPU_TYPE]),
        capture_output=True, text=True, timeout=240, env=env)
    assert proc.returncode == 0, proc.stderr
    first, second, two, far = (json.loads(line) for line in proc.stdout.splitlines())
    assert first["gpus"] == 2                   # the partition's GPUs of the type asked for
    log = sorted(ProtocolChild(tmp_path).entries(), key=lambda e: e["start"])
    assert len(log) == 3                        # the rerun submitted no job
    check_two_gpus_then_a_third_waits(log)          # Slurm chose the GPUs
    records = first["records"]
    assert [r["setup"]["batch"] for r in records] == [1, 2, 3]
    assert [r["step_ms"] for r in records] == [10.0, 20.0, 30.0]       # results never mixed
    assert len({r["placement"]["slurm"]["job_id"] for r in records}) == 3
    for record in records:
        seen = next(e["seen"] for e in log if e["batch"] == record["setup"]["batch"])
        assert record["placement"]["cuda_visible_devices"] == seen
        assert record["placement"]["gpus"] == [int(seen)]
        assert record["placement"]["slurm"]["node"] == "sb1"           # the node with the GPUs
        assert record["placement"]["slurm"]["gpu_type"] == GPU_TYPE
        assert record["placement"]["slurm"]["partition"] == "main"
    assert second["records"] == records
    # One task per node: node 0 wrote its address, node 1 read it; the record names both nodes.
    [record] = two["records"]
    assert record["status"] == "ok", record["error"]
    assert record["placement"]["slurm"]["nodes"] in (["sb1", "sb2"], ["sb2", "sb1"])
    met = [(tmp_path / f"node-{n}").read_text().split() for n in (0, 1)]
    assert met[0][0] == met[1][0] and met[0][0].rsplit(":", 1)[1].isdigit()
    assert [m[1] for m in met] == record["placement"]["slurm"]["nodes"]
    # The folder, the partition and its machines, the flag that fixes it (the family's wording:
    # test_slurmcluster.py).
    assert names(far["refused"], "--slurm", str(tmp_path), "own disk", "partition far", "(far1)",
                 "--out")
    nothing_left(slurm_cluster, tmp_path / "r.jsonl")


def test_an_unknown_gres_type_is_refused_before_anything_runs(slurm_cluster, tmp_path):
    out = tmp_path / "r.jsonl"
    proc = slurm_cli(slurm_cluster, "run", "--slurm", "--device", "cuda", "--gpu-type", "a100",
                     "--out", out, timeout=120)
    assert proc.returncode == 2
    [line] = proc.stderr.strip().splitlines()
    assert error_line(line, "run") and names(line, "--gpu-type a100", "partition main", "h100",
                                             "drop --gpu-type")
    assert not out.exists() or out.read_text() == ""        # nothing ran, nothing written
    assert slurm_cluster.jobs() == []


# ---------------------------------------------------------------- real setups

MATRIX = [*SMALL, "--modes", "eager", "--attn", "sdpa,eager"]


def test_the_matrix_through_slurm_ctrl_c_a_rerun_resumes_and_a_timeout(slurm_cluster, tmp_path):
    out = tmp_path / "r.jsonl"
    command = slurm_cluster.client_argv([sys.executable, "-m", "stepbench", "run", "--slurm",
                                         *MATRIX, "--out", str(out)])
    # The second setup hangs as it warms up (the tests' fault hooks, in the job's processes);
    # SIGINT as a terminal's Ctrl-C sends it (conftest: with its default action, as a foreground
    # job has it, however pytest was started).
    env = dict(client_env(slurm_cluster, hooks=True), **{SETUP_FAULT_ENV: "eager+eager:hang:warmup"})
    first = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=env)
    wait_for(first, "[2/2] eager+eager batch 4 seq 64: warm-up")
    first.send_signal(signal.SIGINT)
    _, err = first.communicate(timeout=120)
    assert first.returncode == 130, err
    assert any(names(line, "interrupted", str(out), "resume") for line in err.splitlines())
    nothing_left(slurm_cluster, out)
    [kept] = read_jsonl(out)
    assert kept["setup"]["attn"] == "sdpa"
    # What a local run records (forked by a process server, as a local run's setups are), and
    # where Slurm ran it.
    assert kept["status"] == "ok" and kept["step_ms"] > 0 and kept["machine"]["gpu"] == "cpu"
    assert len(kept["step_times_ms"]) == 5 and kept["software"]["torch"]
    assert kept["placement"]["start"] == "server" and kept["placement"]["server_start_s"] > 0
    assert kept["loss_first"] > 0 and set(kept["phases"]) >= {"build", "timed", "exit"}
    slurm = kept["placement"]["slurm"]
    assert slurm["job_id"].isdigit() and slurm["node"] in ("sb1", "sb2")
    assert slurm["partition"] == "main" and slurm["gpu_type"] is None
    # The same command again, with a timeout the second setup cannot keep (it starts fresh: its
    # imports alone take longer): the finished setup is resumed (a timeout is not part of a
    # setup), the stopped one runs and its job is cancelled at 1 s.
    again = slurm_cli(slurm_cluster, "run", "--slurm", *MATRIX, "--start", "fresh",
                      "--timeout", "1", "--out", out, "--format", "json")
    resumed_and_timed_out(again, kept, out, "slurm")
    nothing_left(slurm_cluster, out)


# ---------------------------------------------------------------- a user's factory

def test_a_factory_runs_as_a_slurm_job_in_this_folder(slurm_cluster, tmp_path):
    # The nodes share this filesystem: nothing is carried, the job runs in this very folder.
    run = project(tmp_path, guard=False)
    out = tmp_path / "r.jsonl"
    proc = subprocess.run(slurm_cluster.client_argv(
        [sys.executable, "-m", "stepbench", "run", "--slurm", "--model", MODEL, *TINY,
         "--out", str(out), "--format", "json"]),
        cwd=run, capture_output=True, text=True, timeout=600,
        env=dict(slurm_cluster.env, PYTHONPATH=os.pathsep.join([SRC, os.environ.get(
            "PYTHONPATH", "")])))
    assert proc.returncode == 0, proc.stderr
    record = one_ok(json.loads(proc.stdout))
    assert record["placement"]["slurm"]
    # A package only the nodes have (tests/slurmnet.py's task prolog): read in a short job.
    # Refused as a GPU run: the read job asks one of the run's GPUs (gres), on the node that has
    # them (sb1), as a GPU partition may refuse a job that asks none.
    only_the_nodes_have_it(slurm_cluster, ["--slurm"], run, out,
                           dict(slurm_cluster.env, PYTHONPATH=SRC), "on Slurm node",
                           ("--device", "cuda", "--gpu-type", "h100"))
    assert not (run.parent / ".stepbench-slurm").exists() and slurm_cluster.jobs() == []
