"""`stepbench tune`: the fastest setup of one model on this machine, found within a time budget.

A search, not a matrix: it proposes setups, has each measured in its own process by the same
Runner and executor as `run` (every measurement is a record in the results file, tagged
`search`, so an interrupted tune resumes and `stepbench report` shows it), reads the records and
decides what to measure next. Every measurement runs the final steps (`--warmup`, `--steps`):
the best one measured is already a final, and the loss guard sees every step. The stages
(docs/tune.md says the same for users; STAGES names them in the records and the JSON):

ladder    eager mode with the plainest attention (the loss guard's reference) at the start
          batch, doubled until it runs out of memory or a doubling buys less than LADDER_GAIN
          more tokens/s: the memory a sequence takes, the batch where throughput saturates
          (the largest rung that ran), and the guard's reference at every batch used later;
compiled  torch.compile with each attention kernel at the saturating batch and the one below;
explore   one change at a time on any setup measured (an option, another kernel, a doubled
          batch, compilation, checkpointing where a batch ran out of memory);
reference the guard's reference at a leading setup's batch that the ladder did not reach;
final     more processes of the two best, interleaved, only as many as the test between them
          needs (`final`).

Which candidate runs next is a choice by value per second: a candidate's price is its process's
parts as measured here (prices.py); its value is the tokens/s it may add over the best so far,
from the gains that changes like it brought (gains.py: this machine's records, else committed
H200 results), taken to land anywhere between the smallest and the largest seen. A candidate
whose largest gain cannot beat the best is not measured (pruned); nor one that the budget, kept
back for the finals' processes (priced from warm compiles), cannot pay for. The loss guard
(guard.py) must pass before a setup can win, not before it is explored.

The budget counts the wall time of every measurement the tune used (stored ones included) plus
this invocation's own time; every process's timeout is what the budget has left. What it found
is a TuneResult; the report draws it (report/tune.py), the search only decides.

Objective "fit": the fastest setup at the given batch whose step fits under --memory-limit-gb
(the cap stands in for a smaller card); the batch is not grown and checkpointing is an option.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable

from stepbench import stats
from stepbench.axes import AXES, axis
from stepbench.guard import OK, REFERENCE, loss_verdicts
from stepbench.noise import processes_disagree
from stepbench.record import Record
from stepbench.search.gains import (Gain, GainTable, committed, differences, observations, rate,
                                    source_kind)
from stepbench.search.prices import Price, Prices
from stepbench.settings import SEARCHED
from stepbench.setup import Setup
from stepbench.workload.spec import is_factory

LADDER_GAIN = 0.10     # a doubling of the ladder's batch must buy this much more tokens/s
LADDER_SHARE = 0.25    # of the budget, at most, for the ladder
BATCH_LIMIT = 4096     # no batch beyond this
FINAL_PROCESSES = 2    # processes per finalist before the test between them (the least it takes)
# Identical processes of one setup have differed by up to 17% (docs/architecture.md, "Measured
# reasons"): two setups further apart than this, and told apart by the test on one process
# each, need no more processes to say which is faster.
CLEAR_GAP = 0.25
# A candidate beats the best so far when it is faster by more than this: about the smallest
# difference the final test has told apart (docs/architecture.md, "Measured reasons").
BEAT = 0.01
# The stages, in order, as the records' `search.stage` and the JSON name them.
STAGES = {"ladder": "the loss guard's eager reference measured at doubling batches",
          "compiled": "torch.compile with each attention kernel at the ladder's saturating "
                      "batch and the one below",
          "explore": "one change on a measured setup, chosen by value per second",
          "reference": "the loss guard's reference at a leading setup's batch the ladder did "
                       "not reach",
          "final": "another process of one of the two best setups"}

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
    given (a narrowed axis has no notes: the flag chose its values). A value named on the
    command line that this machine cannot run is refused with the reason."""
    from stepbench.errors import UserError

    space, notes = default_space(settings.device)
    for name, values in settings.space.items():
        a = axis(name)
        for value in values:
            reason = a.why_not(value, settings.device)
            if reason is not None:
                fix = "" if "; use --" in reason else f"; drop it from {a.flag}"
                raise UserError(f"{a.flag} {a.text(value) or value} cannot run here: "
                                f"{reason}{fix}")
        space[name] = list(values)
        notes.pop(name)
    if is_factory(settings.values.get("model")):
        # A user's model takes no attention or fused kernels of transformers' (workload/plan.py).
        for name in ("attn", "kernels"):
            space[name], notes[name] = space[name][:1], []
    return space, [text for texts in notes.values() for text in texts]


def start(settings, space: Space) -> Setup:
    """The setup a tune starts from: eager mode, each searched axis at its start value, the
    others as the settings hold them."""
    fields = {**settings.values, **{name: values[0] for name, values in space.items()}}
    if is_factory(fields.get("model")):
        from stepbench.workload.plan import one_setup_values

        fields = one_setup_values(fields)
    return Setup(**{**fields, "mode": "eager"}).check()


@dataclass
class Tried:
    """One measurement the tune used, with the stage that asked for it."""

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
    comparison: dict | None     # winner against runner-up: ratio, p_value, significant, method
    measured_in_full: bool      # the winner ran the final steps (an earlier tune's could not)
    reference: Record | None = None   # the loss guard's eager reference at the winner's batch
    ladder: dict | None = None        # the reference ladder: batches, saturating batch, why
    gains: list[dict] = field(default_factory=list)   # the gain table entries the tune used
    earlier: str | None = None        # what became of an earlier tune's records in the file
    processes: dict | None = None     # processes measured of the winner and the runner-up
    not_measured: list[dict] = field(default_factory=list)   # candidates left, and why
    stopped: bool = False       # stopped (Ctrl-C, SIGTERM, SIGHUP) before it chose: no winner

    def to_dict(self) -> dict:
        return {"winner": self.winner.to_dict() if self.winner else None,
                "runner_up": self.runner_up.to_dict() if self.runner_up else None,
                "tried": [t.record.to_dict() for t in self.tried],
                "command": self.command, "objective": self.objective,
                "budget_s": self.budget_s, "spent_s": round(self.spent_s, 1),
                "comparison": self.comparison, "measured_in_full": self.measured_in_full,
                "reference": self.reference.to_dict() if self.reference else None,
                "skipped": self.skipped, "stages": STAGES, "ladder": self.ladder,
                "gains": self.gains, "earlier_tune": self.earlier,
                "processes": self.processes, "not_measured": self.not_measured,
                "stopped": self.stopped}

    @classmethod
    def from_dict(cls, data: dict) -> "TuneResult":
        """A tune's `--format json` object read back, to render it again. Each tried record's
        stage is in its `search` tag (`stage`, one of STAGES; an earlier tune's records: screen,
        batch, option, reference or final reference, else their role, "final")."""
        def record(value):
            return Record.from_dict(value) if value else None

        tried = [Tried(stage_of(r), r) for r in map(Record.from_dict, data["tried"])]
        return cls(data["objective"], data["budget_s"], data["spent_s"], record(data["winner"]),
                   record(data["runner_up"]), tried, list(data["skipped"]), data["command"],
                   data["comparison"], data["measured_in_full"], record(data.get("reference")),
                   data.get("ladder"), list(data.get("gains") or []), data.get("earlier_tune"),
                   data.get("processes"), list(data.get("not_measured") or []),
                   data.get("stopped", False))


def stage_of(record: Record) -> str:
    """A tune record's stage: its `stage`, else its role (an earlier tune's finals)."""
    tag = record.search or {}
    return tag.get("stage") or tag.get("role") or "?"


def is_earlier(record: Record) -> bool:
    """A record of an earlier stepbench tune: a short probe, or a measurement whose stage is
    not one of STAGES."""
    tag = record.search or {}
    return tag.get("kind") == "tune" and (tag.get("role") == "probe"
                                          or tag.get("stage") not in STAGES)


@dataclass
class Candidate:
    """A setup not measured yet, and what the tune thinks of it: the measured setup it is
    closest to, the gain of the changes from there, its price; `reason` when it is not worth
    measuring now (pruned, too dear, would not fit)."""

    setup: Setup
    parent: Setup | None = None
    parent_rate: float = 0.0
    gain: Gain | None = None
    price: Price | None = None
    value: float = 0.0
    reason: str | None = None
    why: str | None = None      # pruned, budget, memory or failed

    @property
    def per_second(self) -> float:
        return self.value / max(self.price.total, 1.0) if self.price else 0.0


class Tuner:
    """The search. `runner` is a Runner (or anything with its run(), run_id and store): the tune
    only proposes setups and reads the records it returns; `clock` is the time it counts its
    budget by. `gains`: the committed observations (default: gains.committed()); `start`: how
    the executor starts a setup's process (server or fresh), for the prices."""

    def __init__(self, runner, base: Setup, space: Space, *, budget_s: float, objective: str,
                 timeout_s: float, repeats: int = 3, skipped: list[str] | None = None,
                 start: str = "server", gains: list | None = None,
                 clock: Callable[[], float] = time.monotonic, display=None,
                 say: Callable[[str], None] = lambda text: None):
        # (Imported here: the report reads TuneResult and never runs anything.)
        from stepbench.execute.progress import SearchView
        from stepbench.execute.runner import NullDisplay

        self.runner = runner
        # Each process numbered across the tune by its stage ("ladder 3", "final 2"), each
        # finished one with the budget left (execute/progress.py).
        self.display = SearchView(display or NullDisplay(), budget_left=lambda: self.left_s())
        self.space = space
        self.budget_s = budget_s
        self.objective = objective
        self.timeout_s = timeout_s
        self.repeats = repeats
        self.base = base
        self.clock = clock
        self.began = clock()
        self.say = say
        self.gains = GainTable(committed() if gains is None else gains)
        self.prices = Prices(base.device, start)
        stored = runner.store.latest()
        # (setup key, repeat) of what the results file already holds: measured for free.
        self.stored = {(r.setup.key(), r.repeat) for r in stored}
        ours = [r for r in stored if (r.search or {}).get("kind") == "tune"
                and (r.setup.model, r.setup.seq, r.setup.device) ==
                (base.model, base.seq, base.device)]
        self.earlier = [r for r in ours if is_earlier(r)]
        # The budget counts what an interrupted tune of this model spent, from the start (so
        # that a resumed tune knows what it has left before it replays anything), and any
        # other stored record once the tune uses it. An earlier tune's are not counted: this
        # tune searches again, with a budget of its own.
        mine = [r for r in ours if not is_earlier(r)]
        self.stored_spent_s = sum(r.wall_s or 0.0 for r in mine)
        self.counted = {(r.setup.key(), r.repeat) for r in mine}
        self.tried: list[Tried] = []
        self.skipped: list[str] = list(skipped or [])
        self.oom: dict[str, int] = {}       # a setup but its batch -> smallest batch that ran out
        self.ladder_info: dict | None = None
        self.saturating = base.batch
        self.finalizing = False             # in the final stage: nothing kept back
        self.ran_process = False            # this invocation started a process (the server)
        self.earlier_text: str | None = None
        self.used_gains: list[dict] = []    # the gains that chose or pruned a candidate
        self.attempted: set[Setup] = set()  # candidates chosen (measured, or not affordable)
        self.unmeasured: dict[Setup, Candidate] = {}   # candidates left, with the reason
        self._verdicts: dict | None = None
        self._table: GainTable | None = None
        self._compared: dict = {}

    # ------------------------------------------------------------ budget

    def spent_s(self) -> float:
        return self.stored_spent_s + (self.clock() - self.began)

    def left_s(self) -> float:
        return self.budget_s - self.spent_s()

    def price(self, setup: Setup, rate_guess: float | None = None) -> Price:
        """What measuring `setup` once more will take (prices.py), at the tokens/s `rate_guess`
        (else what the setups nearest to it ran at)."""
        guess = rate_guess or self.expected_rate(setup)
        step_s = setup.tokens_per_step / guess if guess else 0.0
        return self.prices.price(setup, step_s, warm=bool(self.processes(setup)),
                                 server=not self.ran_process)

    def expected_rate(self, setup: Setup) -> float | None:
        own = self.rate_of(setup)
        if own:
            return own
        parent, gain = self.derive(setup)
        if parent is None:
            return None
        return self.rate_of(parent) * math.sqrt(gain.lo * gain.hi) if gain else \
            self.rate_of(parent)

    def reserve_s(self) -> float:
        """Budget kept back while exploring: the processes the two leading setups still need for
        the final test (at warm-compile prices) and the loss guard's reference at their batches
        where none ran; at most half the budget."""
        if self.finalizing:
            return 0.0
        leaders = self.leaders()
        cost = 0.0
        if len(leaders) == 2:
            want = min(FINAL_PROCESSES, self.repeats)
            for s in leaders:
                cost += max(0, want - len(self.processes(s))) * self.price(s).total
        for s in leaders:
            if self.reference_at(s.batch) is None:
                cost += self.price(self.reference_setup(s.batch)).total
        return min(cost, self.budget_s / 2)

    def first_price(self) -> Price | None:
        """What the tune's first measurement will take (with the process server's start; its
        steps only where a record says how long they take), or None where the results file
        holds it: the least budget a tune can use."""
        setup = self.reference_setup(self.base.batch)
        if (setup.key(), 0) in self.stored:
            return None
        return self.price(setup)

    # ------------------------------------------------------------ measuring

    def measure(self, setup: Setup, stage: str, role: str = "candidate") -> Record | None:
        """One more process of `setup` (its first, or the next repeat): stored, or measured now;
        None when the budget cannot pay for it (said in `skipped`)."""
        setup = setup.check()
        repeat = len(self.processes(setup))
        if (setup.key(), repeat) not in self.stored:
            price = self.price(setup)
            left = self.left_s() - self.reserve_s()
            if left < price.total:
                which = f" #{repeat + 1}" if repeat else ""
                self.skip(f"{label(setup)}{which}: not measured, the budget has "
                          f"{max(left, 0):.0f} s left for it and it takes about "
                          f"{price.total:.0f} s ({price.describe()})")
                return None
            # A process far slower than priced (a compile that does not end) is stopped.
            timeout = max(1.0, min(self.timeout_s, left, max(3 * price.total, 120.0)))
            self.ran_process = True
        else:
            timeout = self.timeout_s
        self.display.what = stage
        records = self.runner.run([setup], repeats=repeat + 1, timeout_s=timeout,
                                  display=self.display,
                                  tag={"kind": "tune", "stage": stage, "role": role})
        record = next((r for r in records if r.repeat == repeat), None)
        if record is None:          # stopped before a record was kept
            raise KeyboardInterrupt("stopped")
        self.use(record, stage)
        return record

    def use(self, record: Record, stage: str) -> None:
        if record.run_id != self.runner.run_id and \
                (record.setup.key(), record.repeat) not in self.counted:
            self.stored_spent_s += record.wall_s or 0.0
            self.counted.add((record.setup.key(), record.repeat))
        self.tried.append(Tried(stage, record))
        self.prices.records.append(record)
        if record.status == "oom":
            family = record.setup.replace(batch=1).key()
            self.oom[family] = min(self.oom.get(family, BATCH_LIMIT + 1), record.setup.batch)
        self._verdicts = None
        self._table = None
        which = f" #{record.repeat + 1}" if record.repeat else ""
        self.say(f"{stage}: {label(record.setup)}{which}: {outcome(record)}")

    def skip(self, text: str) -> None:
        if text not in self.skipped:
            self.skipped.append(text)
            self.say(text)

    def processes(self, setup: Setup) -> list[Record]:
        return sorted((t.record for t in self.tried if t.record.setup == setup),
                      key=lambda r: r.repeat)

    def measured(self) -> list[Setup]:
        """Every setup measured, in the order first measured."""
        return list(dict.fromkeys(t.record.setup for t in self.tried))

    def rate_of(self, setup: Setup) -> float:
        """The mean of `rate` over the setup's processes that ran; 0 where none did."""
        rates = [rate(r) for r in self.processes(setup) if r.ok]
        return statistics.fmean(rates) if rates else 0.0

    def verdict(self, setup: Setup):
        if self._verdicts is None:
            self._verdicts = loss_verdicts([t.record for t in self.tried])
        runs = self.processes(setup)
        return self._verdicts.get((setup.key(), runs[0].machine.gpu)) if runs else None

    def explorable(self, setup: Setup) -> bool:
        """Ran, and its losses do not depart: a setup to build on and to measure against."""
        runs = self.processes(setup)
        verdict = self.verdict(setup)
        return bool(runs) and all(r.ok for r in runs) and not (verdict and verdict.departs)

    def acceptable(self, setup: Setup) -> bool:
        """Ran in every process, and the loss guard found its losses in agreement with its
        reference's (or it is the reference): a setup that may win. One the guard could not
        check (no reference at its batch) may not: the search must not pick a wrong loss."""
        verdict = self.verdict(setup)
        return self.explorable(setup) and verdict is not None and \
            verdict.status in (OK, REFERENCE)

    def best(self) -> tuple[Setup | None, float]:
        """The explorable setup that delivered the most tokens/s, and that figure: the bar a
        candidate must beat. By the mean of its steps, slow ones included, where a candidate's
        promise starts from its parent's median step (`rate`): one hiccup neither raises the bar
        nor lowers a promise."""
        found = [(self.mean_tokens(s), s) for s in self.measured() if self.explorable(s)]
        if self.objective == "fit":
            found = [(r, s) for r, s in found if s.batch == self.base.batch]
        if not found:
            return None, 0.0
        value, setup = max(found, key=lambda item: item[0])
        return setup, value

    def leaders(self) -> list[Setup]:
        """The two fastest explorable setups: the likely finalists."""
        found = sorted((s for s in self.measured() if self.explorable(s)),
                       key=lambda s: -self.rate_of(s))
        if self.objective == "fit":
            found = [s for s in found if s.batch == self.base.batch]
        return found[:2]

    # ------------------------------------------------------------ the guard's reference

    def reference_setup(self, batch: int) -> Setup:
        """The plainest eager setup at `batch`: the loss guard's reference."""
        attns, plainest = self.space["attn"], axis("attn").plain[0]
        first = {name: values[0] for name, values in self.space.items()}
        return Setup(**{**self.base.fields_all(), **first, "mode": "eager",
                        "attn": plainest if plainest in attns else attns[0], "batch": batch})

    def reference_at(self, batch: int) -> Record | None:
        """A reference that ran at `batch` (with checkpointing where the plain one did not
        fit), or None."""
        for setup in (self.reference_setup(batch),
                      self.reference_setup(batch).replace(checkpointing=True)):
            ok = [r for r in self.processes(setup) if r.ok]
            if ok:
                return ok[0]
        return None

    def reference(self, batch: int, stage: str) -> Record | None:
        """Make sure the guard has a reference at `batch`: measured when missing, with
        activation checkpointing when the plain one runs out of memory."""
        found = self.reference_at(batch)
        if found is not None:
            return found
        plain = self.reference_setup(batch)
        record = self.once(plain, stage, role="reference")
        if record is not None and record.status == "oom":
            self.once(plain.replace(checkpointing=True), stage, role="reference")
        return self.reference_at(batch)

    # ------------------------------------------------------------ the stages

    def so_far(self) -> TuneResult:
        """What a tune stopped before it chose (Ctrl-C, SIGTERM, SIGHUP) had measured: no
        winner; the same command resumes from its records."""
        return TuneResult(self.objective, self.budget_s, self.spent_s(), None, None, self.tried,
                          self.skipped, None, None, False, ladder=self.ladder_info,
                          earlier=self.earlier_text, stopped=True)

    def run(self) -> TuneResult:
        if self.earlier:
            self.earlier_text = (
                f"the results file holds {len(self.earlier)} records of an earlier stepbench "
                "tune of this model (short probes, and finals); this tune searches again with "
                "a budget of its own, and reuses a stored measurement only where it measures "
                "the same setup with the same steps")
            self.skip(self.earlier_text)
        self.ladder()
        self.compiled()
        self.explore()
        return self.final()

    def ladder(self) -> None:
        """The guard's reference at the start batch, doubled while it fits and a doubling buys
        LADDER_GAIN more tokens/s, within LADDER_SHARE of the budget (the fit objective: the
        start batch alone). A start batch whose reference runs out of memory is measured with
        activation checkpointing, and the ladder stops there."""
        batch, rungs, why = self.base.batch, [], f"the batch limit {BATCH_LIMIT}"
        while batch <= BATCH_LIMIT:
            setup = self.reference_setup(batch)
            spent = sum(r.wall_s or 0.0 for r in rungs)
            if rungs and (setup.key(), 0) not in self.stored and \
                    spent + self.price(setup).total > LADDER_SHARE * self.budget_s:
                why = (f"batch {batch} would take the ladder past {LADDER_SHARE:.0%} of the "
                       "budget")
                break
            record = self.once(setup, "ladder", role="reference")
            if record is None:
                why = "the budget could not pay for it"
                break
            if record.status == "oom":
                why = f"batch {batch} ran out of memory"
                if not rungs:
                    found = self.reference(batch, "ladder")
                    rungs += [found] if found is not None else []
                break
            if not record.ok:
                why = f"batch {batch} ended {record.status}"
                break
            rungs.append(record)
            if len(rungs) > 1 and rate(record) < rate(rungs[-2]) * (1 + LADDER_GAIN):
                why = (f"batch {batch} bought {rate(record) / rate(rungs[-2]) - 1:+.0%} over "
                       f"batch {batch // 2}, under {LADDER_GAIN:.0%}")
                break
            if self.objective == "fit":
                why = "the fit objective keeps the batch"
                break
            batch *= 2
        if rungs:
            self.saturating = rungs[-1].setup.batch
        peaks = {r.setup.batch: r.peak_memory_gb for r in rungs if r.peak_memory_gb is not None}
        slope, fixed = _line(peaks) if len(peaks) >= 2 else (None, None)
        if slope is None and peaks:
            [(b, peak)] = peaks.items()
            slope, fixed = peak / b, 0.0
        self.ladder_info = {"batches": [r.setup.batch for r in rungs],
                            "tokens_per_s": [round(rate(r)) for r in rungs],
                            "saturating_batch": self.saturating if rungs else None,
                            "stopped": why,
                            "gb_per_sequence": round(slope, 3) if slope is not None else None,
                            "fixed_gb": round(max(fixed, 0.0), 2) if fixed is not None else None}
        if rungs:
            self.say(f"ladder: saturates at batch {self.saturating} ({why})")

    def once(self, setup: Setup, stage: str, role: str = "candidate") -> Record | None:
        """`setup`'s first process: the one the tune used already, or measured now."""
        runs = self.processes(setup)
        return runs[0] if runs else self.measure(setup, stage, role)

    def compiled(self) -> None:
        """torch.compile with each attention kernel at the saturating batch and the one below,
        the most valuable per second first."""
        if "compile" not in self.space["mode"]:
            return
        batches = [self.saturating]
        if self.objective == "tokens" and self.saturating // 2 >= 1:
            batches.append(self.saturating // 2)
        setups = [self.compiled_setup(attn, b) for b in batches for attn in self.space["attn"]]
        self.choose(lambda: setups, "compiled")

    def compiled_setup(self, attn: str, batch: int) -> Setup:
        first = {name: values[0] for name, values in self.space.items()}
        return Setup(**{**self.base.fields_all(), **first, "mode": "compile", "attn": attn,
                        "batch": batch})

    def explore(self) -> None:
        self.choose(self.explore_setups, "explore")

    def explore_setups(self) -> list[Setup]:
        """One change on each explorable setup measured: each option's other values, the other
        attention kernels, compilation of an eager setup, a doubled batch; checkpointing at a
        batch that ran out of memory."""
        out: dict[Setup, None] = {}
        for s in self.measured():
            if self.explorable(s):
                for change in self.changes(s):
                    out[s.replace(**change)] = None
        if True in self.space.get("checkpointing", []):
            for t in self.tried:
                s = t.record.setup
                if t.record.status == "oom" and not s.checkpointing and \
                        (self.objective == "tokens" or s.batch == self.base.batch):
                    out[s.replace(checkpointing=True)] = None
        return [s for s in out if not self.processes(s)]

    def changes(self, s: Setup) -> list[dict]:
        fields = s.fields_all()
        out = []
        for a in AXES:
            if a.tune != "option" or a.name not in self.space:
                continue
            if a.applies is not None and not a.applies(fields):
                continue
            out += [{a.name: v} for v in self.space[a.name] if v != getattr(s, a.name)]
        out += [{"attn": v} for v in self.space["attn"] if v != s.attn]
        if s.mode == "eager" and "compile" in self.space["mode"]:
            out.append({"mode": "compile"})
        if self.objective == "tokens" and s.batch * 2 <= BATCH_LIMIT:
            out.append({"batch": s.batch * 2})
        return out

    def choose(self, proposals: Callable[[], list[Setup]], stage: str) -> None:
        """Measure the candidate of the highest value per second, again and again, until none
        is worth measuring or affordable; why each one left was not measured is kept
        (`unmeasured`) for the result."""
        while True:
            candidates = [self.assess(s) for s in proposals() if not self.processes(s)
                          and s not in self.attempted]
            left = self.left_s() - self.reserve_s()
            for c in candidates:
                if c.reason is None and c.price.total > left:
                    c.why = "budget"
                    c.reason = (f"the budget has {max(left, 0):.0f} s left for it and it takes "
                                f"about {c.price.total:.0f} s ({c.price.describe()})")
                if c.reason is not None:
                    self.unmeasured[c.setup] = c
            ready = [c for c in candidates if c.reason is None]
            if not ready:
                return
            pick = max(ready, key=lambda c: (c.per_second, -c.price.total))
            self.attempted.add(pick.setup)
            self.unmeasured.pop(pick.setup, None)
            self.note_gain(pick.gain)
            self.say(f"{stage}: next {label(pick.setup)}: about {pick.price.total:.0f} s, "
                     f"up to {pick.parent_rate * pick.gain.hi:,.0f} tokens/s"
                     if pick.gain else f"{stage}: next {label(pick.setup)}")
            self.measure(pick.setup, stage)

    def note_gain(self, gain) -> None:
        if gain is not None and gain.to_dict() not in self.used_gains:
            self.used_gains.append(gain.to_dict())

    def assess(self, setup: Setup) -> Candidate:
        """A candidate's parent, gain, price and value, or the reason it is not worth it: a
        batch of it ran out of memory or would not fit, a change in it failed elsewhere, or
        even its largest gain cannot beat the best so far by BEAT."""
        c = Candidate(setup)
        family = setup.replace(batch=1).key()
        if self.oom.get(family, BATCH_LIMIT + 1) <= setup.batch:
            c.why, c.reason = "memory", f"batch {self.oom[family]} already ran out of memory"
            return c
        need, capacity = self.predicted_peak_gb(setup), self.capacity_gb(setup)
        if need is not None and capacity is not None and need > capacity:
            c.why, c.reason = "memory", f"it would need about {need:.0f} GB of the " \
                                        f"{capacity:.0f} GB"
            return c
        parent, gain = self.derive(setup)
        failed = self.failed_change(parent, setup)
        if failed is not None:
            c.parent, c.why, c.reason = parent, "failed", failed
            return c
        best_setup, best = self.best()
        if parent is not None and gain is not None:
            c.parent, c.parent_rate, c.gain = parent, self.rate_of(parent), gain
            top = c.parent_rate * gain.hi
            # Gains seen on other models order a user's model's candidates, never skip one
            # (a ResNet is not a Llama).
            if best_setup is not None and top <= best * (1 + BEAT) and \
                    not is_factory(setup.model):
                c.why = "pruned"
                c.reason = (f"its largest gain cannot beat the best so far: at most "
                            f"{top:,.0f} tokens/s ({gain.hi:.2f}x {label(parent)}: "
                            f"{gain.kind}, {source_kind(gain.source)}), against "
                            f"{best:,.0f} ({label(best_setup)})")
                return c
            c.value = expected_gain(c.parent_rate, gain.lo, gain.hi, best * (1 + BEAT))
            c.price = self.price(setup, c.parent_rate * math.sqrt(gain.lo * gain.hi))
        else:
            # Nothing measured to say what it is worth: any tokens/s is a gain.
            c.value, c.price = 1.0, self.price(setup)
        return c

    def failed_change(self, parent: Setup | None, setup: Setup) -> str | None:
        """Why `setup` is not worth measuring because a value it changes to (a kernel, a
        precision, compilation with its kernel) failed in a setup measured already (error,
        crash, timeout, unsupported: not out of memory, which depends on the batch)."""
        changed = differences(parent, setup) if parent is not None else []
        for t in self.tried:
            r = t.record
            if r.ok or r.status == "oom":
                continue
            for name in changed:
                if name == "batch" or getattr(r.setup, name) != getattr(setup, name):
                    continue
                if name == "mode" and r.setup.attn != setup.attn:
                    continue
                return (f"{axis(name).noun} {getattr(setup, name)} ended {r.status} in "
                        f"{label(r.setup)}")
        return None

    def derive(self, setup: Setup):
        """(the explorable setup measured that is fewest changes away from `setup`, the gain of
        those changes); of equally near ones, the one that promises most. (None, None) when
        nothing explorable ran."""
        near = [(len(differences(s, setup)), s) for s in self.measured() if self.explorable(s)
                and s != setup]
        if not near:
            return None, None
        least = min(n for n, _ in near)
        table = self.table()
        options = []
        for _, s in (item for item in near if item[0] == least):
            gain = table.chain(s, setup)
            if gain is not None:
                options.append((self.rate_of(s) * gain.hi, s, gain))
        if not options:
            return None, None
        _, parent, gain = max(options, key=lambda item: item[0])
        return parent, gain

    def table(self) -> GainTable:
        """The gain table with this machine's observations (the tune's records so far)."""
        if self._table is None:
            self._table = self.gains.with_machine(
                observations([t.record for t in self.tried]))
        return self._table

    def capacity_gb(self, setup: Setup) -> float | None:
        if setup.device != "cuda":
            return None     # a CPU's cap is address space, which resident memory does not show
        if setup.memory_limit_gb is not None:
            return setup.memory_limit_gb
        return next((t.record.machine.gpu_memory_gb for t in self.tried
                     if t.record.machine.gpu_memory_gb), None)

    def predicted_peak_gb(self, setup: Setup) -> float | None:
        """The peak memory `setup` is expected to need: a line through its own batches' peaks,
        or one batch's peak scaled by the batch above the ladder's fixed part (weights,
        gradients, optimizer state); None where no batch of it ran."""
        family = setup.replace(batch=1)
        points = {}
        for t in self.tried:
            r = t.record
            if r.ok and r.setup.replace(batch=1) == family and r.peak_memory_gb is not None:
                points[r.setup.batch] = max(r.peak_memory_gb, r.peak_reserved_gb or 0.0)
        if not points:
            return None
        if len(points) >= 2:
            slope, fixed = _line(points)
        else:
            [(batch, peak)] = points.items()
            fixed = min((self.ladder_info or {}).get("fixed_gb") or 0.0, peak)
            slope = (peak - fixed) / batch
        return fixed + slope * setup.batch

    # ------------------------------------------------------------ the finals

    def final(self) -> TuneResult:
        """The guard's reference at the leaders' batches where the ladder did not reach; then
        more processes of the two best, interleaved, until the test between them is
        significant or each has run `repeats`. The winner is the fastest setup that agrees and
        that no other measured setup is significantly faster than (the report's test)."""
        self.finalizing = True
        for _ in range(4 * (self.repeats + 2)):
            before = len(self.tried)
            for s in self.leaders():
                if self.reference_at(s.batch) is None:
                    self.reference(s.batch, "reference")
            ranked = self.ranked()
            for s in self.wanted(ranked[:2]):
                self.measure(s, "final")
            if len(self.tried) == before:
                break
        ranked = self.ranked()
        unchecked = [s for s in self.leaders() if s not in ranked]
        for s in unchecked:
            verdict = self.verdict(s)
            self.skip(f"{label(s)}: not a finalist, the loss guard could not check it ("
                      f"{verdict.status if verdict else 'no losses'})")
        return self.result(ranked)

    def ranked(self) -> list[Setup]:
        """The setups that may win, fastest by mean tokens/s first, except that the first is
        one no other is significantly faster than by the report's test (where the test and
        the means disagree: a few slow steps)."""
        setups = sorted((s for s in self.measured() if self.acceptable(s)),
                        key=lambda s: -self.mean_tokens(s))
        if self.objective == "fit":
            setups = [s for s in setups if s.batch == self.base.batch]
        for lead in setups:
            # Only a setup near the lead by its median step can test faster than it.
            near = [o for o in setups if o != lead and
                    self.rate_of(o) >= 0.95 * min(self.rate_of(lead), self.mean_tokens(lead))]
            if not any(self.faster(o, lead) for o in near):
                return [lead] + [s for s in setups if s != lead]
        return setups

    def wanted(self, pair: list[Setup]) -> list[Setup]:
        """Which of the two best need another process for the test between them: none where
        the test and their mean tokens/s both tell them apart, the same way, by more than
        identical processes differ (CLEAR_GAP); else
        FINAL_PROCESSES each first, then, while the test finds no difference or a setup's
        processes disagree, another each up to `repeats`."""
        if len(pair) < 2:
            return []
        result = self.compare(*pair)
        means = self.mean_tokens(pair[1]) / self.mean_tokens(pair[0])   # a's time per token / b's
        if result is not None and result.significant and (means < 1) == (result.ratio < 1) and \
                not any(1 / (1 + CLEAR_GAP) < r < 1 + CLEAR_GAP for r in (result.ratio, means)):
            return []
        least = min(FINAL_PROCESSES, self.repeats)
        short = [s for s in pair if len(self.processes(s)) < least]
        if short:
            return short
        result = self.compare(*pair)
        unsettled = result is None or not result.significant or \
            any(processes_disagree(self.processes(s)) for s in pair)
        if not unsettled:
            return []
        return [s for s in pair if len(self.processes(s)) < self.repeats]

    def compare(self, a: Setup, b: Setup) -> stats.Comparison | None:
        """a's time per token against b's, as the report tests two setups."""
        runs_a, runs_b = self.processes(a), self.processes(b)
        key = (a, b, len(runs_a), len(runs_b))
        if key not in self._compared:
            self._compared[key] = stats.compare_records(runs_a, runs_b, per_token=True)
        return self._compared[key]

    def faster(self, a: Setup, b: Setup) -> bool:
        """The test finds `a` significantly faster than `b`."""
        result = self.compare(a, b)
        return bool(result is not None and result.significant and result.ratio < 1)

    def mean_tokens(self, setup: Setup) -> float:
        return statistics.fmean(r.tokens_per_s for r in self.processes(setup))

    def result(self, ranked: list[Setup]) -> TuneResult:
        winner = representative(self.processes(ranked[0])) if ranked else None
        runner_up = representative(self.processes(ranked[1])) if len(ranked) > 1 else None
        comparison = None
        if len(ranked) > 1:
            found = self.compare(ranked[0], ranked[1])
            if found is not None:
                comparison = {"ratio": found.ratio, "p_value": found.p_value,
                              "significant": found.significant, "method": found.method,
                              "ci": list(found.ci) if found.ci else None}
        if not self.tried:
            self.skip("nothing was measured")
        self.say_unmeasured(ranked[:2])
        reference = self.reference_at(winner.setup.batch) if winner else None
        return TuneResult(
            self.objective, self.budget_s, self.spent_s(), winner, runner_up, self.tried,
            self.skipped, winner.setup.command() if winner else None, comparison,
            bool(winner), reference, self.ladder_info, self.used_gains, self.earlier_text,
            {"winner": len(self.processes(ranked[0])) if ranked else 0,
             "runner_up": len(self.processes(ranked[1])) if len(ranked) > 1 else 0},
            [{"setup": c.setup.to_dict(), "why": c.why, "reason": c.reason}
             for c in self.unmeasured.values() if not self.processes(c.setup)])

    def say_unmeasured(self, leaders: list[Setup]) -> None:
        """One line for each candidate the budget could not pay for, and for each one change
        from the winner or the runner-up that was not worth measuring; a count of the rest
        (all of them, with their reasons, are in the result's `not_measured`)."""
        rest = 0
        for c in self.unmeasured.values():
            if self.processes(c.setup):
                continue
            self.note_gain(c.gain)
            if c.why == "budget" or (c.parent in leaders and c.parent is not None):
                self.skip(f"{label(c.setup)}: not measured, {c.reason}")
            else:
                rest += 1
        if rest:
            self.skip(f"{rest} more candidate{'s' if rest > 1 else ''}, one change from slower "
                      "setups, not measured: they could not beat the best so far, would not "
                      "fit, or change to what failed elsewhere (the JSON's not_measured says "
                      "why for each)")


# ---------------------------------------------------------------- helpers

def expected_gain(parent: float, lo: float, hi: float, best: float) -> float:
    """The tokens/s a candidate is expected to add over `best`, its rate taken to land
    anywhere (uniformly) between parent x lo and parent x hi."""
    a, b = parent * lo, parent * hi
    if b <= best:
        return 0.0
    if b - a < 1e-9:
        return b - best
    if a >= best:
        return (a + b) / 2 - best
    return (b - best) ** 2 / (2 * (b - a))


def _line(points: dict[int, float]) -> tuple[float, float]:
    """(slope, intercept) of the least-squares line through {x: y}."""
    xs, ys = list(points), list(points.values())
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return slope, my - slope * mx


def representative(records: list[Record]) -> Record:
    """The process with the median tokens/s (the lower median for an even count)."""
    ordered = sorted(records, key=lambda r: r.tokens_per_s or 0.0)
    return ordered[(len(ordered) - 1) // 2]


def label(setup: Setup) -> str:
    return f"{setup.name} batch {setup.batch} {setup.dtype}"


def outcome(record: Record) -> str:
    if record.ok:
        text = f"{record.tokens_per_s:,.0f} tokens/s, {record.step_ms:.1f} ms"
        if abs(rate(record) / record.tokens_per_s - 1) > 0.05:
            text += (f" (a mean over an uneven run: {rate(record):,.0f} tokens/s by its median "
                     "step, which the search goes by)")
        return text
    return record.status
