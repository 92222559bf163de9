"""`stepbench compare BEFORE AFTER`: the same setups measured before and after a change, setup
by setup, as a Document (so it renders to every format the report does).

A before and an after setup are the same when every axis but how long they were measured
(warm-up and timed steps, `Axis.timing`) is equal, and they ran on the same GPU: Setup.match_key
and the row's machine. Each side's records are combined as the report combines them (rows.py),
and after is tested against before with the report's test (stats.compare_step_times: a
hierarchical bootstrap where both ran 2 or more processes). A change is called slower or faster
only when it is outside the noise (p < 0.05 and the ratio's 95% interval excludes 1).

A setup whose steps something outside the step disturbed on either side (noise.DISTURBED: other
processes on the CPU or the GPU, throttling, a recompile; `‡` and its kin in the tables) gets no
verdict of slower, faster or within the noise: the test would measure the disturbance, so the
verdict is `disturbed` and the change is shown as measured.

`--fail-above PCT` turns the comparison into a check for CI, as pytest-benchmark's
--benchmark-compare-fail and asv's --factor do: it fails when a setup is slower by more than
PCT percent and outside the noise, or ran before and fails after; where nothing fails but a
setup's verdict is `disturbed`, the check is inconclusive (its own exit code, cli/compare.py).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from stepbench import record_files
from stepbench import stats
from stepbench.axes import AXES
from stepbench.errors import UserError
from stepbench.report import meta as about
from stepbench.report import searches, table
from stepbench.report.columns import unit_headers
from stepbench.report.document import marks, warn
from stepbench.report.findings import TESTS, Finding, change, every, join, slower_pct
from stepbench.report.layout import Document, Table
from stepbench.report.marks import disturbed_marks, mark_notes
from stepbench.report.rows import Row, build_rows, setup_labels, status_text
from stepbench.report.select import Filters

# What a setup's change is (Change.verdict), stable for tools (JSON "verdict").
SLOWER, FASTER, NOISE, UNTESTED = "slower", "faster", "noise", "untested"
DISTURBED_VERDICT = "disturbed"      # a side's steps were disturbed: not compared
FAILS_NOW, RUNS_NOW, FAILS_BOTH = "fails_now", "runs_now", "fails_both"


@dataclass
class Change:
    """One setup before and after: its two rows and the test of after's step times against
    before's (None: too few step times or processes to test, or a side did not run)."""

    before: Row
    after: Row
    result: stats.Comparison | None = None
    label: str = ""              # the setup as the tables name it

    @property
    def both_ran(self) -> bool:
        return self.before.ok and self.after.ok

    @property
    def ratio(self) -> float | None:
        """After's step time over before's: the test's ratio (of the means of per-process
        means, or of medians), else of the rows' step times; None unless both ran."""
        if not self.both_ran:
            return None
        return self.result.ratio if self.result else self.after.step_ms / self.before.step_ms

    @property
    def verdict(self) -> str:
        if not self.both_ran:
            return (FAILS_NOW if self.before.ok else RUNS_NOW if self.after.ok else FAILS_BOTH)
        if self.disturbed_marks:
            return DISTURBED_VERDICT
        if self.result is None:
            return UNTESTED
        if not self.result.significant:
            return NOISE
        return SLOWER if self.result.ratio > 1 else FASTER

    @property
    def disturbed_marks(self) -> str:
        """The marks of what disturbed either side's timed steps (noise.DISTURBED), "" when
        nothing did."""
        return disturbed_marks(self.before, self.after)

    @property
    def change_pct(self) -> float | None:
        """How much slower after is, in percent (negative: how much faster), as
        findings.change words it: the slower step time over the faster's, either way round."""
        return None if self.ratio is None else slower_pct(self.ratio)

    def text(self) -> str:
        """The verdict in words: "7.1% slower", "within the noise, p = 0.31", "untested:
        3.0% slower", "not compared, disturbed (‡): 3.7x faster as measured", "fails now: OOM",
        "runs now (was OOM)", "OOM in both"."""
        verdict = self.verdict
        if verdict == FAILS_NOW:
            return f"fails now: {status_text(self.after.status)}"
        if verdict == RUNS_NOW:
            return f"runs now (was {status_text(self.before.status)})"
        if verdict == FAILS_BOTH:
            b, a = status_text(self.before.status), status_text(self.after.status)
            return f"{b} in both" if a == b else f"{b}, then {a}"
        moved = self.moved()
        if verdict == NOISE:
            return f"within the noise, p = {self.result.p_value:.2f}"
        if verdict == UNTESTED:
            return f"untested: {moved}"
        if verdict == DISTURBED_VERDICT:
            return f"not compared, disturbed ({self.disturbed_marks}): {moved} as measured"
        return moved

    def moved(self) -> str:
        """The change as measured, in the tool's words ("8% slower", "2.8x faster", "the
        same"); both sides ran."""
        size, direction = change(self.ratio, 1.0)
        return f"{size} {direction}" if size else "the same"

    def as_dict(self) -> dict:
        b, a = self.before, self.after
        ci = self.result.ci if self.result and self.both_ran else None
        return {
            "gpu": b.gpu, "gpu_name": b.gpu_name, "setup": b.name, "model": b.model,
            "params": b.setup.params, "batch": b.batch, "seq": b.seq, "dtype": b.dtype,
            "verdict": self.verdict, "verdict_text": self.text(),
            "before_status": b.status, "after_status": a.status,
            "before_step_ms": b.step_ms, "after_step_ms": a.step_ms,
            "before_tokens_per_s": b.tokens_per_s, "after_tokens_per_s": a.tokens_per_s,
            "ratio": self.ratio, "ratio_ci": list(ci) if ci else None,
            "tokens_per_s_ratio": None if self.ratio is None else 1 / self.ratio,
            "tokens_per_s_ratio_ci": [1 / ci[1], 1 / ci[0]] if ci else None,
            "change_pct": self.change_pct,
            "p_value": self.result.p_value if self.result else None,
            "significant": self.result.significant if self.result else None,
            "method": self.result.method if self.result else None,
            "before_repeats": b.repeats, "after_repeats": a.repeats,
            "before_steps": b.setup.steps, "after_steps": a.setup.steps,
            "before_noise_flags": b.noise_flags, "after_noise_flags": a.noise_flags,
            "before_peak_memory_gb": b.peak_memory_gb, "after_peak_memory_gb": a.peak_memory_gb,
            **{f"before_{k}": v for k, v in _software(b).items()},
            **{f"after_{k}": v for k, v in _software(a).items()},
        }

    def csv_dict(self) -> dict:
        d = self.as_dict()
        for key in ("ratio_ci", "tokens_per_s_ratio_ci"):
            d[f"{key}_low"], d[f"{key}_high"] = d.pop(key) or (None, None)
        return d


CSV_KEYS = ["gpu", "setup", "model", "params", "batch", "seq", "dtype", "verdict", "before_status",
            "after_status", "before_step_ms", "after_step_ms", "ratio", "ratio_ci_low",
            "ratio_ci_high", "tokens_per_s_ratio", "tokens_per_s_ratio_ci_low",
            "tokens_per_s_ratio_ci_high", "change_pct", "p_value", "significant", "method",
            "before_tokens_per_s", "after_tokens_per_s", "before_repeats", "after_repeats",
            "before_steps", "after_steps", "before_peak_memory_gb", "after_peak_memory_gb",
            "before_torch", "after_torch", "before_transformers", "after_transformers",
            "before_stepbench_version", "after_stepbench_version", "before_started_first",
            "before_started_last", "after_started_first", "after_started_last", "verdict_text"]


def _software(row: Row) -> dict:
    return about.row_fields(row.records)


def parse_labels(given: list[str] | None) -> tuple[str, str]:
    """(before's label, after's) from `--label`: NAME once per file, in the files' order
    (--label main --label pr-42), or before=NAME and after=NAME; "before" and "after" where
    not given."""
    keyed, plain = {}, []
    for text in given or ():
        side, sep, name = text.partition("=")
        if sep and side.strip().lower() in ("before", "after"):
            keyed[side.strip().lower()] = name.strip()
        else:
            plain.append(text.strip())
    if len(plain) > 2 or (plain and keyed):
        raise UserError("--label: give one name per file, before's then after's (--label main "
                        "--label pr-42), or before=NAME and after=NAME")
    labels = {"before": "before", "after": "after", **dict(zip(("before", "after"), plain)),
              **keyed}
    if not all(labels.values()):
        raise UserError("--label needs a name")
    if labels["before"] == labels["after"]:
        raise UserError(f"--label: both sides are called {labels['before']!r}; give two names")
    return labels["before"], labels["after"]


def compare_document(before: list[str], after: list[str], *,
                     labels: tuple[str, str] = ("before", "after"),
                     filters: Filters = Filters(),
                     fail_above: float | None = None) -> tuple[Document, list[str]]:
    """The comparison of the records in `before` and `after` (files or folders), and what
    fails `fail_above` (one text per setup; empty without it or when nothing does)."""
    both = ({p.resolve() for p in record_files.results_files(before, warn)}
            & {p.resolve() for p in record_files.results_files(after, warn)})
    if both:
        raise UserError(f"{sorted(both)[0]} is in both {labels[0]} and {labels[1]}; compare "
                        "the results files of two runs, before and after a change")
    sides = [record_files.load(paths, warn) for paths in (before, after)]
    kept = {id(r) for r in filters.apply(sides[0] + sides[1])} if filters else None
    rows = []
    for records in sides:
        records = [r for r in records if kept is None or id(r) in kept]
        measured, _ = searches.split(records)          # a search's probes are not results
        rows.append(build_rows(measured, {}, identity=lambda s: s.match_key()))
    after_by_key = {_key(r): r for r in rows[1]}
    changes = [Change(b, after_by_key[_key(b)]) for b in rows[0] if _key(b) in after_by_key]
    matched = {_key(c.before) for c in changes}
    only = [[r for r in side if _key(r) not in matched] for side in rows]
    if not changes:
        raise UserError(
            f"no setup ran in both {labels[0]} ({len(rows[0])} setups) and {labels[1]} "
            f"({len(rows[1])}); setups match when every setting but warm-up and timed steps is "
            f"equal, on the same GPU{_nearest(rows, labels)}")
    names = setup_labels([c.before for c in changes] + only[0] + only[1])
    for c in changes:
        if c.both_ran:
            c.result = c.after.compare(c.before)
        c.label = names[id(c.before)]
    failed = failures(changes, fail_above)
    unsure = inconclusive(changes, fail_above)
    doc = Document(f"stepbench compare: {labels[0]} -> {labels[1]}",
                   [_main_table(changes, labels, fail_above)], rows=changes,
                   csv_keys=CSV_KEYS)
    for side, label in zip(only, labels):
        if side:
            doc.tables.append(_only_table(side, label, names))
    doc.findings = [(None, _findings(changes, only, labels, fail_above, failed, unsure))]
    metas = {}
    for key, label, records in zip(("before", "after"), labels, sides):
        records = [r for r in records if kept is None or id(r) in kept]
        metas[key] = {"label": label, **about.measured(records)}
        what, software = about.header(metas[key])
        named = key.capitalize() + ("" if label == key else f" ({label})")
        doc.header += [(named, what.split(": ", 1)[1]),
                       (f"{key.capitalize()} software", software.split(": ", 1)[1])]
    doc.meta = metas
    doc.extra = {"unmatched": {key: [_only_dict(r) for r in side]
                               for key, side in zip(("before", "after"), only)},
                 "fail_above": fail_above, "failed": failed, "inconclusive": unsure}
    return doc, failed


def _nearest(rows: list[list[Row]], labels: tuple[str, str]) -> str:
    """Where no setup matched, what the closest before and after setups differ in (the GPU, or
    the settings with each side's value): a setting added since the before run (init: its
    records drew the weights on the CPU) is otherwise invisible in both files."""
    timing = {a.name for a in AXES if a.timing}
    best = None
    for b in rows[0]:
        for a in rows[1]:
            names = set(b.setup.fields()) | set(a.setup.fields())
            diff = [n for n in sorted(names - timing)
                    if getattr(b.setup, n) != getattr(a.setup, n)]
            diff += ["gpu"] if b.gpu != a.gpu else []
            if diff and (best is None or len(diff) < len(best[0])):
                best = (diff, b, a)
    if best is None:
        return ""
    diff, b, a = best

    def value(row: Row, name: str):
        return row.gpu if name == "gpu" else getattr(row.setup, name)
    return ("; the closest pair differs in " + ", ".join(
        f"{n} ({value(b, n)} in {labels[0]}, {value(a, n)} in {labels[1]})" for n in diff))


def _key(row: Row) -> tuple[str, str]:
    return row.setup.match_key(), row.gpu


def failures(changes: list[Change], fail_above: float | None) -> list[str]:
    """The setups that fail `--fail-above PCT`: slower by more than PCT percent outside the
    noise, or ran before and fail after."""
    if fail_above is None:
        return []
    out = []
    for c in changes:
        where = f"{c.label} on {c.before.gpu}"
        if c.verdict == SLOWER and c.change_pct > fail_above:
            out.append(f"{where} {c.change_pct:+.1f}%")
        elif c.verdict == FAILS_NOW:
            out.append(f"{where} {c.text()}")
    return out


def inconclusive(changes: list[Change], fail_above: float | None) -> list[str]:
    """The setups `--fail-above PCT` cannot judge: their steps were disturbed on a side
    (verdict `disturbed`), named with the change as measured, in words (a percentage of a
    2.8x speed-up would read -180%)."""
    if fail_above is None:
        return []
    return [f"{c.label} on {c.before.gpu}: {c.moved()} as measured ({c.disturbed_marks})"
            for c in changes if c.verdict == DISTURBED_VERDICT]


def _cell(value: float | None, ci: tuple[float, float] | None) -> str:
    if value is None:
        return "-"
    return f"{value:.3f}" + (f" ({ci[0]:.3f}-{ci[1]:.3f})" if ci else "")


def _main_table(changes: list[Change], labels: tuple[str, str],
                fail_above: float | None) -> Table:
    b, a = labels
    rows = [r for c in changes for r in (c.before, c.after)]
    rate = unit_headers(["Tokens/s"], rows)[0]        # a user's workload's own unit
    columns = ["GPU", "Setup", f"{b} (ms)", f"{a} (ms)", f"{a} / {b} (95% CI)",
               f"{rate} ratio", "Verdict"]
    cells = []
    for c in changes:
        ci = c.result.ci if c.result else None
        cells.append([
            c.before.gpu, c.label, _step(c.before), _step(c.after), _cell(c.ratio, ci),
            _cell(None if c.ratio is None else 1 / c.ratio, (1 / ci[1], 1 / ci[0]) if ci else None),
            c.text()])
    notes = [f"{a} / {b}: {a}'s step time over {b}'s, below 1 faster; where both ran 2 or more "
             "processes, the ratio of their means of per-process means with a hierarchical "
             "bootstrap's 95% interval, else of medians (docs/report.md, \"How differences are "
             f"tested\"). {rate} ratio is its inverse. A change is slower or faster only "
             "outside the noise: p < 0.05 and the interval excludes 1.",
             "Setups are matched by every setting but warm-up and timed steps, on the same GPU; "
             "each side's processes are combined as the report combines them (ms: the median of "
             "per-process means)."]
    notes += mark_notes((r.noise_flags for r in rows),
                        compiled=any(r.compile_marked for r in rows))
    notes += _means_apart(changes, labels)
    if any(c.verdict == DISTURBED_VERDICT for c in changes):
        notes.append("Not compared, disturbed: something outside the step (the marks above) "
                     "disturbed a side's timed steps, so a test would measure that; measure "
                     "the setup again on a quiet machine.")
    if fail_above is not None:
        notes.append(f"--fail-above {fail_above:g}: a setup slower by more than {fail_above:g}% "
                     "outside the noise, or that ran before and fails now, fails the "
                     "comparison (exit 1); where none does but a setup was disturbed, it is "
                     "inconclusive (exit 3).")
    return Table(columns, cells, "llrrrrl", "Before and after", notes)


def _means_apart(changes: list[Change], labels: tuple[str, str]) -> list[str]:
    """Where a ratio of means of per-process means points the other way from the medians the ms
    columns show, a note with the means: the H200's eager+sdpa read 90.3 -> 90.8 ms beside a
    ratio of 0.961, as one before process of 104.8 ms lifted its mean to 95.0."""
    out = []
    for c in changes:
        if c.result is None or c.result.method != "processes" or c.ratio is None:
            continue
        if (c.ratio - 1) * (c.after.step_ms - c.before.step_ms) >= 0:
            continue
        means = [statistics.fmean(r.step_ms for r in row.records if r.ok and r.step_ms)
                 for row in (c.before, c.after)]
        out.append(f"{c.label} on {c.before.gpu}: the ratio is of the means of per-process "
                   f"means, {table.sig(means[0])} ms in {labels[0]} and {table.sig(means[1])} in "
                   f"{labels[1]}, which point the other way from the medians in the ms columns "
                   "(a process far from the others moves the mean).")
    return out


def _step(row: Row) -> str:
    return table.sig(row.step_ms) + marks(row) if row.ok else status_text(row.status)


def _only_table(rows: list[Row], label: str, names: dict[int, str]) -> Table:
    cells = [[r.gpu, names[id(r)], _step(r), table.num(r.tokens_per_s, 0, thousands=True)]
             for r in rows]
    return Table(unit_headers(["GPU", "Setup", "Step (ms)", "Tokens/s"], rows), cells, "llrr",
                 f"Only in {label}",
                 ["Setups of one side that the other did not run (unmatched)."])


def _only_dict(row: Row) -> dict:
    return {"gpu": row.gpu, "setup": row.name, "model": row.model,
            "params": row.setup.params, "batch": row.batch,
            "seq": row.seq, "dtype": row.dtype, "status": row.status, "step_ms": row.step_ms}


def _findings(changes: list[Change], only: list[list[Row]], labels: tuple[str, str],
              fail_above: float | None, failed: list[str],
              unsure: list[str] = ()) -> list[Finding]:
    b, a = labels
    groups = {v: [c for c in changes if c.verdict == v]
              for v in (SLOWER, FASTER, NOISE, UNTESTED, DISTURBED_VERDICT, FAILS_NOW, RUNS_NOW,
                        FAILS_BOTH)}
    total = len(changes)
    parts = []
    for verdict, words in ((SLOWER, "slower outside the noise"),
                           (FASTER, "faster outside the noise")):
        if groups[verdict]:
            parts.append(f"{_count(groups[verdict], total)} {words} ("
                         + _listed([f"{c.label} on {c.before.gpu} by {change(c.ratio, 1.0)[0]}"
                                    for c in groups[verdict]]) + ")")
    for verdict, words in ((NOISE, "within the noise"),
                           (UNTESTED, "untested (too few processes or step times)")):
        if groups[verdict]:
            parts.append(f"{_count(groups[verdict], total)} {words}")
    if groups[DISTURBED_VERDICT]:
        parts.append(f"{_count(groups[DISTURBED_VERDICT], total)} not compared, because "
                     "something outside the step disturbed their timed steps (" + _listed(
                         [f"{c.label} on {c.before.gpu} ({c.disturbed_marks})"
                          for c in groups[DISTURBED_VERDICT]]) + ")")
    for verdict, words in ((FAILS_NOW, "ran before and fail now"),
                           (RUNS_NOW, "fail before and run now"), (FAILS_BOTH, "fail in both")):
        if groups[verdict]:
            parts.append(f"{_count(groups[verdict], total)} {words} ("
                         + _listed([f"{c.label} on {c.before.gpu}: {c.text()}"
                                    for c in groups[verdict]]) + ")")
    text = f"{a} against {b}, setup by setup: " + "; ".join(parts)
    unmatched = [f"{len(side)} setup{'s' if len(side) != 1 else ''} only in {label}"
                 for side, label in zip(only, labels) if side]
    if unmatched:
        text += "; " + " and ".join(unmatched) + " (listed apart)"
    out = [Finding("verdict", text + ".")]
    if fail_above is not None:
        if failed:
            text = f"Fails --fail-above {fail_above:g}: " + _listed(failed, limit=len(failed)) + "."
        elif unsure:
            text = (f"Inconclusive for --fail-above {fail_above:g}: no setup compared is slower "
                    f"by more than {fail_above:g}% outside the noise or fails now, but "
                    + _listed(list(unsure), limit=len(unsure)) + " could not be compared "
                    "(disturbed steps); measure again on a quiet machine.")
        else:
            text = (f"Passes --fail-above {fail_above:g}: no setup is slower by more than "
                    f"{fail_above:g}% outside the noise or fails now.")
        out.append(Finding("fail_above", text))
    methods = {c.result.method for c in changes if c.result}
    if methods:
        out.append(Finding("testing", "Changes were tested " + join(
            [TESTS[m] for m in TESTS if m in methods]) + "."))
    return out


def _count(group: list, total: int) -> str:
    """"2 of 8 setups", "both setups", "all 8 setups", "the one setup"."""
    if len(group) != total:
        return f"{len(group)} of {total} setups"
    return "the one setup" if total == 1 else every(total, "setups")


def _listed(items: list[str], limit: int = 5) -> str:
    """The first `limit` items joined, and how many more."""
    if len(items) <= limit:
        return join(items)
    return ", ".join(items[:limit]) + f" and {len(items) - limit} more"
