"""The Ray executor's decisions that need no cluster (fast): what a cluster's resources allow, which
stored record a job resumes from, and how a job's log is read. The real runs are in
tests/test_ray.py."""

import asyncio

import pytest

from stepbench.errors import UserError
from stepbench.execute.protocol import Job, Outcome
from stepbench.execute.clusters import check_cluster
from stepbench.execute.ray.cluster import Cluster
from stepbench.execute.ray.jobs import RayExecutor, _Follow
from stepbench.record import Machine, Record
from stepbench.setup import Setup


def cluster_of(*nodes) -> Cluster:
    """A Cluster whose nodes() are `nodes` (resource dicts), without a Jobs API behind it."""
    cluster = Cluster.__new__(Cluster)
    cluster.nodes = lambda: [{"node_id": f"n{i}", "ip": "10.0.0.1", "resources": r}
                             for i, r in enumerate(nodes)]
    return cluster


def setup(**fields) -> Setup:
    return Setup(**{"model": "llama-tiny", "mode": "eager", "attn": "sdpa", "batch": 4, "seq": 64,
                    "device": "cuda", **fields})


H100 = {"CPU": 32, "GPU": 8, "accelerator_type:H100": 1}
A10G = {"CPU": 8, "GPU": 1, "accelerator_type:A10G": 1}


def test_the_gpus_a_run_may_use_are_the_clusters_unless_gpus_says_fewer():
    cluster = cluster_of(H100, H100, A10G)
    assert check_cluster(cluster, "cuda", None, None, [setup()]) == 17
    assert check_cluster(cluster, "cuda", "H100", None, [setup()]) == 16
    assert check_cluster(cluster, "cuda", "H100", "4", [setup()]) == 4
    assert check_cluster(cluster, "cpu", None, None, [setup(device="cpu")]) == 1


@pytest.mark.parametrize("args, message", [
    (("cuda", "A100-80G", None), "--gpu-type A100-80G: the Ray cluster has no such GPU; its GPU "
                                 "types: A10G, H100; pass one of them"),
    (("cuda", None, "all"), "--gpus with --ray takes how many of the cluster's 17 GPUs this run "
                            "uses at once: a number from 1 to 17, got 'all'"),
    (("cuda", None, "18"), "--gpus with --ray takes how many of the cluster's 17 GPUs this run "
                           "uses at once: a number from 1 to 17, got '18'"),
    (("cpu", None, "2"), "--gpus needs CUDA setups, and this run is on the CPU"),
])
def test_what_the_cluster_cannot_give_is_refused_up_front(args, message):
    device, gpu_type, gpus = args
    with pytest.raises(UserError, match="^" + message.replace("(", r"\(").replace(")", r"\)")
                       .replace(".", r"\.")):
        check_cluster(cluster_of(H100, H100, A10G), device, gpu_type, gpus,
                      [setup(device=device)])


def test_a_job_must_fit_its_nodes():
    cluster = cluster_of(H100, A10G)
    big = setup(nproc=8, nnodes=2, parallel="ddp")
    with pytest.raises(UserError, match="needs 2 node\\(s\\) with 8 GPU\\(s\\) each"):
        check_cluster(cluster, "cuda", None, None, [big])
    assert check_cluster(cluster_of(H100, H100), "cuda", None, None, [big]) == 16
    with pytest.raises(UserError, match="--nnodes 3 needs a node each, and the Ray cluster has 2"):
        check_cluster(cluster, "cpu", None, None, [setup(device="cpu", nnodes=3, parallel="ddp")])
    with pytest.raises(UserError, match="no GPU; pass --device cpu"):
        check_cluster(cluster_of({"CPU": 4}), "cuda", None, None, [setup()])


def record(s: Setup, repeat: int = 0, ray: dict | None = None, gpu: str = "NVIDIA H100") -> Record:
    return Record(run_id="r", repeat=repeat, setup=s, status="ok", step_ms=1.0,
                  placement={"ray": ray} if ray is not None else None, machine=Machine(gpu=gpu))


def executor(gpu_type=None) -> RayExecutor:
    ex = RayExecutor.__new__(RayExecutor)
    ex.gpu_type = gpu_type
    return ex


def test_a_job_resumes_from_a_ray_record_of_the_gpu_type_asked_for():
    s = setup()
    local = record(s)                                   # run on this machine: not the cluster's
    typed = record(s, ray={"job_id": "a", "gpu_type": "H100"})
    untyped = record(s, ray={"job_id": "b", "gpu_type": None})
    other = record(setup(batch=8), ray={"job_id": "c", "gpu_type": "H100"})
    job = Job(s)
    assert executor().find_done(job, [local]) is None
    assert executor().find_done(job, [local, typed]) is typed        # any GPU when none asked
    assert executor().find_done(job, [typed, untyped]) is untyped    # the latest
    assert executor("H100").find_done(job, [typed, untyped]) is typed
    assert executor("A10G").find_done(job, [typed, untyped, other]) is None
    assert executor().find_done(Job(s, repeat=1), [typed]) is None


def test_a_jobs_log_is_read_line_by_line_whatever_its_chunks():
    seen = []
    outcome = Outcome()
    follow = _Follow(outcome, seen.append)
    log = ('2026 INFO job_manager.py -- Runtime env is setting up.\n'
           'Running entrypoint for job x\n'
           '{"event": "placed", "hostname": "n1", "cuda_visible_devices": "3"}\n'
           '{"event": "start", "machine": {"gpu": "NVIDIA H100"}, "software": {}}\n'
           'a warning on stderr\n'
           '{"event": "progress", "phase": "timed", "args": [20]}\n'
           '{"event": "result", "status": "ok", "error": null, "measured": {"step_ms": 2.5}}\n'
           '{"event": "exit", "returncode": 0, "start": "fresh"}\n')
    for i in range(0, len(log), 7):                    # chunks that cut lines anywhere
        follow.feed(log[i:i + 7])
    follow.feed("\n")
    assert follow.running.is_set() and follow.placed["cuda_visible_devices"] == "3"
    assert [m["event"] for m in seen] == ["start", "progress", "result"]
    assert outcome.result["measured"] == {"step_ms": 2.5}
    assert (follow.exit.returncode, follow.exit.start) == (0, "fresh")
    assert list(follow.other) == ["2026 INFO job_manager.py -- Runtime env is setting up.",
                                  "Running entrypoint for job x", "a warning on stderr"]
    asyncio.run(asyncio.wait_for(follow.running.wait(), 1))     # set, so a waiter returns
