"""The marks placed after a step time (and after a peak memory), and the footnotes that explain
them; which marks keep two rows from being compared (noise.DISTURBED, `disturbed_marks`).

Every table with a step time (the results, `run`'s table, a tune's) marks it the same way, so
that "*" means one thing wherever it appears.
"""

from __future__ import annotations

from typing import Iterable

from stepbench.noise import DISTURBED

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
    "busy_cpu": ("‡", "other processes took more than a tenth of the CPU time its threads "
                      "needed during the timed steps"),
    "recompiled": ("§", "torch.compile recompiled during the timed steps"),
    "host_bound": ("^", "host-bound: the GPU finished each step right after the host launched "
                        "its last kernel (the host's lead under 5% of a step), so the number is "
                        "the host's CPU speed as much as the GPU's"),
}
# After a row's peak memory: its processes' peaks disagreed (noise.peaks_disagree).
MEMORY_MARK = ("~", "after Peak memory: its processes' peaks differed by more than 20%; the "
                    "largest is shown")
MEMORY_FLAG = "memory_spread"




# What torch.compile did beyond one graph compiled once (not noise: a property of the setup
# that the details and the record explain).
COMPILE_MARK = ("¶", "torch.compile split the model at graph breaks, recompiled it after the "
                "first step, or left code eager at its recompile limit (counts in the details)")
# A row the loss guard flagged (stepbench.guard): its losses left its reference's tolerance.
DEPARTS_MARK = "!"


def disturbed_marks(*rows) -> str:
    """The marks of what disturbed any of `rows`' timed steps (rows or records: their
    noise_flags; DISTURBED), in the order first seen; "" where nothing did."""
    return "".join(dict.fromkeys(NOISE_MARKS[f][0] for row in rows for f in row.noise_flags
                                 if f in DISTURBED))


def noise_marks(flags: Iterable[str]) -> list[str]:
    """The marks of `flags` (a record's or a row's noise flags), each once, in their order."""
    return list(dict.fromkeys(NOISE_MARKS[f][0] for f in flags if f in NOISE_MARKS))


def mark_notes(flag_lists: Iterable[Iterable[str]], compiled: bool = False) -> list[str]:
    """The footnotes of the noise marks used in `flag_lists` (one list per row), then the
    compile mark's when `compiled` (some row split or recompiled), then the peak memory's."""
    flag_lists = [list(flags) for flags in flag_lists]
    used = dict.fromkeys(NOISE_MARKS[f] for flags in flag_lists for f in flags
                         if f in NOISE_MARKS)
    if compiled:
        used[COMPILE_MARK] = None
    if any(MEMORY_FLAG in flags for flags in flag_lists):
        used[MEMORY_MARK] = None
    return [f"{mark} {meaning}." for mark, meaning in used]
