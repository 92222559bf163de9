"""What torch.compile did, per attention kernel and GPU: step time, peak memory, what its first
step cost, after how many steps it paid back, and what fit in memory only compiled."""

from __future__ import annotations

import math

from stepbench.report.findings.words import (FITS_ONLY_COMPILED, NOISE, Finding, change,
                                             compiler, every, join, memory_told, on_gpus, one,
                                             places,
                                             secs, span, steady, told, variants, verdict,
                                             with_attn)
from stepbench.report.rows import Row
from stepbench.report.table import sig
from stepbench.units import duration


def compile_speed(rows: list[Row]) -> list[Finding]:
    """Per attention: compiled against eager step time on every GPU, with direction."""
    out = []
    for (attn, mode), pairs in variants(rows).items():
        pairs = [(eager, comp) for eager, comp in pairs if told(comp, eager)]
        if not pairs:
            continue
        items, moved, tags = [], [], set()
        where = places([c for _, c in pairs])
        for eager, comp in pairs:
            phrase, direction = verdict(comp, eager)
            # Its speed stands, but not as a way to train the model (loss_guard says why).
            departs = "; its loss departs, !" if comp.departs or eager.departs else ""
            items.append(f"{where[id(comp)]} {sig(comp.step_ms)} vs {sig(eager.step_ms)} ms "
                         f"({phrase}{departs})")
            if direction in ("slower", "faster"):
                moved.append((comp.step_ms / eager.step_ms, where[id(comp)], direction))
            elif direction == "noise":
                tags.add(NOISE)
        noun = "GPUs" if len(set(where.values())) == len({c.gpu for _, c in pairs}) else \
            "compiled setups"
        lead = _speed_lead(moved, len(pairs), compiler(mode), noun)
        out.append(Finding("compile_speed", with_attn(attn, pairs, f"{lead}compiled against "
                           f"eager step time: {join(items)}."), frozenset(tags)))
    return out


def _speed_lead(moved: list[tuple], total: int, name: str, noun: str = "GPUs") -> str:
    if len(moved) < 2:
        return ""
    moved.sort()
    (lo, lo_gpu, lo_dir), (hi, hi_gpu, hi_dir) = moved[0], moved[-1]
    lo_size, hi_size = change(lo, 1)[0], change(hi, 1)[0]
    if lo_dir == hi_dir:
        first, last = ((lo_size, lo_gpu), (hi_size, hi_gpu)) if lo_dir == "slower" else \
            ((hi_size, hi_gpu), (lo_size, lo_gpu))
        where = every(total, noun) if len(moved) == total else f"{len(moved)} of {total} {noun}"
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
        where = places([c for _, c in pairs])
        lower = [(e, c) for e, c in pairs if moved[id(c)] < 0]
        higher = [(e, c) for e, c in pairs if moved[id(c)] > 0]
        same = [where[id(c)] for e, c in pairs if moved[id(c)] == 0]
        parts = []
        if lower:
            pct = [(1 - c.peak_memory_gb / e.peak_memory_gb) * 100 for e, c in lower]
            saved = [e.peak_memory_gb - c.peak_memory_gb for e, c in lower]
            parts.append(
                f"cut peak memory {on_gpus([where[id(c)] for _, c in lower], len(pairs))} by "
                f"{span(pct, lambda x: f'{x:.0f}', '%')} ({span(saved, gbs, ' GB')}): from "
                f"{span([e.peak_memory_gb for e, _ in lower], gbs, ' GB')} to "
                f"{span([c.peak_memory_gb for _, c in lower], gbs, ' GB')}")
        if higher:
            parts.append(f"raised {'it' if parts else 'peak memory'} on " + join(
                [f"{where[id(c)]} by {(c.peak_memory_gb / e.peak_memory_gb - 1) * 100:.0f}% "
                 f"({gbs(e.peak_memory_gb)} to {gbs(c.peak_memory_gb)} GB)"
                 if e.peak_memory_gb else
                 f"{where[id(c)]} ({gbs(e.peak_memory_gb)} to {gbs(c.peak_memory_gb)} GB)"
                 for e, c in higher]))
        if same:
            parts.append(f"left {'it' if parts else 'peak memory'} unchanged on " + join(same))
        text = "; ".join(parts)
        out.append(Finding("compile_memory",
                           with_attn(attn, pairs, f"{compiler(mode)} {text}.")))
    return out


# Peak memory counts as unchanged only when the change is within both of these: 0.05 GB is
# noise for a GPU's tens of GB, but a third of a CPU run's 0.15 GB.
MEMORY_SAME_GB = 0.05


MEMORY_SAME_SHARE = 0.05
# ... or below what the tables show (0.01 GB): a tiny model's 84 kB against 57 kB read "cut
# peak memory by 32% (0.00 GB): from 0.00 GB to 0.00 GB".
MEMORY_SHOWN_GB = 0.005


def _memory_change(eager_gb: float, compiled_gb: float) -> int:
    """-1 lower, 1 higher, 0 unchanged (within MEMORY_SAME_GB and MEMORY_SAME_SHARE, or within
    MEMORY_SHOWN_GB)."""
    diff = compiled_gb - eager_gb
    if abs(diff) < MEMORY_SHOWN_GB or (abs(diff) <= MEMORY_SAME_GB
                                       and abs(diff) <= MEMORY_SAME_SHARE * abs(eager_gb)):
        return 0
    return -1 if diff < 0 else 1


def gbs(x: float) -> str:
    """GB as the tables print them: one decimal, two below 1 GB (a CPU run's 0.15 GB)."""
    return f"{x:.1f}" if abs(x) >= 1 else f"{x:.2f}"


def compile_cost(rows: list[Row]) -> list[Finding]:
    """Range of compile time: first step minus a warm step, per attention; warm cache apart."""
    # A row whose timed steps were disturbed likely compiled under the same disturbance.
    compiled = [r for r in rows if r.mode == "compile" and r.ok and r.first_step_s is not None
                and steady(r)]
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
        where = places([c for _, c in pairs])
        for eager, comp in pairs:
            # A step that trains something else pays back nothing (loss_guard names it).
            if comp.first_step_s is None or not told(comp, eager) or comp.departs or \
                    eager.departs:
                continue
            _, direction = verdict(comp, eager)
            if direction == "faster":
                steps = _payback_steps(eager, comp)
                count = f"{steps}" if steps < 100 else f"{float(f'{steps:.1e}'):,.0f}"
                # Wall time of the compiled run up to then: its first (compiling) step included.
                took = comp.first_step_s + (steps - 1) * comp.step_ms / 1000
                paid.append(f"after about {count} step{'s' if steps > 1 else ''} "
                            f"({duration(took)}) {on_gpus([where[id(comp)]], 0)}")
            elif direction == "noise":
                noise.append(where[id(comp)])
            else:
                never.append(where[id(comp)])
        clauses = [f"paid back its compile time {join(paid)}"] if paid else []
        if never:
            clauses.append(("never " if clauses else "never paid back its compile time ")
                           + f"{on_gpus(never, 0)}, where compiled steps were not faster")
        if noise:
            clauses.append(("not measurably " if clauses else
                            "did not measurably pay back its compile time ")
                           + f"{on_gpus(noise, 0)}, where the difference was within the noise")
            tags.add(NOISE)
        if clauses:
            parts.append(with_attn(attn, pairs, f"{compiler(mode)} " + "; ".join(clauses) + "."))
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
            out.append(Finding("fit", with_attn(attn, pairs, "; ".join(parts) + "."),
                               frozenset({FITS_ONLY_COMPILED} if only_compiled else ())))
    return out


def _with_memory(rows: list[Row]) -> list[str]:
    return [f"{r.gpu} ({r.gpu_memory_gb:.0f} GB)" if r.gpu_memory_gb else r.gpu for r in rows]
