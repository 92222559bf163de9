"""Render a table of strings as a terminal table, Markdown or CSV.

One renderer for every table stepbench prints (`run` and `report`), so that a column looks the
same wherever it appears. Cells are already formatted strings: formatting numbers is the caller's
job, done with the helpers below so that units and rounding stay uniform.
"""

from __future__ import annotations

import csv
import io
import math

FORMATS = ("table", "markdown", "csv")


def render(columns: list[str], rows: list[list[str]], fmt: str = "table", *,
           title: str | None = None, footnotes: list[str] | None = None,
           align: str | None = None) -> str:
    """Return the table as text in `fmt` (see FORMATS); numeric-looking columns align right.

    `align` overrides that guess with one letter per column, "l" or "r" (e.g. for a numeric
    column whose failed rows show a status word such as "OOM").
    """
    if align is not None and (len(align) != len(columns) or set(align) - {"l", "r"}):
        raise ValueError(f"align {align!r} must have one 'l' or 'r' per column ({len(columns)})")
    if fmt == "csv":
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerow(columns)
        writer.writerows(rows)
        return buf.getvalue()
    right = [align[i] == "r" if align else _right_aligned(rows, i) for i in range(len(columns))]
    if fmt == "markdown":
        return _markdown(columns, rows, title, footnotes, right)
    if fmt == "table":
        return _rich(columns, rows, title, footnotes, right)
    raise ValueError(f"unknown table format {fmt!r}; choose one of: {', '.join(FORMATS)}")


def _right_aligned(rows: list[list[str]], i: int) -> bool:
    cells = [r[i] for r in rows if r[i] not in ("", "-")]
    return bool(cells) and all(_looks_numeric(c) for c in cells)


def _looks_numeric(cell: str) -> bool:
    head = cell.split(" ")[0].replace(",", "").replace("%", "").lstrip("+-~").rstrip("x*†‡§")
    try:
        float(head)
    except ValueError:
        return False
    return True


def _markdown(columns, rows, title, footnotes, right) -> str:
    lines = []
    if title:
        lines += [f"**{title}**", ""]
    lines.append("| " + " | ".join(columns) + " |")
    lines.append("| " + " | ".join("---:" if r else "---" for r in right) + " |")
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in rows]
    for note in footnotes or []:
        # One paragraph per note; a leading "*" or "#" would start a list or a heading.
        lines += ["", "\\" + note if note[:1] in "*#+-" else note]
    return "\n".join(lines) + "\n"


def _rich(columns, rows, title, footnotes, right) -> str:
    from rich import box
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    # Cells and notes are plain text: an error such as "[rank0]: CUDA error" is not rich markup.
    table = Table(title=title, box=box.SIMPLE_HEAVY, title_justify="left")
    for i, col in enumerate(columns):
        table.add_column(Text(col), justify="right" if right[i] else "left", no_wrap=True)
    for row in rows:
        table.add_row(*(Text(cell) for cell in row))
    # A wide virtual console: the table is printed whole, never wrapped to a narrow pipe.
    console = Console(file=io.StringIO(), width=250, color_system=None, force_terminal=False,
                      highlight=False)
    console.print(table)
    for note in footnotes or []:
        console.print(note, soft_wrap=True, markup=False)
    text = console.file.getvalue()
    return "\n".join(line.rstrip() for line in text.splitlines()) + "\n"


def num(value: float | None, digits: int = 1, *, thousands: bool = False) -> str:
    """A number with fixed decimals, '-' for missing; thousands separators on request."""
    if value is None:
        return "-"
    return f"{value:,.{digits}f}" if thousands else f"{value:.{digits}f}"


def sig(value: float | None, digits: int = 3, *, thousands: bool = False) -> str:
    """A number to `digits` significant digits, never dropping integer digits: 215.3 -> "215",
    12.34 -> "12.3", 0.01234 -> "0.0123"; '-' for missing."""
    if value is None:
        return "-"
    if value == 0 or not math.isfinite(value):
        return f"{value:.0f}" if value == 0 else str(value)
    rounded = float(f"{value:.{digits - 1}e}")     # so that 99.96 becomes "100", not "100.0"
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(rounded))))
    return f"{value:,.{decimals}f}" if thousands else f"{value:.{decimals}f}"


def gb(value: float | None) -> str:
    """Memory in GB (1e9 bytes): one decimal on a GPU, two below 1 GB (CPU runs)."""
    if value is None:
        return "-"
    return f"{value:.1f} GB" if value >= 1 else f"{value:.2f} GB"
