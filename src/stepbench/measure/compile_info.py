"""What torch.compile did in a child: graphs, graph breaks and their reasons, recompilations, and
where the compile time went.

Read from torch._dynamo's process-wide counters, which are private API: every read is guarded, so
a torch version that renames them yields nulls, not a failed setup. Counters are read between
phases only (after the first step, before and after the timed window), never inside it.
"""

from __future__ import annotations


def frames_compiled() -> int | None:
    """How many frames dynamo has compiled so far in this process."""
    try:
        from torch._dynamo.utils import counters

        return int(counters["frames"]["total"])
    except Exception:  # noqa: BLE001 - private API; absence is not a failure
        return None


def diagnostics(frames_after_first: int | None, frames_before_timed: int | None,
                frames_after_timed: int | None, cache: str | None) -> dict:
    """The record's `compile` object; `cache` says how the inductor cache started."""
    info = {"cache": cache, "graphs": None, "graph_breaks": None, "break_reasons": [],
            "recompiles": None, "recompiles_in_timed": None, "dynamo_s": None, "inductor_s": None,
            "cache_hits": None, "cache_misses": None}
    try:
        from torch._dynamo.utils import counters

        info["graphs"] = int(counters["stats"]["unique_graphs"])
        breaks = counters["graph_break"]
        info["graph_breaks"] = int(sum(breaks.values()))
        info["break_reasons"] = [f"{reason} (x{count})" for reason, count in breaks.items()]
        inductor = counters["inductor"]
        info["cache_hits"] = int(inductor["fxgraph_cache_hit"])
        info["cache_misses"] = int(inductor["fxgraph_cache_miss"])
    except Exception:  # noqa: BLE001
        pass
    if None not in (frames_after_first, frames_after_timed, frames_before_timed):
        # A frame compiled after the first step is a recompilation (new shapes, failed guards).
        info["recompiles"] = frames_after_timed - frames_after_first
        info["recompiles_in_timed"] = frames_after_timed - frames_before_timed
    info.update(_phase_times())
    return info


def _phase_times() -> dict:
    """Seconds in dynamo (tracing) and in the backend (AOT autograd + inductor), forward+backward."""
    try:
        from torch._dynamo.utils import calculate_time_spent

        spent = calculate_time_spent()
    except Exception:  # noqa: BLE001
        return {}
    frame = spent.get("entire_frame_compile")
    backend = spent.get("backend_compile")
    backward = spent.get("entire_backward_compile", 0.0)
    return {
        "dynamo_s": round(frame - backend, 3) if frame is not None and backend is not None else None,
        # The backward graph is compiled lazily at the first backward: inductor's share.
        "inductor_s": round(backend + backward, 3) if backend is not None else None,
    }
