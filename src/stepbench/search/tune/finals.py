"""A tune's finals and its verdict: the guard's reference where the leaders' batches lack one,
more processes of the two best, interleaved, only as many as the test between them needs, and
the winner: the fastest setup that agrees and that no other measured setup is significantly
faster than (the report's test)."""

from __future__ import annotations

from stepbench.errors import first_line
from stepbench.noise import processes_disagree
from stepbench.search.tune.budget import BEAT
from stepbench.search.tune.measured import representative
from stepbench.search.tune.results import TuneResult, label
from stepbench.setup import Setup

FINAL_PROCESSES = 2    # processes per finalist before the test between them (the least it takes)
# Identical processes of one setup have differed by up to 17% (docs/architecture.md, "Measured
# reasons"): two setups further apart than this, and told apart by the test on one process
# each, need no more processes to say which is faster.
CLEAR_GAP = 0.25


def final(tuner) -> TuneResult:
    """The guard's reference at the leaders' batches where the ladder did not reach; then more
    processes of the two best, interleaved, until the test between them is significant or
    each has run `repeats`."""
    tuner.budget.finalizing = True
    for _ in range(4 * (tuner.repeats + 2)):
        before = len(tuner.seen.tried)
        for s in tuner.leaders():
            if tuner.reference_at(s.batch, s) is None:
                tuner.reference(s.batch, "reference", s)
        for s in wanted(tuner, finalists(tuner)):
            tuner.measure(s, "final")
        if len(tuner.seen.tried) == before:
            break
    order = ranked(tuner)
    for s in tuner.leaders():
        if s not in order:
            verdict = tuner.seen.verdict(s)
            tuner.skip(f"{label(s)}: not a finalist, the loss guard could not check it ("
                       f"{verdict.status if verdict else 'no losses'})")
    for s in order[1:]:
        if order and tuner.seen.faster(s, order[0]):
            mean, best = tuner.seen.mean_tokens(s), tuner.seen.mean_tokens(order[0])
            tuner.skip(f"{label(s)}: not the winner though its steps test faster, by the median: "
                       f"its mean is {mean:,.0f} {tuner.seen.unit}/s against the winner's {best:,.0f} (a "
                       "few slow steps); a tune never names a winner slower than a setup it "
                       "measured")
    return result(tuner, order)


def failed_reference(tuner) -> bool:
    """Whether the first reference failed with an error (not out of memory: the factory raised,
    the loss is no scalar...) and nothing ran: every other setup builds the same model and
    takes the same loss, so the tune measures nothing more and says why, in one line."""
    if (tuner.ladder_info or {}).get("batches"):
        return False
    runs = tuner.seen.processes(tuner.reference_setup(tuner.base.batch))
    failed = next((r for r in runs if r.status == "error"), None)
    if failed is None:
        return False
    tuner.skip(f"{label(failed.setup)} ended {failed.status}: {first_line(failed.error)}; nothing "
               "else was measured, as every setup builds the same model (its record keeps the "
               "traceback)")
    return True


def finalists(tuner) -> list[Setup]:
    """The two setups the finals measure more of: the two best, or, where a setup that the
    test finds faster than the best has fewer tokens/s by its mean (the test and the means
    disagree), the best and that one, so that more processes settle which is faster."""
    order = ranked(tuner)
    if not order:
        return []
    against = next((s for s in order[1:] if tuner.seen.faster(s, order[0])), None)
    return [order[0], against] if against is not None else order[:2]


def ranked(tuner) -> list[Setup]:
    """The setups that may win, fastest by mean tokens/s first, except that the first is one no
    other is significantly faster than by the report's test (where the test and the means
    disagree: a few slow steps), among those within BEAT of the most tokens/s: a tune never
    names a winner slower than a setup it measured (by a median step that a few very slow
    steps leave fast, under contention, the test alone would)."""
    seen = tuner.seen
    setups = sorted((s for s in seen.measured() if seen.acceptable(s)),
                    key=lambda s: -seen.mean_tokens(s))
    if tuner.objective == "fit":
        setups = [s for s in setups if s.batch == tuner.base.batch]
    close = [s for s in setups if seen.mean_tokens(s) * (1 + BEAT) >= seen.mean_tokens(setups[0])]
    for lead in close:
        # Only a setup near the lead by its median step can test faster than it.
        near = [o for o in close if o != lead and
                seen.rate_of(o) >= 0.95 * min(seen.rate_of(lead), seen.mean_tokens(lead))]
        if not any(seen.faster(o, lead) for o in near):
            return [lead] + [s for s in setups if s != lead]
    return setups


def wanted(tuner, pair: list[Setup]) -> list[Setup]:
    """Which of the two best need another process: one measured only under a disturbance;
    else, for the test between them, none where the
    test and their mean tokens/s both tell them apart, the same way, by more than identical
    processes differ (CLEAR_GAP); else FINAL_PROCESSES each first, then, while the test finds
    no difference or a setup's processes disagree, another each up to `repeats`."""
    seen = tuner.seen
    # A finalist measured only under a disturbance (a busy CPU: `‡`) is measured again, up to
    # `repeats` processes, before any test between the two: its quiet process replaces it.
    again = [s for s in pair if seen.disturbed(s) and len(seen.processes(s)) < tuner.repeats]
    if again or len(pair) < 2:
        return again
    result = seen.compare(*pair)
    means = seen.mean_tokens(pair[1]) / seen.mean_tokens(pair[0])   # a's time per token / b's
    if result is not None and result.significant and (means < 1) == (result.ratio < 1) and \
            not any(1 / (1 + CLEAR_GAP) < r < 1 + CLEAR_GAP for r in (result.ratio, means)):
        return []
    least = min(FINAL_PROCESSES, tuner.repeats)
    short = [s for s in pair if len(seen.processes(s)) < least]
    if short:
        return short
    result = seen.compare(*pair)
    unsettled = result is None or not result.significant or \
        any(processes_disagree(seen.ran(s)) for s in pair)
    if not unsettled:
        return []
    return [s for s in pair if len(seen.processes(s)) < tuner.repeats]


def result(tuner, order: list[Setup]) -> TuneResult:
    seen = tuner.seen
    winner = representative(seen.ran(order[0])) if order else None
    runner_up = representative(seen.ran(order[1])) if len(order) > 1 else None
    comparison = None
    if len(order) > 1:
        found = seen.compare(order[0], order[1])
        if found is not None:
            comparison = {"ratio": found.ratio, "p_value": found.p_value,
                          "significant": found.significant, "method": found.method,
                          "ci": list(found.ci) if found.ci else None}
    if not seen.tried:
        tuner.skip("nothing was measured")
    say_unmeasured(tuner, order[:2])
    reference = tuner.reference_at(winner.setup.batch, winner.setup) if winner else None
    said = tuner.said
    return TuneResult(
        tuner.objective, tuner.budget.total_s, tuner.spent_s(), winner, runner_up, seen.tried,
        said.skipped, winner.setup.command() if winner else None, comparison,
        bool(winner), reference, tuner.ladder_info, said.gains, said.earlier,
        {"winner": len(seen.processes(order[0])) if order else 0,
         "runner_up": len(seen.processes(order[1])) if len(order) > 1 else 0},
        [{"setup": c.setup.to_dict(), "why": c.why, "reason": c.reason}
         for c in said.unmeasured.values() if not seen.processes(c.setup)], ended=said.ended,
        host_bound=said.host_bound,
        disturbed=[label(s) for s in order[:2] if seen.disturbed(s)],
        unchecked=[label(s) for s in order[:1] if seen.unchecked(s)])


def say_unmeasured(tuner, leaders: list[Setup]) -> None:
    """One line for each candidate the budget could not pay for, and for each one change from
    the winner or the runner-up that was not worth measuring; a count of the rest (all of them,
    with their reasons, are in the result's `not_measured`)."""
    rest = 0
    for c in tuner.said.unmeasured.values():
        if tuner.seen.processes(c.setup) or c.why == "blocks":
            continue        # a model without repeated blocks: said once (Tuner.blockless)
        tuner.note_gain(c.gain)
        if c.why == "budget" or (c.parent in leaders and c.parent is not None):
            tuner.skip(f"{label(c.setup)}: not measured, {c.reason}")
        else:
            rest += 1
    if rest:
        tuner.skip(f"{rest} more candidate{'s' if rest > 1 else ''}, one change from slower "
                   "setups, not measured: they could not beat the best so far, would not "
                   "fit, or change to what failed elsewhere (the JSON's not_measured says "
                   "why for each)")
