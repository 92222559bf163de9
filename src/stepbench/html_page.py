"""The report as one self-contained HTML file: table, findings and plots, nothing to fetch.

A report gets mailed and attached to tickets, so the plots are embedded as base64 PNGs and the
style sheet is inline; the file opens the same anywhere, offline.
"""

from __future__ import annotations

import base64
import html

from stepbench.plots import PLOTS, figures
from stepbench.report import ALIGN, COLUMNS, Row, details, footnotes, table_cells

STYLE = """
body { font-family: system-ui, sans-serif; max-width: 72rem; margin: 2rem auto; padding: 0 1rem;
       color: #222; }
table { border-collapse: collapse; margin: 1rem 0; font-size: 0.9rem; }
th, td { padding: 0.25rem 0.6rem; border-bottom: 1px solid #ddd; white-space: nowrap; }
th { text-align: left; border-bottom: 2px solid #888; }
td.r, th.r { text-align: right; font-variant-numeric: tabular-nums; }
p.note { font-size: 0.85rem; color: #555; margin: 0.2rem 0; }
figure { margin: 1rem 0; }
img { max-width: 100%; }
"""


def _table(columns: list[str], cells: list[list[str]], align: str | None = None) -> str:
    align = align or "l" * len(columns)
    cls = lambda i: ' class="r"' if align[i] == "r" else ""  # noqa: E731
    head = "".join(f"<th{cls(i)}>{html.escape(c)}</th>" for i, c in enumerate(columns))
    body = "".join("<tr>" + "".join(f"<td{cls(i)}>{html.escape(c)}</td>"
                                    for i, c in enumerate(row)) + "</tr>\n" for row in cells)
    return f"<table>\n<thead><tr>{head}</tr></thead>\n<tbody>\n{body}</tbody>\n</table>\n"


def render_html(rows: list[Row], findings: list, pngs: dict[str, bytes] | None = None) -> str:
    """The whole page as a string; `pngs` are `figures(rows)` when the caller drew them."""
    parts = ["<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n",
             "<title>stepbench report</title>\n", f"<style>{STYLE}</style>\n</head>\n<body>\n",
             "<h1>stepbench report</h1>\n<h2>Results</h2>\n",
             _table(COLUMNS, table_cells(rows), ALIGN)]
    parts += [f'<p class="note">{html.escape(n)}</p>\n' for n in footnotes(rows)]
    extra = details(rows)
    if extra:
        parts += ["<h2>Details</h2>\n", _table(*extra)]  # columns, cells, align
    if findings:
        parts.append("<h2>What the numbers say</h2>\n<ol>\n")
        parts += [f"<li>{html.escape(f.text)}</li>\n" for f in findings]
        parts.append("</ol>\n")
    pngs = figures(rows) if pngs is None else pngs
    if pngs:
        parts.append("<h2>Plots</h2>\n")
        captions = {stem: label for stem, label, _, _ in PLOTS}
        for stem, png in pngs.items():
            data = base64.b64encode(png).decode("ascii")
            parts.append(f'<figure><img alt="{html.escape(captions[stem])}" '
                         f'src="data:image/png;base64,{data}">'
                         f"<figcaption>{html.escape(captions[stem])}</figcaption></figure>\n")
    parts.append("</body>\n</html>\n")
    return "".join(parts)
