"""stepbench report: join result files from any number of machines into the post's table.

The value of the post was one table across GPUs with a cost per token, and a list of what the
numbers say. This module reads result files (bad lines are warned about, never silently
dropped), has them combined into rows with prices (rows.py) and findings written
(findings.py), and renders the table, its footnotes and a details table as a terminal table,
Markdown, CSV, JSON, or one HTML file with plots (html_page.py, plots.py).
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from pathlib import Path

from stepbench import table
from stepbench.errors import UserError
from stepbench.prices import (load_price_file, parse_energy_price, parse_price_flags,
                               unused_keys)
from stepbench.results import read_records
from stepbench.rows import Row, build_rows, setup_labels, status_text

FORMATS = ("table", "markdown", "csv", "json", "html")
COLUMNS = ["GPU", "$/hour", "Setup", "Step (ms)", "Tokens/s", "Peak memory", "First step (s)",
           "M tokens per $"]
ALIGN = "lrlrrrrr"
# One mark per noise flag, placed after the step time; footnotes explain the marks used.
_SLOWED = ("†", "the GPU reported throttling or its SM clock dropped by over 10% during the "
                "timed steps")
NOISE_MARKS = {
    "high_cv": ("*", "step times varied by more than 5% (coefficient of variation)"),
    "throttled": _SLOWED,
    "clock_drop": _SLOWED,
    "other_processes": ("‡", "other processes were using the GPU"),
    "recompiled": ("§", "torch.compile recompiled during the timed steps"),
}
STATUS_NOTES = {
    "oom": "OOM means the run did not fit in the GPU's memory.",
    "timeout": "timeout means the setup ran past its time limit and was stopped.",
    "crashed": "crashed means the process died (signal or exit code) without a result.",
    "error": "error means the setup raised an exception other than out-of-memory.",
    "unsupported": "unsupported means the setup cannot run on this machine or software.",
}


def warn(message: str) -> None:
    """A problem with the input that does not stop the report: one line on stderr."""
    print(f"stepbench report: warning: {message}", file=sys.stderr)


# ---------------------------------------------------------------- reading results

def results_files(paths: list[str]) -> list[Path]:
    """Expand folders to their *.jsonl files; a missing path is a UserError."""
    files: list[Path] = []
    for arg in paths:
        path = Path(arg)
        if path.is_dir():
            found = sorted(path.glob("*.jsonl"))
            if not found:
                raise UserError(f"folder '{path}' holds no results files (*.jsonl); pass the "
                                "folder that `stepbench run --out` wrote to, or the files")
            files += found
        elif path.is_file():
            files.append(path)
        else:
            raise UserError(f"results file '{path}' not found; pass results files (*.jsonl) "
                            "or folders of them")
    unique, seen = [], set()
    for path in files:
        if path.resolve() in seen:
            warn(f"{path}: given more than once, read once")
            continue
        seen.add(path.resolve())
        unique.append(path)
    return unique


def read_results(path: Path) -> list[dict]:
    """Records of one results file; what is bad is skipped with a warning naming the file.

    results.read_records skips (and names by file and line) truncated or garbled lines and
    unknown schema versions; the fields the report groups by are checked here.
    """
    try:
        records = read_records(path, warn=warn)
    except UnicodeDecodeError as exc:
        raise UserError(f"results file '{path}' is not UTF-8 text (byte {exc.start}); pass the "
                        "JSON Lines file that `stepbench run` wrote") from None
    good = []
    for i, record in enumerate(records, 1):
        problem = _record_problem(record)
        if problem:
            warn(f"{path}: record {i} (run {record.get('run_id')!r}): {problem}, skipped")
            continue
        good.append(record)
    return good


def _record_problem(record: dict) -> str | None:
    setup, machine = record.get("setup"), record.get("machine")
    if not isinstance(setup, dict) or not all(setup.get(k) for k in ("name", "mode", "attn")):
        return "record without setup name, mode and attn"
    if not isinstance(machine, dict) or not machine.get("gpu"):
        return "record without machine.gpu"
    if not isinstance(record.get("status"), str):
        return "record without a status"
    return None


def load_records(paths: list[str]) -> list[dict]:
    """All good records of all files, in argument order then line order."""
    records = []
    for path in results_files(paths):
        found = read_results(path)
        if not found:
            warn(f"{path}: no usable records")
        records += found
    if not records:
        raise UserError("no usable records in " + ", ".join(paths) +
                        "; pass results files written by `stepbench run`")
    return records


# ---------------------------------------------------------------- rendering

def table_cells(rows: list[Row]) -> list[list[str]]:
    """The post's columns as strings; a failed row shows its status under Step (ms)."""
    labels = setup_labels(rows)
    cells = []
    for row in rows:
        price = table.num(row.price_per_hour, 2)
        if not row.ok:
            cells.append([row.gpu, price, labels[id(row)], status_text(row.status)]
                         + ["-"] * 4)
            continue
        marks = "".join(dict.fromkeys(NOISE_MARKS[f][0] for f in row.noise_flags
                                      if f in NOISE_MARKS))
        cells.append([
            row.gpu, price, labels[id(row)], table.sig(row.step_ms) + marks,
            table.num(row.tokens_per_s, 0, thousands=True), table.gb(row.peak_memory_gb),
            table.num(row.first_step_s, 1), table.sig(row.m_tokens_per_dollar, 2)])
    return cells


def footnotes(rows: list[Row]) -> list[str]:
    """What the numbers are, how rows were combined, what each mark and status means."""
    notes = ["Step (ms) is the mean of a process's timed steps; Tokens/s is batch x sequence "
             "per step time; Peak memory is the peak allocated during the timed steps; First "
             "step includes compilation."]
    if any(r.m_tokens_per_dollar is not None for r in rows):
        notes.append('"M tokens per $" is training tokens per dollar of GPU time, in millions, '
                     "at each machine's hourly price.")
    used = sorted({r.status for r in rows if not r.ok} & set(STATUS_NOTES),
                  key=list(STATUS_NOTES).index)
    notes += [STATUS_NOTES[s] for s in used]
    notes += _combined_notes(rows)
    marks = dict.fromkeys(NOISE_MARKS[f] for r in rows for f in r.noise_flags
                          if f in NOISE_MARKS)
    notes += [f"{mark} {meaning}." for mark, meaning in marks]
    unknown = sorted({f for r in rows for f in r.noise_flags if f not in NOISE_MARKS})
    if unknown:
        notes.append("Other noise flags: " + ", ".join(unknown) + " (see the details).")
    for row in rows:
        if not row.ok and row.status != "oom" and row.error:
            notes.append(f"{row.gpu} {row.setup} {status_text(row.status)}: "
                         f"{_one_line(row.error)}")
    missing = sorted({r.gpu for r in rows if r.price_per_hour is None})
    if missing:
        notes.append("No price for " + ", ".join(missing) + ": M tokens per $ is left blank.")
    return notes + detail_notes(rows)


def detail_notes(rows: list[Row]) -> list[str]:
    """What the details' FLOP, MFU and energy columns are; only for columns that are shown.

    They are footnotes like the others, so every format (HTML included) carries them."""
    return [n for n in (_flops_note(rows), _peaks_note(rows), _flop_counter_note(rows),
                        _energy_note(rows)) if n]


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
    note = ("TFLOP/s and MFU (details) count the model's FLOPs "
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


def _combined_notes(rows: list[Row]) -> list[str]:
    notes = []
    by_count: dict[int, list[Row]] = {}
    for row in rows:
        if len(row.repeat_step_ms) > 1:
            by_count.setdefault(len(row.repeat_step_ms), []).append(row)
    for n, group in sorted(by_count.items()):
        which = "every row" if len(group) == len([r for r in rows if r.ok]) else \
            ", ".join(f"{r.gpu} {r.setup}" for r in group)
        notes.append(f"{n} repeats combined ({which}): median of per-process means, max of "
                     "peaks, 95% CI by bootstrap over the per-process means (details).")
    for row in rows:
        if row.runs > 1:
            notes.append(f"{row.gpu} {row.setup}: records from {row.runs} runs were combined "
                         "as repeats.")
        bad = {s: n for s, n in row.statuses.items() if s != "ok"}
        if row.ok and bad:
            what = ", ".join(f"{n} {status_text(s)}" for s, n in bad.items())
            notes.append(f"{row.gpu} {row.setup}: {what} of {row.repeats} repeats; the numbers "
                         "come from the others.")
    return notes


def _one_line(text: str, limit: int = 160) -> str:
    lines = [ln.strip() for ln in str(text).splitlines() if ln.strip()]
    line = lines[-1] if lines else ""
    return line if len(line) <= limit else line[:limit - 3] + "..."


DETAIL_COLUMNS = [  # (header, alignment, has data?, cell)
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
    ("Compile cache", "l", lambda r: r.compile_cache is not None,
     lambda r: r.compile_cache or "-"),
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
    ("Loss vs eager", "l", lambda r: r.parity_rel_diff is not None, lambda r: _parity_cell(r)),
]


def _percent(fraction: float | None) -> str:
    return "-" if fraction is None else f"{fraction * 100:.0f}%"


def _signed_percent(fraction: float | None) -> str:
    if fraction is None:
        return "-"
    text = f"{fraction * 100:+.1f}%"
    return "0.0%" if text in ("+0.0%", "-0.0%") else text


def _dollars(value: float | None) -> str:
    return "-" if value is None else "$" + table.sig(value, 2)


def _parity_cell(row: Row) -> str:
    if row.parity_rel_diff is None:
        return "-"
    text = f"{row.parity_rel_diff * 100:.2g}%"
    return text if row.parity_ok else f"{text} (over {row.parity_tolerance * 100:.2g}%)"


def details(rows: list[Row]) -> tuple[list[str], list[list[str]], str] | None:
    """Columns, cells and alignment of an extra table with what the records measured beyond
    the post's columns (repeats, CI, noise flags, TFLOP/s and MFU, FLOP counter cross-check,
    compile cache, energy and its cost, loss parity); `detail_notes` explains them."""
    used = [c for c in DETAIL_COLUMNS if any(c[2](r) for r in rows)]
    if not used:
        return None
    labels = setup_labels(rows)
    shown = [r for r in rows if any(c[2](r) for c in used)]
    columns = ["GPU", "Setup"] + [c[0] for c in used]
    cells = [[r.gpu, labels[id(r)]] + [c[3](r) for c in used] for r in shown]
    return columns, cells, "ll" + "".join(c[1] for c in used)


def render_text(rows: list[Row], findings: list, fmt: str) -> str:
    """Terminal table or Markdown: results table, details table, then the findings."""
    markdown = fmt == "markdown"
    out = ["## Results\n\n" if markdown else ""]
    out.append(table.render(COLUMNS, table_cells(rows), fmt, align=ALIGN,
                            title=None if markdown else "Results", footnotes=footnotes(rows)))
    extra = details(rows)
    if extra and markdown:
        out.append("\n## Details\n\n")
        out.append(table.render(extra[0], extra[1], fmt, align=extra[2]))
    elif extra:
        for part, (columns, cells, align) in enumerate(_split_wide(*extra)):
            out.append("\n" + table.render(columns, cells, fmt, align=align,
                                            title="Details" + (" (continued)" if part else "")))
    if findings:
        out.append("\n## What the numbers say\n\n" if markdown else "\nWhat the numbers say\n\n")
        out += [f"{i}. {f.text}\n" for i, f in enumerate(findings, 1)]
    return "".join(out)


# A terminal table wider than this is printed in parts (each repeating GPU and Setup), since
# a terminal cuts or wraps a wider one.
TERMINAL_WIDTH = 160


def _split_wide(columns: list[str], cells: list[list[str]], align: str,
                width: int = TERMINAL_WIDTH) -> list[tuple[list[str], list[list[str]], str]]:
    """The details table as parts no wider than `width`, the first two columns in each."""
    widths = [max([len(c)] + [len(row[i]) for row in cells]) + 3 for i, c in enumerate(columns)]
    parts: list[list[int]] = [[]]
    for i in range(2, len(columns)):
        if parts[-1] and sum(widths[j] for j in [0, 1, *parts[-1], i]) > width:
            parts.append([])
        parts[-1].append(i)
    return [([columns[j] for j in [0, 1, *part]],
             [[row[j] for j in [0, 1, *part]] for row in cells],
             "".join(align[j] for j in [0, 1, *part])) for part in parts]


CSV_KEYS = ["gpu", "price_per_hour", "setup", "status", "step_ms", "tokens_per_s",
            "peak_memory_gb", "first_step_s", "m_tokens_per_dollar", "mode", "attn",
            "compile_mode", "model", "batch", "seq", "dtype", "repeats", "step_ms_ci_low",
            "step_ms_ci_high", "noise_flags", "first_step_warm_s", "compile_cache", "mfu",
            "mfu_source", "achieved_tflops", "mfu_measured", "mfu_datasheet",
            "flop_counter_diff", "tokens_per_kwh", "joules_per_token", "dollars_per_m_tokens",
            "energy_cost_per_m_tokens", "parity_rel_diff", "parity_ok"]


def render_csv(rows: list[Row]) -> str:
    """The rows with unformatted numbers (for a spreadsheet); empty cell = not measured."""
    cells = []
    for row in rows:
        d = row.as_dict()
        d["step_ms_ci_low"], d["step_ms_ci_high"] = row.step_ms_ci or (None, None)
        d["noise_flags"] = ";".join(row.noise_flags)
        cells.append(["" if d[k] is None else _csv_value(d[k]) for k in CSV_KEYS])
    return table.render(CSV_KEYS, cells, "csv")


def _csv_value(value) -> str:
    if isinstance(value, float):
        return repr(round(value, 6))
    return str(value)


def render_json(rows: list[Row], findings: list) -> str:
    doc = {"rows": [r.as_dict() for r in rows],
           "findings": [{"kind": f.kind, "text": f.text} for f in findings],
           "notes": footnotes(rows)}
    return json.dumps(doc, indent=2, allow_nan=False, default=_json_default) + "\n"


def _json_default(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    raise TypeError(f"not JSON serializable: {value!r}")


# ---------------------------------------------------------------- command

def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "report", help="join result files into one table with cost per token, findings, plots",
        description="Join result files from any number of machines into one table (GPU x "
                    "setup) with cost per token and findings written from the numbers.")
    p.add_argument("files", nargs="+", metavar="FILE",
                   help="results files (*.jsonl) or folders of them")
    p.add_argument("--prices", metavar="FILE",
                   help="price list, .toml ([prices] \"GPU name\" = dollars per hour) or .csv "
                        "(gpu,price_per_hour); see docs/report.md")
    p.add_argument("--price", action="append", default=[], metavar="GPU=DOLLARS",
                   help='price of one GPU per hour, repeatable, over the price file: '
                        '--price "NVIDIA H100 PCIe=3.86"')
    p.add_argument("--energy-price", metavar="DOLLARS_PER_KWH",
                   help="price of electricity in dollars per kWh: adds the GPU's energy cost "
                        "per million tokens to the details (records with NVML energy only)")
    p.add_argument("--format", choices=FORMATS, default="table",
                   help="output format (default: table)")
    p.add_argument("--out", metavar="PATH", help="write the output here instead of stdout")
    p.add_argument("--plots", metavar="DIR", help="also write the plots as PNG files into DIR")
    p.set_defaults(handler=cmd_report)


def load_prices(price_file: str | None, flags: list[str]) -> dict[str, float]:
    prices = load_price_file(price_file) if price_file else {}
    prices.update(parse_price_flags(flags))
    return prices


def cmd_report(args) -> int:
    from stepbench.findings import findings_for

    prices = load_prices(args.prices, args.price)
    energy_price = parse_energy_price(args.energy_price)
    records = load_records(args.files)
    rows = build_rows(records, prices, energy_price)
    _warn_prices(rows, prices)
    if energy_price is not None and not any(r.tokens_per_kwh for r in rows):
        warn("--energy-price given, but no record carries an energy measurement (NVML's energy "
             "counter, GPU only); no energy cost is shown")
    findings = findings_for(rows)
    pngs = None
    if args.plots or args.format == "html":   # drawn once for both
        from stepbench.plots import figures
        pngs = figures(rows)
    text = render(rows, findings, args.format, pngs)
    if args.plots:
        from stepbench.plots import write_plots
        for path in write_plots(pngs, Path(args.plots)):
            print(f"stepbench report: wrote {path}", file=sys.stderr)
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text, encoding="utf-8")
        print(f"stepbench report: wrote {out}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


def render(rows: list[Row], findings: list, fmt: str,
           pngs: dict[str, bytes] | None = None) -> str:
    """The report in `fmt`; `pngs` (plots.figures) are embedded in HTML, drawn there if None."""
    if fmt in ("table", "markdown"):
        return render_text(rows, findings, fmt)
    if fmt == "csv":
        return render_csv(rows)
    if fmt == "json":
        return render_json(rows, findings)
    if fmt == "html":
        from stepbench.html_page import render_html
        return render_html(rows, findings, pngs)
    raise UserError(f"unknown format '{fmt}'; choose one of: {', '.join(FORMATS)}")


def _warn_prices(rows: list[Row], prices: dict[str, float]) -> None:
    missing = list(dict.fromkeys(r.gpu for r in rows if r.price_per_hour is None))
    if missing:
        warn("no price for " + ", ".join(f"'{g}'" for g in missing) + "; its M tokens per $ "
             "is left blank (add --price \"GPU NAME=DOLLARS\" or a --prices file)")
    for key in unused_keys(prices, [r.gpu for r in rows]):
        warn(f"price for '{key}' matches no GPU in the results (GPU names are as the driver "
             "reports them, e.g. 'NVIDIA H100 PCIe')")
