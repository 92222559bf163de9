"""Tables of a `stepbench run --repeats N` results file, for benchmarks/README.md (issue 4).

The report (`stepbench report`) shows one row per setup; this prints what lies under it, per
setup and per process, so that the README's numbers come from the file and not from a hand:
step time (median of per-process means, 95% CI), MFU against both peaks, compile cost cold and
warm, the loss guard's verdict on each compiled setup, energy, and compiled against eager tested
for significance.

    PYTHONPATH=src python benchmarks/summarize_repeats.py RESULTS.jsonl

Only reads stored results; the statistics are stepbench.stats's, the combined rows and the loss
guard's verdicts are the report's own (stepbench.report.rows), so the two cannot disagree.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from stepbench.record import Record, ResultsFile
from stepbench import stats
from stepbench.report.rows import Row, build_rows, eager_twins


def table(columns: list[str], cells: list[list[str]]) -> str:
    """A Markdown table; the first column left-aligned, the others right."""
    lines = ["| " + " | ".join(columns) + " |",
             "| --- " + "| ---: " * (len(columns) - 1) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in cells]
    return "\n".join(lines) + "\n"


def f(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def ok_records(row: Row) -> list[Record]:
    return [r for r in row.records if r.ok]


def median_of(records: list[dict], get) -> float | None:
    values = [v for v in map(get, records) if v is not None]
    return statistics.median(values) if values else None


def step_times(rows: list[Row]) -> str:
    cells = []
    for row in rows:
        means = row.repeat_step_ms
        lo, hi = row.step_ms_ci or (None, None)
        spread = (max(means) - min(means)) / min(means) * 100
        flags = [", ".join(r.noise_flags) or "-" for r in ok_records(row)]
        cells.append([row.name, ", ".join(f(m) for m in means), f(row.step_ms),
                      f"{f(lo)}-{f(hi)}", f"{spread:.1f}%", "; ".join(flags)])
    return table(["setup", "per-process means (ms, in run order)", "median ms",
                  "95% CI of median (ms)", "spread (max-min)/min", "noise flags per process"],
                 cells)


def mfu(rows: list[Row]) -> str:
    cells = []
    for row in rows:
        ok = ok_records(row)
        cells.append([
            row.name, f(median_of(ok, lambda r: r.achieved_tflops)),
            f"{median_of(ok, lambda r: r.mfu_measured) * 100:.1f}%",
            f(median_of(ok, lambda r: r.peak_tflops_measured)),
            f"{median_of(ok, lambda r: r.mfu_datasheet) * 100:.1f}%",
            f(median_of(ok, lambda r: r.peak_tflops_datasheet)),
            f"{median_of(ok, lambda r: r.flop_counter_per_step) / 1e12:.2f}",
            f"{ok[0].flops_per_token * row.batch * row.seq / 1e12:.2f}"])
    return table(["setup", "achieved TFLOP/s", "MFU (measured peak)", "measured peak TFLOP/s",
                  "MFU (datasheet peak)", "datasheet peak TFLOP/s",
                  "FlopCounterMode TFLOP/step", "6N'+12LdT TFLOP/step"], cells)


def compile_cost(rows: list[Row]) -> str:
    cells = []
    for row in rows:
        for r in ok_records(row):
            c = r.compile
            if not c:
                continue
            cells.append([row.name, str(r.repeat), c["cache"], f(r.first_step_s),
                          f(c.get("dynamo_s")), f(c.get("inductor_s")), str(c.get("graphs")),
                          str(c.get("graph_breaks")), "; ".join(c.get("break_reasons") or [])
                          or "-", str(c.get("recompiles_in_timed"))])
    return table(["setup", "repeat", "inductor cache", "first step s", "dynamo s", "inductor s",
                  "graphs", "graph breaks", "break reasons", "recompiles in timed steps"],
                 cells)


def loss_guard(rows: list[Row]) -> str:
    """Each compiled setup against its eager twin: the loss guard's verdict (stepbench.guard),
    the one loss check the report and tune use."""
    cells = []
    for row, twin in eager_twins(rows):
        verdict = row.loss_guard
        if verdict is None or verdict.max_rel_diff is None:
            continue
        cells.append([row.name, verdict.reference, f(twin.loss_last, 4), f(row.loss_last, 4),
                      f"{verdict.max_rel_diff * 100:.3f}%", f"{verdict.tolerance * 100:.0f}%",
                      verdict.status, str(verdict.steps)])
    return table(["compiled setup", "checked against", "eager last loss (median)",
                  "compiled last loss (median)", "largest relative difference",
                  "tolerance", "verdict", "steps compared"], cells)


def energy(rows: list[Row]) -> str:
    cells = []
    for row in rows:
        ok = ok_records(row)
        joules = median_of(ok, lambda r: (r.energy or {}).get("joules_per_step"))
        per_token = [r.energy["joules_per_step"] / (row.batch * row.seq) for r in ok]
        cells.append([row.name, f(joules), f"{joules / (row.batch * row.seq) * 1000:.2f}",
                      ", ".join(f"{j * 1000:.2f}" for j in per_token),
                      f(median_of(ok, lambda r: (r.energy or {}).get("avg_watts")), 0),
                      f"{row.tokens_per_kwh / 1e6:.0f}M"])
    return table(["setup", "J per step (median)", "mJ per token (median)",
                  "mJ per token per process", "average W", "tokens per kWh (median)"], cells)


def significance(rows: list[Row]) -> str:
    by_name = {r.name: r for r in rows}
    cells = []
    for attn in dict.fromkeys(r.attn for r in rows):
        comp, eager = by_name.get(f"compile+{attn}"), by_name.get(f"eager+{attn}")
        if not (comp and eager and comp.ok and eager.ok):
            continue
        for what, a, b in (("per-process means", comp.repeat_step_ms, eager.repeat_step_ms),
                           ("pooled per-step times", comp.step_times_ms, eager.step_times_ms)):
            c = stats.compare(a, b)
            ci = f"{c.ci[0]:.3f}-{c.ci[1]:.3f}" if c.ci else "-"
            verdict = {True: "yes", False: "no",
                       None: f"cannot tell (smallest possible p = "
                             f"{stats.min_p_value(len(a), len(b)):.2f})"}[c.significant]
            cells.append([f"compile+{attn} vs eager+{attn}", what, f"{len(a)} vs {len(b)}",
                          f"{c.ratio:.3f}", ci, f"{c.p_value:.2g}", verdict])
    return table(["comparison", "tested on", "n", "ratio of medians", "95% CI of ratio",
                  "Mann-Whitney p", "significant (p < 0.05 and CI excludes 1)"], cells)


SECTIONS = [("Step time", step_times), ("MFU", mfu), ("Compile cost", compile_cost),
            ("Loss guard", loss_guard), ("Energy", energy),
            ("Compiled against eager", significance)]


def summarize(records: list[dict]) -> str:
    rows = [r for r in build_rows(records, {}) if r.ok]
    gpus = sorted({r.gpu for r in rows})
    head = (f"{len(records)} records, {', '.join(gpus)}, "
            f"{len({r.run_id for r in records})} run(s)\n")
    return head + "".join(f"\n### {title}\n\n{fn(rows)}" for title, fn in SECTIONS)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", type=Path, help="results file of `stepbench run --repeats N`")
    args = parser.parse_args(argv)
    sys.stdout.write(summarize(ResultsFile(args.results).read()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
