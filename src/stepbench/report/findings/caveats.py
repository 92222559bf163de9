"""What to trust: setups whose losses depart (or that every one agreed), results from mixed
software, how the differences were tested, and the comparisons left out because both sides
were disturbed."""

from __future__ import annotations

from stepbench.guard import OK
from stepbench.report.findings.words import (WRONG_LOSS, Finding, best_per_gpu, attention_pairs,
                                             counted, every, join, memory_told, steady, told,
                                             variants)
from stepbench.report.marks import disturbed_marks
from stepbench.report.rows import Row
from stepbench.report.table import sig
from stepbench.units import percent


def loss_guard(rows: list[Row]) -> list[Finding]:
    """Setups whose losses depart from their reference's (stepbench.guard): fast or not, they
    train something else, and the rankings (words.best_per_gpu, the fastest setup) and
    compile_payback leave them out; the sentence names each, as a reader sees a better MFU or
    energy in the details."""
    return [Finding("loss_guard", f"{r.row_label()}: {r.loss_guard.describe()}; its "
                    "numbers do not describe training this model, so it is left out of the "
                    "rankings (fastest setup and GPU, per dollar, MFU, energy) and of the "
                    "compile payback.",
                    frozenset({WRONG_LOSS}))
            for r in rows if r.departs]


def loss_guard_random(rows: list[Row]) -> list[Finding]:
    """Setups the loss guard could not check because their step draws random numbers (dropout)
    and they or their reference are compiled: not a departure, but not a checked loss either
    (a tune may still name one the winner, saying so)."""
    return [Finding("loss_guard", f"{r.row_label()}: {r.loss_guard.describe()}.")
            for r in rows if r.loss_guard is not None and r.loss_guard.random]


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
    by_speed = best_per_gpu(rows, lambda r: r.tokens_per_s)
    pairs += [tuple(by_speed[:2])] if len(by_speed) >= 2 else []
    if not pairs:
        return []
    methods = [a.test_method(b) for a, b in pairs]
    untested = sum(m is None for m in methods)
    if untested == len(pairs):
        return [Finding("testing", "The records hold no per-step times and too few processes "
                        "per setup, so the differences above are stated as measured, untested "
                        "against noise.")]
    used = [TESTS[m] for m in TESTS if m in set(methods)]
    # Each way is a clause of its own (it has its own "and"s): joined by "and", two read as one
    # ("... excludes 1 and p < 0.05 and with a Mann-Whitney U test and ...").
    text = ("Differences were tested " + used[0] if len(used) == 1 else
            f"Differences were tested in {len(used)} ways: " + "; ".join(used))
    if untested:
        text += (f"; {untested} of {len(pairs)} comparisons had too few step times or "
                 "processes to test (e.g. one process without per-step times) and are stated "
                 "as measured")
    return [Finding("testing", text + ".")]


# How each kind of stats.Comparison was tested, for the `testing` finding.
TESTS = {
    "processes": ("by their processes where both setups ran two or more, with a hierarchical "
                  "bootstrap (processes resampled, then the steps within each) of the ratio of "
                  "mean step times, significant when its 95% interval excludes 1 and p < 0.05"),
    "means": ("with a Mann-Whitney U test and a 95% bootstrap interval of the ratio of medians "
              "on per-process means where the records kept no per-step times, significant when both "
              "agree (p < 0.05, the interval excludes 1)"),
    "steps": ("with a Mann-Whitney U test and a 95% bootstrap interval of the ratio of medians "
              "on per-step times where a setup ran one process, significant when both agree "
              "(p < 0.05, the interval excludes 1), which misses the spread between processes"),
}


def untested(rows: list[Row]) -> list[Finding]:
    """The comparisons the rules above leave out because a setup's steps were disturbed: their
    step times (compiled against eager, attention kernels, eager against compiled); the rows
    left out of the rankings (fastest setup and GPU, per dollar, MFU, energy, compile time, the
    host); and peak memory where both sides' processes disagreed on it (compiled against
    eager)."""
    pairs: dict[frozenset, tuple[Row, Row]] = {}
    for group in variants(rows).values():
        pairs.update({frozenset((id(c), id(e))): (c, e) for e, c in group if not told(c, e)})
    for group in attention_pairs(rows).values():
        pairs.update({frozenset((id(a), id(b))): (a, b) for a, b in group if not told(a, b)})
    for eager in (r for r in rows if r.mode == "eager" and r.ok):
        for comp in (r for r in rows if r.mode == "compile" and r.ok and r.gpu == eager.gpu):
            if not told(eager, comp):
                pairs[frozenset((id(eager), id(comp)))] = (eager, comp)
    out = []
    if pairs:
        items = [f"{a.name} against {b.name}" + (f" on {a.gpu}" if a.gpu == b.gpu else
                                                   f" ({a.gpu} against {b.gpu})")
                 + f" ({sig(a.step_ms)} vs {sig(b.step_ms)} ms)" for a, b in pairs.values()]
        marks = disturbed_marks(*(r for pair in pairs.values() for r in pair))
        out.append(Finding("untested", "Not compared, because something outside the step "
                           f"disturbed a setup's timed steps ({marks}, see the "
                           "notes): " + join(items) + "."))
    left = [r for r in rows if r.ok and not r.departs and not steady(r)]
    if left:
        out.append(Finding("untested", "Left out of the fastest setup and GPU, "
                           f"{counted(rows)} per dollar, MFU, energy, compile time and where the "
                           "host set the pace, "
                           f"because their timed steps were disturbed ({disturbed_marks(*left)}): "
                           + join([f"{r.name} on {r.gpu} ({sig(r.step_ms)} ms)" for r in left])
                           + "; measure them again on a quiet machine."))
    memory = [(c, e) for group in variants(rows).values() for e, c in group
              if c.peak_memory_gb and e.peak_memory_gb and not memory_told(c, e)]
    if memory:
        out.append(Finding("untested", "Peak memory not compared, because both setups' "
                           "processes disagreed on it by more than 20%: " + join(
                               [f"{c.name} against {e.name} on {c.gpu}" for c, e in memory])
                           + "."))
    return out
