"""The record formats stepbench has written within schema 1, by name (record.py reads and writes
them): which fields a later format added, so that a record written before reads back unchanged
and code asks a record's format, not a date."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, order=True)
class RecordFormat:
    """A record format stepbench has written, within one `schema` (each later one only adds
    what an older reader ignores): `order` sorts them oldest first; `since` says when it began,
    as the report words it; `added` what a record of it holds that older ones lack."""

    order: int
    name: str
    since: str
    added: str


FORMAT_V1 = RecordFormat(0, "v1", "stepbench 0.1",
                         "every field but LATER_FIELDS, which it never wrote")
"""The first format: a record that leaves every LATER_FIELDS field empty is still written in
it, byte for byte, so that files written then read back unchanged."""

LAYER_GRAPHS = RecordFormat(1, "layer-graphs", "2026-12-02",
                            "`compile.recompile_limit_hits` in every compiled record")
"""Per-layer compile (`--compile-scope layer`, compiled FSDP2) gives every decoder layer its own
graph. In a compiled record of an older format the layers past dynamo's recompile limit, the
ninth on, ran eagerly (benchmarks/README.md section e)."""

FORMATS = (FORMAT_V1, LAYER_GRAPHS)

# Record fields added after FORMAT_V1, left out of the JSON while empty (null, [], {}): a record
# that does not use them is written in FORMAT_V1, so old files read back unchanged. Reading, a
# missing one takes its default.
LATER_FIELDS = ("peak_allocated_gb", "peak_memory_source", "loss_tolerance", "peak_measured_at",
                "phases", "ranks", "scaling", "placement", "host", "rental", "search", "threads",
                "profile", "units", "units_per_step", "flops_per_step", "flops_source", "notes",
                "traceback", "memory_cap", "host_lead_ms", "host_lead_steps_ms",
                "host_lead_offset_ms", "cpu_pinning", "blocks", "draws_random",
                "param_defaults")
