"""A row's details, combined from its processes' records: the first step and what torch.compile
did (a cold or warm cache, graph breaks, recompiles, layers left eager in an older record
format), TFLOP/s, MFU and the FLOP counter, how busy the GPU was, the last loss and energy.

Each `combine_*` fills the fields of one report/rows.py Row from the records that ran (`ok`).
"""

from __future__ import annotations

import statistics
from collections import Counter

from stepbench.record import LAYER_GRAPHS, Record


def median(values) -> float | None:
    values = [v for v in values if v is not None]
    if len(values) == 1:        # one process: its value (statistics.median's, without a sort)
        return values[0]
    return statistics.median(values) if values else None


def most(values) -> int | None:
    values = [v for v in values if v is not None]
    return max(values) if values else None


# A per-layer compiled record older than LAYER_GRAPHS, in the report's words.
BEFORE_LAYER_GRAPHS = (f"measured before every decoder layer had its own graph "
                       f"({LAYER_GRAPHS.since}): the layers past dynamo's recompile limit, the "
                       "ninth on, ran eagerly; run it again to measure it compiled")


def _cache(record: Record) -> str | None:
    return (record.compile or {}).get("cache")


def compile_start(record: Record) -> str | None:
    """How a compiled process's first step found inductor's cache: "cold" (an empty cache of
    its own, or a shared one from which inductor's counters say no graph came: no hits, some
    misses), "warm" (its setup's own cache from an earlier process), "shared-warm" (a shared
    cache that every graph came from), "shared" (a shared cache, partly or unknown), None
    (no cache details: eager, or an older record)."""
    cache = _cache(record)
    if cache != "shared":
        return cache
    hits, misses = record.compile.get("cache_hits"), record.compile.get("cache_misses")
    if hits == 0 and misses:
        return "cold"
    return "shared-warm" if hits and misses == 0 else "shared"


def combine_first_step(row, ok: list[Record]) -> None:
    """First step: the median over the processes whose compile was the coldest the row has:
    cold ones (or, without any, those sharing a cache, else the warm ones); the warm ones
    apart (first_step_warm_s). A shared cache's process counts as cold only where inductor's
    counters say so: combining a run's records with a tune's (which share one cache), a
    shared-cache compile of a few seconds is not a cold one. Records without cache details
    are judged by those that have them."""
    starts = {id(r): compile_start(r) for r in ok}
    said = [r for r in ok if starts[id(r)] is not None] or ok
    cold = [r for r in said if starts[id(r)] in ("cold", None)]
    shared = [r for r in said if starts[id(r)] in ("shared", "shared-warm")]
    warm = [r for r in said if starts[id(r)] == "warm"]
    if cold:
        first, row.first_step_cache = cold, "cold" if starts[id(cold[0])] else None
        warm = warm + [r for r in shared if starts[id(r)] == "shared-warm"]
    elif shared:
        first, row.first_step_cache = shared, "shared"
    else:
        first, row.first_step_cache, warm = warm, "warm", []
    row.first_step_s = median(r.first_step_s for r in first)
    row.first_step_warm_s = median(r.first_step_s for r in warm)
    row.warm_from_shared = any(starts[id(r)] == "shared-warm" for r in warm)
    compiled = [r.compile for r in ok if r.compile]
    row.graph_breaks = most(c.get("graph_breaks") for c in compiled)
    row.recompiles = most(c.get("recompiles") for c in compiled)
    row.recompile_limit_hits = most(c.get("recompile_limit_hits") for c in compiled)
    row.break_reasons = list(dict.fromkeys(b for c in compiled
                                           for b in c.get("break_reasons") or []))
    row.before_layer_fix = any(r.compiled_too_few_layers for r in ok)
    if row.before_layer_fix:
        row.break_reasons.append(BEFORE_LAYER_GRAPHS)
    caches = Counter(_cache(r) for r in ok if _cache(r))
    if set(caches) == {"shared"}:
        kinds = {starts[id(r)] for r in ok if _cache(r)}
        row.shared_cache = ("cold" if kinds == {"cold"} else "warm" if kinds == {"shared-warm"}
                            else None)
    if len(caches) == 1:
        row.compile_cache = next(iter(caches))
    elif caches:
        row.compile_cache = ", ".join(f"{n} {c}" for c, n in sorted(caches.items()))


def combine_details(row, ok: list[Record]) -> None:
    for name in ("achieved_tflops", "mfu_measured", "mfu_datasheet", "peak_tflops_measured",
                 "peak_tflops_datasheet", "flops_per_token", "flops_per_token_causal"):
        setattr(row, name, median(getattr(r, name) for r in ok))
    for source in ("measured", "datasheet"):
        value = getattr(row, f"mfu_{source}")
        if value is not None:
            row.mfu, row.mfu_source = value, source
            break
    row.flops_convention = next((r.flops_convention for r in ok if r.flops_convention), None)
    row.flop_counter_diff = median(_flop_counter_diff(r) for r in ok)
    row.loss_last = median(_last_loss(r) for r in ok)
    busy = [b for b in map(gpu_busy, ok) if b is not None]
    if busy:
        row.gpu_busy, row.gpu_busy_low = median(busy), min(busy)


def gpu_busy(record: Record) -> float | None:
    """The share of a typical step the GPU ran kernels: `run --profile`'s kernel time of its
    one profiled step over the record's median timed step (at most 1; the profiler slows the
    host, not the kernels). None without a GPU profile."""
    device_s = (record.profile or {}).get("device_s")
    if not device_s or not record.step_ms_median:
        return None
    return min(1.0, device_s * 1000 / record.step_ms_median)


def _flop_counter_diff(record: Record) -> float | None:
    """FlopCounterMode's FLOPs per step relative to the convention's, minus 1."""
    counted, per_token = record.flop_counter_per_step, record.flops_per_token
    if not counted or not per_token:
        return None
    return counted / (per_token * record.setup.tokens_per_step) - 1


def combine_energy(row, ok: list[Record], energy_price: float | None) -> None:
    energies = [r.energy for r in ok if isinstance(r.energy, dict)]
    row.tokens_per_kwh = median(e.get("tokens_per_kwh") for e in energies)
    row.joules_per_token = median(e["joules_per_step"] / row.setup.tokens_per_step
                                   for e in energies if e.get("joules_per_step") is not None)
    row.energy_price_per_kwh = energy_price
    if energy_price is not None and row.tokens_per_kwh:
        row.energy_cost_per_m_tokens = 1e6 / row.tokens_per_kwh * energy_price


def _last_loss(record: Record) -> float | None:
    return record.losses[-1] if record.losses else record.loss_last
