"""What the numbers say: sentences built only from the report's rows.

Each finding function takes the rows of one workload (model, batch x seq, dtype) and returns
zero or more findings; a finding with no data behind it is left out, never invented. Every
"faster" or "slower" between two setups is checked against the spread of their step times
(stats.compare): when the difference cannot be told apart from noise the sentence says so, and
when no spread was recorded it states the direction and the last finding says it was untested.
A comparison of two setups whose timed steps were both disturbed (marks.DISTURBED: other
processes on a busy CPU or on the GPU, throttling, recompilation) is not stated at all: a test on
their steps measures their spread, not what disturbed both, so `untested` lists it instead; the
same for peak memory when both sides' processes disagreed on it.

A rule tags what its finding says (e.g. "noise": a comparison could not be told from noise), so
that `key_findings` can choose the few a reader should see first without parsing sentences.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from itertools import combinations, permutations

from stepbench import stats
from stepbench.guard import OK
from stepbench.report.marks import DISTURBED, MEMORY_FLAG, NOISE_MARKS, disturbed
from stepbench.report.rows import LABEL_PARTS, Row, eager_twins
from stepbench.report.table import sig
from stepbench.setup import Setup
from stepbench.units import duration, percent

BIG_RATIO = 1.5   # from here on a difference reads better as "2.6x" than as "160%"


# Tags a rule may give its finding (what its content says, for `key_findings`).
NOISE = "noise"                              # a comparison in it was within the noise
FITS_ONLY_COMPILED = "fits_only_compiled"    # a setup fit in memory only with torch.compile
WRONG_LOSS = "wrong_loss"                    # a setup's losses left its reference's tolerance
ACROSS_GPUS = "across_gpus"                  # compares GPUs (on one GPU the fastest setup is
                                             # also the cheapest: said once, by fastest_setup)


@dataclass(frozen=True)
class Finding:
    kind: str   # which rule wrote it: compile_speed, compile_memory, ... (stable, for tools)
    text: str
    tags: frozenset[str] = field(default=frozenset(), compare=False)


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
    The same Finding objects as in `groups`: each keeps its place there too."""
    short = {heading: name for heading, name in _workload_names(rows).values()}
    out = []
    for kind, tag in LEAD:
        for heading, findings in groups:
            out += [(short.get(heading), f) for f in findings
                    if f.kind == kind and (tag is None or tag in f.tags)]
    return out[:limit]


def _workload_names(rows: list[Row]) -> dict[Setup, tuple[str | None, str | None]]:
    """{workload: (heading, short name)}: the heading names model, batch x seq, dtype and any
    other setting that differs; the short name only what differs between the workloads (e.g.
    the model's label). Both None when there is only one workload."""
    workloads = list(dict.fromkeys(r.workload for r in rows))
    if len(workloads) < 2:
        return {w: (None, None) for w in workloads}
    parts = {"model": lambda w: w.model_label, "batch": lambda w: f"batch {w.batch} x {w.seq}",
             "dtype": lambda w: w.dtype}
    parts.update({name: p for name, p in LABEL_PARTS.items() if name not in parts})
    always = ("model", "batch", "dtype")
    varying = [name for name, p in parts.items() if len({p(w) for w in workloads}) > 1]
    return {w: (", ".join(parts[n](w) for n in parts if n in always or n in varying),
                ", ".join(parts[n](w) for n in varying)) for w in workloads}


# ---------------------------------------------------------------- helpers

def compare_rows(a: Row, b: Row) -> stats.Comparison | None:
    """Test a's step times against b's (Row.compare); None when nothing can be tested."""
    return a.compare(b)


def told(a: Row, b: Row) -> bool:
    """Whether a comparison of a's and b's step times is stated: not when both rows' steps
    were disturbed (`untested` lists those)."""
    return not (disturbed(a.noise_flags) and disturbed(b.noise_flags))


def memory_told(a: Row, b: Row) -> bool:
    """The same for peak memory: not when both rows' processes disagreed on it."""
    return not (MEMORY_FLAG in a.noise_flags and MEMORY_FLAG in b.noise_flags)


def change(new_ms: float, old_ms: float) -> tuple[str, str]:
    """(size, direction) of a step-time change: ("10%", "slower"), ("2.6x", "faster"), ("", "same").

    Percentages are the change in step time relative to `old_ms`.
    """
    ratio = new_ms / old_ms
    if ratio >= BIG_RATIO:
        return f"{ratio:.1f}x", "slower"
    if ratio <= 1 / BIG_RATIO:
        return f"{1 / ratio:.1f}x", "faster"
    pct = abs(ratio - 1) * 100
    if pct < 0.05:
        return "", "same"
    return (f"{pct:.0f}%" if pct >= 1 else f"{pct:.1f}%"), ("slower" if ratio > 1 else "faster")


def verdict(new: Row, old: Row) -> tuple[str, str]:
    """(phrase, direction) for new's step time against old's; direction "noise" when a test on
    their step times finds no significant difference."""
    result = compare_rows(new, old)
    if result is not None and result.significant is False:
        return f"within the noise, p = {result.p_value:.2f}", "noise"
    size, direction = change(new.step_ms, old.step_ms)
    return (f"{size} {direction}" if size else "the same"), direction


# A comparison within the noise is called "equally fast" only when its 95% interval rules out
# a difference this large either way; a wider interval cannot tell the two apart, which is not
# the same as showing them equal (two noisy CPU processes 47% apart had p = 0.30).
EQUAL_WITHIN = 0.10


def alike(new: Row, old: Row) -> str:
    """How two rows that a test could not tell apart (verdict's "noise") compare, with their
    step times (old's first) and the p-value: "equally fast within the noise (50.0 vs 50.4 ms,
    p = 0.61)" where the ratio's interval lies within EQUAL_WITHIN of 1, else "not told apart
    from the noise (50.9 vs 74.6 ms, p = 0.30)"."""
    result = compare_rows(new, old)
    low, high = result.ci if result.ci else (0.0, math.inf)
    close = 1 / (1 + EQUAL_WITHIN) <= low and high <= 1 + EQUAL_WITHIN
    what = "equally fast within the noise" if close else "not told apart from the noise"
    return f"{what} ({sig(old.step_ms)} vs {sig(new.step_ms)} ms, p = {result.p_value:.2f})"


def join(items: list[str]) -> str:
    """'a', 'a and b', 'a, b and c'."""
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def span(values: list[float], fmt, unit: str = "") -> str:
    """'4.0 GB' when all values print the same, else '17.3-17.4 GB'."""
    lo, hi = fmt(min(values)), fmt(max(values))
    return f"{lo}{unit}" if lo == hi else f"{lo}-{hi}{unit}"


def one(x: float) -> str:
    return f"{x:.1f}"


def secs(x: float) -> str:
    return sig(x, 2)


def every(n: int, noun: str) -> str:
    """'both GPUs' for two, 'all 4 GPUs' for more (never 'all 2 GPUs')."""
    return f"both {noun}" if n == 2 else f"all {n} {noun}"


def on_gpus(gpus: list[str], total: int) -> str:
    return f"on {every(total, 'GPUs')}" if len(gpus) == total > 1 else "on " + join(gpus)


def compiler(compile_mode: str) -> str:
    return "torch.compile" if compile_mode == "default" else f"torch.compile ({compile_mode})"


def variants(rows: list[Row], both_ok: bool = True) -> dict[tuple, list[tuple[Row, Row]]]:
    """{(attn, compile_mode): [(eager row, compiled row) per GPU]} in row order."""
    out: dict[tuple, list[tuple[Row, Row]]] = {}
    for row, twin in eager_twins(rows, both_ok):
        out.setdefault((row.attn, row.compile_mode), []).append((twin, row))
    return out


# ---------------------------------------------------------------- rules

def compile_speed(rows: list[Row]) -> list[Finding]:
    """Per attention: compiled against eager step time on every GPU, with direction."""
    out = []
    for (attn, mode), pairs in variants(rows).items():
        pairs = [(eager, comp) for eager, comp in pairs if told(comp, eager)]
        if not pairs:
            continue
        items, moved, tags = [], [], set()
        for eager, comp in pairs:
            phrase, direction = verdict(comp, eager)
            items.append(f"{comp.gpu} {sig(comp.step_ms)} vs {sig(eager.step_ms)} ms ({phrase})")
            if direction in ("slower", "faster"):
                moved.append((comp.step_ms / eager.step_ms, comp.gpu, direction))
            elif direction == "noise":
                tags.add(NOISE)
        lead = _speed_lead(moved, len(pairs), compiler(mode))
        out.append(Finding("compile_speed", f"With {attn} attention, {lead}compiled against "
                           f"eager step time: {join(items)}.", frozenset(tags)))
    return out


def _speed_lead(moved: list[tuple], total: int, name: str) -> str:
    if len(moved) < 2:
        return ""
    moved.sort()
    (lo, lo_gpu, lo_dir), (hi, hi_gpu, hi_dir) = moved[0], moved[-1]
    lo_size, hi_size = change(lo, 1)[0], change(hi, 1)[0]
    if lo_dir == hi_dir:
        first, last = ((lo_size, lo_gpu), (hi_size, hi_gpu)) if lo_dir == "slower" else \
            ((hi_size, hi_gpu), (lo_size, lo_gpu))
        where = every(total, "GPUs") if len(moved) == total else f"{len(moved)} of {total} GPUs"
        return (f"{name} made the step {lo_dir} on {where}, by {first[0]} ({first[1]}) to "
                f"{last[0]} ({last[1]}); ")
    return (f"{name} changed the step time by between {hi_size} slower ({hi_gpu}) and "
            f"{lo_size} faster ({lo_gpu}); ")


def compile_memory(rows: list[Row]) -> list[Finding]:
    """Per attention: how much peak memory compile saved (or cost)."""
    out = []
    for (attn, mode), pairs in variants(rows).items():
        pairs = [(e, c) for e, c in pairs if e.peak_memory_gb is not None
                 and c.peak_memory_gb is not None and memory_told(e, c)]
        if not pairs:
            continue
        moved = {id(c): _memory_change(e.peak_memory_gb, c.peak_memory_gb) for e, c in pairs}
        lower = [(e, c) for e, c in pairs if moved[id(c)] < 0]
        higher = [(e, c) for e, c in pairs if moved[id(c)] > 0]
        same = [c.gpu for e, c in pairs if moved[id(c)] == 0]
        parts = []
        if lower:
            pct = [(1 - c.peak_memory_gb / e.peak_memory_gb) * 100 for e, c in lower]
            saved = [e.peak_memory_gb - c.peak_memory_gb for e, c in lower]
            parts.append(
                f"cut peak memory {on_gpus([c.gpu for _, c in lower], len(pairs))} by "
                f"{span(pct, lambda x: f'{x:.0f}', '%')} ({span(saved, gbs, ' GB')}): from "
                f"{span([e.peak_memory_gb for e, _ in lower], gbs, ' GB')} to "
                f"{span([c.peak_memory_gb for _, c in lower], gbs, ' GB')}")
        if higher:
            parts.append(f"raised {'it' if parts else 'peak memory'} on " + join(
                [f"{c.gpu} by {(c.peak_memory_gb / e.peak_memory_gb - 1) * 100:.0f}% "
                 f"({gbs(e.peak_memory_gb)} to {gbs(c.peak_memory_gb)} GB)"
                 if e.peak_memory_gb else
                 f"{c.gpu} ({gbs(e.peak_memory_gb)} to {gbs(c.peak_memory_gb)} GB)"
                 for e, c in higher]))
        if same:
            parts.append(f"left {'it' if parts else 'peak memory'} unchanged on " + join(same))
        text = "; ".join(parts)
        out.append(Finding("compile_memory",
                           f"With {attn} attention, {compiler(mode)} {text}."))
    return out


# Peak memory counts as unchanged only when the change is within both of these: 0.05 GB is
# noise for a GPU's tens of GB, but a third of a CPU run's 0.15 GB.
MEMORY_SAME_GB = 0.05
MEMORY_SAME_SHARE = 0.05


def _memory_change(eager_gb: float, compiled_gb: float) -> int:
    """-1 lower, 1 higher, 0 unchanged (within MEMORY_SAME_GB and MEMORY_SAME_SHARE)."""
    diff = compiled_gb - eager_gb
    if abs(diff) <= MEMORY_SAME_GB and abs(diff) <= MEMORY_SAME_SHARE * abs(eager_gb):
        return 0
    return -1 if diff < 0 else 1


def gbs(x: float) -> str:
    """GB as the tables print them: one decimal, two below 1 GB (a CPU run's 0.15 GB)."""
    return f"{x:.1f}" if abs(x) >= 1 else f"{x:.2f}"


def compile_cost(rows: list[Row]) -> list[Finding]:
    """Range of compile time: first step minus a warm step, per attention; warm cache apart."""
    compiled = [r for r in rows if r.mode == "compile" and r.ok and r.first_step_s is not None]
    # A row's first step is its coldest processes' (rows.compile_start): a shared cache's
    # process counts as cold only where inductor's counters say no graph came from the cache.
    cold = [(r.first_step_s - r.step_ms / 1000, r) for r in compiled
            if r.first_step_cache in ("cold", None)]
    shared = [(r.first_step_s - r.step_ms / 1000, r) for r in compiled
              if r.first_step_cache == "shared"]
    warm = [(r.first_step_s - r.step_ms / 1000, r) for r in compiled
            if r.first_step_cache == "warm"]
    warm += [(r.first_step_warm_s - r.step_ms / 1000, r) for r in compiled
             if r.first_step_warm_s is not None]
    out = []
    if cold:
        (lo, lo_row), (hi, hi_row) = min(cold, key=_cost), max(cold, key=_cost)
        cache = " with a cold cache" if all(r.first_step_cache for _, r in cold) else ""
        text = f"Compilation{cache} took {span([lo, hi], secs, ' s')} (first step minus a warm step"
        if lo_row.gpu != hi_row.gpu:
            text += f"; least on {lo_row.gpu}, most on {hi_row.gpu}"
        elif len({r.gpu for _, r in cold}) == 1:
            text += f", on {lo_row.gpu}"
        text += ")"
        attns = list(dict.fromkeys(r.attn for _, r in cold))
        if len(attns) > 1:
            text += "; " + ", ".join(
                f"{span([c for c, r in cold if r.attn == a], secs, ' s')} with {a} attention"
                for a in attns)
        out.append(Finding("compile_cost", text + "."))
    if shared:
        how = ("warm from an earlier process's compile of the same graphs"
               if all(r.shared_cache == "warm" for _, r in shared)
               else "cold for a graph's first process, warm after")
        out.append(Finding("compile_cost", f"With a compile cache shared by every process ({how}) "
                           f"it took {span([c for c, _ in shared], secs, ' s')}."))
    if warm:
        source = ("an earlier process's compile of the same graphs"
                  if any(r.warm_from_shared or r.compile_cache == "shared" for _, r in warm)
                  else "a later process of the same setup")
        text = (f"With a warm compile cache ({source}) it took "
                f"{span([c for c, _ in warm], secs, ' s')}")
        warm_gpus = list(dict.fromkeys(r.gpu for _, r in warm))
        if len(warm_gpus) < len({r.gpu for r in compiled}):   # say where: not every GPU had one
            text += " on " + join(warm_gpus)
        out.append(Finding("compile_cost", text + "."))
    return out


def _cost(item: tuple[float, Row]) -> float:
    return item[0]


def compile_payback(rows: list[Row]) -> list[Finding]:
    """After how many steps the compile time is earned back by faster steps, or never."""
    parts, tags = [], set()
    for (attn, mode), pairs in variants(rows).items():
        paid, never, noise = [], [], []
        for eager, comp in pairs:
            if comp.first_step_s is None or not told(comp, eager):
                continue
            _, direction = verdict(comp, eager)
            if direction == "faster":
                steps = _payback_steps(eager, comp)
                count = f"{steps}" if steps < 100 else f"{float(f'{steps:.1e}'):,.0f}"
                # Wall time of the compiled run up to then: its first (compiling) step included.
                took = comp.first_step_s + (steps - 1) * comp.step_ms / 1000
                paid.append(f"after about {count} step{'s' if steps > 1 else ''} "
                            f"({duration(took)}) on {comp.gpu}")
            elif direction == "noise":
                noise.append(comp.gpu)
            else:
                never.append(comp.gpu)
        clauses = [f"paid back its compile time {join(paid)}"] if paid else []
        if never:
            clauses.append(("never on " if clauses else "never paid back its compile time on ")
                           + f"{join(never)}, where compiled steps were not faster")
        if noise:
            clauses.append(("not measurably on " if clauses else
                            "did not measurably pay back its compile time on ")
                           + f"{join(noise)}, where the difference was within the noise")
            tags.add(NOISE)
        if clauses:
            parts.append(f"With {attn} attention, {compiler(mode)} " + "; ".join(clauses) + ".")
    return [Finding("compile_payback", " ".join(parts), frozenset(tags))] if parts else []


def _payback_steps(eager: Row, comp: Row) -> int:
    """Steps n at which compiled total time (first step + n-1 warm steps) drops below eager's."""
    eager_first = eager.first_step_s if eager.first_step_s is not None else eager.step_ms / 1000
    extra_ms = (comp.first_step_s - eager_first) * 1000
    gain_ms = eager.step_ms - comp.step_ms
    return 1 if extra_ms <= 0 else 1 + math.ceil(extra_ms / gain_ms)


def fit(rows: list[Row]) -> list[Finding]:
    """Setups that fit in memory only when compiled (or only eager, or neither)."""
    out = []
    for (attn, mode), pairs in variants(rows, both_ok=False).items():
        only_compiled = [c for e, c in pairs if e.status == "oom" and c.ok]
        only_eager = [e for e, c in pairs if c.status == "oom" and e.ok]
        neither = [c for e, c in pairs if e.status == "oom" and c.status == "oom"]
        name = compiler(mode)
        parts = []
        if only_compiled:
            peaks = [c.peak_memory_gb for c in only_compiled if c.peak_memory_gb is not None]
            parts.append(f"the step fit in memory only with {name}, on "
                         f"{join(_with_memory(only_compiled))}"
                         + (f", at a compiled peak of {span(peaks, one, ' GB')}" if peaks else ""))
        if only_eager:
            parts.append(f"{'it' if parts else 'the step'} fit in memory only without {name}, "
                         f"on {join(_with_memory(only_eager))}")
        if neither:
            parts.append(f"{'it' if parts else 'the step'} ran out of memory either way on "
                         f"{join(_with_memory(neither))}")
        if parts:
            out.append(Finding("fit", f"With {attn} attention, " + "; ".join(parts) + ".",
                               frozenset({FITS_ONLY_COMPILED} if only_compiled else ())))
    return out


def _with_memory(rows: list[Row]) -> list[str]:
    return [f"{r.gpu} ({r.gpu_memory_gb:.0f} GB)" if r.gpu_memory_gb else r.gpu for r in rows]


def attention_pairs(rows: list[Row]) -> dict[tuple, list[tuple[Row, Row]]]:
    """{(mode, compile_mode, attn a, attn b): [(row a, row b) per GPU where both ran]}."""
    attns = list(dict.fromkeys(r.attn for r in rows))
    out: dict[tuple, list[tuple[Row, Row]]] = {}
    for mode in dict.fromkeys((r.mode, r.compile_mode) for r in rows):
        same_mode = [r for r in rows if (r.mode, r.compile_mode) == mode and r.ok]
        for a, b in combinations(attns, 2):
            for gpu in dict.fromkeys(r.gpu for r in same_mode):
                ra = next((r for r in same_mode if r.gpu == gpu and r.attn == a), None)
                rb = next((r for r in same_mode if r.gpu == gpu and r.attn == b), None)
                if ra and rb:
                    out.setdefault((*mode, a, b), []).append((ra, rb))
    return out


def attention_speed(rows: list[Row]) -> list[Finding]:
    """Attention kernels against each other in the same mode, per GPU."""
    out = []
    for (mode, compile_mode, a, b), pairs in attention_pairs(rows).items():
        pairs = [(ra, rb) for ra, rb in pairs if told(ra, rb)]
        if not pairs:
            continue
        label = "In eager mode" if mode == "eager" else \
            f"With {compiler(compile_mode)}" if mode == "compile" else f"In {mode} mode"
        verdicts = [verdict(ra, rb) for ra, rb in pairs]
        items = [f"{ra.gpu} {sig(ra.step_ms)} vs {sig(rb.step_ms)} ms ({phrase})"
                 for (ra, rb), (phrase, _) in zip(pairs, verdicts)]
        tags = {NOISE} if any(d == "noise" for _, d in verdicts) else set()
        out.append(Finding("attention_speed",
                           f"{label}, {a} attention against {b} attention: {join(items)}.",
                           frozenset(tags)))
    return out


def attention_vs_compile(rows: list[Row]) -> list[Finding]:
    """Where eager mode with one attention kernel beats the compiled model with another."""
    attns = list(dict.fromkeys(r.attn for r in rows))
    out = []
    for a, b in permutations(attns, 2):
        beat, lost, noise = [], [], []
        for gpu in dict.fromkeys(r.gpu for r in rows):
            eager = next((r for r in rows if r.gpu == gpu and r.mode == "eager"
                          and r.attn == a and r.ok), None)
            comp = min((r for r in rows if r.gpu == gpu and r.mode == "compile"
                        and r.attn == b and r.ok), key=lambda r: r.step_ms, default=None)
            if eager is None or comp is None or not told(eager, comp):
                continue
            _, direction = verdict(eager, comp)
            item = f"{gpu} {sig(eager.step_ms)} vs {sig(comp.step_ms)} ms"
            {"faster": beat, "noise": noise}.get(direction, lost).append((item, eager, comp))
        if not beat:
            continue
        total = len(beat) + len(lost) + len(noise)
        where = (f"on {every(total, 'GPUs')} where both ran" if total > 1 and not (lost or noise)
                 else f"on {len(beat)} of {total} GPUs where both ran" if total > 1 else "")
        text = (f"Eager mode with {a} attention was faster than torch.compile with {b} "
                f"attention {where}".rstrip() + ": " + join([i for i, _, _ in beat]))
        ratios = [e.peak_memory_gb / c.peak_memory_gb for _, e, c in beat
                  if e.peak_memory_gb and c.peak_memory_gb]
        if len(ratios) == len(beat):
            text += f", at {span(ratios, lambda x: f'{x:.2f}')}x the peak memory"
        if lost:
            text += "; not on " + join([i for i, _, _ in lost])
        if noise:
            text += "; within the noise on " + join([i for i, _, _ in noise])
        out.append(Finding("attention_vs_compile", text + ".",
                           frozenset({NOISE} if noise else ())))
    return out


def _best_per_gpu(rows: list[Row], value) -> list[Row]:
    best: dict[str, Row] = {}
    for row in rows:
        if row.ok and not row.departs and value(row) is not None and (
                row.gpu not in best or value(row) > value(best[row.gpu])):
            best[row.gpu] = row
    return sorted(best.values(), key=value, reverse=True)


def fastest_setup(rows: list[Row]) -> list[Finding]:
    """Per GPU, the fastest setup against the runner-up on that GPU (the answer to "how should I
    run this step here"), or the two that cannot be told apart."""
    items, tags, untested = [], set(), []
    for gpu in dict.fromkeys(r.gpu for r in rows):
        # A setup whose losses depart from its peers' trains another model: never the answer.
        ranked = sorted((r for r in rows if r.gpu == gpu and r.ok and not r.departs),
                        key=lambda r: r.step_ms)
        if len(ranked) < 2:
            continue
        top, second = ranked[:2]
        if not told(top, second):
            continue
        _, direction = verdict(second, top)
        untested.append(compare_rows(second, top) is None)
        if direction == "noise":
            tags.add(NOISE)
            items.append((f"{top.name} and {second.name} on {gpu}, {alike(second, top)}", ""))
        else:
            lead = change(top.step_ms, second.step_ms)[0] or "no"
            items.append((f"{top.name} on {gpu} ({top.tokens_per_s:,.0f} tokens/s, "
                          f"{sig(top.step_ms)} ms; {lead} faster than the runner-up, "
                          f"{second.name} at {sig(second.step_ms)} ms", ")"))
    if not items:
        return []
    # An untested gap is worded as such: once for the finding when none could be tested.
    if all(untested):
        return [Finding("fastest_setup", "Fastest setup (untested against noise): "
                        + "; ".join(text + end for text, end in items) + ".", frozenset(tags))]
    texts = [text + (", untested against noise" if gap and end else "") + end
             for (text, end), gap in zip(items, untested)]
    return [Finding("fastest_setup", "Fastest setup: " + "; ".join(texts) + ".", frozenset(tags))]


def gpus(rows: list[Row]) -> list[Finding]:
    """Tokens per dollar across GPUs, and the fastest GPU against the runner-up with prices."""
    out = []
    by_dollar = _best_per_gpu(rows, lambda r: r.m_tokens_per_dollar)
    by_speed = _best_per_gpu(rows, lambda r: r.tokens_per_s)
    if len(by_dollar) >= 2:
        top, rest = by_dollar[0], by_dollar[1:]
        text = (f"Per dollar, {top.gpu} trained the most tokens: "
                f"{sig(top.m_tokens_per_dollar, 2)}M tokens per $ with {top.name}, against "
                + join([f"{sig(r.m_tokens_per_dollar, 2)}M on {r.gpu}" for r in rest]))
        fastest = by_speed[0]
        if fastest.gpu != top.gpu and fastest.price_per_hour:
            text += (f"; it costs {_times(top.price_per_hour / fastest.price_per_hour)} the "
                     f"hourly price of the fastest GPU, {fastest.gpu}")
        out.append(Finding("tokens_per_dollar", text + ".", frozenset({ACROSS_GPUS})))
    elif len(by_dollar) == 1:
        top = by_dollar[0]
        out.append(Finding("tokens_per_dollar", f"On {top.gpu}, {top.name} trained the most "
                           f"tokens per dollar: {sig(top.m_tokens_per_dollar, 2)}M per $."))
    if len(by_speed) >= 2 and told(*by_speed[:2]):
        top, second = by_speed[:2]
        _, direction = verdict(second, top)
        tags = frozenset({NOISE} if direction == "noise" else ())
        if direction == "noise":
            text = (f"{top.gpu} and {second.gpu} were the fastest GPUs, "
                    f"{alike(second, top)}")
        else:
            text = (f"{top.gpu} was the fastest GPU ({top.tokens_per_s:,.0f} tokens/s with "
                    f"{top.name}), {_times(top.tokens_per_s / second.tokens_per_s)} "
                    f"{second.gpu} ({second.tokens_per_s:,.0f} tokens/s with {second.name})")
            if top.price_per_hour and second.price_per_hour:
                text += f" at {_times(top.price_per_hour / second.price_per_hour)} its price"
        out.append(Finding("fastest_gpu", text + ".", tags))
    return out


def _times(ratio: float) -> str:
    return f"{ratio:.2f}x" if ratio < 1 else f"{ratio:.1f}x"


def loss_guard(rows: list[Row]) -> list[Finding]:
    """Setups whose losses depart from their reference's (stepbench.guard): fast or not, they
    train something else, and the other findings leave them out."""
    return [Finding("loss_guard", f"{r.row_label()}: {r.loss_guard.describe(r.name)}; its "
                    "numbers do not describe training this model, so it is left out of the "
                    "fastest setup and GPU.", frozenset({WRONG_LOSS}))
            for r in rows if r.departs]


def loss_guard_agreed(rows: list[Row]) -> list[Finding]:
    """When no setup departs: that every setup the loss guard checked agreed with its
    reference, and the largest difference (a compiled setup's against its eager twin, where
    it ran)."""
    checked = [r for r in rows if r.loss_guard is not None and r.loss_guard.status == OK]
    if not checked or any(r.departs for r in rows):
        return []
    worst = max(checked, key=lambda r: r.loss_guard.max_rel_diff)
    verdict = worst.loss_guard
    which = ("the one setup the loss guard checked agreed with its reference's" if len(checked) == 1
             else f"{every(len(checked), 'setups')} the loss guard checked agreed with their "
                  "references'")
    against = ("its peers, without an eager reference" if verdict.by_peers
               else verdict.reference)
    return [Finding("loss_guard", f"The losses of {which} within tolerance (largest "
                    f"difference {percent(verdict.max_rel_diff)}, {worst.name} on {worst.gpu} "
                    f"against {against}; tolerance {percent(verdict.tolerance)} for "
                    f"{worst.dtype}).")]


def mfu(rows: list[Row]) -> list[Finding]:
    """Best model FLOPs utilization per GPU, naming the peak it is measured against."""
    best = _best_per_gpu(rows, lambda r: r.mfu)
    if not best:
        return []
    peak = {"measured": "the measured matmul peak", "datasheet": "the datasheet peak"}
    items = [f"{r.mfu * 100:.0f}% on {r.gpu} with {r.name} (against {peak[r.mfu_source]})"
             for r in best]
    return [Finding("mfu", "Best model FLOPs utilization: " + join(items) + ".")]


# A process whose GPU ran kernels less of its step than this waited on the host. On one H200,
# profiled plain steps of the post's model ran 94-96% of their step (compiled whole or per
# layer, eager+sdpa in its fast processes), host-bound ones 38-79% (FSDP2 at world size 1,
# eager+sdpa's slow processes; benchmarks/README.md sections e and h).
HOST_BOUND = 0.85


def host_bound(rows: list[Row]) -> list[Finding]:
    """The setups whose GPU waited for the host (`run --profile`'s kernel time against the
    median step), in some process or in all, per GPU."""
    waited = [r for r in rows if r.gpu_busy_low is not None and r.gpu_busy_low < HOST_BOUND]
    if not waited:
        return []
    per_gpu: dict[str, list[str]] = {}
    for r in sorted(waited, key=lambda r: r.gpu_busy_low):
        name = r.name + (f" ({r.setup.parallel_label})" if r.setup.distributed else "")
        share = f"{r.gpu_busy * 100:.0f}%"
        if r.gpu_busy >= HOST_BOUND:
            share += f" ({r.gpu_busy_low * 100:.0f}% in its slowest process)"
        per_gpu.setdefault(r.gpu, []).append(f"{name} {share}")
    where = "; ".join(f"on {gpu}, {join(items)}" for gpu, items in per_gpu.items())
    return [Finding("host_bound", "The GPU waited for the host (the share of the median step "
                    f"its kernels took, profiled): {where}. There the host's Python, dispatch, "
                    "kernel launches and hooks set the pace; fewer, larger kernels and launches "
                    "(torch.compile, CUDA graphs, fewer FSDP2 units) shorten it.")]


def energy(rows: list[Row]) -> list[Finding]:
    """Most tokens per kWh per GPU."""
    best = _best_per_gpu(rows, lambda r: r.tokens_per_kwh)
    if not best:
        return []
    items = [f"{sig(r.tokens_per_kwh / 1e6, 2)}M on {r.gpu} with {r.name}" for r in best]
    return [Finding("energy", "Most tokens per kWh of GPU energy: " + join(items) + ".")]


def software(rows: list[Row]) -> list[Finding]:
    """A caveat when the GPUs ran different torch/transformers versions: GPU differences then
    mix hardware and software."""
    stacks: dict[str, list[str]] = {}
    for row in rows:
        for record in row.records:
            sw = record.software
            if not (sw.torch or sw.transformers):
                continue   # unknown (e.g. a hand-written failed record): not a different stack
            stack = f"torch {_release(sw.torch)}, transformers {_release(sw.transformers)}"
            gpus = stacks.setdefault(stack, [])
            if row.gpu not in gpus:
                gpus.append(row.gpu)
    if len(stacks) < 2:
        return []
    parts = [f"{join(gpus)} on {stack}" for stack, gpus in stacks.items()]
    return [Finding("software", "The results come from different software: " + "; ".join(parts)
                    + ". Differences between these GPUs mix hardware and software versions.")]


def _release(version: str | None) -> str:
    """'2.11.0' for '2.11.0+cu130': the local tag names the build (CUDA or CPU), which the record
    keeps apart (software.cuda), not another release."""
    return version.split("+")[0] if version else "?"


def testing(rows: list[Row]) -> list[Finding]:
    """How the differences above were tested, or that they could not be."""
    pairs = [pair for pairs in variants(rows).values() for pair in pairs]
    pairs += [pair for pairs in attention_pairs(rows).values() for pair in pairs]
    by_speed = _best_per_gpu(rows, lambda r: r.tokens_per_s)
    pairs += [tuple(by_speed[:2])] if len(by_speed) >= 2 else []
    if not pairs:
        return []
    methods = [a.test_method(b) for a, b in pairs]
    untested = sum(m is None for m in methods)
    if untested == len(pairs):
        return [Finding("testing", "The records hold no per-step times and too few processes "
                        "per setup, so the differences above are stated as measured, untested "
                        "against noise.")]
    used = set(methods)
    text = "Differences were tested " + join([TESTS[m] for m in TESTS if m in used])
    if untested:
        text += (f"; {untested} of {len(pairs)} comparisons had too few step times or "
                 "processes to test (e.g. one process without per-step times) and are stated "
                 "as measured")
    return [Finding("testing", text + ".")]


# How each kind of stats.Comparison was tested, for the `testing` finding.
TESTS = {
    "processes": ("by their processes where both setups ran two or more: a hierarchical "
                  "bootstrap (processes resampled, then the steps within each) of the ratio of "
                  "mean step times, significant when its 95% interval excludes 1 and p < 0.05"),
    "means": ("with a Mann-Whitney U test and a 95% bootstrap interval of the ratio of medians "
              "on per-process means where the records kept no per-step times"),
    "steps": ("with a Mann-Whitney U test and a 95% bootstrap interval of the ratio of medians "
              "on per-step times where a setup ran one process, which misses the spread "
              "between processes"),
}


def scaling(rows: list[Row]) -> list[Finding]:
    """A distributed job against one GPU without a wrapper: tokens/s, efficiency, memory per GPU."""
    items = []
    for row in rows:
        if row.scaling_efficiency is None:
            continue
        speedup = row.scaling_efficiency * row.setup.world_size
        items.append(f"{row.name} on {row.gpu}: {speedup:.2f}x the tokens/s of one GPU "
                     f"({percent(row.scaling_efficiency)} scaling efficiency, "
                     f"{row.tokens_per_s_per_gpu:,.0f} tokens/s per GPU), peak memory "
                     f"{row.peak_memory_gb:.1f} GB per GPU")
    if not items:
        return []
    label = rows[0].setup.parallel_label
    return [Finding("scaling", f"Scaling over {label}: " + "; ".join(items) + ".")]


def untested(rows: list[Row]) -> list[Finding]:
    """The comparisons the rules above leave out because both setups' steps were disturbed: their
    step times (compiled against eager, attention kernels, eager against compiled, the fastest
    setup of a GPU and the fastest GPUs), and peak memory where both sides' processes disagreed
    on it (compiled against eager)."""
    pairs: dict[frozenset, tuple[Row, Row]] = {}
    for group in variants(rows).values():
        pairs.update({frozenset((id(c), id(e))): (c, e) for e, c in group if not told(c, e)})
    for group in attention_pairs(rows).values():
        pairs.update({frozenset((id(a), id(b))): (a, b) for a, b in group if not told(a, b)})
    for eager in (r for r in rows if r.mode == "eager" and r.ok):
        for comp in (r for r in rows if r.mode == "compile" and r.ok and r.gpu == eager.gpu):
            if not told(eager, comp):
                pairs[frozenset((id(eager), id(comp)))] = (eager, comp)
    ranked = [sorted((r for r in rows if r.gpu == gpu and r.ok and not r.departs),
                     key=lambda r: r.step_ms) for gpu in dict.fromkeys(r.gpu for r in rows)]
    ranked.append(_best_per_gpu(rows, lambda r: r.tokens_per_s))
    for group in ranked:
        if len(group) >= 2 and not told(*group[:2]):
            pairs[frozenset(map(id, group[:2]))] = tuple(group[:2])
    out = []
    if pairs:
        flags = [f for a, b in pairs.values() for f in (*a.noise_flags, *b.noise_flags)]
        marks = "".join(dict.fromkeys(NOISE_MARKS[f][0] for f in flags if f in DISTURBED))
        items = [f"{a.name} against {b.name}" + (f" on {a.gpu}" if a.gpu == b.gpu else
                                                   f" ({a.gpu} against {b.gpu})")
                 + f" ({sig(a.step_ms)} vs {sig(b.step_ms)} ms)" for a, b in pairs.values()]
        out.append(Finding("untested", "Not compared, because something outside the step "
                           f"disturbed both setups' timed steps ({marks}, see the notes): "
                           + join(items) + "."))
    memory = [(c, e) for group in variants(rows).values() for e, c in group
              if c.peak_memory_gb and e.peak_memory_gb and not memory_told(c, e)]
    if memory:
        out.append(Finding("untested", "Peak memory not compared, because both setups' "
                           "processes disagreed on it by more than 20%: " + join(
                               [f"{c.name} against {e.name} on {c.gpu}" for c, e in memory])
                           + "."))
    return out


RULES = [loss_guard, software, fastest_setup, scaling, compile_speed, compile_memory,
         compile_cost, compile_payback, fit, attention_speed, attention_vs_compile, gpus,
         untested, loss_guard_agreed, mfu, host_bound, energy, testing]
