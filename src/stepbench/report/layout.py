"""What a report is made of: tables of formatted cells, findings, and the data behind them.

Its own module so that the builders (document.py, searches.py, tune.py) and the renderer
(render.py) import it without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from stepbench.report.findings import Finding
    from stepbench.report.rows import Row


class _MadeWhenRead:
    """A Table's cells, given as the list or as a function that makes it, called when the
    cells are first read: JSON reads only a report's notes, and formatting thousands of rows'
    cells for no one cost a twentieth of a large report's time. (A dataclass field whose default
    is a descriptor is set and read through it; no default: its class read raises.)"""

    def __get__(self, table, owner=None):
        if table is None:
            raise AttributeError("cells")
        cells = table.__dict__["_cells"]
        if callable(cells):
            cells = table.__dict__["_cells"] = cells()
        return cells

    def __set__(self, table, cells) -> None:
        table.__dict__["_cells"] = cells


@dataclass
class Table:
    """A table of formatted cells, with its title and the notes printed under it."""

    columns: list[str]
    cells: list[list[str]] | Callable[[], list[list[str]]] = _MadeWhenRead()
    align: str
    title: str | None = None
    notes: list[str] = field(default_factory=list)


@dataclass
class Document:
    """Everything a report shows, formatted once; render.py only lays it out."""

    title: str | None
    tables: list[Table]                    # the main table first
    findings: list[tuple[str | None, list[Finding]]] = field(default_factory=list)  # per heading
    # The few findings to read first, as (workload's short name or None, finding); each is also
    # in `findings`, in its place.
    lead: list[tuple[str | None, Finding]] = field(default_factory=list)
    # For JSON and CSV (unformatted numbers): the report's Rows, or rows of another kind with
    # as_dict() and csv_dict() (compare's Change).
    rows: list[Row] = field(default_factory=list)
    # Records a search asked for that are not ranked (probes) and its full measurements, for
    # JSON and CSV (report/searches.py); empty without searches.
    searches: list[dict] = field(default_factory=list)
    # Each tune's records, as its table lists them (report/tune.py's tune_dict), for JSON and
    # CSV; empty without tunes.
    tunes: list[dict] = field(default_factory=list)
    pngs: dict[str, bytes] = field(default_factory=dict)   # plots.figures
    plots_note: str | None = None          # what the plots leave out (plots.plots_note)
    # What the records measured (report/meta.py): JSON's `meta`, and the header lines that
    # open the other formats, as (label, text): ("Measured", "llama-468m, batch 4 x 2048, ...").
    meta: dict | None = None
    header: list[tuple[str, str]] = field(default_factory=list)
    # A Document of other rows than the report's (compare's): its CSV columns, and JSON keys
    # beside rows, findings, notes and meta.
    csv_keys: list[str] | None = None
    extra: dict = field(default_factory=dict)
    # Rows of another kind after the report's in CSV, in columns of their own (keys, dicts):
    # the predicted section (`report --predict`), whose measured columns stay empty.
    csv_more: list[tuple[list[str], list[dict]]] = field(default_factory=list)

    @property
    def notes(self) -> list[str]:
        return [note for t in self.tables for note in t.notes]

    def write_plots(self, folder: Path) -> list[Path]:
        from stepbench.report.plots import write_plots

        return write_plots(self.pngs, folder)
