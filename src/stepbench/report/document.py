"""The report as one document, built once from the records, rendered to every format.

`report_document` joins result files from any number of machines into rows (rows.py), prices
and findings (findings/); `run_document` is the end-of-run table of `stepbench run`, made of the
same columns (columns.py) with the same number rules; the detail tables are detail_tables.py's;
`peak_document` is `stepbench peak`'s table. render.py turns a Document into a terminal table,
Markdown, CSV, JSON or one HTML page.
"""

from __future__ import annotations

import sys

from stepbench import record_files
from stepbench.errors import command_name, warning_line
from stepbench.record import Record
from stepbench.report import meta as about
from stepbench.report import searches, table, tune
from stepbench.report.columns import (COLUMNS, RUN_COLUMNS, align, footnotes, marks, table_cells,
                                      unit_headers)
from stepbench.report.detail_tables import details
from stepbench.report.findings import findings_for, key_findings
from stepbench.report.layout import Document, Table
from stepbench.report.prices import parse_energy_price, unused_keys
from stepbench.report.rows import Row, build_rows
from stepbench.report.select import Filters, labels_for


def warn(message: str, prefix: str = "warning: ") -> None:
    """A problem with the input that does not stop the report: one line on stderr, as every
    command prints a warning (errors.warning_line); `prefix` "" for a plain note."""
    command = command_name()        # report, or compare, whose inputs this reads too
    print(warning_line(command, message) if prefix == "warning: " else
          f"stepbench {command}: {prefix}{message}", file=sys.stderr)


# ---------------------------------------------------------------- builders

def report_document(paths: list[str], *, prices: dict[str, float] | None = None,
                    energy_price: str | None = None,
                    plots: bool = False, filters: Filters = Filters(),
                    labels: list[str] | None = None) -> Document:
    """The whole report of the records in `paths` (files or folders of them), those `filters`
    keep; with `labels` (one per path) each input's records are kept apart; `prices`: dollars
    an hour by GPU (cli/report.py `prices_of`)."""
    prices = prices or {}
    energy = parse_energy_price(energy_price)
    named = labels_for(paths, labels)
    loaded = record_files.load_each(paths, warn)
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
    tables = [Table(unit_headers(COLUMNS, rows), lambda: table_cells(rows, COLUMNS),
                    align(COLUMNS), "Results", footnotes(rows))]
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
        title = about.title([head.setup.model_label], [precisions], head.machine.name)
        if len(hosts) == 1:
            title += f" at {hosts[0]}"
    if len({r.gpu for r in rows}) > 1 or len(hosts) > 1:
        # Several machines (SSH hosts): each row names its own.
        title = about.title([head.setup.model_label], [precisions],
                            f"{len(hosts) or 'several'} machines")
        columns = ["GPU"] + RUN_COLUMNS
    if rows and not any(r.setup.has_seq for r in rows):
        columns = [c for c in columns if c != "Seq"]    # a user's model without seq_len
    tables = [Table(unit_headers(columns, rows), table_cells(rows, columns), align(columns),
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
        per_dollar = unit_headers(["M tokens per $"], rows)[0]
        warn("no price for " + ", ".join(f"'{g}'" for g in missing) + f"; its {per_dollar} "
             "is left blank (add --price \"GPU NAME=DOLLARS\" or a --prices file)")
    for key in unused_keys(prices, [r.gpu_name for r in rows]):
        warn(f"price for '{key}' matches no GPU in the results (GPU names are as the driver "
             "reports them, e.g. 'NVIDIA H100 PCIe')")


# (`marks`: compare.py marks its rows as the report does.)
__all__ = ["marks", "peak_document", "report_document", "rows_document", "run_document", "warn",
           "with_meta"]
