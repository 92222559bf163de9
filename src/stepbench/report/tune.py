"""A tune as a Document: the table of what it tried and its verdict.

`stepbench tune` prints `tune_document` in every format but json (which stays the TuneResult
object, a documented output), and `stepbench report` shows the same table for each tune in its
files, read back from the records' `search` tags (`tune_tables`): one table builder, so that the
tune's own output and the report of its results file list the same measurements alike.
"""

from __future__ import annotations

import dataclasses

from stepbench import stats
from stepbench.guard import loss_verdicts
from stepbench.record import Record
from stepbench.report import searches, table
from stepbench.report.columns import unit_columns
from stepbench.report.findings import change
from stepbench.report.layout import Document, Table
from stepbench.report.marks import disturbed_marks, mark_notes, noise_marks
from stepbench.search.gains import source_kind
from stepbench.search.tune.results import TuneResult, label, stage_of
from stepbench.setup import Setup
from stepbench.units import TOKENS, common_unit, duration, unit_of

COLUMNS = ["Stage", "Setup", "Batch", "Precision", "Status", "Tokens/s", "Step (ms)",
           "Peak memory", "First step (s)", "Loss guard"]
ALIGN = "llrllrrrrl"
# (stage, record): what a tune used, in the order it used it. The stage is one of
# search.tune.results.STAGES (an earlier tune's: screen, batch, option, reference, final reference or
# final).
Entry = tuple[str, Record]


# ---------------------------------------------------------------- the table

def stage_text(stage: str, record: Record) -> str:
    """"final #2" for a finalist's second process; another stage as it is."""
    return f"{stage} #{record.repeat + 1}" if stage == "final" else stage


def tried_table(entries: list[Entry], title: str | None = None) -> Table:
    """What a tune tried, one row per measurement, with the loss guard's verdict over them all
    and the noise marks after the step time."""
    verdicts = loss_verdicts([r for _, r in entries])
    cells = []
    for stage, r in entries:
        verdict = verdicts.get((r.setup.key(), r.machine.gpu))
        name = r.setup.name + (f" ({r.setup.params})" if r.setup.params else "")
        cells.append([stage_text(stage, r), name, str(r.setup.batch), r.setup.dtype,
                      r.status, table.num(r.tokens_per_s, 0, thousands=True) if r.ok else "-",
                      table.sig(r.step_ms) + "".join(noise_marks(r.noise_flags)) if r.ok else "-",
                      table.gb(r.peak_memory_gb),
                      f"{r.first_step_s:.1f}" if r.first_step_s is not None else "-",
                      verdict.status if verdict else "-"])
    notes = mark_notes(r.noise_flags for _, r in entries if r.ok)
    # A user's workload's own unit where every measurement counts the same one.
    columns = unit_columns(COLUMNS, common_unit(r.units for _, r in entries if r.ok))
    return Table(columns, cells, ALIGN, title, notes)


def tried_dicts(entries: list[Entry]) -> list[dict]:
    """The table's measurements with unformatted numbers, for JSON and CSV (`search`: the
    stage as CSV tells a search's records apart)."""
    verdicts = loss_verdicts([r for _, r in entries])
    out = []
    for stage, r in entries:
        verdict = verdicts.get((r.setup.key(), r.machine.gpu))
        out.append({"gpu": r.machine.name, "host": r.host, "setup": r.setup.name,
                    "search": f"{searches.TUNE} {stage_text(stage, r)}", "stage": stage,
                    "repeat": r.repeat, "mode": r.setup.mode, "attn": r.setup.attn,
                    "compile_mode": r.setup.compile_mode, "model": r.setup.model,
                    "params": r.setup.params,
                    "batch": r.setup.batch, "seq": r.setup.seq, "dtype": r.setup.dtype,
                    "warmup": r.setup.warmup, "steps": r.setup.steps, "status": r.status,
                    "step_ms": r.step_ms, "tokens_per_s": r.tokens_per_s,
                    "peak_memory_gb": r.peak_memory_gb, "peak_reserved_gb": r.peak_reserved_gb,
                    "first_step_s": r.first_step_s, "noise_flags": list(r.noise_flags),
                    "loss_guard": verdict.status if verdict else None,
                    "loss_guard_reference": verdict.reference if verdict else None,
                    "loss_guard_rel_diff": verdict.max_rel_diff if verdict else None})
    return out


# ---------------------------------------------------------------- tune's own output

def tune_document(result: TuneResult) -> Document:
    """`stepbench tune`'s output: the "Tried" table, then the verdict as its notes (the
    noise marks' footnotes first), in the order a reader checks them: the winner, the
    runner-up, the ratios to the plain setups, the command that measures the winner again,
    the reference ladder, what was not tried, the budget; then the gains the tune went by."""
    entries = [(t.stage, t.record) for t in result.tried]
    tried = tried_table(entries)
    tried.notes += verdict(result)
    first = entries[0][1] if entries else None
    tunes = [tune_dict(first, entries)] if first is not None else []
    tables = [tried] + ([gains_table(result.gains, result_unit(result))] if result.gains else [])
    return Document("Tried", tables, tunes=tunes)


def verdict(result: TuneResult) -> list[str]:
    """The verdict in sentences."""
    out = []
    winner, second = result.winner, result.runner_up
    if result.stopped:
        out.append("Stopped before the tune chose: no winner yet; the same command resumes from "
                   "these measurements.")
    elif winner is None:
        out.append("No setup ran without failing or departing from the reference's losses; "
                   "see the table." if result.tried else
                   "Nothing was measured; see below why.")
    else:
        out += _winner(result)
        if result.disturbed:
            out.append(f"Chosen from disturbed measurements: every process of "
                       f"{' and '.join(result.disturbed)} ran while something outside the step "
                       "(another process, throttling, a recompile: the marks above) took from "
                       "its timed steps, measured again up to the tune's processes; measure "
                       "again on a quiet machine before relying on the choice.")
        if result.unchecked:
            out.append(f"Its losses were not checked: {' and '.join(result.unchecked)}'s step "
                       "draws random numbers (dropout), which compiled code draws apart from "
                       "eager, so the loss guard compares none of them; set the dropout to 0 "
                       "(a --param) and measure it again to have them checked.")
        if second is not None:
            marks = disturbed_marks(winner, second)
            out.append(f"Runner-up: {label(second.setup)}: {second.tokens_per_s:,.0f} "
                       f"{unit_of(second.units)}/s"
                       + (f"; not compared with the winner: a side's timed steps were "
                          f"disturbed ({marks})" if marks else versus(result.comparison))
                       + ".")
        out += _ratios(result)
        out.append(f"Reproduce: {result.command}")
    if result.ladder and result.ladder.get("batches"):
        out.append(ladder_text(result.ladder, result_unit(result)))
    out += [f"{h['reason']}." for h in result.host_bound]
    out += result.skipped
    out.append(f"Budget {duration(result.budget_s, exact=True)}, spent "
               f"{duration(result.spent_s, exact=True)}; {len(result.tried)} measurement"
               f"{'' if len(result.tried) == 1 else 's'}"
               + (f"; {result.ended}." if result.ended else "."))
    return out


def result_unit(result: TuneResult) -> str:
    """What the tune's throughput counts: the records' own unit ("images"), else tokens."""
    return unit_of(*(t.record.units for t in result.tried))


def ladder_text(ladder: dict, unit: str = TOKENS) -> str:
    """The reference ladder in a sentence, counting `unit`."""
    rungs = ", ".join(f"{b} ({t:,} {unit}/s)" for b, t in zip(ladder["batches"],
                                                             ladder["tokens_per_s"]))
    # One batch element: a sequence of tokens, else one of the workload's samples.
    element = "sequence" if unit == TOKENS else "sample"
    memory = (f"; about {ladder['gb_per_sequence']:.2g} GB a {element}"
              if ladder.get("gb_per_sequence") else "")
    return (f"Reference ladder (the loss guard's eager reference, measured in full) at batch "
            f"{rungs}: saturates at batch {ladder['saturating_batch']}, where it stopped "
            f"because {ladder['stopped']}{memory}.")


GAINS_NOTE = ("What each change was taken to multiply {unit}/s by, from the smallest to the "
              "largest ratio observed (this machine's records where they held one, else "
              "committed H200 results; the tune's JSON lists every observation and its file): "
              "a candidate whose largest gain could not beat the best so far was not measured.")


FOREIGN_NOTE = ("A gain measured on another machine class or on other models (\"orders "
                "only\") ordered the "
                "candidates and skipped none: measurements on this machine decide.")


def gains_table(gains: list[dict], unit: str = TOKENS) -> Table:
    """The gains the tune chose and pruned candidates by, each with where it came from; a
    gain of another machine class (`may_skip` false: an older tune's JSON lacks the key) is
    marked as one that only ordered the candidates."""
    cells = [[g["kind"], f"{g['smallest']:.2f}x", f"{g['largest']:.2f}x",
              source_kind(g["source"]) + ("" if g.get("may_skip", True) else
                                          f", {g.get('elsewhere', 'another machine')}: orders "
                                          "only")] for g in gains]
    foreign = any(not g.get("may_skip", True) for g in gains)
    notes = [GAINS_NOTE.format(unit=unit)] + ([FOREIGN_NOTE] if foreign else [])
    return Table(["Change", "Smallest", "Largest", "From"], cells, "lrrl",
                 "Gains the tune went by", notes)


def _winner(result: TuneResult) -> list[str]:
    winner = result.winner
    how = ("measured in full" if result.measured_in_full
           else "from a short probe only: the budget left no time to measure it in full")
    out = [f"Winner: {label(winner.setup)}: {winner.tokens_per_s:,.0f} "
           f"{unit_of(winner.units)}/s, "
           f"{winner.step_ms:.1f} ms/step, peak {peak(winner)} ({how})."]
    if winner.setup.dtype == "float8":
        out.append("The winner trains its linear layers in float8: compare its tokens/s with "
                   "bf16 setups knowing that, and its MFU is taken against the bf16 peak.")
    return out


def _ratios(result: TuneResult) -> list[str]:
    """The winner against the loss guard's reference measured in full at its batch, and
    against the plainest setup at the start batch (the ladder's first rung; an earlier tune's
    short probe of it): a ratio where the test on their steps tells them apart, "within the
    noise" where it does not."""
    out = []
    winner, ref = result.winner, result.reference
    if ref is not None and ref.ok and ref.setup.key() != winner.setup.key():
        out.append(f"Measured in full at batch {winner.setup.batch}, the winner "
                   f"{_against(result, winner, ref)} {label(ref.setup)}, the loss guard's "
                   f"reference ({winner.tokens_per_s:,.0f} against {ref.tokens_per_s:,.0f}).")
    first = next((t.record for t in result.tried if t.stage == "ladder"), None)
    if first is not None and first.ok and first.setup.key() not in (
            winner.setup.key(), ref.setup.key() if ref is not None else None):
        out.append(f"It {_against(result, winner, first)} {label(first.setup)}, the "
                   f"plainest setup at the start batch ({winner.tokens_per_s:,.0f} against "
                   f"{first.tokens_per_s:,.0f}).")
    plain, probe = plainest(result), probe_of(result, winner.setup)
    if plain is not None and probe is not None and plain.ok and probe is not plain:
        out.append(f"In the short probes the winner {_against(result, probe, plain)} "
                   f"{label(plain.setup)}, the plainest setup "
                   f"({probe.tokens_per_s:,.0f} against {plain.tokens_per_s:,.0f}).")
    return out


def _against(result: TuneResult, a: Record, b: Record) -> str:
    """"ran at 1.95x the tokens/s of" b, "ran at the tokens/s, within the noise (p = 0.31),
    of" where the report's test on their processes (or steps) cannot tell them apart, or "was
    not compared (...) with" where either side's steps were disturbed."""
    def runs(record):
        return [t.record for t in result.tried if t.record.setup == record.setup] or [record]

    marks = disturbed_marks(a, b)
    if marks:   # no claim rests on a disturbed row (report/marks.py DISTURBED)
        return f"was not compared (a side's timed steps were disturbed, {marks}) with"
    test = stats.compare_records(runs(a), runs(b), per_token=True)
    if test is not None and test.significant is False:
        return f"ran at the {result_unit(result)}/s, within the noise (p = {test.p_value:.2f}), of"
    return f"ran at {a.tokens_per_s / b.tokens_per_s:.2f}x the {result_unit(result)}/s of"


def peak(record: Record) -> str:
    """As the tables print it (table.gb): a CPU tune's 0.03 GB, not "0.0 GB"."""
    return table.gb(record.peak_memory_gb) if record.peak_memory_gb is not None else "unknown"


def versus(comparison: dict | None) -> str:
    """The winner against the runner-up, worded as the report words a comparison
    (findings.change): a difference only where the test finds one."""
    if comparison is None or comparison["significant"] is None:
        return " (too few steps or processes to test the difference)"
    if comparison["significant"]:
        size, direction = change(comparison["ratio"], 1.0)
        return f"; the winner is {size} {direction} (p = {comparison['p_value']:.2g})"
    return f"; equally fast within the noise (p = {comparison['p_value']:.2f})"


def plainest(result: TuneResult) -> Record | None:
    """Eager mode with sdpa at the start batch: the plainest way to run the step."""
    for t in result.tried:
        s = t.record.setup
        if t.stage == "screen" and s.mode == "eager" and s.attn == "sdpa":
            return t.record
    return None


def probe_of(result: TuneResult, setup: Setup) -> Record | None:
    """The probe of `setup` (any step counts): how it did under the probes' protocol."""
    same = dataclasses.replace(setup, warmup=0, steps=1)
    for t in result.tried:
        if t.stage != "final" and \
                dataclasses.replace(t.record.setup, warmup=0, steps=1) == same:
            return t.record
    return None


# ---------------------------------------------------------------- tunes in a report

def is_tune(record: Record) -> bool:
    return searches.kind(record) == searches.TUNE


def tune_key(record: Record) -> tuple:
    """What identifies one tune: the model, sequence length and device it searched, and the
    machine it ran on (a resumed tune is the same tune)."""
    s = record.setup
    return (s.model, s.seq, s.device, record.machine.name, record.host)


def tunes(records: list[Record]) -> list[list[Entry]]:
    """The records of each tune in `records`, in the order they were measured."""
    found: dict[tuple, list[Entry]] = {}
    for r in records:
        if is_tune(r):
            found.setdefault(tune_key(r), []).append((stage_of(r), r))
    return list(found.values())


def tune_tables(records: list[Record]) -> list[Table]:
    """A "Tune" table per tune in `records` (every probe, reference and final it stored)."""
    out = []
    for entries in tunes(records):
        t = tried_table(entries, title=f"Tune: {_where(entries[0][1])}")
        t.notes.insert(0, TUNE_NOTE)
        out.append(t)
    return out


TUNE_NOTE = ("Every measurement the tune stored, in the order it ran them, with the stage that "
             "asked for it; those measured in full (all but an earlier tune's short probes) are "
             "ranked in the Results table too. Loss guard: the guard's verdict among this "
             "tune's records.")


def tune_dicts(records: list[Record]) -> list[dict]:
    """Each tune in `records` for JSON and CSV."""
    return [tune_dict(entries[0][1], entries) for entries in tunes(records)]


def tune_dict(head: Record, entries: list[Entry]) -> dict:
    return {"model": head.setup.model, "model_label": head.setup.model_label,
            "seq": head.setup.seq, "device": head.setup.device, "gpu": head.machine.name,
            "host": head.host, "tried": tried_dicts(entries)}


def _where(record: Record) -> str:
    where = record.machine.gpu if record.machine.gpu != "cpu" else "the CPU"
    host = f" at {record.host}" if record.host else ""
    return f"{record.setup.model_label}{record.setup.at_seq} on {where}{host}"
