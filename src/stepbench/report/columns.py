"""The Results table's columns: each column's cell of a row, the marks after a step time, and
the footnotes that say what each mark and status means and how the rows were combined. The
report and `stepbench run`'s end-of-run table share them (report/document.py).
"""

from __future__ import annotations

import math

from stepbench.errors import first_line
from stepbench.units import TOKENS, common_unit, unit_of
from stepbench.workload.spec import is_factory
from stepbench.report import table
from stepbench.report.marks import (COMPILE_MARK, DEPARTS_MARK, MEMORY_FLAG, MEMORY_MARK,
                                    NOISE_MARKS, mark_notes, noise_marks)
from stepbench.report.rows import Row, setup_labels, status_text


STATUS_NOTES = {
    "oom": "OOM means the step did not fit in {where}.",
    "timeout": "timeout means the setup ran past its time limit and was stopped.",
    "crashed": "crashed means the process died (signal or exit code) without a result.",
    "error": "error means the setup raised an exception other than out-of-memory.",
    "unsupported": "unsupported means the setup cannot run on this machine or software.",
}


def status_note(status: str, rows: list[Row]) -> str:
    """The meaning of `status`; for OOM, which memory the step did not fit in."""
    if status != "oom":
        return STATUS_NOTES[status]
    places = []
    if any(r.setup.memory_limit_gb is not None and r.setup.device == "cuda" for r in rows):
        places.append("its --memory-limit-gb cap")
    if any(r.setup.memory_limit_gb is not None and r.setup.device == "cpu" for r in rows):
        places.append("its --memory-limit-gb cap on allocated memory")
    if any(r.setup.memory_limit_gb is None and r.setup.device == "cuda" for r in rows):
        places.append("the GPU's memory")
    if any(r.setup.memory_limit_gb is None and r.setup.device == "cpu" for r in rows):
        places.append("the machine's memory")
    return STATUS_NOTES["oom"].format(where=" or ".join(places))


# header -> (alignment, cell of a row that ran). Identity columns (IDENTITY) are filled for every
# row; a row that did not run shows its status under Step (ms) and "-" in the rest.
CELLS = {
    "GPU": ("l", lambda row, label: row.gpu),
    "$/hour": ("r", lambda row, label: table.num(row.price_per_hour, 2)),
    "Setup": ("l", lambda row, label: label),
    "Batch": ("r", lambda row, label: str(row.batch)),
    "Seq": ("r", lambda row, label: str(row.seq)),
    "Step (ms)": ("r", lambda row, label: table.sig(row.step_ms) + marks(row)),
    "Tokens/s": ("r", lambda row, label: table.num(row.tokens_per_s, 0, thousands=True)),
    "Peak memory": ("r", lambda row, label: table.gb(row.peak_memory_gb)
                    + (MEMORY_MARK[0] if MEMORY_FLAG in row.noise_flags else "")),
    "First step (s)": ("r", lambda row, label: table.num(row.first_step_s, 1)),
    "M tokens per $": ("r", lambda row, label: table.sig(row.m_tokens_per_dollar, 2)),
}


IDENTITY = ("GPU", "$/hour", "Setup", "Batch", "Seq")


COLUMNS = ["GPU", "$/hour", "Setup", "Step (ms)", "Tokens/s", "Peak memory", "First step (s)",
           "M tokens per $"]


RUN_COLUMNS = ["Setup", "Batch", "Seq", "Step (ms)", "Tokens/s", "Peak memory", "First step (s)"]


def rows_unit(rows: list[Row]) -> str | None:
    """What every row that ran counts (units.common_unit); where nothing ran, what the failed
    records name, else a factory's default, samples; None where rows count several units."""
    ran = [r.units for row in rows for r in row.records if r.ok]
    if ran:
        return common_unit(ran)
    return common_unit(r.units or ("samples" if is_factory(r.setup.model) else None)
                       for row in rows for r in row.records)


def unit_headers(columns: list[str], rows: list[Row]) -> list[str]:
    """The headers, with a user's workload's unit in place of tokens where every row that ran
    counts the same one ("Images/s", "M images per $"); tokens stay tokens, and rows of several
    units say units ("Units/s": a "Tokens/s" header over an image model's rows misnamed them;
    the notes say which unit each model counts)."""
    return unit_columns(columns, rows_unit(rows))


def unit_columns(columns: list[str], unit: str | None) -> list[str]:
    """`columns` with `unit` in place of tokens ("units" for None: several); unchanged for
    tokens."""
    if unit == TOKENS:
        return list(columns)
    unit = unit or "units"
    one = unit[:-1] if unit.endswith("s") else unit        # images: J/image
    names = {"Tokens/s": f"{unit.capitalize()}/s", "M tokens per $": f"M {unit} per $",
             "Tokens/s per GPU": f"{unit.capitalize()}/s per GPU", "J/token": f"J/{one}",
             "M tokens per kWh": f"M {unit} per kWh",
             "$/M tokens (hourly)": f"$/M {unit} (hourly)",
             "$/M tokens (energy)": f"$/M {unit} (energy)"}
    return [names.get(c, c) for c in columns]


def align(columns: list[str]) -> str:
    return "".join(CELLS[c][0] for c in columns)


def table_cells(rows: list[Row], columns: list[str]) -> list[list[str]]:
    """The rows as strings, one cell per column."""
    labels = setup_labels(rows, shown=[c for c in ("Batch", "Seq") if c in columns])
    cells = []
    for row in rows:
        label = labels[id(row)]
        if row.ok:
            cells.append([CELLS[c][1](row, label) for c in columns])
        else:
            cells.append([CELLS[c][1](row, label) if c in IDENTITY
                          else status_text(row.status) if c == "Step (ms)" else "-"
                          for c in columns])
    return cells


def marks(row: Row) -> str:
    """The marks after a row's step time: the loss guard's, noise flags, then what
    torch.compile did."""
    found = [DEPARTS_MARK] if row.departs else []
    found += noise_marks(row.noise_flags)
    if row.compile_marked:
        found.append(COMPILE_MARK[0])
    return "".join(dict.fromkeys(found))


def footnotes(rows: list[Row], explain: bool = True) -> list[str]:
    """What each mark and status means and how rows were combined; with `explain` also what the
    numbers are, prices and failures' messages (the results table's notes; each details table
    carries its own, `details`)."""
    notes = []
    # A user's workload counts its own units: the unit the headers name (unit_headers).
    unit = rows_unit(rows)
    per_dollar = unit_columns(["M tokens per $"], unit)[0]
    if explain:
        if unit == TOKENS:
            rate = "Tokens/s is batch x sequence per step time"
        elif unit is not None:
            rate = f"{unit.capitalize()}/s is the {unit} one step trains per step time"
        else:
            rate = f"Units/s counts each model's own unit per step time: {_units_by_model(rows)}"
        notes.append(f"Step (ms) is the mean of a process's timed steps; {rate}; Peak memory is "
                     "the peak allocated during the timed steps; First step includes "
                     "compilation.")
    if explain and any(r.m_tokens_per_dollar is not None for r in rows):
        notes.append(f'"{per_dollar}" is training {unit or "units"} per dollar of GPU time, in '
                     "millions, at each machine's hourly price.")
    if any(r.setup.distributed for r in rows):
        notes.append(distributed_note(rows, unit))
    labels = setup_labels(rows)
    notes += [f"{DEPARTS_MARK} loss guard: {r.loss_guard.describe(labels[id(r)])}; "
              "do not take its speed as a way to train this model." for r in rows if r.departs]
    if any(r.setup.uses_cudagraphs for r in rows if r.ok):
        notes.append("Under CUDA graphs (compile modes reduce-overhead, max-autotune) Peak memory "
                     "is the peak reserved memory, graph pools included: max_memory_allocated "
                     "does not see a graph replay's memory.")
    if any(r.peak_memory_source == "tensors" for row in rows for r in row.records if r.ok):
        notes.append("On the CPU, Peak memory is the peak of the step's tensors (weights, "
                     "gradients, optimizer state, activations), as torch's profiler counts "
                     "their allocations over one more step after the timed ones.")
    used = sorted({r.status for r in rows if not r.ok} & set(STATUS_NOTES),
                  key=list(STATUS_NOTES).index)
    notes += [status_note(s, [r for r in rows if r.status == s]) for s in used]
    names = _row_names(rows, labels)
    notes += _combined_notes(rows, names)
    notes += mark_notes((r.noise_flags for r in rows),
                        compiled=any(r.compile_marked for r in rows))
    # Each failure's one line: `run`'s table too, where a user's factory that raised says why.
    for row in rows:
        if not row.ok and row.status != "oom" and row.error:
            notes.append(f"{names[id(row)]} {status_text(row.status)}: "
                         f"{_error_line(row)}")
    notes += [f"{names[id(row)]}: its loss was not finite (NaN or inf); the step ran and was "
              "timed, but it trains nothing: check the model, its inputs and the precision"
              for row in rows if row.ok and _loss_not_finite(row)]
    if not explain:
        return notes
    notes += _uncounted_notes(rows, names)
    unknown = sorted({f for r in rows for f in r.noise_flags
                      if f not in NOISE_MARKS and f != MEMORY_FLAG})
    if unknown:
        notes.append("Other noise flags: " + ", ".join(unknown) + " (see the details).")
    missing = sorted({r.gpu_name for r in rows if r.price_per_hour is None})
    if missing:
        notes.append("No price for " + ", ".join(missing) + f": {per_dollar} is left blank.")
    rented = sorted({(r.gpu, r.price_source) for r in rows
                     if r.price_source not in (None, "given")})
    if rented:
        notes.append("Prices of " + ", ".join(f"{gpu} ({source})" for gpu, source in rented)
                     + " are the provider's hourly price of the rented machine, per GPU; "
                     "--price or --prices overrides them.")
    return notes


def _uncounted_notes(rows: list[Row], names: dict[int, str]) -> list[str]:
    """Why a row has no TFLOP/s or MFU, where its records' notes say (a user's factory: a
    distributed job without its single-process count, a search's probe, the counter failed;
    each such note ends "no MFU"): a row missing from the FLOPs table says what to do."""
    found = []
    for row in rows:
        if not row.ok or row.achieved_tflops is not None:
            continue
        said = next((n for r in row.records if r.ok for n in r.notes
                     if n.endswith("no MFU")), None)
        if said:
            found.append(f"{names[id(row)]}: {said}.")
    return found


def _loss_not_finite(row: Row) -> bool:
    return any(loss is not None and not math.isfinite(loss)
               for r in row.records for loss in (r.loss_first, r.loss_last))


def _error_line(row: Row) -> str:
    """An error's line for a note: the first for an `error` (the exception the child caught; the
    stderr tail after it may end in an unrelated warning), else the last (a crash's stderr)."""
    return first_line(row.error, limit=160, last=row.status != "error")


def _row_names(rows: list[Row], labels: dict[int, str]) -> dict[int, str]:
    """"GPU setup-label" per row (`labels`: setup_labels(rows)), for notes: the label names the
    model (or batch, dtype...) where rows differ in it, so that a note points at one row; the
    GPU only where the rows are of more than one (a one-GPU table's title names it)."""
    several = len({r.gpu for r in rows}) > 1
    return {id(r): f"{r.gpu} {labels[id(r)]}" if several else labels[id(r)] for r in rows}


def _combined_notes(rows: list[Row], names: dict[int, str]) -> list[str]:
    notes = []
    by_count: dict[int, list[Row]] = {}
    for row in rows:
        if len(row.repeat_step_ms) > 1:
            by_count.setdefault(len(row.repeat_step_ms), []).append(row)
    for n, group in sorted(by_count.items()):
        which = "every row" if len(group) == len([r for r in rows if r.ok]) else \
            ", ".join(names[id(r)] for r in group)
        notes.append(f"{n} repeats combined ({which}): median of per-process means, max of "
                     "peaks, 95% CI by bootstrap over the per-process means (details).")
    for row in rows:
        if row.runs > 1:
            notes.append(f"{names[id(row)]}: records from {row.runs} runs were combined "
                         "as repeats.")
        bad = {s: n for s, n in row.statuses.items() if s != "ok"}
        if row.ok and bad:
            what = ", ".join(f"{n} {status_text(s)}" for s, n in bad.items())
            notes.append(f"{names[id(row)]}: {what} of {row.repeats} repeats; the numbers "
                         "come from the others.")
    return notes


DISTRIBUTED_NOTE = (
    "A ddp or fsdp2 row is one torchrun job of several processes, one GPU each: Step (ms) is its "
    "slowest rank's mean, Tokens/s counts the global batch (batch x sequence x processes), Peak "
    "memory is the largest of any rank (per GPU), and its cost per token pays for every GPU of "
    "the job.")


def _units_by_model(rows: list[Row]) -> str:
    """"tokens (llama-tiny), pixels (net.py:make)": what each model's rows count."""
    units: dict[str, str] = {}
    for row in rows:
        units.setdefault(row.setup.model, unit_of(*(r.units for r in row.records)))
    return ", ".join(f"{unit} ({model})" for model, unit in units.items())


def distributed_note(rows: list[Row], unit: str | None = None) -> str:
    """DISTRIBUTED_NOTE in a user's workload's own unit where the rows share one (`unit`: the
    rows' rows_unit, where the caller has it), in units where they count several."""
    unit = unit or rows_unit(rows)
    note = DISTRIBUTED_NOTE
    if all(r.setup.device == "cpu" for r in rows if r.setup.distributed):
        # gloo on one machine's CPU: its processes share the CPU and the machine's price.
        note = (note.replace("one GPU each", "sharing the CPU").replace(" (per GPU)", "")
                .replace("pays for every GPU of the job", "pays for the machine"))
    if unit == TOKENS:
        return note
    rate = unit_columns(["Tokens/s"], unit)[0]
    unit = (unit or "units").lower()                 # in a sentence; the header capitalizes it
    return (note.replace("Tokens/s counts the global batch (batch x sequence x processes)",
                         f"{rate} counts the global batch ({unit} per batch x processes)")
            .replace("cost per token", f"cost per million {unit}"))
