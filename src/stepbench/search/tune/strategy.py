"""The search's strategy: the stages in order, which candidate runs next, and the finals.

Which candidate runs next is a choice by value per second: a candidate's price is its process's
parts as measured here (search/prices.py); its value is the tokens/s it may add over the best so
far, from the gains that changes like it brought (search/gains.py: this machine's records, else
committed results), taken to land anywhere between the smallest and the largest seen. A
candidate whose largest gain cannot beat the best is not measured (pruned); nor one that the
budget, kept back for the finals' processes (priced from warm compiles), cannot pay for. The
loss guard (guard.py) must pass before a setup can win, not before it is explored.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable

from stepbench.axes import AXES, axis, canonical_params
from stepbench.execute.local import SERVER
from stepbench.record import Record
from stepbench.search.gains import (THIS_MACHINE, GainTable, committed, prior, rate,
                                    source_kind)
from stepbench.search.prices import Price, Prices
from stepbench.search.tune.budget import (BEAT, LADDER_SHARE, Budget, Candidate, expected_gain,
                                          spent_by, why_ended)
from stepbench.search.tune.finals import FINAL_PROCESSES, failed_reference, final, wanted
from stepbench.search.tune.launches import host_bound_setups
from stepbench.search.tune.measured import BATCH_LIMIT, Measurements, line, outcome
from stepbench.search.tune.results import TuneResult, is_earlier, label
from stepbench.search.tune.space import Space
from stepbench.setup import Setup, planned
from stepbench.workload.plan import FSDP2_SCOPES
from stepbench.workload.spec import is_factory

LADDER_GAIN = 0.10     # a doubling of the ladder's batch must buy this much more tokens/s


@dataclass
class Said:
    """What the tune says beside its measurements: what it skipped and why, the gains that chose
    or pruned a candidate, the candidates chosen and those left with their reason, what became of
    an earlier tune's records, and why it stopped exploring."""

    skipped: list[str] = field(default_factory=list)
    gains: list[dict] = field(default_factory=list)
    attempted: set = field(default_factory=set)
    unmeasured: dict = field(default_factory=dict)    # Setup -> Candidate
    earlier: str | None = None
    ended: str | None = None
    host_bound: list = field(default_factory=list)    # HostBound.to_dict, said once each


class Tuner:
    """The search. `runner` is a Runner (or anything with its run(), run_id and store): the tune
    only proposes setups and reads the records it returns; `clock` is the time it counts its
    budget by. `gains`: the committed observations (default: gains.committed()); `start`: how
    the executor starts a setup's process (server or fresh), for the prices."""

    def __init__(self, runner, base: Setup, space: Space, *, budget_s: float, objective: str,
                 timeout_s: float, repeats: int = 3, skipped: list[str] | None = None,
                 start: str = SERVER, gains: list | None = None,
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
        self.objective = objective
        self.timeout_s = timeout_s
        self.repeats = repeats
        self.base = base
        self.say = say
        # The committed results are HF causal LMs': of a factory's model they only order.
        self.gains = GainTable(committed() if gains is None else gains,
                               other_models=is_factory(base.model))
        self.prices = Prices(base.device, start)
        stored = runner.store.latest()
        # (setup key, repeat) of what the results file already holds: measured for free.
        self.seen = Measurements({(r.setup.key(), r.repeat) for r in stored})
        ours = [r for r in stored if (r.search or {}).get("kind") == "tune"
                and (r.setup.model, r.setup.seq, r.setup.device) ==
                (base.model, base.seq, base.device)]
        self.earlier = [r for r in ours if is_earlier(r)]
        # The budget counts what an interrupted tune of this model spent, from the start (so
        # that a resumed tune knows what it has left before it replays anything), and any
        # other stored record once the tune uses it. An earlier tune's are not counted: this
        # tune searches again, with a budget of its own.
        mine = [r for r in ours if not is_earlier(r)]
        self.budget = Budget(budget_s, clock, clock(), spent_by(mine),
                             {(r.setup.key(), r.repeat) for r in mine})
        self.said = Said(skipped=list(skipped or []))
        self.ladder_info: dict | None = None
        self.saturating = base.batch

    # ------------------------------------------------------------ budget and prices

    def spent_s(self) -> float:
        return self.budget.spent_s()

    def left_s(self) -> float:
        return self.budget.left_s()

    def price(self, setup: Setup, rate_guess: float | None = None) -> Price:
        """What measuring `setup` once more will take (prices.py), at the tokens/s `rate_guess`
        (else what the setups nearest to it ran at)."""
        guess = rate_guess or self.expected_rate(setup)
        step_s = setup.tokens_per_step / guess if guess else None
        return self.prices.price(setup, step_s, warm=bool(self.seen.processes(setup)),
                                 server=not self.budget.ran_process)

    def expected_rate(self, setup: Setup) -> float | None:
        own = self.seen.rate_of(setup)
        if own:
            return own
        parent, gain = self.derive(setup)
        if parent is None:
            return None
        return self.seen.rate_of(parent) * math.sqrt(gain.lo * gain.hi) if gain else \
            self.seen.rate_of(parent)

    def reserve_s(self) -> float:
        """Budget kept back while exploring (Budget.reserve): the processes the finals would run
        of the two leaders (wanted; warm-compile prices) and the guard's reference at their
        batches where none ran."""
        if self.budget.finalizing:
            return 0.0
        leaders, want = self.leaders(), min(FINAL_PROCESSES, self.repeats)
        prices = [p for s in wanted(self, leaders)
                  for p in [self.price(s).total] * max(0, want - len(self.seen.processes(s)))]
        return self.budget.reserve(prices + [self.price(self.reference_setup(s.batch, s)).total
                                             for s in leaders if self.reference_at(s.batch, s) is None])

    def first_price(self) -> Price | None:
        """What the tune's first measurement will take (with the process server's start; its
        steps only where a record says how long they take), or None where the results file
        holds it: the least budget a tune can use."""
        setup = self.reference_setup(self.base.batch)
        if (setup.key(), 0) in self.seen.stored:
            return None
        return self.price(setup)

    # ------------------------------------------------------------ measuring

    def measure(self, setup: Setup, stage: str, role: str = "candidate") -> Record | None:
        """One more process of `setup` (its first, or the next repeat): stored, or measured now;
        None when the budget cannot pay for it (said in `skipped`)."""
        setup = setup.check()
        repeat = len(self.seen.processes(setup))
        if (setup.key(), repeat) not in self.seen.stored:
            price = self.price(setup)
            left = self.left_s() - self.reserve_s()
            if left < price.total:
                which = f" #{repeat + 1}" if repeat else ""
                self.skip(f"{label(setup)}{which}: not measured, {price.over_budget(left)}")
                return None
            # A process far slower than priced (a compile that does not end) is stopped; one
            # priced without its steps (the first reference) may take what the budget has left.
            cap = max(3 * price.total, 120.0) if price.knows_steps else math.inf
            timeout = max(1.0, min(self.timeout_s, left, cap))
            self.budget.ran_process = True
        else:
            timeout = self.timeout_s
        self.display.what = stage
        tag = {"kind": "tune", "stage": stage, "role": role, "began_at": self.budget.began_at}
        if timeout < self.timeout_s:
            tag["limit_s"] = round(timeout, 3)      # the tune's own limit, not --timeout
        # retry=False: a stored record is a measurement the tune has (Measurements.stored),
        # priced at nothing and not paid again; its timeout is the budget's verdict.
        records = self.runner.run([setup], repeats=repeat + 1, timeout_s=timeout,
                                  display=self.display, retry=False, tag=tag)
        record = next((r for r in records if r.repeat == repeat), None)
        if record is None:          # stopped before a record was kept
            raise KeyboardInterrupt("stopped")
        self.use(record, stage)
        return record

    def use(self, record: Record, stage: str) -> None:
        self.budget.count(record, self.runner.run_id)
        self.seen.add(stage, record)
        self.prices.records.append(record)
        which = f" #{record.repeat + 1}" if record.repeat else ""
        self.say(f"{stage}: {label(record.setup)}{which}: {outcome(record)}")

    def blockless(self, setup: Setup) -> str | None:
        """Why `setup` takes no process (said once): an option of it acts on each repeated
        block of a model whose records found none."""
        why = self.seen.blockless(setup)
        if why is not None:
            self.skip(f"not tried: {why}")
        return why

    def skip(self, text: str) -> None:
        if text not in self.said.skipped:
            self.said.skipped.append(text)
            self.say(text)

    def best(self) -> tuple[Setup | None, float]:
        """The explorable setup that delivered the most tokens/s, and that figure: the bar a
        candidate must beat. By the mean of its steps, slow ones included, where a candidate's
        promise starts from its parent's median step (`rate`): one hiccup neither raises the bar
        nor lowers a promise."""
        return self.seen.kept("best", self._best)

    def _best(self) -> tuple[Setup | None, float]:
        found = [(self.seen.mean_tokens(s), s) for s in self.seen.measured()
                 if self.seen.explorable(s)]
        if self.objective == "fit":
            found = [(r, s) for r, s in found if s.batch == self.base.batch]
        if not found:
            return None, 0.0
        value, setup = max(found, key=lambda item: item[0])
        return setup, value

    def leaders(self) -> list[Setup]:
        """The two fastest explorable setups: the likely finalists."""
        found = sorted((s for s in self.seen.measured() if self.seen.explorable(s)),
                       key=lambda s: -self.seen.rate_of(s))
        if self.objective == "fit":
            found = [s for s in found if s.batch == self.base.batch]
        return found[:2]

    # ------------------------------------------------------------ the guard's reference

    def reference_setup(self, batch: int, like: Setup | None = None) -> Setup:
        """The plainest eager setup at `batch`: the loss guard's reference (of `like`'s model:
        a factory's parameters make another model)."""
        attns, plainest = self.space["attn"], axis("attn").plain[0]
        first = {name: values[0] for name, values in self.space.items()}
        if like is not None and "params" in first:
            first["params"] = like.params
        return Setup(**{**self.base.fields_all(), **first, "mode": "eager",
                        "attn": plainest if plainest in attns else attns[0], "batch": batch})

    def reference_at(self, batch: int, like: Setup | None = None) -> Record | None:
        """A reference that ran at `batch` (with checkpointing where the plain one did not
        fit), or None."""
        for setup in (self.reference_setup(batch, like),
                      self.reference_setup(batch, like).replace(checkpointing=True)):
            ok = self.seen.ran(setup)
            if ok:
                return ok[0]
        return None

    def reference(self, batch: int, stage: str, like: Setup | None = None) -> Record | None:
        """Make sure the guard has a reference at `batch`: measured when missing, with
        activation checkpointing when the plain one runs out of memory."""
        found = self.reference_at(batch, like)
        if found is not None:
            return found
        plain = self.reference_setup(batch, like)
        record = self.once(plain, stage, role="reference")
        checkpointed = plain.replace(checkpointing=True)
        if record is not None and record.status == "oom" and not self.blockless(checkpointed):
            self.once(checkpointed, stage, role="reference")
        return self.reference_at(batch, like)

    def once(self, setup: Setup, stage: str, role: str = "candidate") -> Record | None:
        """`setup`'s first process: the one the tune used already, or measured now."""
        runs = self.seen.processes(setup)
        return runs[0] if runs else self.measure(setup, stage, role)

    # ------------------------------------------------------------ the stages

    def so_far(self) -> TuneResult:
        """What a tune stopped before it chose (Ctrl-C, SIGTERM, SIGHUP) had measured: no
        winner; the same command resumes from its records."""
        return TuneResult(self.objective, self.budget.total_s, self.spent_s(), None, None,
                          self.seen.tried, self.said.skipped, None, None, False,
                          ladder=self.ladder_info, earlier=self.said.earlier, stopped=True,
                          host_bound=self.said.host_bound)

    def run(self) -> TuneResult:
        if self.earlier:
            self.said.earlier = (
                f"the results file holds {len(self.earlier)} records of an earlier stepbench "
                "tune of this model (short probes, and finals); this tune searches again with "
                "a budget of its own, and reuses a stored measurement only where it measures "
                "the same setup with the same steps")
            self.skip(self.said.earlier)
        self.ladder()
        if not failed_reference(self):      # a model that cannot train: nothing more to try
            self.compiled()
            self.explore()
        return final(self)

    def ladder(self) -> None:
        """The guard's reference at the start batch, doubled while it fits and a doubling buys
        LADDER_GAIN more tokens/s, within LADDER_SHARE of the budget (the fit objective: the
        start batch alone). A start batch whose reference runs out of memory is measured with
        activation checkpointing, and the ladder stops there."""
        batch, rungs, why = self.base.batch, [], f"the batch limit {BATCH_LIMIT}"
        while batch <= BATCH_LIMIT:
            setup = self.reference_setup(batch)
            spent = sum(r.wall_s or 0.0 for r in rungs)
            if rungs and (setup.key(), 0) not in self.seen.stored and \
                    spent + self.price(setup).total > LADDER_SHARE * self.budget.total_s:
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
        slope, fixed = line(peaks) if len(peaks) >= 2 else (None, None)
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

    def compiled(self) -> None:
        """torch.compile with each attention kernel at the saturating batch and the one below,
        the most valuable per second first."""
        if "compile" not in self.space["mode"]:
            return
        if self.base.parallel == "fsdp2" and len(self.space.get("compile_scope", ())) > 1:
            self.skip(f"not tried apart: {FSDP2_SCOPES}")
        batches = [self.saturating]
        if self.objective == "tokens" and self.saturating // 2 >= 1:
            batches.append(self.saturating // 2)
        first = {name: values[0] for name, values in self.space.items()}
        setups = [planned(Setup(**{**self.base.fields_all(), **first, "mode": "compile", "attn": a,
                                   "batch": b})) for b in batches for a in self.space["attn"]]
        self.choose(lambda: setups, "compiled")

    def explore(self) -> None:
        self.choose(self.explore_setups, "explore")
        self.say(f"explore: {self.said.ended}")

    def explore_setups(self) -> list[Setup]:
        """One change on each explorable setup measured: each option's other values, the other
        attention kernels, compilation of an eager setup, a doubled batch; checkpointing at a
        batch that ran out of memory."""
        out: dict[Setup, None] = {}
        for s in self.seen.measured():
            if self.seen.explorable(s):
                for change in self.changes(s):     # one setup each under FSDP2's scopes
                    out[planned(s.replace(**change))] = None
        if True in self.space.get("checkpointing", []):
            for r in self.seen.records():
                s = r.setup
                if r.status == "oom" and not s.checkpointing and \
                        (self.objective == "tokens" or s.batch == self.base.batch):
                    out[s.replace(checkpointing=True)] = None
        return [s for s in out if not self.seen.processes(s)]

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
        # A factory's other --param values: another model each, as the user asked to compare.
        out += [{"params": v} for v in self.space.get("params", [])
                if canonical_params(v) != s.params]
        if s.mode == "eager" and "compile" in self.space["mode"]:
            out.append({"mode": "compile"})
        if self.objective == "tokens" and s.batch * 2 <= BATCH_LIMIT:
            out.append({"batch": s.batch * 2})
        return out

    def choose(self, proposals: Callable[[], list[Setup]], stage: str) -> None:
        """Measure the candidate of the highest value per second, again and again, until none
        is worth measuring or affordable; why each one left was not measured is kept
        (`unmeasured`) for the result."""
        said = self.said
        while True:
            # Fewer launches first (launches.py): the candidates that cut the launches of a
            # setup measured host-bound here join the proposals and run before the rest.
            bound = {c: h for h in host_bound_setups(self.seen, self.space, self.changes)
                     for c in h.cutters}
            candidates = [self.assess(s, s in bound) for s in dict.fromkeys(
                [*proposals(), *bound]) if not self.seen.processes(s) and s not in said.attempted]
            now, kept = self.left_s(), self.reserve_s()
            left = now - kept
            for c in candidates:
                # A candidate the results file holds costs nothing more: a resumed tune takes
                # what it took before, though the budget counts it spent from the start.
                stored = (c.setup.check().key(), 0) in self.seen.stored
                if c.reason is None and c.price.total > left and not stored:
                    c.why = "budget"
                    c.reason = c.price.over_budget(left)
                if c.reason is not None:
                    said.unmeasured[c.setup] = c
            ready = [c for c in candidates if c.reason is None]
            if not ready:
                said.ended = why_ended(candidates, max(now, 0.0), kept)
                return
            pick = max(ready, key=lambda c: (c.setup in bound, c.per_second, -c.price.total))
            moved = bound.get(pick.setup)
            if moved and label(moved.setup) not in {h["setup"] for h in said.host_bound}:
                said.host_bound.append(moved.to_dict(label))
                self.say(said.host_bound[-1]["reason"])
            said.attempted.add(pick.setup)
            said.unmeasured.pop(pick.setup, None)
            self.note_gain(pick.gain)
            self.say(f"{stage}: next {label(pick.setup)}: about {pick.price.total:.0f} s, "
                     f"up to {pick.parent_rate * pick.gain.hi:,.0f} {self.seen.unit}/s{prior(pick.gain)}"
                     if pick.gain else f"{stage}: next {label(pick.setup)}")
            self.measure(pick.setup, stage)

    def note_gain(self, gain) -> None:
        if gain is not None and gain.to_dict() not in self.said.gains:
            self.said.gains.append(gain.to_dict())

    def assess(self, setup: Setup, host_bound: bool = False) -> Candidate:
        """A candidate's parent, gain, price and value, or the reason it is not worth it: a
        batch of it ran out of memory or would not fit, a change in it failed elsewhere, or
        even its largest gain cannot beat the best so far by BEAT, by a gain that may decide
        (measured here or on this machine's class: another machine's gain only orders it, at
        no value, after every candidate that may gain). One that cuts the launches of a
        host-bound setup (`host_bound`) is pruned only by a gain measured here: the committed
        results' hosts launched at another rate."""
        c = Candidate(setup, reason=self.blockless(setup))
        if c.reason is not None:
            c.why = "blocks"
            return c
        family = setup.replace(batch=1).key()
        oom = self.seen.oom
        if oom.get(family, BATCH_LIMIT + 1) <= setup.batch:
            c.why, c.reason = "memory", f"batch {oom[family]} already ran out of memory"
            return c
        fixed = (self.ladder_info or {}).get("fixed_gb") or 0.0
        need = self.seen.predicted_peak_gb(setup, fixed)
        capacity = self.seen.capacity_gb(setup)
        if need is not None and capacity is not None and need > capacity:
            c.why, c.reason = "memory", f"it would need about {need:.0f} GB of the " \
                                        f"{capacity:.0f} GB"
            return c
        parent, gain = self.derive(setup)
        failed = self.seen.failed_change(parent, setup)
        if failed is not None:
            c.parent, c.why, c.reason = parent, "failed", failed
            return c
        best_setup, best = self.best()
        if parent is not None and gain is not None:
            c.parent, c.parent_rate, c.gain = parent, self.seen.rate_of(parent), gain
            top = c.parent_rate * gain.hi
            # Gains seen on other models order a user's model's candidates, never skip one
            # (a ResNet is not a Llama).
            decides = gain.decides and not (host_bound and
                                            source_kind(gain.source) != THIS_MACHINE)
            if best_setup is not None and top <= best * (1 + BEAT) and decides \
                    and not is_factory(setup.model):
                c.why = "pruned"
                c.reason = (f"its largest gain cannot beat the best so far: at most "
                            f"{top:,.0f} {self.seen.unit}/s ({gain.hi:.2f}x {label(parent)}: "
                            f"{gain.kind}, {source_kind(gain.source)}), against "
                            f"{best:,.0f} ({label(best_setup)})")
                return c
            c.value = expected_gain(c.parent_rate, gain.lo, gain.hi, best * (1 + BEAT))
            c.price = self.price(setup, c.parent_rate * math.sqrt(gain.lo * gain.hi))
        else:
            # Nothing measured to say what it is worth: any tokens/s is a gain.
            c.value, c.price = 1.0, self.price(setup)
        return c

    def derive(self, setup: Setup):
        """(the explorable setup measured that is fewest changes away from `setup`, the gain of
        those changes): Measurements.nearest, kept until the next measurement."""
        return self.seen.kept(("derive", setup), lambda: self.seen.nearest(setup, self.gains))
