"""stepbench: how should this model's training step run on this GPU, how fast, does it fit, and
what does a token cost."""

__version__ = "0.1.0"



def __getattr__(name: str):
    """`stepbench.Workload`, what a user's factory may return (docs/workloads.md), imported when
    first asked for: `import stepbench` stays cheap. The Python API is `stepbench.api`
    (docs/api.md)."""
    if name == "Workload":
        from stepbench.workload.contract import Workload

        return Workload
    raise AttributeError(f"module 'stepbench' has no attribute {name!r}")
