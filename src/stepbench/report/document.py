"""The report as one document, built once from the records, rendered to every format.

`report_document` joins result files from any number of machines into rows (rows.py), prices
and findings (findings.py); `run_document` is the end-of-run table of `stepbench run`, made of the
same columns with the same number rules; `peak_document` is `stepbench peak`'s table. render.py
turns a Document into a terminal table, Markdown, CSV, JSON or one HTML page.
"""

from __future__ import annotations

import statistics
import sys

from stepbench import record as store
from stepbench.errors import command_name, first_line, warning_line
from stepbench.guard import DEPARTS, OK, Verdict
from stepbench.record import Record
from stepbench.report import meta as about
from stepbench.report import searches, table, tune
from stepbench.report.findings import findings_for, key_findings
from stepbench.report.layout import Document, Table
from stepbench.report.marks import (COMPILE_MARK, DEPARTS_MARK, MEMORY_FLAG, MEMORY_MARK,
                                    NOISE_MARKS, mark_notes, noise_marks)
from stepbench.report.prices import (load_price_file, parse_energy_price, parse_price_flags,
                                     unused_keys)
from stepbench.report.rows import Row, build_rows, setup_labels, status_text
from stepbench.report.select import Filters, labels_for
from stepbench.units import percent

STATUS_NOTES = {
    "oom": "OOM means the step did not fit in {where}.",
    "timeout": "timeout means the setup ran past its time limit and was stopped.",
    "crashed": "crashed means the process died (signal or exit code) without a result.",
    "error": "error means the setup raised an exception other than out-of-memory.",
    "unsupported": "unsupported means the setup cannot run on this machine or software.",
}


def status_note(status: str, rows: list[Row]) -> str:
    """The meaning of `status`; for OOM, which memory the step did not fit in."""
    if status != "oom":
        return STATUS_NOTES[status]
    places = []
    if any(r.setup.memory_limit_gb is not None and r.setup.device == "cuda" for r in rows):
        places.append("its --memory-limit-gb cap")
    if any(r.setup.memory_limit_gb is not None and r.setup.device == "cpu" for r in rows):
        places.append("its --memory-limit-gb cap on address space")
    if any(r.setup.memory_limit_gb is None and r.setup.device == "cuda" for r in rows):
        places.append("the GPU's memory")
    if any(r.setup.memory_limit_gb is None and r.setup.device == "cpu" for r in rows):
        places.append("the machine's memory")
    return STATUS_NOTES["oom"].format(where=" or ".join(places))


def warn(message: str, prefix: str = "warning: ") -> None:
    """A problem with the input that does not stop the report: one line on stderr, as every
    command prints a warning (errors.warning_line); `prefix` "" for a plain note."""
    command = command_name()        # report, or compare, whose inputs this reads too
    print(warning_line(command, message) if prefix == "warning: " else
          f"stepbench {command}: {prefix}{message}", file=sys.stderr)


# ---------------------------------------------------------------- builders

def report_document(paths: list[str], *, price_file: str | None = None,
                    price_flags: list[str] = (), energy_price: str | None = None,
                    plots: bool = False, filters: Filters = Filters(),
                    labels: list[str] | None = None) -> Document:
    """The whole report of the records in `paths` (files or folders of them), those `filters`
    keep; with `labels` (one per path) each input's records are kept apart."""
    prices = load_price_file(price_file) if price_file else {}
    prices.update(parse_price_flags(list(price_flags)))
    energy = parse_energy_price(energy_price)
    named = labels_for(paths, labels)
    loaded = store.load_each(paths, warn)
    records = filters.apply([r for found in loaded for r in found])
    kept = {id(r) for r in records}
    by_record = {id(r): label for label, found in zip(named, loaded) for r in found
                 if label is not None and id(r) in kept}
    # A search's probes decided something; they are not measurements to rank.
    measured, _ = searches.split(records)
    if not measured:
        warn("every record is a search's probe; the Results table is empty (the searches' "
             "tables list them)")
    rows = build_rows(measured, prices, energy, labels=by_record)
    _warn_prices(rows, prices)
    if energy is not None and not any(r.tokens_per_kwh for r in rows):
        warn("--energy-price given, but no record carries an energy measurement (NVML's energy "
             "counter, GPU only); no energy cost is shown")
    doc = rows_document(rows, plots=plots, searched=records)
    if labels:
        doc.meta["labels"] = list(dict.fromkeys(named))
    return doc


def with_meta(doc: Document, records: list[Record]) -> Document:
    """`doc` with what `records` measured: JSON's `meta` and the other formats' header."""
    doc.meta = about.measured(records)
    doc.header = [tuple(line.split(": ", 1)) for line in about.header(doc.meta)]
    return doc


def rows_document(rows: list[Row], *, plots: bool = False,
                  searched: list[Record] = ()) -> Document:
    """The report of rows already built: results table, details, findings, plots. `searched`:
    records among which those of searches are listed: each tune's in a "Tune" table
    (report/tune.py), the other probes and max-batch full measurements in "Details: searches"
    (report/searches.py)."""
    tables = [Table(unit_headers(COLUMNS, rows), table_cells(rows, COLUMNS), _align(COLUMNS),
                    "Results", footnotes(rows))]
    tables += details(rows)
    tables += tune.tune_tables(list(searched))
    search_table = searches.details_table(list(searched))
    if search_table is not None:
        tables.append(search_table)
    pngs, note = {}, None
    if plots:
        from stepbench.report.plots import figures, plots_note

        pngs, note = figures(rows), plots_note(rows)
    groups = findings_for(rows) + searches.max_batch_findings(rows)
    doc = Document("stepbench report", tables, groups, lead=key_findings(rows, groups),
                   rows=rows, pngs=pngs, plots_note=note,
                   searches=searches.search_dicts(list(searched)),
                   tunes=tune.tune_dicts(list(searched)))
    every = list(searched) or [r for row in rows for r in row.records]
    return with_meta(doc, every) if every else doc


def run_document(records: list[Record], searched: list[Record] = ()) -> Document:
    """`stepbench run`'s table: one row per setup (repeats combined as the report does); with
    `searched` (`run --max-batch`: every record of its searches) also "Details: searches"
    (and the full measurements that ran out of memory before a smaller batch are listed there,
    not in the table, as the report does)."""
    if searched:
        records, _ = searches.split(records)
    rows = build_rows(records, {})
    head = records[0] if records else None
    title, columns = None, RUN_COLUMNS
    hosts = list(dict.fromkeys(r.host for r in records if r.host))
    precisions = ", ".join(dict.fromkeys(r.setup.dtype for r in records))
    if head is not None:
        title = about.title([head.setup.model_label], [precisions], about.machine_name(head))
        if len(hosts) == 1:
            title += f" at {hosts[0]}"
    if len({r.gpu for r in rows}) > 1 or len(hosts) > 1:
        # Several machines (SSH hosts): each row names its own.
        title = about.title([head.setup.model_label], [precisions],
                            f"{len(hosts) or 'several'} machines")
        columns = ["GPU"] + RUN_COLUMNS
    tables = [Table(unit_headers(columns, rows), table_cells(rows, columns), _align(columns),
                    notes=footnotes(rows, explain=False))]
    search_table = searches.details_table(list(searched))
    if not rows and search_table is not None:
        tables = []         # every search stopped before a full measurement: nothing to rank
    if search_table is not None:
        tables.append(search_table)
    return Document(title, tables, rows=rows, searches=searches.search_dicts(list(searched)))


def peak_document(result: dict) -> Document:
    """`stepbench peak`'s one-row table (measure/peaks.measure_peak's result)."""
    name = result["gpu"] if result["device"] == "cuda" else f"cpu ({result['cpu']})"
    fraction = result["fraction_of_datasheet"]
    row = [name, result["dtype"], str(result["size"]), table.sig(result["measured_tflops"]),
           table.num(result["datasheet_tflops"], 1), "-" if fraction is None else f"{fraction:.0%}"]
    n = result["size"]
    when = (f"after {result['sustained_s']:g} s of sustained load (the power-capped rate)"
            if result.get("sustained_s") else "after a short warm-up (the burst rate)")
    notes = [f"measured: median of {result['repeats']} timed {n} x {n} x {n} products on random "
             f"data (2*n^3 FLOPs each), {when}.",
             "datasheet: the vendor's dense peak (no sparsity) for this dtype, "
             "stepbench.measure.peaks.DATASHEET_PEAK_TFLOPS; '-' where the GPU or dtype is not "
             "listed."]
    columns = ["device", "dtype", "size", "measured TFLOP/s", "datasheet TFLOP/s", "of datasheet"]
    return Document(None, [Table(columns, [row], "llrrrr", notes=notes)])


def _warn_prices(rows: list[Row], prices: dict[str, float]) -> None:
    missing = list(dict.fromkeys(r.gpu_name for r in rows if r.price_per_hour is None))
    if missing:
        warn("no price for " + ", ".join(f"'{g}'" for g in missing) + "; its M tokens per $ "
             "is left blank (add --price \"GPU NAME=DOLLARS\" or a --prices file)")
    for key in unused_keys(prices, [r.gpu_name for r in rows]):
        warn(f"price for '{key}' matches no GPU in the results (GPU names are as the driver "
             "reports them, e.g. 'NVIDIA H100 PCIe')")


# ---------------------------------------------------------------- rendering

# header -> (alignment, cell of a row that ran). Identity columns (IDENTITY) are filled for every
# row; a row that did not run shows its status under Step (ms) and "-" in the rest.
CELLS = {
    "GPU": ("l", lambda row, label: row.gpu),
    "$/hour": ("r", lambda row, label: table.num(row.price_per_hour, 2)),
    "Setup": ("l", lambda row, label: label),
    "Batch": ("r", lambda row, label: str(row.batch)),
    "Seq": ("r", lambda row, label: str(row.seq)),
    "Step (ms)": ("r", lambda row, label: table.sig(row.step_ms) + marks(row)),
    "Tokens/s": ("r", lambda row, label: table.num(row.tokens_per_s, 0, thousands=True)),
    "Peak memory": ("r", lambda row, label: table.gb(row.peak_memory_gb)
                    + (MEMORY_MARK[0] if MEMORY_FLAG in row.noise_flags else "")),
    "First step (s)": ("r", lambda row, label: table.num(row.first_step_s, 1)),
    "M tokens per $": ("r", lambda row, label: table.sig(row.m_tokens_per_dollar, 2)),
}
IDENTITY = ("GPU", "$/hour", "Setup", "Batch", "Seq")
COLUMNS = ["GPU", "$/hour", "Setup", "Step (ms)", "Tokens/s", "Peak memory", "First step (s)",
           "M tokens per $"]
RUN_COLUMNS = ["Setup", "Batch", "Seq", "Step (ms)", "Tokens/s", "Peak memory", "First step (s)"]
def unit_headers(columns: list[str], rows: list[Row]) -> list[str]:
    """The headers, with a user's workload's unit in place of tokens where every row that ran
    counts the same one ("Images/s", "M images per $"); tokens stay tokens, and rows of several
    units keep the token headers (their records say each row's unit)."""
    units = {r.units for row in rows for r in row.records if r.ok}
    if len(units) != 1 or None in units or units == {"tokens"}:
        return list(columns)
    unit = units.pop()
    names = {"Tokens/s": f"{unit.capitalize()}/s", "M tokens per $": f"M {unit} per $"}
    return [names.get(c, c) for c in columns]


def _align(columns: list[str]) -> str:
    return "".join(CELLS[c][0] for c in columns)


def table_cells(rows: list[Row], columns: list[str]) -> list[list[str]]:
    """The rows as strings, one cell per column."""
    labels = setup_labels(rows, shown=[c for c in ("Batch", "Seq") if c in columns])
    cells = []
    for row in rows:
        label = labels[id(row)]
        if row.ok:
            cells.append([CELLS[c][1](row, label) for c in columns])
        else:
            cells.append([CELLS[c][1](row, label) if c in IDENTITY
                          else status_text(row.status) if c == "Step (ms)" else "-"
                          for c in columns])
    return cells


def marks(row: Row) -> str:
    """The marks after a row's step time: the loss guard's, noise flags, then what
    torch.compile did."""
    found = [DEPARTS_MARK] if row.departs else []
    found += noise_marks(row.noise_flags)
    if row.compile_marked:
        found.append(COMPILE_MARK[0])
    return "".join(dict.fromkeys(found))


def footnotes(rows: list[Row], explain: bool = True) -> list[str]:
    """What each mark and status means and how rows were combined; with `explain` also what the
    numbers are, prices and failures' messages (the results table's notes; each details table
    carries its own, `details`)."""
    notes = []
    if explain:
        notes.append("Step (ms) is the mean of a process's timed steps; Tokens/s is batch x "
                     "sequence per step time; Peak memory is the peak allocated during the timed "
                     "steps; First step includes compilation.")
    if explain and any(r.m_tokens_per_dollar is not None for r in rows):
        notes.append('"M tokens per $" is training tokens per dollar of GPU time, in millions, '
                     "at each machine's hourly price.")
    if any(r.setup.distributed for r in rows):
        notes.append(DISTRIBUTED_NOTE)
    labels = setup_labels(rows)
    notes += [f"{DEPARTS_MARK} loss guard: {r.loss_guard.describe(labels[id(r)])}; "
              "do not take its speed as a way to train this model." for r in rows if r.departs]
    if any(r.setup.uses_cudagraphs for r in rows if r.ok):
        notes.append("Under CUDA graphs (compile modes reduce-overhead, max-autotune) Peak memory "
                     "is the peak reserved memory, graph pools included: max_memory_allocated "
                     "does not see a graph replay's memory.")
    if any(r.peak_memory_source == "tensors" for row in rows for r in row.records if r.ok):
        notes.append("On the CPU, Peak memory is the peak of the step's tensors (weights, "
                     "gradients, optimizer state, activations), as torch's profiler counts "
                     "their allocations over one more step after the timed ones.")
    used = sorted({r.status for r in rows if not r.ok} & set(STATUS_NOTES),
                  key=list(STATUS_NOTES).index)
    notes += [status_note(s, [r for r in rows if r.status == s]) for s in used]
    names = _row_names(rows)
    notes += _combined_notes(rows, names)
    notes += mark_notes((r.noise_flags for r in rows),
                        compiled=any(r.compile_marked for r in rows))
    if not explain:
        return notes
    unknown = sorted({f for r in rows for f in r.noise_flags
                      if f not in NOISE_MARKS and f != MEMORY_FLAG})
    if unknown:
        notes.append("Other noise flags: " + ", ".join(unknown) + " (see the details).")
    for row in rows:
        if not row.ok and row.status != "oom" and row.error:
            notes.append(f"{names[id(row)]} {status_text(row.status)}: "
                         f"{_error_line(row)}")
    missing = sorted({r.gpu_name for r in rows if r.price_per_hour is None})
    if missing:
        notes.append("No price for " + ", ".join(missing) + ": M tokens per $ is left blank.")
    rented = sorted({(r.gpu, r.price_source) for r in rows
                     if r.price_source not in (None, "given")})
    if rented:
        notes.append("Prices of " + ", ".join(f"{gpu} ({source})" for gpu, source in rented)
                     + " are the provider's hourly price of the rented machine, per GPU; "
                     "--price or --prices overrides them.")
    return notes


def _error_line(row: Row) -> str:
    """An error's line for a note: the first for an `error` (the exception the child caught; the
    stderr tail after it may end in an unrelated warning), else the last (a crash's stderr)."""
    return first_line(row.error, limit=160, last=row.status != "error")


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
            "about 3% more" + (f" ({expected})" if expected else "")
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
    note = ("Energy (J per token, M tokens per kWh) is the GPU's alone, from NVML's energy "
            "counter over the timed steps; the host, its cooling and the power supply's losses "
            "are not in it.")
    priced = [r for r in rows if r.energy_cost_per_m_tokens is not None]
    if priced:
        note += (f" \"$/M tokens (energy)\" is that electricity per million tokens at "
                 f"${priced[0].energy_price_per_kwh:g} per kWh; \"$/M tokens (hourly)\" is "
                 "the GPU time per million tokens at the machine's hourly price, which usually "
                 "includes the electricity.")
    return note


def _row_names(rows: list[Row]) -> dict[int, str]:
    """"GPU setup-label" per row, for notes: the label names the model (or batch, dtype...)
    where rows differ in it, so that a note points at one row."""
    labels = setup_labels(rows)
    return {id(r): f"{r.gpu} {labels[id(r)]}" for r in rows}


def _combined_notes(rows: list[Row], names: dict[int, str]) -> list[str]:
    notes = []
    by_count: dict[int, list[Row]] = {}
    for row in rows:
        if len(row.repeat_step_ms) > 1:
            by_count.setdefault(len(row.repeat_step_ms), []).append(row)
    for n, group in sorted(by_count.items()):
        which = "every row" if len(group) == len([r for r in rows if r.ok]) else \
            ", ".join(names[id(r)] for r in group)
        notes.append(f"{n} repeats combined ({which}): median of per-process means, max of "
                     "peaks, 95% CI by bootstrap over the per-process means (details).")
    for row in rows:
        if row.runs > 1:
            notes.append(f"{names[id(row)]}: records from {row.runs} runs were combined "
                         "as repeats.")
        bad = {s: n for s, n in row.statuses.items() if s != "ok"}
        if row.ok and bad:
            what = ", ".join(f"{n} {status_text(s)}" for s, n in bad.items())
            notes.append(f"{names[id(row)]}: {what} of {row.repeats} repeats; the numbers "
                         "come from the others.")
    return notes


DISTRIBUTED_NOTE = (
    "A ddp or fsdp2 row is one torchrun job of several processes, one GPU each: Step (ms) is its "
    "slowest rank's mean, Tokens/s counts the global batch (batch x sequence x processes), Peak "
    "memory is the largest of any rank (per GPU), and its cost per token pays for every GPU of "
    "the job.")


LOSS_GUARD_NOTE = (
    "Loss guard: each setup's losses against its reference's, step by step over the steps both "
    "ran; the percentage is the largest relative difference (stepbench.guard). A compiled setup "
    "is checked against its eager twin where that ran, every other setup against the plainest "
    "eager setup of the same model, seed, batch and sequence length (of its own precision where "
    "there is one), the row marked reference; where the weights are kept in another dtype, only "
    "the first loss is compared.")


def _scaling_note(rows: list[Row]) -> str | None:
    return ("Tokens/s per GPU: the job's tokens/s over its GPUs (processes). Scaling efficiency: "
            "that over the tokens/s of the same setup on one GPU without a wrapper (the "
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
     "layers 9 on, before 2026-12-02" if r.before_layer_fix else "-"),
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
    ("Wrapping", "l", lambda r: r.setup.distributed, lambda r: r.setup.wrapping),
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
    ("Details: losses", ["Loss guard"], lambda rows: [LOSS_GUARD_NOTE]),
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
    labels = setup_labels(rows)
    tables = []
    for title, headers, notes in DETAIL_TABLES:
        used = [by_header[h] for h in headers if any(by_header[h][2](r) for r in rows)]
        if not used:
            continue
        shown = [r for r in rows if any(c[2](r) for c in used)]
        tables.append(Table(["GPU", "Setup"] + [c[0] for c in used],
                            [[r.gpu, labels[id(r)]] + [c[3](r) for c in used] for r in shown],
                            "ll" + "".join(c[1] for c in used), title,
                            [n for n in notes(shown) if n]))
    return tables
