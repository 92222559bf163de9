"""What a tune has measured, read the ways the search asks: each setup's processes, its rate,
the loss guard's verdict, the test between two setups, the batches that ran out of memory and
the peak memory a batch is expected to need."""

from __future__ import annotations

import statistics

from stepbench import stats
from stepbench.axes import axis
from stepbench.guard import OK, REFERENCE, loss_verdicts
from stepbench.noise import disturbed
from stepbench.record import Record
from stepbench.search.gains import GainTable, differences, observations, rate
from stepbench.search.tune.results import Tried, label
from stepbench.setup import Setup
from stepbench.units import unit_of
from stepbench.workload.plan import no_blocks, per_block

BATCH_LIMIT = 4096     # no batch beyond this


class Measurements:
    """The measurements a tune used, in order (`tried`), and what the results file held when
    it started (`stored`: setup keys and repeats, measured for free). Derived views are cached
    until the next measurement."""

    def __init__(self, stored: set):
        self.tried: list[Tried] = []
        self.stored = stored
        self.oom: dict[str, int] = {}   # a setup but its batch -> smallest batch that ran out
        self._verdicts: dict | None = None
        self._table: GainTable | None = None
        self._compared: dict = {}
        # setup -> its records, by repeat: the search asks for a setup's processes, and whether
        # it is explorable, hundreds of thousands of times between two measurements (a dict of
        # its own: `kept`'s key and function would cost more than the answer).
        self._processes: dict[Setup, list[Record]] = {}
        self._explorable: dict[Setup, bool] = {}
        self._kept: dict = {}
        # Timeouts under a limit the tune shortened (the budget's remainder, or a few times the
        # process's price) rather than the run's --timeout: the tune ran out of time, which
        # says nothing against a setup that ran in another process (ids of the records).
        self.shortened: set[int] = set()

    def add(self, stage: str, record: Record) -> None:
        self.tried.append(Tried(stage, record))
        # Stopped at a limit the tune shortened, now or (a stored record says so in its
        # `search`) when it was measured: the same verdict either way, so that a tune run again
        # on its own records names the same winner.
        if record.status == "timeout" and (record.search or {}).get("limit_s") is not None:
            self.shortened.add(id(record))
        runs = self._processes.setdefault(record.setup, [])
        runs.append(record)
        runs.sort(key=lambda r: r.repeat)
        if record.status == "oom":
            family = record.setup.replace(batch=1).key()
            self.oom[family] = min(self.oom.get(family, BATCH_LIMIT + 1), record.setup.batch)
        self._verdicts = None
        self._table = None
        self._explorable = {}
        self._kept = {}

    def kept(self, what, make):
        """`make()` once per measurement: for what the search reads from the measurements alone
        (its best setup, a candidate's parent), asked for each candidate each round."""
        if what not in self._kept:
            self._kept[what] = make()
        return self._kept[what]

    def records(self) -> list[Record]:
        return [t.record for t in self.tried]

    def processes(self, setup: Setup) -> list[Record]:
        return list(self._processes.get(setup, ()))

    def measured(self) -> list[Setup]:
        """Every setup measured, in the order first measured."""
        return list(self.kept("measured",
                              lambda: list(dict.fromkeys(t.record.setup for t in self.tried))))

    def rate_of(self, setup: Setup) -> float:
        """The mean of `rate` over the setup's processes that ran; 0 where none did."""
        rates = [rate(r) for r in self.ran(setup)]
        return statistics.fmean(rates) if rates else 0.0

    @property
    def unit(self) -> str:
        """What the measured setups' throughput counts: a factory's own unit ("images"), else
        "tokens"."""
        return self.kept("unit", lambda: unit_of(*(r.units for r in self.records())))

    def mean_tokens(self, setup: Setup) -> float:
        """The mean tokens/s of the setup's processes that ran."""
        return statistics.fmean(r.tokens_per_s for r in self.ran(setup))

    def ran(self, setup: Setup) -> list[Record]:
        """The setup's processes that ran (status ok); where some of them ran undisturbed, those
        alone (noise.DISTURBED: another process's CPU time, a throttled GPU, a recompile made
        the others' steps the disturbance's as much as the setup's)."""
        ok = [r for r in self.processes(setup) if r.ok]
        quiet = [r for r in ok if not disturbed(r.noise_flags)]
        return quiet or ok

    def disturbed(self, setup: Setup) -> bool:
        """Whether every process of the setup that ran was disturbed: a choice resting on it
        rests on the disturbance."""
        ok = self.ran(setup)
        return bool(ok) and all(disturbed(r.noise_flags) for r in ok)

    def table(self, gains: GainTable) -> GainTable:
        """The gain table with this machine's observations (the tune's records so far) and its
        machine class (the GPU its records ran on)."""
        if self._table is None:
            records = self.records()
            self._table = gains.with_machine(observations(records),
                                             records[0].machine.gpu if records else None)
        return self._table

    def nearest(self, setup: Setup, gains: GainTable):
        """(the explorable setup measured that is fewest changes away from `setup`, the gain of
        those changes by `gains` with this machine's); of equally near ones, the one that
        promises most. (None, None) when nothing explorable ran."""
        near = [(len(differences(s, setup)), s) for s in self.measured()
                if self.explorable(s) and s != setup]
        if not near:
            return None, None
        least = min(n for n, _ in near)
        table = self.table(gains)
        options = []
        for _, s in (item for item in near if item[0] == least):
            gain = table.chain(s, setup)
            if gain is not None:
                options.append((self.rate_of(s) * gain.hi, s, gain))
        if not options:
            return None, None
        _, parent, gain = max(options, key=lambda item: item[0])
        return parent, gain

    def verdict(self, setup: Setup):
        if self._verdicts is None:
            self._verdicts = loss_verdicts(self.records())
        runs = self.processes(setup)
        return self._verdicts.get((setup.key(), runs[0].machine.gpu)) if runs else None

    def explorable(self, setup: Setup) -> bool:
        """Ran, and its losses do not depart: a setup to build on and to measure against. A
        process the tune's shortened limit stopped (`shortened`, marked as `add` takes the
        record, which clears the cache below) is left out, where another ran: under a
        busy machine a reference's second process timed out at the budget's end, and the tune
        named a setup slower than that reference's first (issue 37)."""
        found = self._explorable.get(setup)
        if found is None:
            runs = [r for r in self.processes(setup) if id(r) not in self.shortened]
            verdict = self.verdict(setup)
            found = self._explorable[setup] = bool(runs) and all(r.ok for r in runs) and \
                not (verdict and verdict.departs)
        return found

    def acceptable(self, setup: Setup) -> bool:
        """Ran in every process, and the loss guard found its losses in agreement with its
        reference's (or it is the reference): a setup that may win. One the guard could not
        check for want of a reference at its batch may not: the search must not pick a wrong
        loss. One it could not compare because its step draws random numbers (dropout: a
        compiled setup draws them apart from eager, `Verdict.random`) may, said beside the
        winner (`unchecked`): no reference could ever check it, and a tune that never
        compiled a model with dropout would not answer whether to compile it."""
        verdict = self.verdict(setup)
        return self.explorable(setup) and verdict is not None and \
            (verdict.status in (OK, REFERENCE) or verdict.random)

    def unchecked(self, setup: Setup) -> bool:
        """Acceptable although the guard compared none of its losses (`acceptable`)."""
        verdict = self.verdict(setup)
        return bool(verdict and verdict.random)

    def compare(self, a: Setup, b: Setup) -> stats.Comparison | None:
        """a's time per token against b's, as the report tests two setups."""
        runs_a, runs_b = self.ran(a), self.ran(b)
        key = (a, b, len(runs_a), len(runs_b))
        if key not in self._compared:
            self._compared[key] = stats.compare_records(runs_a, runs_b, per_token=True)
        return self._compared[key]

    def faster(self, a: Setup, b: Setup) -> bool:
        """The test finds `a` significantly faster than `b`."""
        result = self.compare(a, b)
        return bool(result is not None and result.significant and result.ratio < 1)

    def failed_change(self, parent: Setup | None, setup: Setup) -> str | None:
        """Why `setup` is not worth measuring because a value it changes to (a kernel, a
        precision, compilation with its kernel) failed in a setup measured already (error,
        crash, timeout, unsupported: not out of memory, which depends on the batch, nor a
        timeout under the tune's shortened limit, which says the tune ran out of time)."""
        changed = differences(parent, setup) if parent is not None else []
        for r in self.records():
            if r.ok or r.status == "oom" or id(r) in self.shortened:
                continue
            for name in changed:
                if name == "batch" or getattr(r.setup, name) != getattr(setup, name):
                    continue
                # Compilation fails with its kernel, and in its own scope and mode: a model
                # without repeated blocks fails compile/layer, yet compiles whole.
                if name == "mode" and any(getattr(r.setup, n) != getattr(setup, n)
                                          for n in ("attn", "compile_scope", "compile_mode")):
                    continue
                return (f"{axis(name).noun} {getattr(setup, name)} ended {r.status} in "
                        f"{label(r.setup)}")
        return None

    def blockless(self, setup: Setup) -> str | None:
        """Why `setup` is not worth a process: it asks for an option that acts on each repeated
        block (workload/plan.py `per_block`) and a record of its model (a factory, with its
        parameters) found none; None otherwise, and always for a transformers model, whose
        records say nothing of blocks."""
        needs = per_block(setup)
        if not needs:
            return None
        none = self.kept("blockless", lambda: {(r.setup.model, r.setup.params): r.blocks.get("class")
                                               for r in self.records()
                                               if r.blocks is not None and r.blocks["count"] == 0})
        if (setup.model, setup.params) in none:
            params = f" ({setup.params})" if setup.params else ""
            return no_blocks(" and ".join(needs), setup.model + params,
                             none[setup.model, setup.params])
        return None

    def capacity_gb(self, setup: Setup) -> float | None:
        if setup.device != "cuda":
            return None     # a CPU's cap is address space, which resident memory does not show
        if setup.memory_limit_gb is not None:
            return setup.memory_limit_gb
        return next((r.machine.gpu_memory_gb for r in self.records()
                     if r.machine.gpu_memory_gb), None)

    def _peaks(self) -> dict[Setup, dict[int, float]]:
        """Each family's (a setup but its batch) {batch: peak memory} of the batches that ran."""
        peaks: dict[Setup, dict[int, float]] = {}
        for r in self.records():
            if r.ok and r.peak_memory_gb is not None:
                peaks.setdefault(r.setup.replace(batch=1), {})[r.setup.batch] = \
                    max(r.peak_memory_gb, r.peak_reserved_gb or 0.0)
        return peaks

    def predicted_peak_gb(self, setup: Setup, fixed_gb: float) -> float | None:
        """The peak memory `setup` is expected to need: a line through its own batches' peaks,
        or one batch's peak scaled by the batch above `fixed_gb` (the ladder's fixed part:
        weights, gradients, optimizer state); None where no batch of it ran."""
        points = self.kept("peaks", self._peaks).get(setup.replace(batch=1))
        if not points:
            return None
        if len(points) >= 2:
            slope, fixed = line(points)
        else:
            [(batch, peak)] = points.items()
            fixed = min(fixed_gb, peak)
            slope = (peak - fixed) / batch
        return fixed + slope * setup.batch


def line(points: dict[int, float]) -> tuple[float, float]:
    """(slope, intercept) of the least-squares line through {x: y}."""
    xs, ys = list(points), list(points.values())
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return slope, my - slope * mx


def representative(records: list[Record]) -> Record:
    """The process with the median tokens/s (the lower median for an even count)."""
    ordered = sorted(records, key=lambda r: r.tokens_per_s or 0.0)
    return ordered[(len(ordered) - 1) // 2]


def outcome(record: Record) -> str:
    """A measurement in a few words, as the tune's lines say it: its rate and step, or its
    status."""
    if record.ok:
        text = f"{record.tokens_per_s:,.0f} {unit_of(record.units)}/s, {record.step_ms:.1f} ms"
        if abs(rate(record) / record.tokens_per_s - 1) > 0.05:
            text += (f" (a mean over an uneven run: {rate(record):,.0f} {unit_of(record.units)}"
                     "/s by its median step, which the search goes by)")
        return text
    return record.status
