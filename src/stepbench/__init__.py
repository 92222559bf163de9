"""stepbench: how should this model's training step run on this GPU, how fast, does it fit, and
what does a token cost."""

__version__ = "0.1.0"


def __getattr__(name: str):
    """`stepbench.Workload` (what a user's factory may return, docs/workloads.md) and the Python
    API (`stepbench.run`, `stepbench.tune`, `stepbench.report`, docs/api.md), imported when
    first asked for: `import stepbench` stays cheap."""
    if name == "Workload":
        from stepbench.workload.contract import Workload

        return Workload
    if name in ("run", "tune", "report"):
        from stepbench import api

        return getattr(api, name)
    raise AttributeError(f"module 'stepbench' has no attribute {name!r}")
