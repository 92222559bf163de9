"""The Slurm backend (`run --slurm [PARTITION]`, `tune --slurm`): each setup a Slurm job
(jobs.py) in a partition of a cluster the user has (cluster.py); task.py runs in the job."""

from stepbench.execute.clusters import ClusterBackend


class SlurmBackend(ClusterBackend):
    name, flag = "slurm", "--slurm"
    engine, jobs = "stepbench.execute.slurm.cluster", "stepbench.execute.slurm.jobs"
    signatures = "stepbench.execute.slurm.signatures"
