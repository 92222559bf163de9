"""The findings' shared words and pairings: the Finding type and its tags, how two rows are
compared (the test on their steps, or nothing where both were disturbed) and how the result is
worded, and the pairs of rows the rules compare (eager against compiled twins, attention
kernels, the best row per GPU)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from itertools import combinations

from stepbench import stats
from stepbench.noise import disturbed
from stepbench.report.columns import rows_unit
from stepbench.report.marks import MEMORY_FLAG
from stepbench.report.rows import Row, eager_twins
from stepbench.report.table import sig
from stepbench.units import TOKENS
from stepbench.workload.spec import is_factory


BIG_RATIO = 1.5   # from here on a difference reads better as "2.6x" than as "160%"


def counted(rows: list[Row]) -> str:
    """What one workload's rows count per step, for a sentence: the unit the table's headers
    name (columns.rows_unit: a user's images or samples), tokens where they name several (a
    finding speaks only of rows that ran)."""
    return rows_unit(rows) or TOKENS


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


def compare_rows(a: Row, b: Row) -> stats.Comparison | None:
    """Test a's step times against b's (Row.compare); None when nothing can be tested."""
    return a.compare(b)


def told(a: Row, b: Row) -> bool:
    """Whether a comparison of a's and b's step times is stated: not when either row's steps
    were disturbed (`untested` lists those): a disturbed row's step time is the disturbance's
    as much as the setup's, so no claim rests on it."""
    return steady(a) and steady(b)


def steady(row: Row) -> bool:
    """Whether nothing outside the step disturbed the row's timed steps (noise.DISTURBED): the
    rows that rankings (fastest setup and GPU, per dollar, MFU, energy, compile time, the host)
    may use; `untested` names the others."""
    return not disturbed(row.noise_flags)


def memory_told(a: Row, b: Row) -> bool:
    """The same for peak memory: not when both rows' processes disagreed on it."""
    return not (MEMORY_FLAG in a.noise_flags and MEMORY_FLAG in b.noise_flags)


def change(new_ms: float, old_ms: float) -> tuple[str, str]:
    """(size, direction) of a step-time change: ("10%", "slower"), ("2.6x", "faster"), ("", "same").

    The one way the tool words a speed difference (findings, compare, tune, max-batch): the
    size is the slower's time over the faster's, whichever way round, so a pair one side calls
    "10% faster" the other calls "10% slower" (the faster does 10% more steps per second).
    """
    ratio = new_ms / old_ms
    times = max(ratio, 1 / ratio)
    direction = "slower" if ratio > 1 else "faster"
    if times >= BIG_RATIO:
        return f"{times:.1f}x", direction
    pct = abs(slower_pct(ratio))
    if pct < 0.05:
        return "", "same"
    return (f"{pct:.0f}%" if pct >= 1 else f"{pct:.1f}%"), direction


def slower_pct(ratio: float) -> float:
    """How much slower a step time `ratio` (new over old) is, in percent, negative for faster:
    the slower's time over the faster's, either way round (as `change` words it)."""
    return (ratio - 1) * 100 if ratio >= 1 else (1 - 1 / ratio) * 100


def verdict(new: Row, old: Row) -> tuple[str, str]:
    """(phrase, direction) for new's step time against old's; direction "noise" when a test on
    their step times finds no significant difference."""
    result = compare_rows(new, old)
    if result is not None and result.significant is False:
        return f"within the noise, {odds(result)}", "noise"
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
    return f"{what} ({sig(old.step_ms)} vs {sig(new.step_ms)} ms, {odds(result)})"


def odds(result: stats.Comparison) -> str:
    """A test's p-value as a reader can take it: "p = 0.37"; "p < 0.01", never "p = 0.00"; and
    where p is small but the ratio's 95% interval still holds 1 (the two must agree for a
    difference, stats.compare), that interval, else "within the noise, p = 0.00" reads as a
    contradiction (compile/layer+sdpa against eager+sdpa on an H200: p = 0.0003, 0.90-1.01)."""
    p = f"p = {result.p_value:.2f}" if result.p_value >= 0.01 else "p < 0.01"
    if result.p_value < stats.ALPHA and result.ci:
        low, high = result.ci
        return f"{p} but the ratio's 95% interval, {low:.2f}-{high:.2f}, holds 1"
    return p


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
    """"on all 3 GPUs" where `gpus` (distinct, as `places` gives them) are every one of `total`;
    else "on A and B", or "for compile+sdpa on A and ..." where a place names its setup."""
    if len(gpus) == total > 1 and len(set(gpus)) == total and not any(map(_named, gpus)):
        return f"on {every(total, 'GPUs')}"
    return ("for " if any(map(_named, gpus)) else "on ") + join(gpus)


def places(rows: list[Row]) -> dict[int, str]:
    """Where each of `rows` (compiled twins, each against its eager one) ran, by id, for a
    sentence: its GPU; its setup on its GPU where another of `rows` ran on the same GPU
    (compiled whole and per layer), else "NVIDIA H200 67.1 vs 93.1 ms and NVIDIA H200 85.7 vs
    93.1 ms" and "on both GPUs" said of one GPU."""
    gpus = [r.gpu for r in rows]
    return {id(r): f"{r.name} on {r.gpu}" if gpus.count(r.gpu) > 1 else r.gpu for r in rows}


def _named(place: str) -> bool:
    return " on " in place


def compiler(compile_mode: str) -> str:
    return "torch.compile" if compile_mode == "default" else f"torch.compile ({compile_mode})"


def with_attn(attn: str, pairs: list[tuple[Row, Row]], rest: str) -> str:
    """"With sdpa attention, " + rest; `rest` alone (capitalized) where the rows are a user's
    factory's, whose attention (held at its default) means nothing."""
    if all(is_factory(row.model) for pair in pairs for row in pair):
        return rest[:1].upper() + rest[1:] if not rest.startswith("torch") else rest
    return f"With {attn} attention, {rest}"


def variants(rows: list[Row], both_ok: bool = True) -> dict[tuple, list[tuple[Row, Row]]]:
    """{(attn, compile_mode): [(eager row, compiled row) per GPU]} in row order."""
    out: dict[tuple, list[tuple[Row, Row]]] = {}
    for row, twin in eager_twins(rows, both_ok):
        out.setdefault((row.attn, row.compile_mode), []).append((twin, row))
    return out


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


def best_per_gpu(rows: list[Row], value) -> list[Row]:
    """Per GPU, the row with the largest `value` among those that ran, whose losses agree and
    whose steps were not disturbed; best first."""
    best: dict[str, Row] = {}
    for row in rows:
        if row.ok and not row.departs and steady(row) and value(row) is not None and (
                row.gpu not in best or value(row) > value(best[row.gpu])):
            best[row.gpu] = row
    return sorted(best.values(), key=value, reverse=True)
