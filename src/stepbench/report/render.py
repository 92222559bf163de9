"""A Document (document.py) laid out as a terminal table, Markdown, CSV, JSON or one HTML page.

Every format shows the same cells and notes: numbers are formatted once, in document.py and its
tables' modules (columns.py, detail_tables.py). The HTML page is self-contained (inline style,
plots as base64 PNGs) because a report gets mailed and attached to tickets, so it opens the same
anywhere, offline.
"""

from __future__ import annotations

import base64
import html
from pathlib import Path

from stepbench.errors import UserError
from stepbench.record_checks import written_over
from stepbench.report import jsontext, table
from stepbench.report.layout import Document, Table

FORMATS = ("table", "markdown", "csv", "json", "html")
# A terminal table wider than this is printed in parts (each repeating the first two columns),
# since a terminal cuts or wraps a wider one.
TERMINAL_WIDTH = 160


def render(doc: Document, fmt: str) -> str:
    if fmt in ("table", "markdown"):
        return render_text(doc, fmt)
    if fmt == "csv":
        return render_csv(doc)
    if fmt == "json":
        return render_json(doc)
    if fmt == "html":
        return render_html(doc)
    raise UserError(f"unknown format '{fmt}'; choose one of: {', '.join(FORMATS)}",
                    kind="unknown_value")


def write_output(text: str, path: Path) -> None:
    """Write a rendered report (or price file); an unwritable path, or a results file (whose
    records writing over it would lose), is a UserError naming it."""
    problem = written_over(path)       # (the commands' --out refuses it as it is parsed)
    if problem:
        raise UserError(problem, kind="results_file")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise UserError(f"cannot write {path} ({exc.strerror}); pass a writable --out "
                        "path") from None


# ---------------------------------------------------------------- terminal and Markdown

LEAD_TITLE = "Key findings"


def render_text(doc: Document, fmt: str) -> str:
    """The key findings, each table with its notes, then the findings under their headings."""
    markdown = fmt == "markdown"
    out = [_header_text(doc, markdown)] if doc.header else []
    out += [_lead_text(doc, markdown)] if doc.lead else []
    for t in doc.tables:
        if markdown:
            out.append((f"## {t.title}\n\n" if t.title else "")
                       + table.render(t.columns, t.cells, fmt, align=t.align,
                                      title=None if t.title else doc.title, footnotes=t.notes))
            continue
        parts = _split_wide(t.columns, t.cells, t.align)
        for part, (columns, cells, align) in enumerate(parts):
            title = t.title or doc.title if not part else f"{t.title} (continued)"
            notes = t.notes if part == len(parts) - 1 else None
            out.append(table.render(columns, cells, fmt, align=align, title=title, footnotes=notes))
    if doc.findings:
        lines = ["## What the numbers say\n" if markdown else "What the numbers say\n"]
        number = 0
        for heading, findings in doc.findings:
            if heading:
                lines.append(f"### {heading}\n" if markdown else f"{heading}:\n")
            for f in findings:
                number += 1
                lines.append(f"{number}. {f.text}")
            lines.append("")
        out.append("\n".join(lines))
    return "\n".join(part.rstrip("\n") + "\n" for part in out if part)


def _header_text(doc: Document, markdown: bool) -> str:
    """What was measured: "Measured: ..." lines (Markdown: a paragraph each, labels in bold)."""
    if markdown:
        return "\n\n".join(f"**{label}:** {text}" for label, text in doc.header) + "\n"
    return "\n".join(f"{label}: {text}" for label, text in doc.header) + "\n"


def _lead_text(doc: Document, markdown: bool) -> str:
    lines = [f"## {LEAD_TITLE}\n" if markdown else f"{LEAD_TITLE}\n"]
    for workload, f in doc.lead:
        prefix = "" if workload is None else f"**{workload}**: " if markdown else f"{workload}: "
        lines.append(f"- {prefix}{f.text}")
    return "\n".join(lines) + "\n"


def _split_wide(columns: list[str], cells: list[list[str]], align: str,
                width: int = TERMINAL_WIDTH) -> list[tuple[list[str], list[list[str]], str]]:
    """A table as parts no wider than `width`, the first two columns in each."""
    widths = [max([len(c)] + [len(row[i]) for row in cells]) + 3 for i, c in enumerate(columns)]
    if sum(widths) <= width or len(columns) <= 2:
        return [(columns, cells, align)]
    parts: list[list[int]] = [[]]
    for i in range(2, len(columns)):
        if parts[-1] and sum(widths[j] for j in [0, 1, *parts[-1], i]) > width:
            parts.append([])
        parts[-1].append(i)
    return [([columns[j] for j in [0, 1, *part]],
             [[row[j] for j in [0, 1, *part]] for row in cells],
             "".join(align[j] for j in [0, 1, *part])) for part in parts]


# ---------------------------------------------------------------- CSV and JSON

# "units" says what tokens_per_s and m_tokens_per_dollar count in that row (tokens, a user's
# images or samples): a report of two workloads has no header that names both.
CSV_KEYS = ["gpu", "price_per_hour", "setup", "status", "step_ms", "tokens_per_s",
            "peak_memory_gb", "first_step_s", "m_tokens_per_dollar", "mode", "attn",
            "compile_mode", "model", "params", "batch", "seq", "dtype", "units", "repeats",
            "step_ms_ci_low", "step_ms_ci_high", "noise_flags", "first_step_warm_s",
            "compile_cache", "graph_breaks",
            "recompiles", "mfu", "mfu_source", "achieved_tflops", "mfu_measured", "mfu_datasheet",
            "flop_counter_diff", "tokens_per_kwh", "joules_per_token", "dollars_per_m_tokens",
            "energy_cost_per_m_tokens", "loss_guard", "loss_guard_rel_diff", "torch",
            "transformers", "stepbench_version", "started_first", "started_last", "label"]


def render_csv(doc: Document) -> str:
    """The rows with unformatted numbers (for a spreadsheet); empty cell = not measured. A
    Document of other rows (compare's) names its own columns (`csv_keys`); `csv_more` adds rows
    of another kind after them in columns of their own (`gpu` and `setup` shared)."""
    keys, cells = _rows_csv(doc)
    for more_keys, dicts in doc.csv_more:
        own = [k for k in more_keys if k not in keys]
        cells = [row + [""] * len(own) for row in cells]
        keys = keys + own
        for d in dicts:
            cells.append(["" if d.get(k) is None or (k not in more_keys) else _csv_value(d[k])
                          for k in keys])
    return table.render(keys, cells, "csv")


def _rows_csv(doc: Document) -> tuple[list[str], list[list[str]]]:
    keys = doc.csv_keys or CSV_KEYS
    cells = []
    for row in doc.rows:
        d = row.csv_dict()
        cells.append(["" if d.get(k) is None else _csv_value(d[k]) for k in keys])
    if doc.csv_keys:
        return keys, cells
    listed = doc.searches + [d for tune in doc.tunes for d in tune["tried"]]
    if not listed:
        return CSV_KEYS, cells
    # A search's records (probes, max-batch full measurements, a tune's table) after the rows,
    # told apart by the last column ("tune final #2"); the rows leave it empty.
    keys = CSV_KEYS + ["peak_reserved_gb", "search"]
    cells = [row + ["", ""] for row in cells]
    for d in listed:
        cells.append(["" if d.get(k) is None else _csv_value(d[k]) for k in keys])
    return keys, cells


def _csv_value(value) -> str:
    if isinstance(value, float):
        return repr(round(value, 6))
    if isinstance(value, list):
        return ";".join(map(str, value))     # noise flags
    return str(value)


def render_json(doc: Document) -> str:
    """{"rows": [...], "findings": [{"kind", "text", "group", "key"}], "notes": [...],
    "meta": {...}}; "key" marks the findings of the lead (Key findings), "meta" says what the
    records measured (report/meta.py). With searches' records also "searches":
    [...], the records of "Details: searches" (probes are never rows), and with tunes "tunes":
    [{"model", "seq", "device", "gpu", "tried": [...]}], each tune's table."""
    lead = {id(f) for _, f in doc.lead}
    data = {"rows": [r.as_dict() for r in doc.rows],
            "findings": [{"kind": f.kind, "text": f.text, "group": heading, "key": id(f) in lead}
                         for heading, findings in doc.findings for f in findings],
            "notes": doc.notes}
    if doc.meta is not None:
        data["meta"] = doc.meta
    data.update(doc.extra)
    if doc.searches:
        data["searches"] = doc.searches
    if doc.tunes:
        data["tunes"] = doc.tunes
    try:
        return jsontext.dumps(data) + "\n"
    except ValueError:          # a NaN or an infinity somewhere: walk the whole object for it
        return jsontext.dumps(jsontext.finite(data)) + "\n"


# ---------------------------------------------------------------- HTML

# Every table must fit a 1280-1440 px window without sideways scrolling: document.py splits
# the details by theme for that; headers may wrap, and the scroll box is only a last resort (a
# narrow window, a very long GPU name).
STYLE = """
body { font-family: system-ui, sans-serif; max-width: 72rem; margin: 2rem auto; padding: 0 1rem;
       color: #222; line-height: 1.4; }
.scroll { overflow-x: auto; }
table { border-collapse: collapse; margin: 1rem 0; font-size: 0.9rem; }
th, td { padding: 0.25rem 0.6rem; border-bottom: 1px solid #ddd; }
td { white-space: nowrap; }
th { text-align: left; vertical-align: bottom; border-bottom: 2px solid #888; }
td.r, th.r { text-align: right; font-variant-numeric: tabular-nums; }
p.note { font-size: 0.85rem; color: #555; margin: 0.2rem 0; max-width: 60rem; }
p.meta { margin: 0.2rem 0; max-width: 60rem; }
section.lead { background: #f3f6fa; border-left: 4px solid #3b6ea5; padding: 0.2rem 1.2rem;
               margin: 1rem 0 2rem; }
section.lead li { margin: 0.4rem 0; }
ol li { margin: 0.2rem 0; }
figure { margin: 1.5rem 0; }
figcaption { font-size: 0.9rem; color: #555; }
img { max-width: 100%; height: auto; }
"""


def _html_table(t: Table) -> str:
    cls = lambda i: ' class="r"' if t.align[i] == "r" else ""  # noqa: E731
    head = "".join(f"<th{cls(i)}>{html.escape(c)}</th>" for i, c in enumerate(t.columns))
    body = "".join("<tr>" + "".join(f"<td{cls(i)}>{html.escape(c)}</td>"
                                    for i, c in enumerate(row)) + "</tr>\n" for row in t.cells)
    return (f'<div class="scroll"><table>\n<thead><tr>{head}</tr></thead>\n<tbody>\n{body}'
            "</tbody>\n</table></div>\n")


def render_html(doc: Document) -> str:
    """The whole page as a string."""
    from stepbench.report.plots import plot_captions

    title = html.escape(doc.title or "stepbench report")
    parts = ["<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n",
             f"<title>{title}</title>\n", f"<style>{STYLE}</style>\n</head>\n<body>\n",
             f"<h1>{title}</h1>\n"]
    parts += [f'<p class="meta"><strong>{html.escape(label)}:</strong> {html.escape(text)}</p>\n'
              for label, text in doc.header]
    if doc.lead:
        parts.append(f'<section class="lead">\n<h2>{LEAD_TITLE}</h2>\n<ul>\n')
        parts += [f"<li>{'' if w is None else f'<strong>{html.escape(w)}:</strong> '}"
                  f"{html.escape(f.text)}</li>\n" for w, f in doc.lead]
        parts.append("</ul>\n</section>\n")
    for t in doc.tables:
        parts += [f"<h2>{html.escape(t.title)}</h2>\n" if t.title else "", _html_table(t)]
        parts += [f'<p class="note">{html.escape(n)}</p>\n' for n in t.notes]
    if doc.findings:
        parts.append("<h2>What the numbers say</h2>\n")
        for heading, findings in doc.findings:
            if heading:
                parts.append(f"<h3>{html.escape(heading)}</h3>\n")
            parts.append("<ol>\n" + "".join(f"<li>{html.escape(f.text)}</li>\n" for f in findings)
                         + "</ol>\n")
    if doc.pngs:
        parts.append("<h2>Plots</h2>\n")
        if doc.plots_note:
            parts.append(f'<p class="note">{html.escape(doc.plots_note)}</p>\n')
        captions = plot_captions(doc.rows)
        for stem, png in doc.pngs.items():
            data = base64.b64encode(png).decode("ascii")
            parts.append(f'<figure><img alt="{html.escape(captions[stem])}" '
                         f'src="data:image/png;base64,{data}">'
                         f"<figcaption>{html.escape(captions[stem])}</figcaption></figure>\n")
    parts.append("</body>\n</html>\n")
    return "".join(parts)
