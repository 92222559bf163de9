"""What torch.compile did in a child: graphs, graph breaks and their reasons, recompilations, and
where the compile time went.

Read from torch._dynamo's process-wide counters, which are private API: every read is guarded, so
a torch version that renames them yields nulls, not a failed setup. Counters are read between
phases only (after the first step, before and after the timed window), never inside it.
"""

from __future__ import annotations

import logging


def frames_compiled() -> int | None:
    """How many frames dynamo has compiled so far in this process."""
    try:
        from torch._dynamo.utils import counters

        return int(counters["frames"]["total"])
    except Exception:  # noqa: BLE001 - private API; absence is not a failure
        return None


class _LimitHits(logging.Handler):
    """Counts dynamo's "hit config.recompile_limit" warnings: each is a frame that then ran
    eagerly for good (a compiled layer past the limit runs uncompiled), which no counter shows."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        if str(record.msg).startswith("torch._dynamo hit config."):
            self.count += 1


_LIMIT_HITS = _LimitHits()


def watch_recompile_limit() -> None:
    """Start counting recompile-limit hits in this process (before anything compiles)."""
    logger = logging.getLogger("torch._dynamo.convert_frame")
    if _LIMIT_HITS not in logger.handlers:
        logger.addHandler(_LIMIT_HITS)


def diagnostics(frames_after_first: int | None, frames_before_timed: int | None,
                frames_after_timed: int | None, cache: str | None) -> dict:
    """The record's `compile` object; `cache` says how the inductor cache started."""
    info = {"cache": cache, "graphs": None, "graph_breaks": None, "break_reasons": [],
            "recompiles": None, "recompiles_in_timed": None, "dynamo_s": None, "inductor_s": None,
            "cache_hits": None, "cache_misses": None,
            "recompile_limit_hits": _LIMIT_HITS.count}
    try:
        from torch._dynamo.utils import counters

        info["graphs"] = int(counters["stats"]["unique_graphs"])
        breaks = counters["graph_break"]
        info["graph_breaks"] = int(sum(breaks.values()))
        info["break_reasons"] = [f"{reason} (x{count})" for reason, count in breaks.items()]
        if _LIMIT_HITS.count:
            info["break_reasons"].append(
                f"dynamo's recompile limit hit (x{_LIMIT_HITS.count}): code past it ran eagerly")
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
