"""The Slurm executor's decisions that need no cluster (fast): a node's GPUs as sinfo writes them,
what a partition allows, a job's sbatch options, which paths a far node cannot read, which stored
record a job resumes from, how a job's log file is read as it grows, and what a signature read
the queue does not start says. The real runs are in tests/test_slurm.py."""

import sys
from pathlib import Path

import pytest

import stepbench
from stepbench.errors import UserError
from stepbench.execute.slurm import cluster as slurmcluster
from stepbench.execute.clusters import check_cluster
from stepbench.execute.protocol import Job, Outcome
from stepbench.execute.slurm.cluster import Cluster, Node, check_shared, gpus_of
from stepbench.execute.slurm.jobs import SlurmExecutor, _Task
from stepbench.record import Record
from stepbench.setup import Setup
from says import names


def partition(*nodes: Node, name: str = "gpu") -> Cluster:
    """A Cluster of `nodes`, without sinfo behind it."""
    cluster = Cluster.__new__(Cluster)
    cluster.partition, cluster.what, cluster.nodes = name, f"the Slurm partition {name}", list(nodes)
    return cluster


def node(name: str, gres: str = "(null)", host: str = "far.example", cpus: int = 32) -> Node:
    return Node(name, host, "10.0.0.9", gpus_of(gres), cpus)


def setup(**fields) -> Setup:
    return Setup(**{"model": "llama-tiny", "mode": "eager", "attn": "sdpa", "batch": 4, "seq": 64,
                    "device": "cuda", **fields})


def test_a_nodes_gpus_as_sinfo_writes_them():
    assert gpus_of("gpu:h100:2(S:0-1)") == {"h100": 2}
    assert gpus_of("gpu:4") == {"": 4}
    assert gpus_of("gpu:a100:2(S:0,1),gpu:h100:1,shard:8") == {"a100": 2, "h100": 1}
    assert gpus_of("(null)") == {}


def test_what_a_partition_can_give():
    cluster = partition(node("a", "gpu:h100:8"), node("b", "gpu:h100:8"), node("c", "gpu:a10:1"),
                        node("d"))
    assert check_cluster(cluster, "cuda", None, None, [setup()]) == 17
    assert check_cluster(cluster, "cuda", "h100", "4", [setup()]) == 4
    assert check_cluster(cluster, "cpu", None, None, [setup(device="cpu")]) == 1
    with pytest.raises(UserError, match=r"^--gpu-type a100: the Slurm partition gpu has no such "
                                        r"GPU; its GPU types: a10, h100; pass one of them \(the "
                                        r"gres types of its nodes, e\.g\. h100, a100\)"):
        check_cluster(cluster, "cuda", "a100", None, [setup()])
    with pytest.raises(UserError, match=r"^--gpus with --slurm takes how many of the cluster's "
                                        r"16 h100 GPUs"):
        check_cluster(cluster, "cuda", "h100", "all", [setup()])
    with pytest.raises(UserError, match="needs 2 node\\(s\\) with 8 a10 GPU\\(s\\) each"):
        check_cluster(cluster, "cuda", "a10", None, [setup(nproc=8, nnodes=2, parallel="ddp")])
    with pytest.raises(UserError, match="^the Slurm partition cpu has no GPU; pass --device cpu"):
        check_cluster(partition(node("d"), name="cpu"), "cuda", None, None, [setup()])


def executor(gpu_type=None, tmp_path=None) -> SlurmExecutor:
    return SlurmExecutor(partition(node("a", "gpu:h100:8")), "cuda", gpus=8, gpu_type=gpu_type,
                         out=(tmp_path or "/results") / "r.jsonl", run_id="20261201T000000Z-abc")


def test_a_jobs_sbatch_options(tmp_path):
    params = executor("h100", tmp_path).parameters(setup(nproc=2, parallel="ddp"), timeout_s=600)
    assert params["gres"] == "gpu:h100:2" and "exclusive" not in params
    assert params["time"] == 13             # --timeout and START_S, in whole minutes
    assert (params["partition"], params["nodes"], params["ntasks_per_node"]) == ("gpu", 1, 1)
    assert params["job_name"] == "stepbench-20261201T000000Z-abc"
    assert params["additional_parameters"] == {"no_requeue": True}
    assert executor(None, tmp_path).parameters(setup(), 1)["gres"] == "gpu:1"
    cpu = executor(None, tmp_path).parameters(setup(device="cpu", nnodes=2, parallel="ddp"), 1)
    assert cpu["exclusive"] is True and "gres" not in cpu and cpu["nodes"] == 2
    # The run's job files go beside the results file (a filesystem the nodes share).
    assert executor(None, tmp_path).folder == tmp_path / ".stepbench-slurm" / params["job_name"]


def test_paths_a_far_node_cannot_read_are_refused_unless_shared(tmp_path, monkeypatch):
    out = tmp_path / "results" / "r.jsonl"
    check_shared(partition(node("here", host="localhost")), out)    # this machine: all shared
    far = partition(node("n1"), node("n2"), node("n3"), node("n4"))
    monkeypatch.setattr(slurmcluster, "EXPORTS", tmp_path / "etab")
    (tmp_path / "etab").write_text("/srv/elsewhere\t10.0.0.0/8(rw,sync)\n")
    with pytest.raises(UserError, match=rf"^--slurm: the results folder {tmp_path}/results is on "
                                        r"this machine's own disk \(.* at .*\), and the Slurm "
                                        r"partition gpu runs its jobs on other machines \(n1, n2, "
                                        r"n3 and 1 more\), which cannot read it; pass --out"):
        check_shared(far, out)
    # A folder this machine exports over NFS is the nodes' too (a head node serving /home); then
    # the jobs' Python and stepbench must be on such a folder too.
    exports = f"/srv/elsewhere\t10.0.0.0/8(rw)\n{tmp_path}\t*(rw,sync)\n"
    (tmp_path / "etab").write_text(exports)
    with pytest.raises(UserError, match=rf"^--slurm: this Python's environment {sys.prefix} is on "
                                        r"this machine's own disk .*; run stepbench from an "
                                        r"environment on a filesystem they share"):
        check_shared(far, out)
    package = Path(stepbench.__file__).resolve().parent
    (tmp_path / "etab").write_text(f"{exports}{Path(sys.prefix).resolve()}\t*(rw)\n{package}\t*(rw)\n")
    check_shared(far, out)


def test_a_job_resumes_from_a_slurm_record_of_the_gpu_type_asked_for(tmp_path):
    s = setup()

    def record(slurm=None, ray=None):
        placement = {"slurm": slurm} if slurm else {"ray": ray} if ray else None
        return Record(run_id="r", repeat=0, setup=s, status="ok", step_ms=1.0, placement=placement)

    local, ray = record(), record(ray={"job_id": "a", "gpu_type": "h100"})
    typed, untyped = record({"job_id": "1", "gpu_type": "h100"}), record({"job_id": "2"})
    assert executor(None, tmp_path).find_done(Job(s), [local, ray]) is None
    assert executor(None, tmp_path).find_done(Job(s), [typed, untyped]) is untyped
    assert executor("h100", tmp_path).find_done(Job(s), [typed, untyped]) is typed
    assert executor("h100", tmp_path).find_done(Job(s, repeat=1), [typed]) is None


def test_a_jobs_log_file_is_read_as_it_grows(tmp_path):
    seen, outcome = [], Outcome()
    task = _Task(tmp_path, "7", 0, outcome, seen.append)
    task.read()                                 # not there yet: nothing
    log = ('submitit INFO (2026-12-01) - Starting with JobEnvironment(job_id=7)\n'
           '{"event": "placed", "hostname": "n1", "cuda_visible_devices": "1", "job_id": "7", '
           '"node": "n1"}\n'
           '{"event": "start", "machine": {"gpu": "NVIDIA H100"}, "software": {}}\n'
           '{"event": "result", "status": "ok", "error": null, "measured": {"step_ms": 2.5}}\n'
           '{"event": "exit", "returncode": 0, "start": "server", "wall_s": 3.5, "exit_s": 0.2}\n')
    data = log.encode()
    for i in range(0, len(data), 9):            # appends that cut lines (and characters) anywhere
        with open(tmp_path / "7_0_log.out", "ab") as f:
            f.write(data[i:i + 9])
        task.read()
    assert task.lines.placed["node"] == "n1" and [m["event"] for m in seen] == ["start", "result"]
    assert (task.lines.exit.start, task.lines.exit.wall_s, task.lines.exit.exit_s) == ("server", 3.5, 0.2)
    (tmp_path / "7_0_log.err").write_text("submitit INFO (2026) - Loading pickle\nTraceback: boom\n")
    assert task.said() == "Traceback: boom"         # submitit's own lines left out, in both files


def test_a_slurm_read_the_queue_does_not_start_is_cancelled_and_said(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from stepbench.execute.slurm import signatures

    # (The read itself, in a real Slurm job: test_slurm.py.)
    monkeypatch.setattr(signatures, "READ_TIMEOUT_S", 0.3)
    monkeypatch.setattr(signatures, "LOOK_S", 0.05)
    monkeypatch.setattr(signatures, "POLL_S", 0.05)
    monkeypatch.setattr(signatures, "_state", lambda job_id: "PENDING")
    job = SimpleNamespace(job_id="41", paths=SimpleNamespace(result_pickle=tmp_path / "none"))
    [why] = signatures._answers(job, "gpu", ["p.m:make"], "a free GPU").values()
    assert names(why, "Slurm job", "41", "PENDING", "cancelled", "partition gpu", "free GPU")
    monkeypatch.setattr(signatures, "_state", lambda job_id: "FAILED")
    monkeypatch.setattr(signatures, "SETTLE_S", 0)
    [why] = signatures._answers(job, "gpu", ["p.m:make"]).values()
    assert names(why, "41", "ended FAILED", "without an answer")


def test_the_signature_reads_job_asks_what_the_runs_jobs_ask():
    from types import SimpleNamespace

    from stepbench.execute.slurm import signatures

    # A GPU partition may refuse a job that asks for no GPU: one of the run's type, per node.
    gpus = partition(node("a", "gpu:h100:8"), node("b", "gpu:a10:1"))
    read = signatures.parameters(gpus, SimpleNamespace(device="auto", gpu_type="h100"), "n")
    assert read["gres"] == "gpu:h100:1" and read["cpus_per_task"] == 1 and read["time"] == 3
    assert (read["partition"], read["nodes"], read["job_name"]) == ("gpu", 1, "n")
    assert read["additional_parameters"] == {"no_requeue": True}
    anyone = signatures.parameters(gpus, SimpleNamespace(device="cuda", gpu_type=None), "n")
    assert anyone["gres"] == "gpu:1"
    # CPU setups: one core, no GPU, even on a partition that has them.
    for cluster, device in ((gpus, "cpu"), (partition(node("d"), name="cpu"), "auto")):
        read = signatures.parameters(cluster, SimpleNamespace(device=device, gpu_type=None), "n")
        assert "gres" not in read and read["cpus_per_task"] == 1
