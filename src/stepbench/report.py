"""stepbench report: join result files from any number of machines into the post's table.

The value of the post was one table across GPUs with a cost per token, and a list of what the
numbers say. This module reads result files (bad lines are warned about, never silently
dropped), combines the records of one setup on one GPU into a row (repeats: median of
per-process means), joins prices, and writes the table with its findings (findings.py) as a
terminal table, Markdown, CSV, JSON or one HTML file with plots (plots.py, html.py).
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from stepbench import stats, table
from stepbench.errors import UserError
from stepbench.results import SCHEMA, read_records
from stepbench.prices import load_price_file, parse_price_flags, price_for, unused_keys

FORMATS = ("table", "markdown", "csv", "json", "html")
COLUMNS = ["GPU", "$/hour", "Setup", "Step (ms)", "Tokens/s", "Peak memory", "First step (s)",
           "M tokens per $"]
ALIGN = "lrlrrrrr"
# Tolerance on the relative difference of the last loss between a compiled setup and its eager
# twin: bf16 rounding alone moves a loss by about 1e-2 over a few steps, fp32 by far less.
PARITY_TOLERANCE = {"bf16": 2e-2, "fp16": 1e-2, "fp32": 1e-4}
# One mark per noise flag, placed after the step time; footnotes explain the marks used.
NOISE_MARKS = {
    "high_cv": ("*", "step times varied by more than 5% (coefficient of variation)"),
    "throttled": ("†", "the GPU reported throttling or its SM clock dropped by over 10% "
                       "during the timed steps"),
    "clock_drop": ("†", "the GPU reported throttling or its SM clock dropped by over 10% "
                        "during the timed steps"),
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


# ---------------------------------------------------------------- rows

@dataclass
class Row:
    """One GPU x setup: the records of all its repeats combined. Units are in the names."""

    gpu: str
    setup: str
    mode: str
    attn: str
    compile_mode: str
    model: str
    batch: int
    seq: int
    dtype: str
    status: str
    statuses: dict[str, int]
    repeats: int
    runs: int
    price_per_hour: float | None = None
    step_ms: float | None = None
    step_ms_ci: tuple[float, float] | None = None
    ci_method: str | None = None
    tokens_per_s: float | None = None
    peak_memory_gb: float | None = None
    first_step_s: float | None = None
    first_step_warm_s: float | None = None
    m_tokens_per_dollar: float | None = None
    noise_flags: list[str] = field(default_factory=list)
    error: str | None = None
    gpu_memory_gb: float | None = None
    mfu: float | None = None
    mfu_source: str | None = None
    compile_cache: str | None = None
    tokens_per_kwh: float | None = None
    loss_last: float | None = None
    parity_rel_diff: float | None = None
    parity_tolerance: float | None = None
    # Samples for significance tests (not shown): per-process step_ms and all step times.
    repeat_step_ms: list[float] = field(default_factory=list, repr=False)
    step_times_ms: list[float] = field(default_factory=list, repr=False)
    records: list[dict] = field(default_factory=list, repr=False)

    @property
    def ok(self) -> bool:
        return self.status == "ok" and self.step_ms is not None

    @property
    def workload(self) -> tuple:
        return (self.model, self.batch, self.seq, self.dtype)

    @property
    def parity_ok(self) -> bool | None:
        if self.parity_rel_diff is None:
            return None
        return self.parity_rel_diff <= self.parity_tolerance

    def as_dict(self) -> dict:
        """The JSON row: the post's columns first, then everything else measured."""
        return {
            "gpu": self.gpu, "price_per_hour": self.price_per_hour, "setup": self.setup,
            "status": self.status, "step_ms": self.step_ms, "tokens_per_s": self.tokens_per_s,
            "peak_memory_gb": self.peak_memory_gb, "first_step_s": self.first_step_s,
            "m_tokens_per_dollar": self.m_tokens_per_dollar,
            "mode": self.mode, "attn": self.attn, "compile_mode": self.compile_mode,
            "model": self.model, "batch": self.batch, "seq": self.seq, "dtype": self.dtype,
            "repeats": self.repeats, "runs": self.runs, "statuses": self.statuses,
            "step_ms_ci": list(self.step_ms_ci) if self.step_ms_ci else None,
            "step_ms_ci_method": self.ci_method, "noise_flags": self.noise_flags,
            "error": self.error, "gpu_memory_gb": self.gpu_memory_gb,
            "first_step_warm_s": self.first_step_warm_s, "compile_cache": self.compile_cache,
            "mfu": self.mfu, "mfu_source": self.mfu_source,
            "tokens_per_kwh": self.tokens_per_kwh, "loss_last": self.loss_last,
            "parity_rel_diff": self.parity_rel_diff, "parity_tolerance": self.parity_tolerance,
            "parity_ok": self.parity_ok,
        }


def row_key(record: dict) -> tuple:
    s = record["setup"]
    return (record["machine"]["gpu"], s["name"], s.get("model"), s.get("batch"), s.get("seq"),
            s.get("dtype"))


def build_rows(records: list[dict], prices: dict[str, float]) -> list[Row]:
    """Group records by GPU x setup, combine each group, order the rows like the post."""
    groups: dict[tuple, list[dict]] = {}
    for record in records:
        groups.setdefault(row_key(record), []).append(record)
    rows = [combine(group, price_for(prices, key[0])) for key, group in groups.items()]
    rows.sort(key=_order(records))
    add_parity(rows)
    return rows


def _order(records: list[dict]):
    """Per GPU, per workload, per attention in order of appearance; eager before compile."""
    first: dict[tuple, int] = {}
    for i, r in enumerate(records):
        s = r["setup"]
        for key in (("gpu", r["machine"]["gpu"]),
                    ("work", (s.get("model"), s.get("batch"), s.get("seq"), s.get("dtype"))),
                    ("attn", s["attn"]), ("name", s["name"])):
            first.setdefault(key, i)
    return lambda row: (first[("gpu", row.gpu)], first[("work", row.workload)],
                        first[("attn", row.attn)], row.mode != "eager", first[("name", row.setup)])


def _median(values) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def combine(records: list[dict], price: float | None) -> Row:
    """One row from the records of one setup on one GPU (one per repeat, from any runs).

    Step time: the median of the per-process means; with one process, its mean. Its 95% CI is
    a bootstrap over the per-process means, or over the step times when one process ran.
    Peak memory: the largest peak of any process. First step: median over processes, with a
    warm compile cache counted apart (first_step_warm_s).
    """
    head, setup = records[0], records[0]["setup"]
    statuses = Counter(r["status"] for r in records)
    ok = [r for r in records if r["status"] == "ok" and r.get("step_ms") is not None]
    failed = [r for r in records if r["status"] != "ok"]
    row = Row(
        gpu=head["machine"]["gpu"], setup=setup["name"], mode=setup["mode"], attn=setup["attn"],
        compile_mode=setup.get("compile_mode") or "default", model=setup.get("model"),
        batch=setup.get("batch"), seq=setup.get("seq"), dtype=setup.get("dtype"),
        status="ok" if ok else statuses.most_common(1)[0][0], statuses=dict(statuses),
        repeats=len(records), runs=len({r.get("run_id") for r in records}),
        price_per_hour=price, gpu_memory_gb=head["machine"].get("gpu_memory_gb"),
        error=next((r.get("error") for r in failed if r.get("error")), None), records=records)
    if not ok:
        return row
    row.repeat_step_ms = [r["step_ms"] for r in ok]
    row.step_times_ms = [t for r in ok for t in (r.get("step_times_ms") or [])]
    row.step_ms = statistics.median(row.repeat_step_ms)
    if len(ok) >= 2:
        row.step_ms_ci = stats.median_ci(row.repeat_step_ms)
        row.ci_method = f"median of {len(ok)} per-process means, bootstrap over processes"
    elif len(row.step_times_ms) >= 2:
        row.step_ms_ci = stats.mean_ci(row.step_times_ms)
        row.ci_method = f"mean of {len(row.step_times_ms)} steps, bootstrap over steps"
    if row.batch and row.seq:
        row.tokens_per_s = row.batch * row.seq * 1000.0 / row.step_ms
    else:
        row.tokens_per_s = _median(r.get("tokens_per_s") for r in ok)
    if row.tokens_per_s is not None and price:
        row.m_tokens_per_dollar = row.tokens_per_s * 3600 / price / 1e6
    peaks = [r.get("peak_memory_gb") for r in ok if r.get("peak_memory_gb") is not None]
    row.peak_memory_gb = max(peaks) if peaks else None
    _combine_first_step(row, ok)
    flags = [f for r in ok for f in (r.get("noise_flags") or [])]
    if len(ok) >= 2:
        flags += stats.noise_flags_for(row.repeat_step_ms)   # spread between processes
    row.noise_flags = list(dict.fromkeys(flags))
    _combine_details(row, ok)
    return row


def _cache(record: dict) -> str | None:
    compiled = record.get("compile")
    return compiled.get("cache") if isinstance(compiled, dict) else None


def _combine_first_step(row: Row, ok: list[dict]) -> None:
    warm = [r for r in ok if _cache(r) == "warm"]
    rest = [r for r in ok if _cache(r) != "warm"] or warm
    row.first_step_s = _median(r.get("first_step_s") for r in rest)
    if rest is not warm:
        row.first_step_warm_s = _median(r.get("first_step_s") for r in warm)
    caches = Counter(_cache(r) for r in ok if _cache(r))
    if len(caches) == 1:
        row.compile_cache = next(iter(caches))
    elif caches:
        row.compile_cache = ", ".join(f"{n} {c}" for c, n in sorted(caches.items()))


def _combine_details(row: Row, ok: list[dict]) -> None:
    for source in ("measured", "datasheet"):
        value = _median(r.get(f"mfu_{source}") for r in ok)
        if value is not None:
            row.mfu, row.mfu_source = value, source
            break
    row.tokens_per_kwh = _median((r.get("energy") or {}).get("tokens_per_kwh") for r in ok)
    row.loss_last = _median(_last_loss(r) for r in ok)


def _last_loss(record: dict) -> float | None:
    losses = record.get("losses") or []
    return losses[-1] if losses else record.get("loss_last")


def add_parity(rows: list[Row]) -> None:
    """Relative difference of the last loss, compiled against eager, same seed and workload.

    Same seed gives the same weights and tokens, so after the same number of steps the two
    should agree up to rounding; the largest difference over matching processes is kept.
    """
    eager = {(r.gpu, r.workload, r.attn): r for r in rows if r.mode == "eager" and r.ok}
    for row in rows:
        twin = eager.get((row.gpu, row.workload, row.attn))
        if row.mode != "compile" or not row.ok or twin is None:
            continue
        diffs = []
        for rc in row.records:
            for re_ in twin.records:
                if rc["setup"].get("seed") != re_["setup"].get("seed"):
                    continue
                lc, le = _last_loss(rc), _last_loss(re_)
                steps_c, steps_e = len(rc.get("losses") or []), len(re_.get("losses") or [])
                if lc is None or le is None or not le or steps_c != steps_e:
                    continue
                diffs.append(abs(lc - le) / abs(le))
        if diffs:
            row.parity_rel_diff = max(diffs)
            row.parity_tolerance = PARITY_TOLERANCE.get(row.dtype, PARITY_TOLERANCE["bf16"])


# ---------------------------------------------------------------- rendering

def setup_labels(rows: list[Row]) -> dict[int, str]:
    """Setup name, plus the workload where rows differ in it (model, batch x seq, dtype)."""
    varies = [len({getattr(r, f) for r in rows}) > 1 for f in ("model", "batch", "dtype")]
    varies[1] = varies[1] or len({r.seq for r in rows}) > 1
    labels = {}
    for row in rows:
        extra = [str(row.model)] if varies[0] else []
        extra += [f"{row.batch}x{row.seq}"] if varies[1] else []
        extra += [str(row.dtype)] if varies[2] else []
        labels[id(row)] = row.setup + (f" ({', '.join(extra)})" if extra else "")
    return labels


def status_text(status: str) -> str:
    return "OOM" if status == "oom" else status


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
    notes = ["Step (ms) is the mean of the timed steps; Tokens/s is batch x sequence per step "
             "time; Peak memory is the peak allocated during the timed steps; First step "
             "includes compilation."]
    if any(r.m_tokens_per_dollar is not None for r in rows):
        notes.append('"M tokens per $" is training tokens per dollar of GPU time, in millions, '
                     "at each machine's hourly price.")
    used = sorted({r.status for r in rows if not r.ok} & set(STATUS_NOTES),
                  key=list(STATUS_NOTES).index)
    notes += [STATUS_NOTES[s] for s in used]
    notes += _combined_notes(rows)
    flagged: dict[str, list[str]] = {}
    for row in rows:
        for flag in row.noise_flags:
            if flag in NOISE_MARKS:
                mark, meaning = NOISE_MARKS[flag]
                flagged.setdefault(f"{mark} {meaning}", [])
    notes += [f"{text}." for text in flagged]
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
    return notes


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


DETAIL_COLUMNS = [  # (header, has data?, cell)
    ("Repeats", lambda r: r.repeats > 1, lambda r: str(r.repeats)),
    ("Step 95% CI (ms)", lambda r: r.step_ms_ci is not None,
     lambda r: f"{table.sig(r.step_ms_ci[0])}-{table.sig(r.step_ms_ci[1])}"
     if r.step_ms_ci else "-"),
    ("Noise flags", lambda r: bool(r.noise_flags), lambda r: ", ".join(r.noise_flags) or "-"),
    ("MFU", lambda r: r.mfu is not None,
     lambda r: f"{r.mfu * 100:.0f}% ({r.mfu_source})" if r.mfu is not None else "-"),
    ("Compile cache", lambda r: r.compile_cache is not None, lambda r: r.compile_cache or "-"),
    ("First step warm (s)", lambda r: r.first_step_warm_s is not None,
     lambda r: table.num(r.first_step_warm_s, 1)),
    ("M tokens per kWh", lambda r: r.tokens_per_kwh is not None,
     lambda r: table.sig(r.tokens_per_kwh / 1e6 if r.tokens_per_kwh else None, 2)),
    ("Loss vs eager", lambda r: r.parity_rel_diff is not None, lambda r: _parity_cell(r)),
]


def _parity_cell(row: Row) -> str:
    if row.parity_rel_diff is None:
        return "-"
    text = f"{row.parity_rel_diff * 100:.2g}%"
    return text if row.parity_ok else f"{text} (over {row.parity_tolerance * 100:.2g}%)"


def details(rows: list[Row]) -> tuple[list[str], list[list[str]]] | None:
    """An extra table with what the records measured beyond the post's columns, if anything."""
    used = [c for c in DETAIL_COLUMNS if any(c[1](r) for r in rows)]
    if not used:
        return None
    labels = setup_labels(rows)
    shown = [r for r in rows if any(c[1](r) for c in used)]
    columns = ["GPU", "Setup"] + [c[0] for c in used]
    return columns, [[r.gpu, labels[id(r)]] + [c[2](r) for c in used] for r in shown]


def render_text(rows: list[Row], findings: list, fmt: str) -> str:
    """Terminal table or Markdown: results table, details table, then the findings."""
    markdown = fmt == "markdown"
    out = ["## Results\n\n" if markdown else ""]
    out.append(table.render(COLUMNS, table_cells(rows), fmt, align=ALIGN,
                            title=None if markdown else "Results", footnotes=footnotes(rows)))
    extra = details(rows)
    if extra:
        out.append("\n## Details\n\n" if markdown else "\n")
        out.append(table.render(*extra, fmt, title=None if markdown else "Details"))
    if findings:
        out.append("\n## What the numbers say\n\n" if markdown else "\nWhat the numbers say\n\n")
        out += [f"{i}. {f.text}\n" for i, f in enumerate(findings, 1)]
    return "".join(out)


CSV_KEYS = ["gpu", "price_per_hour", "setup", "status", "step_ms", "tokens_per_s",
            "peak_memory_gb", "first_step_s", "m_tokens_per_dollar", "mode", "attn",
            "compile_mode", "model", "batch", "seq", "dtype", "repeats", "step_ms_ci_low",
            "step_ms_ci_high", "noise_flags", "first_step_warm_s", "compile_cache", "mfu",
            "mfu_source", "tokens_per_kwh", "parity_rel_diff", "parity_ok"]


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
    records = load_records(args.files)
    rows = build_rows(records, prices)
    _warn_prices(rows, prices)
    findings = findings_for(rows)
    text = render(rows, findings, args.format)
    if args.plots:
        from stepbench.plots import write_plots
        for path in write_plots(rows, Path(args.plots)):
            print(f"stepbench report: wrote {path}", file=sys.stderr)
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text, encoding="utf-8")
        print(f"stepbench report: wrote {out}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


def render(rows: list[Row], findings: list, fmt: str) -> str:
    if fmt in ("table", "markdown"):
        return render_text(rows, findings, fmt)
    if fmt == "csv":
        return render_csv(rows)
    if fmt == "json":
        return render_json(rows, findings)
    if fmt == "html":
        from stepbench.html_page import render_html
        return render_html(rows, findings)
    raise UserError(f"unknown format '{fmt}'; choose one of: {', '.join(FORMATS)}")


def _warn_prices(rows: list[Row], prices: dict[str, float]) -> None:
    missing = list(dict.fromkeys(r.gpu for r in rows if r.price_per_hour is None))
    if missing:
        warn("no price for " + ", ".join(f"'{g}'" for g in missing) + "; its M tokens per $ "
             "is left blank (add --price \"GPU NAME=DOLLARS\" or a --prices file)")
    for key in unused_keys(prices, [r.gpu for r in rows]):
        warn(f"price for '{key}' matches no GPU in the results (GPU names are as the driver "
             "reports them, e.g. 'NVIDIA H100 PCIe')")
