"""The report's detail tables: the columns beyond the Results table (the loss guard, MFU, the
FLOP counter, GPU busy, compile cache and graphs, energy and cost), grouped into tables, each
shown only where some row has data for it.
"""

from __future__ import annotations

import functools
import statistics

from stepbench.guard import DEPARTS, OK, Verdict
from stepbench.record import LAYER_GRAPHS
from stepbench.report import table
from stepbench.report.columns import rows_unit, unit_columns, unit_headers
from stepbench.report.layout import Table
from stepbench.report.rows import Row, setup_labels
from stepbench.units import percent


def _by_workload(rows: list[Row], value) -> str:
    """`value(row)` (a string or None) per model and sequence length, what FLOPs per token
    depend on: "0.906 for llama-468m at 2048 tokens, 0.95 for ..."; "" when all are None."""
    found: dict[str, list[str]] = {}
    for row in rows:
        text = value(row)
        if text is not None:
            where = found.setdefault(text, [])
            if f"{row.model} at {row.seq} tokens" not in where:
                where.append(f"{row.model} at {row.seq} tokens")
    return ", ".join(f"{text} for {' and '.join(where)}" for text, where in found.items())


def _flops_note(rows: list[Row]) -> str | None:
    counted = [r for r in rows if r.achieved_tflops is not None or r.mfu is not None]
    if not counted:
        return None
    conventions = list(dict.fromkeys(r.flops_convention for r in counted if r.flops_convention))
    sources = {r.flops_source for row in counted for r in row.records if r.ok}
    if not conventions and sources and sources <= {"flop_counter", "workload"}:
        # A user's factory: its FLOPs per step as it gave them, or as FlopCounterMode counted.
        said = {"flop_counter": "as torch's FlopCounterMode counted one step (matrix products "
                                "only)", "workload": "as the workload gave them (flops_per_step)"}
        # A ddp or fsdp2 row's count is its model's single-process one (workload/factory.py).
        alone = ("; a ddp or fsdp2 row's count is its single-process setup's, per process"
                 if "flop_counter" in sources and any(r.setup.distributed for r in counted)
                 else "")
        return "TFLOP/s and MFU count the FLOPs per step " + " or ".join(
            said[s] for s in sorted(sources)) + alone + "."
    note = ("TFLOP/s and MFU count the model's FLOPs "
            + ("as " + "; ".join(conventions) if conventions else "by a convention the records "
               "do not name") + ". Attention is counted non-causal, the full score matrix")
    causal = _by_workload(counted, lambda r: f"{r.flops_per_token_causal / r.flops_per_token:.3g}"
                          if r.flops_per_token and r.flops_per_token_causal else None)
    if causal:
        note += ("; counting it causal (half the matrix) would scale these FLOPs, TFLOP/s and "
                 f"MFU by {causal}")
    return note + "."


def _peaks_note(rows: list[Row]) -> str | None:
    if not any(r.mfu is not None for r in rows):
        return None
    peaks = []
    for kind, what in (("measured", "the matmul rate measured on the device"),
                       ("datasheet", "the vendor's dense datasheet peak for the dtype")):
        per_gpu: dict[str, list[float]] = {}
        for row in rows:
            value = getattr(row, f"peak_tflops_{kind}")
            if value is not None and getattr(row, f"mfu_{kind}") is not None:
                per_gpu.setdefault(row.gpu, []).append(value)
        values = ", ".join(f"{table.sig(statistics.median(v))} TFLOP/s on {gpu}"
                           for gpu, v in per_gpu.items())
        peaks.append(f"MFU ({kind} peak) is against {what}" + (f" ({values})" if values else ""))
    return "; ".join(peaks) + ". A - means that peak is unknown."


def _flop_counter_note(rows: list[Row]) -> str | None:
    checked = [r for r in rows if r.flop_counter_diff is not None]
    if not checked:
        return None
    expected = _by_workload(checked, _recompute_share)
    return ("FLOP counter diff compares the FLOPs that torch's FlopCounterMode counted for "
            "one forward and backward with the convention's FLOPs per token x batch x "
            "sequence. With a fused attention kernel (sdpa, flex_attention) the counter finds "
            + (f"more ({expected})" if expected else "more (about 3% for llama-468m at 2048 "
                                                     "tokens)")
            + ", because torch also counts the Q @ K^T product that the kernel's backward "
            "recomputes, 2*L*d*T per token; eager attention keeps the scores and matches to "
            "within 0.1% (the convention also counts the norm weights, which do no matmul).")


def _recompute_share(row: Row) -> str | None:
    """The fused backward's recompute over the convention's FLOPs: the convention's non-causal
    minus causal attention term is 6*L*d*T per token, the recompute a third of it."""
    if not row.flops_per_token or not row.flops_per_token_causal:
        return None
    share = (row.flops_per_token - row.flops_per_token_causal) / 3 / row.flops_per_token
    return f"+{share * 100:.1f}%"


def _energy_note(rows: list[Row]) -> str | None:
    if not any(r.joules_per_token is not None or r.tokens_per_kwh is not None for r in rows):
        return None
    unit = rows_unit(rows)
    joules, per_kwh, hourly, cost = unit_columns(
        ["J/token", "M tokens per kWh", "$/M tokens (hourly)", "$/M tokens (energy)"], unit)
    several = "" if unit else "; units are each model's own, its records' units"
    note = (f"Energy ({joules}, {per_kwh}{several}) is the GPU's alone, from NVML's energy "
            "counter over the timed steps; the host, its cooling and the power supply's losses "
            "are not in it.")
    priced = [r for r in rows if r.energy_cost_per_m_tokens is not None]
    if priced:
        million = f"million {unit or 'tokens'}"
        note += (f" \"{cost}\" is that electricity per {million} at "
                 f"${priced[0].energy_price_per_kwh:g} per kWh; \"{hourly}\" is "
                 f"the GPU time per {million} at the machine's hourly price, which usually "
                 "includes the electricity.")
    return note


LOSS_GUARD_NOTE = (
    "Loss guard: each setup's losses against its reference's, step by step over the steps both "
    "ran; the percentage is the largest relative difference (stepbench.guard). A compiled setup "
    "is checked against its eager twin where that ran, every other setup against the plainest "
    "eager setup of the same model, seed, batch and sequence length (of its own precision where "
    "there is one), the row marked reference; where the weights are kept in another dtype, only "
    "the first loss is compared.")


def loss_guard_note(rows: list[Row]) -> str:
    """LOSS_GUARD_NOTE; without "sequence length" where no row has one (a user's model without
    seq_len)."""
    if any(r.setup.has_seq for r in rows):
        return LOSS_GUARD_NOTE
    return LOSS_GUARD_NOTE.replace("seed, batch and sequence length", "parameters, seed and batch")


def _scaling_note(rows: list[Row]) -> str | None:
    rate = unit_headers(["Tokens/s"], rows)[0]         # a user's workload's own unit
    return (f"{rate} per GPU: the job's {rate.lower()} over its GPUs (processes). Scaling "
            f"efficiency: that over the {rate.lower()} of the same setup on one GPU without a "
            "wrapper (the "
            "baseline named: compiled whole, and in bf16 for FSDP2's mixed precision); 100% is "
            "perfect data-parallel scaling. Wrapping: how the job wrapped the model (FSDP2: its "
            "units, whether layers reshard after the forward, prefetching, the weights' dtype; "
            "compiled, what torch.compile wrapped). Rank spread: how far the "
            "ranks' mean step times differ, (slowest - fastest) / fastest.")


DETAIL_COLUMNS = [  # (header, alignment, has data?, cell); DETAIL_TABLES groups them
    ("Repeats", "r", lambda r: r.repeats > 1, lambda r: str(r.repeats)),
    ("Step 95% CI (ms)", "r", lambda r: r.step_ms_ci is not None,
     lambda r: f"{table.sig(r.step_ms_ci[0])}-{table.sig(r.step_ms_ci[1])}"
     if r.step_ms_ci else "-"),
    ("Noise flags", "l", lambda r: bool(r.noise_flags),
     lambda r: ", ".join(r.noise_flags) or "-"),
    ("TFLOP/s", "r", lambda r: r.achieved_tflops is not None,
     lambda r: table.sig(r.achieved_tflops)),
    # Both MFU columns or neither: a "-" says which peak is unknown.
    ("MFU (measured)", "r", lambda r: r.mfu is not None,
     lambda r: _percent(r.mfu_measured)),
    ("MFU (datasheet)", "r", lambda r: r.mfu is not None,
     lambda r: _percent(r.mfu_datasheet)),
    ("FLOP counter diff", "r", lambda r: r.flop_counter_diff is not None,
     lambda r: _signed_percent(r.flop_counter_diff)),
    ("GPU busy (profiled)", "r", lambda r: r.gpu_busy is not None, lambda r: _busy(r)),
    ("Compile cache", "l", lambda r: r.compile_cache is not None,
     lambda r: r.compile_cache or "-"),
    ("Graph breaks", "r", lambda r: r.compile_marked,
     lambda r: "-" if r.graph_breaks is None else str(r.graph_breaks)),
    ("Recompiles", "r", lambda r: r.compile_marked,
     lambda r: "-" if r.recompiles is None else str(r.recompiles)),
    ("Left eager at the recompile limit", "r",
     lambda r: bool(r.recompile_limit_hits) or r.before_layer_fix,
     lambda r: str(r.recompile_limit_hits) if r.recompile_limit_hits else
     f"layers 9 on, before {LAYER_GRAPHS.since}" if r.before_layer_fix else "-"),
    ("First step warm (s)", "r", lambda r: r.first_step_warm_s is not None,
     lambda r: table.num(r.first_step_warm_s, 1)),
    ("J/token", "r", lambda r: r.joules_per_token is not None,
     lambda r: table.sig(r.joules_per_token, 2)),
    ("M tokens per kWh", "r", lambda r: r.tokens_per_kwh is not None,
     lambda r: table.sig(r.tokens_per_kwh / 1e6 if r.tokens_per_kwh else None, 2)),
    # The GPU-time cost next to the electricity cost, only where the latter was asked for.
    ("$/M tokens (hourly)", "r", lambda r: r.energy_cost_per_m_tokens is not None,
     lambda r: _dollars(r.dollars_per_m_tokens)),
    ("$/M tokens (energy)", "r", lambda r: r.energy_cost_per_m_tokens is not None,
     lambda r: _dollars(r.energy_cost_per_m_tokens)),
    ("Loss guard", "l", lambda r: r.loss_guard is not None, lambda r: guard_cell(r.loss_guard)),
    ("Processes", "r", lambda r: r.setup.distributed, lambda r: r.setup.parallel_label),
    ("Wrapping", "l", lambda r: r.setup.distributed, lambda r: wrapping(r)),
    ("Tokens/s per GPU", "r", lambda r: r.tokens_per_s_per_gpu is not None,
     lambda r: table.num(r.tokens_per_s_per_gpu, 0, thousands=True)),
    ("Rank spread", "r", lambda r: r.rank_spread is not None,
     lambda r: "-" if r.rank_spread is None else f"{r.rank_spread * 100:.1f}%"),
    ("Scaling efficiency", "r", lambda r: r.scaling_efficiency is not None,
     lambda r: _percent(r.scaling_efficiency)),
    ("Baseline", "l", lambda r: r.scaling_baseline is not None,
     lambda r: r.scaling_baseline or "-"),
]


def _percent(fraction: float | None) -> str:
    return "-" if fraction is None else f"{fraction * 100:.0f}%"


def _busy(row) -> str:
    """"96%", or "95% (lowest 78%)" where a process was well below the row's median."""
    text = _percent(row.gpu_busy)
    if row.gpu_busy_low is not None and row.gpu_busy - row.gpu_busy_low >= 0.02:
        text += f" (lowest {_percent(row.gpu_busy_low)})"
    return text


GPU_BUSY_NOTE = ("GPU busy: the kernel time of the one step `run --profile` profiled, over the "
                 "process's median timed step; the rest of the step the GPU waited for the host "
                 "(Python, dispatch, kernel launches, hooks). The median over the row's processes.")


def _signed_percent(fraction: float | None) -> str:
    if fraction is None:
        return "-"
    text = f"{fraction * 100:+.1f}%"
    return "0.0%" if text in ("+0.0%", "-0.0%") else text


def _dollars(value: float | None) -> str:
    return "-" if value is None else "$" + table.sig(value, 2)


def guard_cell(verdict: Verdict | None) -> str:
    """The loss guard's verdict in a cell: "ok 0.19% vs eager+sdpa" (the largest relative
    difference over the steps compared), "departs 4.1% (tolerance 2%) vs eager+sdpa",
    "reference" (the others of its group were checked against it), "unchecked"."""
    if verdict is None:
        return "-"
    if verdict.random:
        return f"{verdict.status} (the step draws random numbers)"
    if verdict.status not in (OK, DEPARTS) or verdict.max_rel_diff is None:
        return verdict.status
    text = f"{verdict.status} {percent(verdict.max_rel_diff)}"
    if verdict.departs:
        text += f" (tolerance {percent(verdict.tolerance)})"
    text += f" vs {verdict.reference}"
    return text + (", first loss" if verdict.first_only else "")


# The details as one table per theme: all their columns side by side (up to 18 with GPU and
# setup) are wider than a page or a terminal. (title, column headers, notes explaining them)
DETAIL_TABLES = [
    ("Details: repeats and noise", ["Repeats", "Step 95% CI (ms)", "Noise flags"],
     lambda rows: []),
    ("Details: FLOPs and MFU",
     ["TFLOP/s", "MFU (measured)", "MFU (datasheet)", "FLOP counter diff"],
     lambda rows: [_flops_note(rows), _peaks_note(rows), _flop_counter_note(rows)]),
    ("Details: torch.compile",
     ["Compile cache", "Graph breaks", "Recompiles", "Left eager at the recompile limit",
      "First step warm (s)"],
     lambda rows: []),
    ("Details: the GPU or the host", ["GPU busy (profiled)"], lambda rows: [GPU_BUSY_NOTE]),
    ("Details: losses", ["Loss guard"], lambda rows: [loss_guard_note(rows)]),
    ("Details: scaling",
     ["Processes", "Wrapping", "Tokens/s per GPU", "Rank spread", "Scaling efficiency",
      "Baseline"],
     lambda rows: [_scaling_note(rows)]),
    ("Details: energy and cost",
     ["J/token", "M tokens per kWh", "$/M tokens (hourly)", "$/M tokens (energy)"],
     lambda rows: [_energy_note(rows)]),
]


def details(rows: list[Row]) -> list[Table]:
    """What the records measured beyond the main table's columns (repeats, CI, noise flags, TFLOP/s
    and MFU, the FLOP counter's cross-check, compile cache, the loss guard, energy and its cost),
    one table per theme of DETAIL_TABLES. A column appears only when some row has its number,
    a table only when it has a column, and a row only when it has one of its table's numbers."""
    by_header = {c[0]: c for c in DETAIL_COLUMNS}
    tables = []
    labels = functools.cache(lambda: setup_labels(rows))    # once, for whichever table is read
    for title, headers, notes in DETAIL_TABLES:
        used = [by_header[h] for h in headers if any(by_header[h][2](r) for r in rows)]
        if not used:
            continue
        shown = [r for r in rows if any(c[2](r) for c in used)]
        tables.append(Table(unit_headers(["GPU", "Setup"] + [c[0] for c in used], shown),
                            functools.partial(_cells, labels, shown, used),
                            "ll" + "".join(c[1] for c in used), title,
                            [n for n in notes(shown) if n]))
    return tables


def _cells(labels, shown: list[Row], used: list[tuple]) -> list[list[str]]:
    """A details table's cells (made when read: JSON shows only the notes); `labels()`: every
    row's setup label, by id."""
    names = labels()
    return [[r.gpu, names[id(r)]] + [c[3](r) for c in used] for r in shown]


def wrapping(row) -> str:
    """How the job wrapped the model: as its records measured it (a user's model: the block
    class FSDP2 sharded, or the root alone), else as the setup says (records before that)."""
    measured = [(r.scaling or {}).get("wrapping") for r in row.records]
    return next((w for w in measured if w), row.setup.wrapping)
