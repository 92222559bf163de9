"""The noise flags that step times alone justify: high_cv, the spread of one process's steps (the
same rule in a setup's process and in the report), and process_spread, processes of one setup
that disagree (`processes_disagree`: the report's flag, and the rule by which `run` measures a
setup in a third process); and memory_spread, processes of one setup whose peak memory
disagrees (`peaks_disagree`, the report's).

The thresholds follow the spread seen between identical processes (docs/report.md;
docs/architecture.md, "Measured reasons"). Other flags come from NVML (measure/telemetry.py) and torch.compile
(measure/step.py).
"""

from __future__ import annotations

import math
import statistics
from itertools import combinations
from typing import Iterable, Sequence

CV_THRESHOLD = 0.05
# Processes disagree when their median steps are further apart than this share (of the faster)
# and than SPREAD_CVS times the larger within-process coefficient of variation: a gap the
# steps' own jitter cannot explain, and one large enough to change a reading of the table.
SPREAD_FLOOR = 0.03
SPREAD_CVS = 2.0
# Processes of one setup whose peak memory differs by more than this share (of the smaller).
MEMORY_SPREAD = 0.20

# The flags that say something outside the step disturbed the timed steps (another process
# took CPU or GPU time, the GPU slowed, torch.compile recompiled): such a row's step time is the
# disturbance's as much as the setup's, unlike spread (high_cv, process_spread), which a test
# on the steps measures.
DISTURBED = ("busy_cpu", "other_processes", "throttled", "clock_drop", "recompiled")


def disturbed(flags: Iterable[str]) -> bool:
    """Whether a row's step time carries a mark of DISTURBED (no finding compares or ranks
    such a row: the report lists it as untested)."""
    return not _DISTURBED.isdisjoint(flags)      # (asked tens of thousands of times)


_DISTURBED = frozenset(DISTURBED)


def coefficient_of_variation(values: Sequence[float]) -> float | None:
    """Sample standard deviation over mean; None for fewer than 2 values or a zero mean."""
    if len(values) < 2:
        return None
    mean = statistics.fmean(values)
    return statistics.stdev(values) / mean if mean else None


def noise_flags_for(step_times_ms: Sequence[float], cv_threshold: float = CV_THRESHOLD) -> list[str]:
    """["high_cv"] when the coefficient of variation is above `cv_threshold`; fewer than 2 values
    give no flag, since there is no spread to judge."""
    cv = coefficient_of_variation(step_times_ms)
    return ["high_cv"] if cv is not None and cv > cv_threshold else []


def processes_disagree(records: Sequence) -> bool:
    """Whether some two processes of one setup disagree (records that ran; each read by its
    `step_times_ms`, else its `step_ms`): their median steps more than SPREAD_FLOOR apart and
    more than SPREAD_CVS times the larger coefficient of variation of the two's steps. Fewer
    than two processes cannot disagree; a process without step times has no spread to add.

    The median, so that one slow step (a hiccup) does not make a process look slow; the gap is
    set against the steps' own spread, so that noisy processes are not called apart for a gap
    their steps span anyway."""
    timed = [t for t in (r.step_times_ms or ([r.step_ms] if r.step_ms else []) for r in records)
             if t]
    processes = [(statistics.median(t), t) for t in timed]
    return any(_apart(a, b) for a, b in combinations(processes, 2))


def _apart(a: tuple[float, Sequence[float]], b: tuple[float, Sequence[float]]) -> bool:
    """(median, step times) of two processes: further apart than the floor and than their
    noise (the coefficients of variation, computed only past the floor)."""
    (fast, _), (slow, _) = sorted((a, b), key=lambda p: p[0])
    if fast <= 0:
        return False
    gap = slow / fast - 1
    if not gap > SPREAD_FLOOR:
        return False
    noise = SPREAD_CVS * max(_quick_cv(a[1]), _quick_cv(b[1]))
    if abs(gap - noise) > _QUICK_MARGIN * max(gap, noise):
        return gap > noise
    # Within a rounding error of the line: the exact coefficients decide (statistics.stdev's
    # exact sum is slow, and a report asks this of thousands of rows).
    return gap > SPREAD_CVS * max(coefficient_of_variation(a[1]) or 0.0,
                                  coefficient_of_variation(b[1]) or 0.0)


# _quick_cv is within a few units of the last bit of coefficient_of_variation, never this far.
_QUICK_MARGIN = 1e-9


def _quick_cv(values: Sequence[float]) -> float:
    """coefficient_of_variation in floating point (math.fsum's sums; 0.0 where that gives
    None)."""
    n = len(values)
    if n < 2:
        return 0.0
    mean = math.fsum(values) / n
    if not mean:
        return 0.0
    return math.sqrt(math.fsum((x - mean) ** 2 for x in values) / (n - 1)) / mean


def peaks_disagree(records: Sequence) -> bool:
    """Whether the peak memory of some two processes of one setup (records that ran) differs by
    more than MEMORY_SPREAD of the smaller."""
    peaks = [r.peak_memory_gb for r in records if r.peak_memory_gb]
    return len(peaks) > 1 and max(peaks) > (1 + MEMORY_SPREAD) * min(peaks)
