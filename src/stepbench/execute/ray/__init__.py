"""The Ray backend (`run --ray ADDRESS`, `tune --ray`): each setup a Ray job (jobs.py) on a
cluster the user has (cluster.py); servers.py and nodes.py run on the cluster's nodes."""

from stepbench.execute.clusters import ClusterBackend


class RayBackend(ClusterBackend):
    name, flag = "ray", "--ray"
    engine, jobs = "stepbench.execute.ray.cluster", "stepbench.execute.ray.jobs"
    signatures = "stepbench.execute.ray.signatures"
