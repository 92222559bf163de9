"""Records a search asked for (`run --max-batch`, `tune`): what the report ranks, what it lists.

A probe (`search.role` "probe", of any search) is a short run that decided something, not a
measurement: it stays out of the Results table and the findings and is listed in "Details:
searches", beside each max-batch search's full measurements (a tune's records are listed in the
tune's own table instead, report/tune.py). A max-batch full measurement at a
batch where one ran out of memory (the search then measured the next smaller batch) is an
attempt: listed there too, not ranked. What the max-batch searches found becomes one finding
per compiled setup and its eager twin: how far compile's memory saving lets the batch grow, and
what that buys in tokens/s.
"""

from __future__ import annotations

import dataclasses

from stepbench.errors import first_line
from stepbench.record import Record
from stepbench import stats
from stepbench.report import table
from stepbench.report.findings import Finding, change, compiler
from stepbench.report.layout import Table
from stepbench.report.marks import disturbed_marks
from stepbench.report.rows import Row, status_text

MAX_BATCH = "max_batch"
TUNE = "tune"       # a tune's records are listed in its own table (report/tune.py), not here


def role(record: Record) -> str | None:
    return (record.search or {}).get("role")


def kind(record: Record) -> str | None:
    return (record.search or {}).get("kind")


def _search_key(record: Record) -> tuple:
    """One max-batch search: the setup but its batch and its steps (a probe runs fewer than the
    full measurement), where it ran, where it started."""
    setup = dataclasses.replace(record.setup, batch=1, warmup=0, steps=0)
    return (setup.key(), record.machine.name, record.host,
            (record.search or {}).get("start_batch"))


def _attempts(records: list[Record]) -> set[tuple]:
    """(search, batch) of max-batch full measurements that ran out of memory."""
    return {(_search_key(r), r.setup.batch) for r in records
            if kind(r) == MAX_BATCH and role(r) == "final" and r.status == "oom"}


def split(records: list[Record]) -> tuple[list[Record], list[Record]]:
    """(records to rank, records only listed): probes and max-batch attempts are only listed."""
    attempts = _attempts(records)
    listed = [r for r in records if role(r) == "probe"
              or (kind(r) == MAX_BATCH and (_search_key(r), r.setup.batch) in attempts)]
    ids = {id(r) for r in listed}
    return [r for r in records if id(r) not in ids], listed


def shown(records: list[Record]) -> list[Record]:
    """The records of "Details: searches": every probe but a tune's, and the max-batch full
    measurements, grouped by search in order of appearance."""
    picked = [r for r in records if kind(r) != TUNE and (
        role(r) == "probe" or kind(r) == MAX_BATCH and role(r) == "final")]
    order: dict[tuple, int] = {}
    for r in picked:
        order.setdefault((kind(r), _search_key(r)), len(order))
    return sorted(picked, key=lambda r: order[(kind(r), _search_key(r))])


def _role_text(record: Record, attempts: set[tuple]) -> str:
    search = record.search or {}
    name = f"{search.get('kind', '?')} {search.get('role', '?')}"
    if search.get("step"):
        name += f" ({search['step']})"
    if role(record) == "final" and (_search_key(record), record.setup.batch) in attempts:
        name = f"{search.get('kind')} attempt"
    return name


COLUMNS = ["GPU", "Setup", "Search", "Batch", "Seq", "Steps", "Status", "Peak memory",
           "Peak reserved", "Step (ms)"]


def details_table(records: list[Record]):
    """"Details: searches", or None when no record came from a search."""
    listed = shown(records)
    if not listed:
        return None
    attempts = _attempts(records)
    cells = []
    for r in listed:
        ran = r.status == "ok"
        cells.append([r.machine.name, r.setup.name, _role_text(r, attempts), str(r.setup.batch),
                      str(r.setup.seq), f"{r.setup.warmup}+{r.setup.steps}", status_text(r.status),
                      table.gb(r.peak_memory_gb) if ran else "-",
                      table.gb(r.peak_reserved_gb) if ran else "-",
                      table.sig(r.step_ms) if ran else "-"])
    notes = ["Probes are the short runs a search decided by (Steps: warm-up + timed), not "
             "measurements: the Results table and the findings leave them out. A max-batch probe "
             "fits when it ran; on a GPU only when its peak reserved memory also left the margin "
             "free. An attempt is a full measurement that ran out of memory, after which the "
             "search measured the next smaller batch that fit."]
    notes += [summary(r) for r in _last_finals(listed)]
    notes += [_unfinished(r) for r in _last_probes_without_final(listed)]
    if not any(r.setup.has_seq for r in listed):      # a user's model without seq_len
        at = COLUMNS.index("Seq")
        return Table(COLUMNS[:at] + COLUMNS[at + 1:], [c[:at] + c[at + 1:] for c in cells],
                     "lllrrlrrr", "Details: searches", notes)
    return Table(COLUMNS, cells, "lllrrrlrrr", "Details: searches", notes)


def _last_probes_without_final(records: list[Record]) -> list[Record]:
    """The last probe of each max-batch search that has no full measurement: it stopped."""
    finished = {_search_key(r) for r in records if kind(r) == MAX_BATCH and role(r) == "final"}
    last: dict[tuple, Record] = {}
    for r in records:
        if kind(r) == MAX_BATCH and role(r) == "probe" and _search_key(r) not in finished:
            last[_search_key(r)] = r
    return list(last.values())


def _unfinished(probe: Record) -> str:
    """Why a max-batch search measured nothing, from its last probe."""
    where = f"{probe.machine.name} {probe.setup.name}{probe.setup.at_seq}"
    if probe.status == "oom" and (probe.setup.batch == 1 or probe.phase == "starting"):
        return f"{where}: nothing fit, down to batch {probe.setup.batch}; no full measurement."
    if probe.status in ("ok", "oom"):
        return (f"{where}: the search was stopped before its full measurement; run the same "
                "command again to resume it.")
    line = first_line(probe.error, limit=160)
    why = f" ({line})" if line else ""
    return (f"{where}: the search stopped when its probe at batch {probe.setup.batch} ended "
            f"{status_text(probe.status)}{why}; no full measurement.")


def _last_finals(records: list[Record]) -> list[Record]:
    """The last max-batch full measurement of each search (its tag holds the search's story)."""
    last: dict[tuple, Record] = {}
    for r in records:
        if kind(r) == MAX_BATCH and role(r) == "final":
            last[_search_key(r)] = r
    return list(last.values())


def summary(record: Record) -> str:
    """One max-batch search in a line, from its last full measurement's tag."""
    tag = record.search or {}
    found = [f"largest seen to fit {tag.get('largest_fit')}"]
    if tag.get("smallest_oom") is not None:
        found.append(f"smallest out of memory {tag['smallest_oom']}")
    text = (f"{record.machine.name} {record.setup.name}{record.setup.at_seq}: batch "
            f"{tag.get('start_batch')} grew to {tag.get('chosen')} ({', '.join(found)}")
    if tag.get("margin") is not None and tag.get("capacity_gb"):
        text += f"; chosen to leave {tag['margin']:.0%} of {tag['capacity_gb']:g} GB free"
    text += ")"
    if tag.get("stepped_down_from"):
        text += (f"; the full measurement ran out of memory at "
                 f"{', '.join(map(str, tag['stepped_down_from']))} first")
    if record.status != "ok":
        text += f"; the full measurement ended {status_text(record.status)}"
    return text + "."


def search_dicts(records: list[Record]) -> list[dict]:
    """"Details: searches" for JSON and CSV: one object per record, numbers unformatted."""
    attempts = _attempts(records)
    return [{"gpu": r.machine.name, "host": r.host, "setup": r.setup.name,
             "search": _role_text(r, attempts), "mode": r.setup.mode, "attn": r.setup.attn,
             "compile_mode": r.setup.compile_mode, "model": r.setup.model,
             "model_label": r.setup.model_label, "params": r.setup.params,
             "batch": r.setup.batch, "seq": r.setup.seq, "dtype": r.setup.dtype,
             "warmup": r.setup.warmup, "steps": r.setup.steps, "status": r.status,
             "step_ms": r.step_ms, "tokens_per_s": r.tokens_per_s,
             "peak_memory_gb": r.peak_memory_gb, "peak_reserved_gb": r.peak_reserved_gb,
             "first_step_s": r.first_step_s, "tag": r.search}
            for r in shown(records)]


# ---------------------------------------------------------------- findings

def _final_tag(row: Row) -> dict | None:
    return next((r.search for r in row.records
                 if kind(r) == MAX_BATCH and role(r) == "final"), None)


def max_batch_findings(rows: list[Row]) -> list[tuple[str | None, list[Finding]]]:
    """Per compiled setup whose max-batch search and its eager twin's both measured: how far
    each batch grew, and the compiled setup's tokens/s against eager's at its own largest batch
    (and against eager at the start batch, where the report has that row)."""
    finals = {id(r): _final_tag(r) for r in rows if r.ok and not r.departs}
    finals = {k: v for k, v in finals.items() if v}
    by_id = {id(r): r for r in rows}
    groups: dict[str, list[Finding]] = {}
    for comp in (by_id[i] for i in finals):
        if comp.mode != "compile":
            continue
        start = finals[id(comp)].get("start_batch")
        twin = dataclasses.replace(comp.setup.eager_twin(), batch=1).key()
        eager = next((by_id[i] for i, tag in finals.items() if by_id[i].gpu == comp.gpu
                      and tag.get("start_batch") == start
                      and dataclasses.replace(by_id[i].setup, batch=1).key() == twin), None)
        if eager is None:
            continue
        base_key = dataclasses.replace(comp.setup.eager_twin(), batch=start).key()
        base = next((r for r in rows if r.ok and not r.departs and r.gpu == comp.gpu
                     and r.setup.key() == base_key and r is not eager), None)
        heading = f"{comp.model}, largest batch{comp.setup.at_seq}, {comp.dtype}"
        groups.setdefault(heading, []).append(_finding(comp, eager, base, start))
    return list(groups.items())


def _finding(comp: Row, eager: Row, base: Row | None, start: int) -> Finding:
    name = compiler(comp.compile_mode)
    if comp.batch > eager.batch:
        grew = f"lets batch {start} grow to {comp.batch} (eager: {eager.batch})"
    elif comp.batch == eager.batch:
        grew = f"lets batch {start} grow to {comp.batch}, as far as eager"
    else:
        grew = f"lets batch {start} grow only to {comp.batch} (eager: {eager.batch})"
    text = (f"On {comp.gpu}, with {comp.attn} attention: {name} {grew} and "
            f"{_gain(comp, eager, 'eager at its own largest batch')}")
    if base is not None:
        text += f" (and {_gain(comp, base, f'eager at batch {start}', short=True)})"
    return Finding(MAX_BATCH, text + ".")


def _gain(new: Row, old: Row, against: str, short: bool = False) -> str:
    """"raises tokens/s by 18% over X" (short: "18% over X"), "reaches 2.1x the tokens/s of X",
    "runs 5% slower per token than X" (X's tokens/s are 5% more), or within the noise of X;
    "not compared with X" where either row's steps were disturbed (noise.DISTURBED: no claim
    rests on such a row)."""
    marks = disturbed_marks(new, old)
    if marks:
        return (f"not compared with {against} ({marks}: disturbed steps)" if short
                else f"is not compared with {against}: a side's timed steps were disturbed "
                     f"({marks})")
    result = compare_throughput(new, old)
    if result is not None and result.significant is False:
        return (f"within the noise of {against}, p = {result.p_value:.2f}" if short else
                f"runs at tokens/s within the noise of {against} (p = {result.p_value:.2f})")
    # findings.change words it: the size is the faster's rate over the slower's either way.
    size, direction = change(old.tokens_per_s, new.tokens_per_s)
    if direction == "same":
        return f"the tokens/s of {against}" if short else f"runs at the tokens/s of {against}"
    if direction == "faster" and size.endswith("x"):
        return (f"{size} the tokens/s of {against}" if short
                else f"reaches {size} the tokens/s of {against}")
    if direction == "faster":
        return f"{size} over {against}" if short else f"raises tokens/s by {size} over {against}"
    return f"{size} slower than {against}" if short else f"runs {size} slower per token than {against}"


def compare_throughput(a: Row, b: Row) -> stats.Comparison | None:
    """Test a's time per token against b's (their batches differ): Row.compare, per token."""
    return a.compare(b, per_token=True)
