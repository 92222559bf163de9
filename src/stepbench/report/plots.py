"""Bar charts of the report's rows: step time, tokens/s, peak memory and tokens per dollar, per
setup per GPU.

Drawn only from stored results (the rows the report built), never from a live run, with
matplotlib's Agg canvas and no pyplot state, so that they render on a headless machine and the
same rows give the same PNG bytes. A setup that did not run shows its status (e.g. "OOM") where
its bar would be, as the table keeps its row.

The bars are horizontal, in the tables' row order, on a figure of fixed width: a page shows it
at its own size, so its text stays readable however many setups there are (a figure that grew
wider with each setup was scaled down by the browser until its labels could not be read), and
a label as long as "compile+eager (qwen2.5-0.5b)" reads across instead of slanted. A plot shows
at most MAX_BARS bars (the first setups in the tables' order, every GPU's bar of each): a
figure of thousands of bars is taller than a PNG can be and unreadable anyway; the tables and
the CSV hold every row, and the plots' note says how many setups were left out.

Tokens/s, unlike step time, is comparable across batch sizes (a step of 8 x 2048 tokens takes
longer than one of 4 x 2048): the plot to read when the rows differ in batch or sequence.
"""

from __future__ import annotations

import io
import math
from pathlib import Path

from stepbench.errors import UserError
from stepbench.report.rows import Row, setup_labels, status_text

def tokens_per_s_ci(row: Row) -> tuple[float, float] | None:
    """The tokens/s interval of a row's step-time interval: tokens per step / step time."""
    if row.step_ms_ci is None or row.tokens_per_s is None or min(row.step_ms_ci) <= 0:
        return None
    tokens_ms = row.tokens_per_s * row.step_ms       # tokens per step x 1000
    return tokens_ms / row.step_ms_ci[1], tokens_ms / row.step_ms_ci[0]


# (file stem, axis label, value of a row, error interval of a row or None)
PLOTS = [
    ("step_time", "Step time (ms, lower is better)", lambda r: r.step_ms,
     lambda r: r.step_ms_ci),
    ("tokens_per_s", "Tokens/s (higher is better; comparable across batch sizes)",
     lambda r: r.tokens_per_s, tokens_per_s_ci),
    ("peak_memory", "Peak memory (GB)", lambda r: r.peak_memory_gb, lambda r: None),
    ("tokens_per_dollar", "M tokens per $ (higher is better)",
     lambda r: r.m_tokens_per_dollar, lambda r: None),
]


# Bars one plot shows at most (setups x GPUs): 100 bars of one GPU make a figure 4,300 px tall.
MAX_BARS = 100


def figures(rows: list[Row]) -> dict[str, bytes]:
    """{stem: PNG bytes} for each plot that has at least one value to draw (of the rows
    `plotted` keeps)."""
    shown = plotted(rows)
    labels = bar_labels(rows)
    captions = plot_captions(rows)
    out = {}
    for stem, _, value, interval in PLOTS:
        if any(value(r) is not None for r in shown):
            out[stem] = _bar_chart(shown, labels, captions[stem], value, interval)
    return out


def plot_captions(rows: list[Row]) -> dict[str, str]:
    """{stem: axis label}, counting a user's workload's own unit where the rows share one
    ("Images/s", "M images per $"), as the tables' headers do."""
    from stepbench.report.columns import unit_headers

    rate, per_dollar = unit_headers(["Tokens/s", "M tokens per $"], rows)
    return {stem: label.replace("Tokens/s", rate).replace("M tokens per $", per_dollar)
            for stem, label, _, _ in PLOTS}


def plotted(rows: list[Row]) -> list[Row]:
    """The rows the plots show: those of the first setups in table order, as many as fit in
    MAX_BARS bars with one bar per GPU each."""
    labels = bar_labels(rows)
    setups = list(dict.fromkeys(labels[id(r)] for r in rows))
    keep = set(setups[:max(1, MAX_BARS // max(1, len({r.gpu for r in rows})))])
    return [r for r in rows if labels[id(r)] in keep]


def plots_note(rows: list[Row]) -> str | None:
    """What the plots leave out, or None when they show every row."""
    labels = bar_labels(rows)
    total = len(dict.fromkeys(labels.values()))
    shown = len({labels[id(r)] for r in plotted(rows)})
    if shown == total:
        return None
    return (f"The plots show the first {shown:,} of {total:,} setups, in the tables' order (at "
            f"most {MAX_BARS} bars a plot); the tables and --format csv have every row.")


def write_plots(pngs: dict[str, bytes], folder: Path) -> list[Path]:
    """Write each of `figures`' plots as folder/<stem>.png; returns the paths written.

    A folder that cannot be made or written is a UserError naming it (the --plots flag's)."""
    if folder.exists() and not folder.is_dir():
        raise UserError(f"--plots {folder} is a file; pass a folder")
    paths = []
    try:
        folder.mkdir(parents=True, exist_ok=True)
        for stem, png in pngs.items():
            path = folder / f"{stem}.png"
            path.write_bytes(png)
            paths.append(path)
    except OSError as exc:
        raise UserError(f"cannot write the plots into {folder} ({exc.strerror}); pass a "
                        "writable --plots folder") from None
    return paths


def bar_labels(rows: list[Row]) -> dict[int, str]:
    """The label of each row's bar, as in the tables: the setup, with the model's short label
    (never its config path), batch x seq or dtype where rows differ in them."""
    return setup_labels(rows)


def error_bar(y: float, ci: tuple[float, float] | None) -> list[list[float]] | None:
    """matplotlib's xerr/yerr ([[below], [above]]) for value y and its interval, never negative.

    The interval need not contain y: a one-process row's interval is a bootstrap of its step
    times' mean while y is the record's step_ms, and a record written from a published table
    may repeat one number, whose zero-width interval then lies a rounding error away. matplotlib
    refuses negative error bars, so each side is clamped at zero; a non-finite interval (scipy's
    bootstrap of identical values) draws no bar."""
    if ci is None or not all(math.isfinite(v) for v in ci):
        return None
    return [[max(0.0, y - ci[0])], [max(0.0, ci[1] - y)]]


# Inches at 100 dpi: 9 in is 900 px, narrower than the HTML page's column, so it is never scaled.
FIGURE_WIDTH_IN = 9.0
BAR_IN = 0.22        # height of one bar
GAP_IN = 0.2         # between setups


def _margins(fig, longest: str, legend_in: float) -> None:
    """Room for the longest setup label on the left, the legend above and the axis label
    below: what tight_layout finds by measuring every tick label (a second draw of the whole
    figure), from the one label that matters."""
    width_in, height_in = fig.get_size_inches()
    probe = fig.text(0, 0, longest, fontsize=9)
    label_in = probe.get_window_extent(fig.canvas.get_renderer()).width / fig.dpi
    probe.remove()
    fig.subplots_adjust(left=min(0.6, (label_in + 0.25) / width_in), right=1 - 0.25 / width_in,
                        top=1 - (legend_in + 0.25) / height_in, bottom=0.6 / height_in)


def _bar_chart(rows: list[Row], names: dict[int, str], label: str, value, interval) -> bytes:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    setups = {name: i for i, name in enumerate(dict.fromkeys(names[id(r)] for r in rows))}
    gpus = list(dict.fromkeys(r.gpu for r in rows))
    height = 1.0 - GAP_IN / (len(gpus) * BAR_IN + GAP_IN)     # of one setup's group, in y units
    width = height / len(gpus)
    legend_in = 0.25 * math.ceil(len(gpus) / 3)
    fig = Figure(figsize=(FIGURE_WIDTH_IN, 1.0 + legend_in
                          + len(setups) * (len(gpus) * BAR_IN + GAP_IN)), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    top = max((value(r) for r in rows if value(r) is not None), default=1.0)
    for g, gpu in enumerate(gpus):
        # One bar call and one error-bar call per GPU: a call per bar took seconds per plot.
        ys, xs, errors = [], [], []
        for row in (r for r in rows if r.gpu == gpu):
            y = setups[names[id(row)]] + (g - (len(gpus) - 1) / 2) * width
            x = value(row)
            if x is None:
                text = status_text(row.status) if not row.ok else "n/a"
                ax.text(top * 0.01, y, text, ha="left", va="center", fontsize=8, color=f"C{g}")
                continue
            ys.append(y)
            xs.append(x)
            bar = error_bar(x, interval(row))
            if bar is not None:
                errors.append((y, x, bar[0][0], bar[1][0]))
        if ys:
            ax.barh(ys, xs, width, color=f"C{g}", label=gpu)
        if errors:
            y, x, below, above = zip(*errors)
            ax.errorbar(x, y, xerr=[below, above], fmt="none", ecolor="black", elinewidth=1,
                        capsize=2)
    ax.set_yticks(range(len(setups)), list(setups), fontsize=9)
    ax.set_ylim(len(setups) - 0.5, -0.5)      # first row on top, as in the tables
    ax.set_xlabel(label)
    ax.legend(fontsize=8, ncols=min(3, len(gpus)), loc="lower left", bbox_to_anchor=(0.0, 1.0),
              frameon=False)   # above the axes: never over a bar
    ax.grid(axis="x", alpha=0.3)
    _margins(fig, max(setups, key=len), legend_in)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata={"Software": None})
    return buf.getvalue()
