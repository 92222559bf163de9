"""The loss guard: a fast setup that trains a different model is not a faster way to train it.

Setups of one model, seed, batch and sequence length start from the same weights and train on
the same tokens, whatever their mode, attention kernel, precision, fused kernels, checkpointing
or optimizer implementation. So their losses must agree step for step, up to rounding: within a
relative tolerance set by the precision (`TOLERANCE`). A setup whose losses depart from its
reference is flagged; the report says so, and a search over setups (`tune`) must never pick it. This
is the only loss check: the report's word on a compiled setup against eager mode is the guard's
verdict against its eager twin.

A compiled setup is checked against its eager twin (`Setup.eager_twin()`: the same setup in
eager mode) where that twin ran and may be a reference: what compilation changes, and nothing
else. Every other setup is checked against the eager setup of the same model, seed, batch and
sequence on the same GPU, with no fused kernels and no float8 (the plainest: bf16, sdpa, fused
AdamW, no checkpointing, first); a setup of another precision against the eager setup of its own
precision where there is one, and that one against the reference. Where there is no eager
setup, a setup departs when it disagrees with most of its peers.
A step that draws random numbers (dropout: `Record.draws_random`) draws them differently eager
and compiled (inductor's own generator): such a compiled setup and an eager one are not compared,
their verdict `unchecked` and `random`; eager setups draw alike and are compared as any.
Losses are compared over the steps both ran (the first step and every step after it), so
setups with other warm-up or timed step counts are still peers. Reads records only (no torch).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from stepbench.axes import AXES
from stepbench.record import Record
from stepbench.setup import Setup
from stepbench.units import percent
from stepbench.workload.spec import DECLARABLE_AXES, param_parts

DECLARED = set(DECLARABLE_AXES.values())    # the keywords a factory takes them by

# Relative tolerance on a loss, per precision. bf16 keeps about 3 significant digits (8-bit
# mantissa) and fused kernels round in another order, so losses drift apart over the steps;
# fp32 keeps about 7. float8 (e4m3 matmul inputs, 3-bit mantissa) rounds the linear layers'
# products much more coarsely than bf16. Two setups are held to the looser of their two.
TOLERANCE = {"bf16": 2e-2, "fp16": 1e-2, "fp32": 1e-4, "autocast-bf16": 2e-2, "float8": 5e-2,
             "mixed-bf16": 2e-2}
# The dtype a precision keeps its weights in. AdamW's updates (lr 1e-4) are rounded to the
# weights' dtype, so setups whose weights differ in dtype train apart after the first step
# (docs/architecture.md, "Measured reasons"). Between them only the first loss, the same
# weights' forward, is compared; curves are compared between setups whose weights share a dtype.
WEIGHTS = {"bf16": "bf16", "float8": "bf16", "fp16": "fp16", "fp32": "fp32",
           "autocast-bf16": "fp32", "mixed-bf16": "fp32"}

OK, DEPARTS, REFERENCE, UNCHECKED = "ok", "departs", "reference", "unchecked"


def loss_tolerance(setup: Setup) -> float:
    return TOLERANCE.get(setup.dtype, TOLERANCE["bf16"])


@dataclass(frozen=True)
class Verdict:
    """The guard's word on one setup on one GPU."""

    status: str                       # ok, departs, reference (it is the others' reference),
                                      # unchecked (no reference and no peers to vote)
    reference: str | None = None      # the setup it was checked against, or "N of M peers"
    first_rel_diff: float | None = None   # |first loss - reference's| / reference's
    max_rel_diff: float | None = None     # largest such difference over the common steps
    step: int | None = None           # index (0 = first step) of that largest difference
    loss: float | None = None         # this setup's loss at that step
    reference_loss: float | None = None
    tolerance: float | None = None
    steps: int | None = None          # how many steps were compared
    first_loss: float | None = None
    reference_first_loss: float | None = None
    by_peers: bool = False            # no eager reference: judged by a vote of its peers
    random: bool = False              # unchecked: its step or its reference's draws random
                                      # numbers, and one of them is compiled (draws_random)

    @property
    def departs(self) -> bool:
        return self.status == DEPARTS

    @property
    def first_only(self) -> bool:
        """Only the first loss was compared (the weights are kept in another dtype)."""
        return self.steps == 1

    def describe(self, name: str | None = None) -> str:
        """One sentence: how `name`'s losses compare with the reference's; without a name
        ("its losses ..."), for a sentence that has named the setup already."""
        whose = f"{name}'s" if name else "its"
        if self.status == DEPARTS and self.reference_loss is not None:
            if self.first_rel_diff is not None and not self.first_rel_diff <= self.tolerance:
                where, mine, theirs = "first loss", self.first_loss, self.reference_first_loss
                apart = self.first_rel_diff
            else:
                where = f"loss at step {self.step + 1}"
                mine, theirs = self.loss, self.reference_loss
                apart = self.max_rel_diff
            return (f"{whose} {where} is {mine:.4g} against {theirs:.4g} for "
                    f"{self.reference} ({percent(apart)} apart, tolerance "
                    f"{percent(self.tolerance)})")
        if self.status == DEPARTS:
            return f"{whose} losses disagree with {self.reference}"
        if self.random:
            return (f"{whose} losses were not compared with {self.reference}: the step draws "
                    "random numbers (dropout), which compiled code draws apart from eager; "
                    "set its dropout to 0 (a --param) for the guard to compare them")
        if self.status == OK:
            what = ("first loss agrees" if self.first_only
                    else f"losses agree over {self.steps} steps")
            return (f"{whose} {what} with {self.reference} within "
                    f"{percent(self.max_rel_diff)} (tolerance {percent(self.tolerance)})")
        return f"{name}: {self.status}" if name else self.status


def peers_key(setup: Setup, gpu: str) -> tuple:
    """What must be equal for two setups to start from the same weights and tokens: the
    registry's `start` fields (model, seed, batch, seq, device, where the weights are drawn, how
    the job is spread: its ranks train other tokens than one process). A factory's declared
    axes (`attn`, `kernels`, passed through its params) are how its step runs, not which model
    it trains: setups that differ only there are peers, as a transformers model's are."""
    return (gpu, *(_without_declared(setup.params) if a.name == "params" else getattr(setup, a.name)
                   for a in AXES if a.start))


def _without_declared(params: str | None) -> str | None:
    kept = [name if value is None else f"{name}={value}" for name, value in param_parts(params)
            if name not in DECLARED]
    return ";".join(kept) or None


def _declared(setup: Setup) -> dict:
    """A factory's declared axes and the values its params pass them ({} for any other)."""
    return {name: value for name, value in param_parts(setup.params)
            if value is not None and name in DECLARED}


def losses_of(record: Record) -> list[float]:
    if record.losses:
        return list(record.losses)
    return [record.loss_first] if record.loss_first is not None else []


def weights_of(setup: Setup) -> str:
    return WEIGHTS.get(setup.dtype, setup.dtype)


def compare(a: list[float], b: list[float], tolerance: float,
            first_only: bool = False) -> Verdict | None:
    """a's losses against b's over their common steps (or the first step alone); None when there
    is nothing to compare."""
    steps = min(len(a), len(b), 1 if first_only else len(a))
    if not steps:
        return None
    diffs = [abs(x - y) / abs(y) if y else abs(x - y) for x, y in zip(a[:steps], b[:steps])]
    worst = max(range(steps), key=diffs.__getitem__)
    bad = any(d != d for d in diffs) or diffs[worst] > tolerance   # NaN departs
    return Verdict(DEPARTS if bad else OK, first_rel_diff=diffs[0], max_rel_diff=diffs[worst],
                   step=worst, loss=a[worst], reference_loss=b[worst], tolerance=tolerance,
                   steps=steps, first_loss=a[0], reference_first_loss=b[0])


def _rank(setup: Setup, steps: int, index: int):
    """Plainest first, by the registry's `plain` values (bf16, sdpa, no checkpointing, fused
    AdamW; axes.AXES, in their `plain_rank` order); of equally plain ones, the one that ran the
    most steps, so that a longer run is checked over all its steps (a tune's 25-step finals
    against a 25-step reference, not against its probes' 8)."""
    declared = _declared(setup)
    plainness = tuple(declared.get(a.name, getattr(setup, a.name)) not in a.plain
                      for a in PLAIN_AXES)
    return (*plainness, -steps, index)


def can_be_reference(setup: Setup) -> bool:
    """Every field at a value a reference may have (the registry's `reference` values): eager
    mode, the model's own kernels, no float8: the plainest way to run the step."""
    return all(getattr(setup, a.name) in a.reference for a in AXES if a.reference)


PLAIN_AXES = sorted((a for a in AXES if a.plain), key=lambda a: a.plain_rank)


def loss_verdicts(records: list[Record]) -> dict[tuple[str, str], Verdict]:
    """{(setup key, GPU): Verdict} for every setup that ran (status ok) in `records`.

    A setup measured in several processes is judged by its first ok record: same seed, same
    weights, and the processes of one setup agree with each other far inside the tolerance.
    """
    first: dict[tuple[str, str], tuple[Setup, list[float]]] = {}
    random = set()
    for record in records:
        key = (record.setup.key(), record.machine.gpu)
        if record.status == "ok" and key not in first and losses_of(record):
            first[key] = (record.setup, losses_of(record))
        if record.draws_random:
            random.add(key)
    groups: dict[tuple, list[tuple[str, str]]] = {}
    for key, (setup, _) in first.items():
        groups.setdefault(peers_key(setup, key[1]), []).append(key)
    verdicts = {}
    for keys in groups.values():
        verdicts.update(_judge_group(keys, first, random))
    return verdicts


def _draw_apart(a: tuple, b: tuple, first, random: set) -> bool:
    """Setups `a` and `b` (keys of `first`) draw their random numbers differently: one is
    compiled and the other not, and a step of either drew some."""
    return bool({a, b} & random) and first[a][0].mode != first[b][0].mode


def _judge_group(keys, first, random: set = frozenset()) -> dict:
    """The group's reference is its plainest eager setup (`_rank`). A compiled setup whose eager
    twin is a candidate is checked against that twin; every other setup against the plainest
    eager setup of its own precision (which keeps fp32's tight tolerance among fp32 setups),
    else of its weights' dtype, else against the group's reference: curves where the weights
    share a dtype, the first loss where they do not. An eager candidate is checked against
    candidates ranked before it, so that no two check only each other."""
    out = {}
    candidates = sorted(((i, k) for i, k in enumerate(keys) if can_be_reference(first[k][0])),
                        key=lambda c: _rank(first[c[1]][0], len(first[c[1]][1]), c[0]))
    if not candidates:
        return {key: _by_majority(key, keys, first, random) for key in keys}
    main = candidates[0][1]
    for key in keys:
        setup, losses = first[key]
        if key == main:
            out[key] = Verdict(REFERENCE, tolerance=loss_tolerance(setup))
            continue
        # A candidate is checked against those ranked before it only: every chain of
        # references ends at the group's reference.
        order = [k for _, k in candidates]
        before = order[:order.index(key)] if key in order else order
        ref_key = _twin(setup, key[1], order) or _alike(setup, before, first) or main
        ref_setup, ref_losses = first[ref_key]
        tolerance = max(loss_tolerance(setup), loss_tolerance(ref_setup))
        if _draw_apart(key, ref_key, first, random):
            out[key] = Verdict(UNCHECKED, reference=_label(ref_setup, setup), tolerance=tolerance,
                               random=True)
            continue
        verdict = compare(losses, ref_losses, tolerance,
                          first_only=weights_of(ref_setup) != weights_of(setup))
        out[key] = (Verdict(UNCHECKED, tolerance=tolerance) if verdict is None else
                    _with_reference(verdict, _label(ref_setup, setup)))
    return out


def _twin(setup: Setup, gpu: str, candidates: list) -> tuple[str, str] | None:
    """The candidate that is `setup`'s eager twin on `gpu`, or None (not compiled, or its twin
    did not run or may not be a reference)."""
    if setup.mode == "eager":
        return None
    twin = (setup.eager_twin().key(), gpu)
    return twin if twin in candidates else None


def _alike(setup: Setup, before: list, first) -> tuple[str, str] | None:
    """The first of `before` (ranked candidates) of `setup`'s precision, else of its weights'
    dtype, or None."""
    for alike in (lambda other: other.dtype == setup.dtype,
                  lambda other: weights_of(other) == weights_of(setup)):
        found = [k for k in before if alike(first[k][0])]
        if found:
            return found[0]
    return None


def _label(reference: Setup, setup: Setup) -> str:
    declared = _declared(reference)
    name = reference.name + (f" {';'.join(f'{k}={v}' for k, v in declared.items())}"
                             if declared else "")
    if reference.dtype == setup.dtype:
        return name
    return f"{name} ({reference.dtype})"


def _with_reference(verdict: Verdict, reference: str) -> Verdict:
    return dataclasses.replace(verdict, reference=reference)


def _by_majority(key, keys, first, random: set) -> Verdict:
    """No eager reference: the setup departs when it disagrees with more than half of its peers
    (with one peer and a disagreement, neither can be trusted, so both depart)."""
    setup, losses = first[key]
    others = [k for k in keys if k != key and not _draw_apart(key, k, first, random)]
    if not others:
        apart = len(keys) > 1      # it has peers, but they draw their random numbers apart
        return Verdict(UNCHECKED, tolerance=loss_tolerance(setup), random=apart,
                       reference="its peers" if apart else None)
    results = []
    for other in others:
        other_setup, other_losses = first[other]
        tolerance = max(loss_tolerance(setup), loss_tolerance(other_setup))
        verdict = compare(losses, other_losses, tolerance,
                          first_only=weights_of(other_setup) != weights_of(setup))
        if verdict is not None:
            results.append(verdict)
    if not results:
        return Verdict(UNCHECKED, tolerance=loss_tolerance(setup))
    agree = [v for v in results if v.status == OK]
    departs = len(results) - len(agree) > len(results) / 2 or (len(results) == 1 and not agree)
    closest = min(results, key=lambda v: v.max_rel_diff if v.max_rel_diff == v.max_rel_diff
                  else float("inf"))
    peers = f"{len(agree)} of {len(results)} peers (no eager reference)"
    return dataclasses.replace(closest, status=DEPARTS if departs else OK, reference=peers,
                               by_peers=True)
