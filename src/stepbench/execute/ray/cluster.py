"""A Ray cluster the user already has (`run --ray ADDRESS`, `tune --ray`), as its Jobs API shows
it (`Cluster`, a clusters.View), or one started on this machine for the run (`--ray local`);
and what the backend asks of it (clusters.ClusterBackend). Each setup is one Ray job: jobs.py.
"""

from __future__ import annotations

import os
import sys
import time

from stepbench.errors import UserError, first_line
from stepbench.execute.protocol import KILL_GRACE_S

INSTALL_HINT = "pip install 'stepbench[ray]'"
ACCELERATOR = "accelerator_type:"
LOCAL_READY_S = 120         # `--ray local`: until its Jobs API answers


def require_ray():
    try:
        import ray
        from ray.job_submission import JobSubmissionClient  # noqa: F401 - ray[default]'s
    except ImportError:
        raise UserError(f"--ray needs Ray with its Jobs API: {INSTALL_HINT}") from None
    return ray


def quiet_ray_logs() -> None:
    """Ray's client logs each upload and closed log stream at INFO on stderr, through the live
    progress: only its warnings and errors are shown."""
    import logging

    for name in ("ray", "ray.dashboard", "ray.dashboard.modules.dashboard_sdk",
                 "ray.dashboard.modules.job.sdk"):
        logging.getLogger(name).setLevel(logging.WARNING)


def jobs_address(address: str) -> str:
    """The Jobs API's URL from --ray's value: http://HOST:PORT, HOST:PORT, or `auto`
    (RAY_ADDRESS)."""
    if address == "auto":
        address = os.environ.get("RAY_ADDRESS", "")
        if not address:
            raise UserError("--ray auto reads RAY_ADDRESS, which is not set; set it to the "
                            "cluster's Jobs API address (http://HEAD:8265) or pass that to --ray")
    if "://" not in address:
        address = f"http://{address}"
    return address.rstrip("/")


class Cluster:
    """A Ray cluster as its Jobs API shows it: its nodes and their resources (a clusters.View)."""

    what, flag = "the Ray cluster", "--ray"
    type_names = "Ray's names, e.g. H100, A100-80G"
    no_types = "none (its nodes declare no accelerator_type)"

    def __init__(self, address: str, local=None):
        require_ray()
        from ray.job_submission import JobSubmissionClient

        self.address = address
        self.local = local          # the LocalRay this run started, stopped by close()
        quiet_ray_logs()
        try:
            self.client = JobSubmissionClient(address)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise UserError(f"cannot reach Ray's Jobs API at {address} ({_reason(exc)}); pass "
                            "the dashboard's address (http://HEAD:8265) or `local`") from None

    def nodes(self) -> list[dict]:
        """The live nodes: id, address and total resources."""
        from ray.util.state import list_nodes

        found = list_nodes(address=self.address, detail=True, filters=[("state", "=", "ALIVE")],
                           raise_on_missing_output=False)
        return [{"node_id": n.node_id, "ip": n.node_ip, "resources": dict(n.resources_total)}
                for n in found]

    def gpu_types(self) -> set[str]:
        return {name[len(ACCELERATOR):] for n in self.nodes() for name in n["resources"]
                if name.startswith(ACCELERATOR)}

    def gpus(self, gpu_type: str | None = None) -> list[int]:
        """Each live node's GPUs (of `gpu_type` when given)."""
        return [int(n["resources"].get("GPU", 0)) for n in self.nodes()
                if gpu_type is None or f"{ACCELERATOR}{gpu_type}" in n["resources"]]

    def cpu_nodes(self) -> int:
        return sum(1 for n in self.nodes() if n["resources"].get("CPU", 0) >= 1)

    def close(self) -> None:
        if self.local is not None:
            self.local.stop()
            self.local = None


class LocalRay:
    """`--ray local`: a Ray head on this machine for this run (ray.init, which starts its
    processes as this process's children), stopped by stop()."""

    def __init__(self, note):
        ray = require_ray()
        note("starting a local Ray for this run (`--ray local`); Ray listens on this machine's "
             "network address, not only on 127.0.0.1: run it where that is allowed")
        context = ray.init(include_dashboard=True, dashboard_host="127.0.0.1",
                           configure_logging=False, log_to_driver=False, logging_level="ERROR")
        self.ray = ray
        self.address = f"http://{context.dashboard_url}"
        self.python = sys.executable     # the cluster is this machine: this very Python

    def wait_ready(self) -> None:
        """Until the Jobs API answers (the dashboard starts after ray.init returns)."""
        from ray.job_submission import JobSubmissionClient

        deadline = time.monotonic() + LOCAL_READY_S
        while True:
            try:
                JobSubmissionClient(self.address).list_jobs()
                return
            except Exception as exc:  # noqa: BLE001 - not up yet: asked again below
                if time.monotonic() > deadline:
                    raise UserError(f"the local Ray's Jobs API did not answer within "
                                    f"{LOCAL_READY_S} s ({_reason(exc)})") from None
                time.sleep(1.0)

    def stop(self) -> None:
        """ray.shutdown(), then whatever of Ray's outlived it (the dashboard's forkserver was
        seen to): every process below this one was started by this Ray."""
        import psutil

        family = psutil.Process().children(recursive=True)
        self.ray.shutdown()
        alive = [p for p in family if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        for sig in ("terminate", "kill"):
            for p in alive:
                try:
                    getattr(p, sig)()
                except psutil.Error:
                    pass
            _, alive = psutil.wait_procs(alive, timeout=KILL_GRACE_S)
            if not alive:
                return


def connect(address: str, note) -> Cluster:
    """The cluster --ray names; `local` starts one (stopped by Cluster.close())."""
    if address != "local":
        return Cluster(jobs_address(address))
    local = LocalRay(note)
    try:
        local.wait_ready()
        return Cluster(local.address, local)
    except BaseException:
        local.stop()
        raise


# -- what `run --ray` and `tune --ray` ask (clusters.ClusterBackend) -------------------------

def require() -> None:
    require_ray()


def precheck(settings):
    """Before anything is made: a model config file (the nodes have none), a factory file
    that cannot travel, `auto` without RAY_ADDRESS. Returns what travels (bundle.Carried, or
    None), read once: `travels` words it for a dry run."""
    workload = check_model_files(settings.values["model"], getattr(settings, "workload_dir", None))
    if settings.ray != "local":
        jobs_address(settings.ray)
    return workload


def travels(workload) -> str | None:
    """For a dry run: what each job is sent (`workload`, precheck's bundle.Carried: a factory
    file or --workload-dir folder, as its working_dir), or None where nothing travels."""
    if workload is None:
        return None
    return (f"each Ray job is sent {workload.describe().removeprefix('carries ')} as its "
            "working_dir")


def open_cluster(settings, note) -> Cluster:
    return connect(settings.ray, note)



def check_model_files(model, workload_dir=None):
    """A model given as a config file is on this machine only: refused up front. A factory
    travels (a file as the jobs' working_dir, execute/bundle.py; a package.module as installed
    on the nodes); one given by an absolute path is refused by carry.gather. Returns what
    travels (bundle.Carried, or None)."""
    from stepbench.execute.bundle import gather
    from stepbench.measure.models import PRESETS
    from stepbench.workload.loader import is_factory

    workload = gather(model, workload_dir, "the Ray cluster")
    for name in (model if isinstance(model, (tuple, list)) else [model]):
        if name is not None and name not in PRESETS and not is_factory(name):
            raise UserError(f"--model {name}: a config file stays on this machine, and --ray "
                            "runs the setups on the cluster's nodes; pass a preset ("
                            + ", ".join(PRESETS) + ")")
    return workload




def _reason(exc: BaseException) -> str:
    return first_line(str(exc)) or type(exc).__name__

