"""What the numbers say: sentences built only from the report's rows.

Each finding function takes the rows of one workload (model, batch x seq, dtype) and returns
zero or more findings; a finding with no data behind it is left out, never invented. Every
"faster" or "slower" between two setups is checked against the spread of their step times
(stats.compare): when the difference cannot be told apart from noise the sentence says so, and
when no spread was recorded it states the direction and the last finding says it was untested.
No finding rests on a row whose timed steps were disturbed (noise.DISTURBED: other processes
on a busy CPU or on the GPU, throttling, recompilation): a comparison with it is not stated and
rankings leave it out (words.told, words.steady), and `untested` names both; peak memory is not
compared when both sides' processes disagreed on it.

A rule tags what its finding says (e.g. "noise": a comparison could not be told from noise), so
that `key_findings` can choose the few a reader should see first without parsing sentences.
"""

from __future__ import annotations

from stepbench.report.findings.caveats import (TESTS, loss_guard, loss_guard_agreed,
                                               loss_guard_random, software, testing, untested)
from stepbench.report.findings.compiling import (compile_cost, compile_memory, compile_payback,
                                                 compile_speed, fit)
from stepbench.report.findings.speed import (attention_speed, attention_vs_compile, energy,
                                             fastest_setup, gpus, host_bound, mfu, scaling)
from stepbench.report.findings.words import (ACROSS_GPUS, BIG_RATIO, FITS_ONLY_COMPILED, NOISE,
                                             WRONG_LOSS, Finding, change, compiler, every, join,
                                             slower_pct)
from stepbench.report.rows import LABEL_PARTS, Row
from stepbench.setup import Setup

# The rules live by subject: compiling.py (what torch.compile did), speed.py (which setup and
# GPU are fastest), caveats.py (what to trust); words.py holds what they share.


def findings_for(rows: list[Row]) -> list[tuple[str | None, list[Finding]]]:
    """The findings per workload, as (heading, findings); the heading names the workload (model,
    batch x seq, dtype and any other setting that differs), None when there is only one."""
    out = []
    groups: dict[Setup, list[Row]] = {}
    for row in rows:
        groups.setdefault(row.workload, []).append(row)
    for workload, (heading, _) in _workload_names(rows).items():
        group = groups[workload]
        found = [f for rule in RULES for f in rule(group)]
        if found:
            out.append((heading, found))
    return out


# What a reader should see first, in this order: (kind, tag it must carry or None). The fastest
# GPU and the most tokens per dollar answer "where should I run it"; a setup that fits only when
# compiled changes what can run at all; a comparison within the noise warns against a
# difference the table seems to show. compile_payback's "not measurably" repeats compile_speed's.
# A comparison across GPUs comes with its caveat when they ran different software. max_batch
# (report/searches.py) says what compile's memory saving buys at the largest batch that fits.
LEAD = [("loss_guard", WRONG_LOSS), ("fastest_setup", None),
        ("scaling", None), ("fastest_gpu", None), ("software", None),
        ("tokens_per_dollar", ACROSS_GPUS), ("fit", FITS_ONLY_COMPILED), ("max_batch", None),
        ("compile_speed", NOISE), ("attention_vs_compile", NOISE), ("attention_speed", NOISE),
        ("untested", None)]


LEAD_MAX = 5     # a lead longer than this is a second list of findings, not a summary


def key_findings(rows: list[Row], groups: list[tuple[str | None, list[Finding]]],
                 limit: int = LEAD_MAX) -> list[tuple[str | None, Finding]]:
    """The few findings of `groups` (findings_for's) to show first, as (workload, finding): the
    workload is its shortest name (e.g. the model's label) when there are several, else None.
    The same Finding objects as in `groups`: each keeps its place there too; a finding that
    names its workload itself ("Scaling over ddp x2: ...") comes without it."""
    short = {heading: name for heading, name in _workload_names(rows).values()}
    out = []
    for kind, tag in LEAD:
        for heading, findings in groups:
            name = short.get(heading)
            out += [(None if name and name in f.text else name, f) for f in findings
                    if f.kind == kind and (tag is None or tag in f.tags)]
    return out[:limit]


def _workload_names(rows: list[Row]) -> dict[Setup, tuple[str | None, str | None]]:
    """{workload: (heading, short name)}: the heading names model, batch x seq, dtype and any
    other setting that differs; the short name only what differs between the workloads (e.g.
    the model's label). Both None when there is only one workload."""
    workloads = list(dict.fromkeys(r.workload for r in rows))
    if len(workloads) < 2:
        return {w: (None, None) for w in workloads}
    parts = {"model": lambda w: w.model_label, "batch": lambda w: f"batch {w.shape}",
             "dtype": lambda w: w.dtype}
    parts.update({name: p for name, p in LABEL_PARTS.items() if name not in parts})
    always = ("model", "batch", "dtype")
    varying = [name for name, p in parts.items() if len({p(w) for w in workloads}) > 1]
    return {w: (", ".join(parts[n](w) for n in parts if n in always or n in varying),
                ", ".join(parts[n](w) for n in varying)) for w in workloads}


RULES = [loss_guard, loss_guard_random, software, fastest_setup, scaling, compile_speed,
         compile_memory, compile_cost, compile_payback, fit, attention_speed, attention_vs_compile, gpus,
         untested, loss_guard_agreed, mfu, host_bound, energy, testing]


__all__ = ["ACROSS_GPUS", "BIG_RATIO", "FITS_ONLY_COMPILED", "LEAD", "LEAD_MAX", "NOISE", "RULES",
           "TESTS", "WRONG_LOSS", "Finding", "change", "compiler", "every", "findings_for", "join",
           "key_findings", "slower_pct"]
