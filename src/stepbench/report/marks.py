"""The marks placed after a step time, and the footnotes that explain them.

Every table with a step time (the results, `run`'s table, a tune's) marks it the same way, so
that "*" means one thing wherever it appears.
"""

from __future__ import annotations

from typing import Iterable

# One mark per noise flag; a flag without a mark is named in the details instead.
_SLOWED = ("†", "the GPU reported throttling or its SM clock dropped by over 10% during the "
                "timed steps")
NOISE_MARKS = {
    "high_cv": ("*", "step times varied by more than 5% (coefficient of variation)"),
    "process_spread": ("~", "its processes disagreed: their median steps were more than 3% apart, "
                            "and more than twice the larger within-process coefficient of "
                            "variation; the step time is the median of their means"),
    "throttled": _SLOWED,
    "clock_drop": _SLOWED,
    "other_processes": ("‡", "other processes were using the GPU"),
    "recompiled": ("§", "torch.compile recompiled during the timed steps"),
}
# What torch.compile did beyond one graph compiled once (not noise: a property of the setup
# that the details and the record explain).
COMPILE_MARK = ("¶", "torch.compile split the model at graph breaks or recompiled it after the "
                "first step (counts in the details)")
# A row the loss guard flagged (stepbench.guard): its losses left its reference's tolerance.
DEPARTS_MARK = "!"


def noise_marks(flags: Iterable[str]) -> list[str]:
    """The marks of `flags` (a record's or a row's noise flags), each once, in their order."""
    return list(dict.fromkeys(NOISE_MARKS[f][0] for f in flags if f in NOISE_MARKS))


def mark_notes(flag_lists: Iterable[Iterable[str]], compiled: bool = False) -> list[str]:
    """The footnotes of the noise marks used in `flag_lists` (one list per row), then the
    compile mark's when `compiled` (some row split or recompiled)."""
    used = dict.fromkeys(NOISE_MARKS[f] for flags in flag_lists for f in flags
                         if f in NOISE_MARKS)
    if compiled:
        used[COMPILE_MARK] = None
    return [f"{mark} {meaning}." for mark, meaning in used]
