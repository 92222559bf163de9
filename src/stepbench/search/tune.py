"""`stepbench tune`: the fastest setup of one model on this machine, found within a time budget.

A search, not a matrix: it proposes setups, has each measured in its own process by the same
Runner and executor as `run` (every probe is a record in the results file, tagged `search`, so an
interrupted tune resumes and `stepbench report` shows it), reads the records and decides what to
try next. The stages (docs/tune.md says the same for users):

screen   every attention kernel at the start batch in eager mode (cheap: nothing compiles), then
         torch.compile with each kernel eager mode did not rule out (a failed kernel; the plain
         "eager" attention once a fused kernel beat it);
batch    the best (mode, attention) pair grows by doubling the batch until a probe runs out of
         memory or the doubling buys less than GAIN more tokens/s; then one bisection step
         between its largest fit and its out-of-memory batch;
options  one change at a time on the best setup so far (CUDA graphs, fused kernels, float8,
         foreach AdamW, per-layer compile, autotuning, activation checkpointing to pass the
         memory limit); a change is kept when it is faster by GAIN and its losses agree;
batch    the second best pair grows the same way, if the budget allows;
final    the two best setups measured in full, with repeats (interleaved), and a significance
         test between them.

The loss guard (guard.py) checks every probe against the eager reference of its batch, which the
tune measures where it is missing; a setup whose losses depart is never picked and its option is
not tried further. Probes are compared by their median timed step (`rate`): a probe times a
few steps, and one slow step must not decide. The budget counts the wall time of every probe the
tune used (stored ones included) plus this invocation's own time; every probe's timeout is what
the budget has left, so a tune ends within its budget. What it found is a TuneResult; the
report draws it (report/tune.py), the search only decides.

Objective "fit": the fastest setup at the given batch whose step fits under --memory-limit-gb
(the cap stands in for a smaller card); the batch is not grown and checkpointing is an option.
"""

from __future__ import annotations

import collections
import dataclasses
import statistics
import time
from dataclasses import dataclass
from typing import Callable

from stepbench import stats
from stepbench.axes import AXES, axis
from stepbench.guard import OK, REFERENCE, can_be_reference, loss_verdicts
from stepbench.record import Record
from stepbench.settings import SEARCHED
from stepbench.setup import Setup

GAIN = 0.03            # a doubling or an option must buy this much more tokens/s to count
BATCH_LIMIT = 4096     # no batch search beyond this
# A probe: warm-up and timed steps (a GPU's steps are short; a CPU's are not).
PROBE_STEPS = {"cuda": (2, 5), "cpu": (1, 3)}
# Before any record says otherwise, what a probe's process is expected to take (s): eager,
# compiled, autotuned.
PRIOR_S = {"cuda": {"eager": 30.0, "compile": 90.0, "autotune": 420.0},
           "cpu": {"eager": 12.0, "compile": 40.0, "autotune": 120.0}}
FINALISTS = 2
# A compile's first step with the inductor cache warm, as a share of its cold one
# (benchmarks/README.md, section g).
WARM_COMPILE_SHARE = 0.25
FUSED_ATTENTIONS = ("sdpa", "flash_attention_2", "flash_attention_3", "flex_attention")

# What the tune may vary: axis name -> the values it searches, the start value first (the
# registry's axes with a `tune` stage, axes.AXES).
Space = dict


def default_space(device: str) -> tuple[Space, dict[str, list[str]]]:
    """Every value of every searched axis this machine can run, and, by axis, a note for each
    value left out and why."""
    space, notes = {}, {}
    for a in AXES:
        if a.tune in SEARCHED:
            space[a.name], notes[a.name] = a.searched(device)
    return space, notes


def space_for(settings) -> tuple[Space, list[str]]:
    """The search space of a tune's settings: what this machine runs, narrowed by the axis flags
    given (a narrowed axis has no notes: the flag chose its values)."""
    space, notes = default_space(settings.device)
    for name, values in settings.space.items():
        space[name] = list(values)
        notes.pop(name)
    return space, [text for texts in notes.values() for text in texts]


def start(settings, space: Space) -> Setup:
    """The setup a tune starts from: eager mode, each searched axis at its start value, the
    others as the settings hold them."""
    fields = {**settings.values, **{name: values[0] for name, values in space.items()}}
    return Setup(**{**fields, "mode": "eager"}).check()


@dataclass
class Tried:
    """One probe or final measurement the tune used, with why and what came of it."""

    stage: str
    record: Record


@dataclass
class TuneResult:
    objective: str
    budget_s: float
    spent_s: float
    winner: Record | None
    runner_up: Record | None
    tried: list[Tried]
    skipped: list[str]          # what was not tried, and why (budget, pruning, this machine)
    command: str | None         # the `stepbench run` that measures the winner again
    comparison: dict | None     # winner against runner-up: ratio, p_value, significant
    measured_in_full: bool      # the winner comes from the final stage, not from a probe
    reference: Record | None = None   # the loss guard's eager reference at the winner's batch,
                                      # measured in full (the winner's losses were checked on it)
    stopped: bool = False       # stopped (Ctrl-C, SIGTERM, SIGHUP) before it chose: no winner

    def to_dict(self) -> dict:
        return {"winner": self.winner.to_dict() if self.winner else None,
                "runner_up": self.runner_up.to_dict() if self.runner_up else None,
                "tried": [t.record.to_dict() for t in self.tried],
                "command": self.command, "objective": self.objective,
                "budget_s": self.budget_s, "spent_s": round(self.spent_s, 1),
                "comparison": self.comparison, "measured_in_full": self.measured_in_full,
                "reference": self.reference.to_dict() if self.reference else None,
                "skipped": self.skipped, "stopped": self.stopped}

    @classmethod
    def from_dict(cls, data: dict) -> "TuneResult":
        """A tune's `--format json` object read back, to render it again (each tried record's
        stage is in its `search` tag: a probe's stage, else its role, "final")."""
        def record(value):
            return Record.from_dict(value) if value else None

        tried = []
        for value in data["tried"]:
            r = Record.from_dict(value)
            tag = r.search or {}
            tried.append(Tried(tag.get("stage") or tag.get("role") or "?", r))
        return cls(data["objective"], data["budget_s"], data["spent_s"], record(data["winner"]),
                   record(data["runner_up"]), tried, list(data["skipped"]), data["command"],
                   data["comparison"], data["measured_in_full"], record(data.get("reference")),
                   data.get("stopped", False))


class Tuner:
    """The search. `runner` is a Runner (or anything with its run(), run_id and store): the tune
    only proposes setups and reads the records it returns."""

    def __init__(self, runner, base: Setup, space: Space, *, budget_s: float, objective: str,
                 timeout_s: float, repeats: int = 3, final_steps: tuple[int, int] = (4, 20),
                 probe_steps: tuple[int, int] | None = None, skipped: list[str] | None = None,
                 clock: Callable[[], float] = time.monotonic, display=None,
                 say: Callable[[str], None] = lambda text: None):
        # (Imported here: the report reads TuneResult and never runs anything.)
        from stepbench.execute.progress import SearchView
        from stepbench.execute.runner import NullDisplay

        self.runner = runner
        # Each process numbered across the tune ("probe 5", "final 2"), each finished one with
        # the budget left (execute/progress.py).
        self.display = SearchView(display or NullDisplay(), budget_left=lambda: self.left_s())
        self.space = space
        self.budget_s = budget_s
        self.objective = objective
        self.timeout_s = timeout_s
        self.repeats = repeats
        self.final_steps = final_steps
        warmup, steps = probe_steps or PROBE_STEPS[base.device]
        self.base = dataclasses.replace(base, warmup=warmup, steps=steps)
        self.clock = clock
        self.start = clock()
        self.say = say
        # (setup key, repeat) of what the results file already holds: measured for free.
        stored = runner.store.latest()
        self.stored = {(r.setup.key(), r.repeat) for r in stored}
        # The budget counts what an earlier, interrupted tune of this model spent, from the
        # start (so a resumed tune knows what it has left before it replays anything), and
        # any other stored record once the tune uses it.
        mine = [r for r in stored if (r.search or {}).get("kind") == "tune"
                and (r.setup.model, r.setup.seq, r.setup.device) ==
                (base.model, base.seq, base.device)]
        self.stored_spent_s = sum(r.wall_s or 0.0 for r in mine)
        self.counted = {(r.setup.key(), r.repeat) for r in mine}
        self.tried: list[Tried] = []
        self.by_key: dict[str, Record] = {}
        self.skipped: list[str] = list(skipped or [])
        self.oom_batch: dict[tuple, int] = {}   # (mode, attn) -> the batch that ran out of memory
        self._verdicts: dict | None = None      # the loss guard over `tried`, until it grows
        self.finalizing = False                 # in the final stage: no reserve kept back

    # ------------------------------------------------------------ budget

    def spent_s(self) -> float:
        return self.stored_spent_s + (self.clock() - self.start)

    def left_s(self) -> float:
        return self.budget_s - self.spent_s()

    def estimate_s(self, setup: Setup) -> float:
        """What a probe of `setup` will take: the slowest like it so far (same mode, compile
        mode and steps; of those, the same precision's where there are any, since one slow
        precision's compile must not price the others out of the budget), else the prior."""
        kind = ("autotune" if setup.compile_mode.startswith("max-autotune")
                else "compile" if setup.mode == "compile" else "eager")
        like = [t.record for t in self.tried if t.record.wall_s
                and t.record.setup.mode == setup.mode
                and t.record.setup.compile_mode == setup.compile_mode
                and t.record.setup.steps == setup.steps]
        same_dtype = [r for r in like if r.setup.dtype == setup.dtype]
        return (max(r.wall_s for r in same_dtype or like) if like
                else PRIOR_S[setup.device][kind])

    def final_reserve_s(self) -> float:
        """Budget kept back for the final stage while probing: two finalists, `repeats` each,
        as long as the best probe took plus its extra steps, and the loss guard's reference
        in full (at most half the budget)."""
        best = self.best()
        if best is None:
            return 0.0
        reference = self.reference_probe(best.setup.batch)
        return min(self.budget_s / 2, FINALISTS * self.repeats * self.final_cost_s(best)
                   + (self.final_cost_s(reference) if reference else 0.0))

    def final_cost_s(self, record: Record) -> float:
        """What a final measurement of `record`'s setup will take: as long as one did, else
        the probe's time with the compile warm (the tune's processes share an inductor cache)
        plus the extra steps."""
        finals = [t.record.wall_s for t in self.tried if t.stage == "final" and t.record.wall_s
                  and dataclasses.replace(t.record.setup, warmup=record.setup.warmup,
                                          steps=record.setup.steps) == record.setup]
        if finals:
            return max(finals)
        first = record.first_step_s or 0.0
        warm = first * WARM_COMPILE_SHARE if record.setup.mode == "compile" else first
        extra_steps = sum(self.final_steps) - record.setup.warmup - record.setup.steps
        return ((record.wall_s or 0.0) - first + warm
                + max(extra_steps, 0) * (record.step_ms or 0.0) / 1e3)

    # ------------------------------------------------------------ measuring

    def probe(self, setup: Setup, stage: str, role: str = "probe",
              estimate: float | None = None) -> Record | None:
        """The record of `setup` (stored, or measured now), or None when the budget cannot
        afford it. `role`: "probe" (a short run, kept out of the report's results) or
        "reference" (the loss guard's reference measured in full, a result like the finals);
        `estimate`: what it will take, where the probes like it do not say."""
        setup = setup.check()
        key = setup.key()
        if key in self.by_key:
            return self.by_key[key]
        if (key, 0) not in self.stored:
            left = self.left_s() - (0.0 if self.finalizing else self.final_reserve_s())
            estimate = estimate or self.estimate_s(setup)
            if left < estimate:
                self.skip(f"{label(setup)}: not tried, the budget has {max(left, 0):.0f} s left "
                          f"for it and it takes about {estimate:.0f} s")
                return None
            # A probe far slower than others like it (a compile that does not end) is stopped.
            timeout = max(1.0, min(self.timeout_s, left, max(3 * estimate, 120.0)))
        else:
            timeout = self.timeout_s
        record = self.runner.run([setup], timeout_s=timeout, display=self.display,
                                 tag={"kind": "tune", "role": role, "stage": stage})[0]
        self.use(record, stage)
        return record

    def use(self, record: Record, stage: str) -> None:
        if record.run_id != self.runner.run_id and \
                (record.setup.key(), record.repeat) not in self.counted:
            self.stored_spent_s += record.wall_s or 0.0
            self.counted.add((record.setup.key(), record.repeat))
        self.by_key.setdefault(record.setup.key(), record)
        self.tried.append(Tried(stage, record))
        self._verdicts = None
        self.say(f"{stage}: {label(record.setup)}: {outcome(record)}")

    def skip(self, text: str) -> None:
        if text not in self.skipped:
            self.skipped.append(text)
            self.say(text)

    def verdict(self, record: Record):
        if self._verdicts is None:
            self._verdicts = loss_verdicts([t.record for t in self.tried])
        return self._verdicts.get((record.setup.key(), record.machine.gpu))

    def acceptable(self, record: Record | None) -> bool:
        """Ran, and the loss guard found its losses in agreement with its reference's (or it is
        the reference). A setup the guard could not check (no reference ran at its batch, no
        peers to vote) is not taken either: the search must not pick a wrong loss."""
        if record is None or not record.ok:
            return False
        verdict = self.verdict(record)
        return verdict is not None and verdict.status in (OK, REFERENCE)

    def reference(self, batch: int, in_full: bool = False) -> Record | None:
        """Make sure the loss guard has an eager reference at `batch`: the plainest eager setup,
        with activation checkpointing when that does not fit; `in_full`: one that ran the final
        stage's steps, so that the finals' losses are compared over all of theirs. Returns it,
        or None when none could run."""
        steps = sum(self.final_steps) if in_full else 0
        found = self.reference_probe(batch, steps)
        if found is not None:
            return found
        attns, plainest = self.space["attn"], axis("attn").plain[0]
        attn = plainest if plainest in attns else attns[0]
        plain = dataclasses.replace(self.base, mode="eager", attn=attn, batch=batch)
        stage, role, estimate = "reference", "probe", None
        if in_full:
            plain, stage, role = self.in_full(plain), "final reference", "reference"
            short = self.reference_probe(batch)
            estimate = self.final_cost_s(short) if short else None
        record = self.probe(plain, stage, role=role, estimate=estimate)
        if record is not None and record.status == "oom":
            self.probe(dataclasses.replace(plain, checkpointing=True), stage, role=role,
                       estimate=estimate)
        return self.reference_probe(batch, steps)

    def reference_probe(self, batch: int, steps: int = 0) -> Record | None:
        """The longest-run eager bf16 record at `batch` the loss guard can take as its
        reference, of at least `steps` steps (warm-up and timed)."""
        found = [t.record for t in self.tried if t.record.ok and t.record.setup.batch == batch
                 and can_be_reference(t.record.setup) and t.record.setup.dtype == "bf16"
                 and t.record.setup.warmup + t.record.setup.steps >= steps]
        return max(found, key=lambda r: r.setup.warmup + r.setup.steps, default=None)

    def best(self) -> Record | None:
        candidates = [t.record for t in self.tried if self.acceptable(t.record)]
        return max(candidates, key=rate, default=None)

    # ------------------------------------------------------------ the stages

    def run(self) -> TuneResult:
        self.screen()
        if self.objective == "tokens":
            self.grow(0)        # the best pair first: its options are worth more than the
        self.options()          # second pair's batches, when the budget is short
        if self.objective == "tokens":
            self.grow(1)
        winner, runner_up, comparison, in_full = self.final()
        command = winner.setup.command(self.repeats) if winner else None
        reference = (self.reference_probe(winner.setup.batch, sum(self.final_steps))
                     if winner and in_full else None)
        return TuneResult(self.objective, self.budget_s, self.spent_s(), winner, runner_up,
                          self.tried, self.skipped, command, comparison, in_full, reference)

    def so_far(self) -> TuneResult:
        """What a tune stopped before it chose (Ctrl-C, SIGTERM, SIGHUP) had measured: no
        winner; the same command resumes from its records."""
        return TuneResult(self.objective, self.budget_s, self.spent_s(), None, None, self.tried,
                          self.skipped, None, None, False, stopped=True)

    def screen(self) -> None:
        """Every attention kernel at the start batch: eager mode first, then compiled."""
        eager: dict[str, Record] = {}
        if "eager" in self.space["mode"]:
            for attn in self.space["attn"]:
                record = self.probe(dataclasses.replace(self.base, mode="eager", attn=attn),
                                    "screen")
                if record is not None:
                    eager[attn] = record
        if "compile" not in self.space["mode"]:
            return
        for attn in self.space["attn"]:
            seen = eager.get(attn)
            if seen is not None and seen.status not in ("ok", "oom"):
                self.skip(f"{attn}: not compiled, it failed in eager mode ({seen.status})")
                continue
            faster = [a for a, r in eager.items() if a in FUSED_ATTENTIONS and r.ok and seen
                      and seen.ok and rate(r) > rate(seen) * (1 + GAIN)]
            if attn == "eager" and faster:
                self.skip(f"eager attention: not compiled, {faster[0]} was faster in eager mode")
                continue
            self.probe(self.compiled(attn), "screen")

    def pairs(self) -> list[tuple[tuple[str, str], Record]]:
        """The screened (mode, attention) pairs that ran and agree, fastest first."""
        pairs: list[tuple[tuple[str, str], Record]] = []
        screened = [t for t in self.tried if t.stage == "screen" and self.acceptable(t.record)]
        for t in sorted(screened, key=lambda t: -rate(t.record)):
            pair = (t.record.setup.mode, t.record.setup.attn)
            if pair not in [p for p, _ in pairs]:
                pairs.append((pair, t.record))
        return pairs

    def grow(self, rank: int) -> None:
        """Double the batch of the rank-th best pair while it fits and pays; for the best pair,
        then one bisection step between its largest fit and the batch that did not fit."""
        pairs = self.pairs()
        if rank >= len(pairs):
            return
        pair, record = pairs[rank]
        while record.setup.batch * 2 <= BATCH_LIMIT:
            bigger = self.probe(dataclasses.replace(record.setup, batch=record.setup.batch * 2),
                                "batch")
            if bigger is None:
                return
            if bigger.status == "oom":
                self.oom_batch[pair] = bigger.setup.batch
                self.skip(f"{pair[0]}+{pair[1]}: batch {bigger.setup.batch} ran out of "
                          "memory, not grown further")
                break
            self.reference(bigger.setup.batch)
            if not self.acceptable(bigger) or \
                    rate(bigger) < rate(record) * (1 + GAIN):
                return
            record = bigger
        top = self.oom_batch.get(pair)
        if rank == 0 and top is not None and top > record.setup.batch + 1:
            middle = (record.setup.batch + top) // 2
            between = self.probe(dataclasses.replace(record.setup, batch=middle), "batch")
            if between is not None and between.ok:
                self.reference(between.setup.batch)

    def options(self) -> None:
        """One change at a time on the best setup so far; a change that is faster and agrees
        is kept, and the next change is tried on top of it."""
        best = self.best()
        if best is None and self.objective == "fit" and True in self.space["checkpointing"]:
            # Nothing fits the batch: recomputing activations may make it fit.
            for t in [t for t in self.tried if t.record.status == "oom"]:
                self.probe(dataclasses.replace(t.record.setup, checkpointing=True), "option")
            best = self.best()
        if best is None:
            return
        for change in self.changes(best):
            candidate = dataclasses.replace(best.setup, **change)
            if candidate == best.setup:
                continue
            record = self.probe(candidate, "option")
            if record is None or not record.ok:
                continue
            if candidate.batch != best.setup.batch:
                self.reference(candidate.batch)
            if self.acceptable(record) and rate(record) > rate(best) * (1 + GAIN):
                self.say(f"kept: {describe(change)} ({rate(record):,.0f} against "
                         f"{rate(best):,.0f} tokens/s)")
                best = record

    def compiled(self, attn: str) -> Setup:
        """The start setup compiled with `attn`, every compile-only axis at its start value."""
        first = {name: values[0] for name, values in self.space.items()}
        return Setup(**{**self.base.fields_all(), **first, "mode": "compile", "attn": attn})

    def changes(self, best: Record) -> list[dict]:
        """The options to try on `best`, one axis at a time, in the registry's `tune_order`
        (the most promising and cheapest first): each value other than the best's and the start
        value; expensive values (autotuning compiles for minutes) after all the rest.
        Checkpointing ("memory") only where it may make a batch fit."""
        s, fields = best.setup, best.setup.fields_all()
        cheap: list[dict] = []
        dear: list[dict] = []
        for a in sorted((a for a in AXES if a.tune == "option" and a.name in self.space),
                        key=lambda a: a.tune_order):
            if a.applies is not None and not a.applies(fields):
                continue
            values = self.space[a.name]
            for value in values:
                if value != getattr(s, a.name) and value != values[0]:
                    (dear if value in a.expensive else cheap).append({a.name: value})
        memory = [a for a in AXES if a.tune == "memory" and a.name in self.space]
        for a in memory:
            if True in self.space[a.name] and not getattr(s, a.name):
                oom = self.oom_batch.get((s.mode, s.attn))
                if self.objective == "tokens" and oom is not None:
                    cheap.append({a.name: True, "batch": oom})
                elif self.objective == "fit":
                    cheap.append({a.name: True})
        return cheap + dear

    def final(self):
        """The best setups measured in full, `repeats` processes each, interleaved, with the loss
        guard's reference measured in full at their batches: a finalist whose losses depart over the
        full run (a probe's few steps can hide a slow drift) is measured no more, and the next best
        probe takes its place. The winner is the faster that agrees, tested against the
        runner-up."""
        ranked = []
        for record in sorted((t.record for t in self.tried if self.acceptable(t.record)),
                             key=lambda r: -rate(r)):
            if record.setup not in [r.setup for r in ranked]:
                ranked.append(record)
        if not ranked:
            return None, None, None, False
        self.finalizing = True
        self.display.what = "final"
        waiting = [(self.in_full(r.setup), r) for r in ranked]
        active, waiting = waiting[:FINALISTS], waiting[FINALISTS:]
        results: dict[Setup, list[Record]] = collections.defaultdict(list)
        stopped: set[Setup] = set()
        dropped: set[Setup] = set()      # the probes' setups whose finals failed or departed
        while True:
            ran = False
            for plan, probe in list(active):     # interleaved: A B, A B, ...
                repeat = len(results[plan])
                if plan in stopped or repeat >= self.repeats:
                    continue
                if self.reference(plan.batch, in_full=True) is None:
                    self.skip(f"final: no eager reference measured in full at batch "
                              f"{plan.batch}; the finals there are checked over the probes' "
                              "steps only")
                cost = self.final_cost_s(probe)
                if (plan.key(), repeat) not in self.stored and self.left_s() < cost:
                    self.skip(f"final: {label(plan)} #{repeat + 1} not run, the budget has "
                              f"{max(self.left_s(), 0):.0f} s left and it takes about "
                              f"{cost:.0f} s")
                    stopped.add(plan)
                    continue
                records = self.runner.run(
                    [plan], repeats=repeat + 1, display=self.display,
                    timeout_s=max(1.0, min(self.timeout_s, self.left_s())),
                    tag={"kind": "tune", "role": "final"})
                record = next(r for r in records if r.repeat == repeat)
                self.use(record, "final")
                results[plan].append(record)
                ran = True
                if not self.acceptable(record):
                    why = (self.verdict(record).describe(plan.name) if record.ok
                           and self.verdict(record) else record.status)
                    self.skip(f"final: {label(plan)} dropped: {why}")
                    active.remove((plan, probe))
                    dropped.add(probe.setup)
                    if waiting:
                        active.append(waiting.pop(0))
            if not ran:
                break
        measured = [(plan, [r for r in results[plan] if r.ok]) for plan, _ in active]
        measured = [(p, rs) for p, rs in measured if rs and all(self.acceptable(r) for r in rs)]
        if not measured:
            # Never a setup whose finals failed or departed: the best of the rest, from its
            # probe, or none.
            rest = [r for r in ranked if r.setup not in dropped]
            self.skip("final: nothing measured in full; " + (
                "the winner is the best probe" if rest else
                "every finalist failed or departed from its reference, so there is no winner"))
            if not rest:
                return None, None, None, False
            return rest[0], rest[1] if len(rest) > 1 else None, None, False
        measured.sort(key=lambda item: -statistics.mean(r.tokens_per_s for r in item[1]))
        winner = representative(measured[0][1])
        runner_up = representative(measured[1][1]) if len(measured) > 1 else None
        comparison = compare(measured[0][1], measured[1][1]) if len(measured) > 1 else None
        return winner, runner_up, comparison, True

    def in_full(self, setup: Setup) -> Setup:
        """`setup` with the final stage's warm-up and timed steps."""
        return dataclasses.replace(setup, warmup=self.final_steps[0], steps=self.final_steps[1])


# ---------------------------------------------------------------- helpers

def rate(record: Record) -> float:
    """The tokens/s the search decides by: a record's, but by its median timed step. A probe
    times only 5 steps (3 on a CPU), and one hiccup among them must not decide what grows or is
    kept."""
    if not (record.ok and record.tokens_per_s and record.step_ms and record.step_ms_median):
        return record.tokens_per_s or 0.0
    return record.tokens_per_s * record.step_ms / record.step_ms_median


def representative(records: list[Record]) -> Record:
    """The process with the median tokens/s (the lower median for an even count)."""
    ordered = sorted(records, key=lambda r: r.tokens_per_s)
    return ordered[(len(ordered) - 1) // 2]


def compare(a: list[Record], b: list[Record]) -> dict | None:
    """The winner's time per token against the runner-up's (their batches may differ), tested
    as the report tests two searched setups (stats.compare_step_times, per token)."""
    result = stats.compare_records(a, b, per_token=True)
    if result is None:
        return None
    return {"ratio": result.ratio, "p_value": result.p_value, "significant": result.significant,
            "ci": list(result.ci) if result.ci else None}


def label(setup: Setup) -> str:
    return f"{setup.name} batch {setup.batch} {setup.dtype}"


def describe(change: dict) -> str:
    return ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in change.items())


def outcome(record: Record) -> str:
    if record.ok:
        text = f"{record.tokens_per_s:,.0f} tokens/s, {record.step_ms:.1f} ms"
        if abs(rate(record) / record.tokens_per_s - 1) > 0.05:
            text += (f" (a mean over an uneven run: {rate(record):,.0f} tokens/s by its median "
                     "step, which the search goes by)")
        return text
    return record.status
