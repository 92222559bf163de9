"""What a change to a setup is worth: the gain table `tune` values its candidates by.

A gain is the ratio of two setups' tokens/s (`rate`: by the median step) that differ in one
thing: the compile mode, the attention kernel, a doubled batch, ... (`change_key`). Every pair of
measured setups of one model, sequence and GPU that differ in exactly one searched axis is an
observation of that change. A candidate is valued by the changes that lead to it from a setup
already measured: a change is looked up among this machine's records first and, where they hold
no observation of it, among the committed H200 results (`committed()`: the package's
committed_gains.json, which benchmarks/gain_table.py writes from benchmarks/results and a test
checks against them), from the most specific match (the same change in the same context) to the
least (any change to the same value). Each looked-up gain says which records it came from, so
that a decision can be traced to them.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass
from typing import Iterable

from stepbench.axes import AXES
from stepbench.noise import disturbed
from stepbench.record import Record
from stepbench.settings import SEARCHED
from stepbench.setup import Setup

THIS_MACHINE = "this machine"
# Where a gain that only orders the candidates was measured, as its lines say it.
ANOTHER_MACHINE = "another machine"
OTHER_MODELS = "other models"
# A change no record holds an observation of (flash attention where no H200 run had it): assumed
# to land anywhere in this range, so that it is neither pruned nor favoured.
UNKNOWN = (0.8, 1.25)
# Changes no committed result measured alone, whose cost follows from what they do: checkpointing
# runs each layer's forward pass again in the backward pass, a third more compute.
REASONED = {("checkpointing", False, True): (0.7, 0.8, "no measurement; checkpointing runs each "
                                             "layer's forward again (a third more compute)")}
# The axes a tune varies, in the order a chain of changes applies them (the context of each
# change is the setup before it): the mode first, then the attention, the options, the batch.
CHANGED = ["mode", "attn", *[a.name for a in AXES if a.tune in SEARCHED
                              and a.name not in ("mode", "attn")], "batch"]


def rate(record: Record) -> float:
    """The tokens/s the search decides by: a record's, but by its median timed step, so that
    one hiccup among its steps does not decide what grows or is kept."""
    if not (record.ok and record.tokens_per_s and record.step_ms and record.step_ms_median):
        return record.tokens_per_s or 0.0
    return record.tokens_per_s * record.step_ms / record.step_ms_median


# ---------------------------------------------------------------- observations

@dataclass(frozen=True)
class Observation:
    """One measured change: `key` (change_key), the ratio of tokens/s after to before, the two
    setups it compares, where they were measured (THIS_MACHINE or results files) and on what
    (`gpu`, the records' machine.gpu: "NVIDIA H200", "cpu"; None where unknown)."""

    key: tuple
    ratio: float
    what: str
    where: str
    gpu: str | None = None


def change_key(axis: str, before: Setup, after: Setup) -> tuple:
    """What a change is, with the context its effect depends on: an attention kernel's gain
    depends on the mode, compilation's on the attention kernel, a doubled batch's on the mode
    and the batch it starts from; the options' are taken as they come."""
    if axis == "batch":
        return ("batch", after.batch / before.batch, before.mode, before.batch)
    if axis == "attn":
        return ("attn", before.attn, after.attn, before.mode)
    if axis == "mode":
        return ("mode", before.mode, after.mode, before.attn)
    return (axis, getattr(before, axis), getattr(after, axis), None)


def differences(a: Setup, b: Setup) -> list[str]:
    """The searched axes and the batch in which `a` and `b` differ, in CHANGED's order."""
    return [name for name in CHANGED if getattr(a, name) != getattr(b, name)]


def _group(setup: Setup, gpu: str) -> str:
    """What two setups must share for their ratio to be a gain: everything but the searched
    axes, the batch and the step counts, and the GPU."""
    blank = {name: getattr(setup, name) for name in CHANGED}
    rest = {k: v for k, v in setup.fields_all().items()
            if k not in blank and k not in ("warmup", "steps")}
    return repr((gpu, sorted(rest.items(), key=lambda item: item[0])))


def observations(records: Iterable[Record], where: str = THIS_MACHINE) -> list[Observation]:
    """Every one-change pair among `records` that ran undisturbed (noise.DISTURBED: another
    process's CPU time, a throttled GPU, a recompile; such a pair's ratio is the disturbance's
    as much as the change's), both ways, measured `where`; a setup measured several times
    counts by the median of its rates."""
    return _observations((r, where) for r in records)


def _observations(items: Iterable[tuple[Record, str]]) -> list[Observation]:
    rates: dict[tuple, list[float]] = {}
    setups: dict[tuple, Setup] = {}
    files: dict[tuple, set] = {}
    gpus: dict[tuple, str] = {}
    for r, where in items:
        if not r.ok or not rate(r) or disturbed(r.noise_flags):
            continue
        plain = r.setup.replace(warmup=0, steps=1)
        key = (_group(r.setup, r.machine.gpu), plain.key())
        rates.setdefault(key, []).append(rate(r))
        setups[key] = plain
        gpus[key] = r.machine.gpu
        files.setdefault(key, set()).add(where)
    out = []
    keys = sorted(rates)
    for i, ka in enumerate(keys):
        for kb in keys[i + 1:]:
            if ka[0] != kb[0]:
                continue
            a, b = setups[ka], setups[kb]
            diff = differences(a, b)
            if len(diff) != 1 or (diff == ["batch"] and max(a.batch, b.batch) !=
                                  2 * min(a.batch, b.batch)):
                continue
            ra, rb = statistics.median(rates[ka]), statistics.median(rates[kb])
            source = " + ".join(sorted(files[ka] | files[kb]))
            for x, y, rx, ry in ((a, b, ra, rb), (b, a, rb, ra)):
                out.append(Observation(change_key(diff[0], x, y), round(ry / rx, 4),
                                       f"{_label(y)} / {_label(x)} ({x.model_label})", source,
                                       gpus[ka]))
    return out


def _label(setup: Setup) -> str:
    return f"{setup.name} batch {setup.batch} {setup.dtype}"


# ---------------------------------------------------------------- looking a change up

@dataclass(frozen=True)
class Gain:
    """What a change (or a chain of them) may multiply tokens/s by: from `lo` to `hi` (the
    smallest and largest ratio observed; a candidate is taken to land anywhere between), the
    change in words and where the observations came from."""

    lo: float
    hi: float
    kind: str
    source: str
    samples: tuple = ()
    # Whether the gain may skip a candidate: measured on this machine or on its machine class
    # (or reasoned), not on another machine class, whose gains only order the candidates.
    decides: bool = True
    # Where a gain that does not decide was measured, in the words its lines use.
    elsewhere: str = ANOTHER_MACHINE

    def then(self, other: "Gain") -> "Gain":
        return Gain(self.lo * other.lo, self.hi * other.hi, f"{self.kind}, then {other.kind}",
                    f"{self.source}; {other.source}", self.samples + other.samples,
                    self.decides and other.decides,
                    self.elsewhere if not self.decides else other.elsewhere)

    def to_dict(self) -> dict:
        return {"kind": self.kind, "smallest": round(self.lo, 3), "largest": round(self.hi, 3),
                "source": self.source, "may_skip": self.decides,
                **({} if self.decides else {"elsewhere": self.elsewhere}),
                "observations": [{"ratio": o.ratio, "setups": o.what, "where": o.where,
                                  "gpu": o.gpu} for o in self.samples]}


def source_kind(source: str) -> str:
    """A gain's source in a few words: "this machine", "committed H200 results", "assumed" (no
    measurement), or several of them for a chain; the files and reasons stay in `source`."""
    kinds = dict.fromkeys(THIS_MACHINE if part == THIS_MACHINE else part.split(" (")[0]
                          if part.startswith("committed") else "assumed"
                          for part in source.split("; "))
    return " + ".join(kinds)


def prior(gain) -> str:
    """Where a gain measured on another machine class came from, said where it ordered a
    candidate (it never skips one); "" for a gain that may decide."""
    if gain.decides:
        return ""
    whose = gain.elsewhere + ("'" if gain.elsewhere.endswith("s") else "'s")
    return (f" (by {source_kind(gain.source)}, {whose}: it orders the candidates, "
            "measurements here decide)")


def machine_name(gpu: str | None) -> str:
    """A machine class as a source names it: "H200" for "NVIDIA H200", "CPU" for "cpu"."""
    if gpu is None:
        return "unknown-machine"
    return "CPU" if gpu == "cpu" else gpu.removeprefix("NVIDIA ")


def describe_key(key: tuple) -> str:
    """A change in words: "attention sdpa -> flex_attention (compile)", "batch x2 (eager, from
    8)"."""
    axis = key[0]
    if axis == "batch":
        factor = key[1]
        how = f"x{factor:g}" if factor >= 1 else f"/{1 / factor:g}"
        return f"batch {how} ({key[2]}, from {key[3]})"
    noun = {"attn": "attention", "mode": "mode", "dtype": "precision",
            "compile_mode": "compile mode", "compile_scope": "compile scope",
            "kernels": "fused kernels"}.get(axis, axis.replace("_", " "))
    where = f" ({key[3]})" if key[3] is not None else ""
    before, after = ({True: "on", False: "off"}.get(v, v) for v in key[1:3])
    return f"{noun} {before} -> {after}{where}"


class GainTable:
    """Looks changes up: among this machine's observations first, then among the committed
    ones of its machine class (`gpu`: the records' machine.gpu), then among the committed ones
    of other machine classes, each from the most specific match to the least (`_levels`). A gain
    from another machine class does not decide (`Gain.decides`): priors order the candidates,
    measurements decide. Nor does a committed one where the tune's model is of another family
    than the committed results' (`other_models`: a user's factory against their HF causal LMs):
    what compiling a Llama gains says nothing certain of a ResNet's step."""

    def __init__(self, committed: list[Observation], machine: list[Observation] = (),
                 gpu: str | None = None, other_models: bool = False):
        self.committed = list(committed)
        self.machine = list(machine)
        self.gpu = gpu
        self.other_models = other_models

        def ours(o: Observation) -> bool:      # measured on this machine class, of these models
            return not other_models and gpu is not None and o.gpu == gpu

        self._ours = [o for o in self.committed if ours(o)]
        self._others = [o for o in self.committed if not ours(o)]
        self._found: dict[tuple, Gain] = {}     # key -> its gain: a tune asks thousands of times

    def with_machine(self, machine: list[Observation], gpu: str | None = None) -> "GainTable":
        return GainTable(self.committed, machine, gpu, self.other_models)

    def lookup(self, key: tuple) -> Gain:
        found = self._found.get(key)
        if found is None:
            found = self._found[key] = self._lookup(key)
        return found

    def _lookup(self, key: tuple) -> Gain:
        kind = describe_key(key)
        for pool, decides in ((self.machine, True), (self._ours, True), (self._others, False)):
            for level in _levels(key):
                found = level(pool)
                if found:
                    ratios = [bounded(key, o.ratio) for o in found]
                    where = THIS_MACHINE if pool is self.machine else _committed_source(found)
                    elsewhere = OTHER_MODELS if self.other_models and all(
                        o.gpu == self.gpu for o in found) else ANOTHER_MACHINE
                    return Gain(min(ratios), max(ratios), kind, where, tuple(found), decides,
                                elsewhere)
        if key[:3] in REASONED:
            lo, hi, why = REASONED[key[:3]]
            return Gain(lo, hi, kind, why)
        return Gain(*UNKNOWN, kind, f"no measurement of this change (assumed {UNKNOWN[0]:g}x "
                                    f"to {UNKNOWN[1]:g}x)")

    def chain(self, before: Setup, after: Setup) -> Gain | None:
        """The gain of the changes from `before` to `after`, one axis at a time in CHANGED's
        order (each in the context of the setup before it); None when they are the same."""
        gain, current = None, before
        for axis in differences(before, after):
            step = current.replace(**{axis: getattr(after, axis)})
            if axis == "batch":
                # A batch changes by doublings (or halvings), each looked up on its own.
                for batch in _doublings(current.batch, after.batch):
                    step = current.replace(batch=batch)
                    g = self.lookup(change_key("batch", current, step))
                    gain, current = (g if gain is None else gain.then(g)), step
                continue
            g = self.lookup(change_key(axis, current, step))
            gain, current = (g if gain is None else gain.then(g)), step
        return gain


def bounded(key: tuple, ratio: float) -> float:
    """A measured ratio within what its change can do: a batch times f trains f times the
    tokens a step in no less time (more work), so at most f times the tokens/s; a batch cut to
    f, in no more time, at least f times. A ratio beyond it is a disturbed measurement (on a busy
    CPU, a chain of doublings from such ratios promised a tune up to 9.7e12 samples/s)."""
    if key[0] != "batch":
        return ratio
    factor = key[1]
    return min(ratio, factor) if factor > 1 else max(ratio, factor)


def _committed_source(found: list[Observation]) -> str:
    """"committed H200 results (FILE, ...)": the machine classes and files observations came
    from."""
    names = " + ".join(dict.fromkeys(machine_name(o.gpu) for o in found))
    files = sorted({f for o in found for f in o.where.split(" + ")})
    return f"committed {names} results (" + ", ".join(files) + ")"


def _doublings(start: int, end: int) -> list[int]:
    """The batches from `start` to `end` by doubling (or halving); the last step lands on
    `end` even where it is not a power of two away."""
    out, batch = [], start
    while batch != end:
        batch = min(batch * 2, end) if end > batch else max(batch // 2, end)
        out.append(batch)
    return out


def _levels(key: tuple) -> list:
    """Matchers from the most specific to the least: each takes a list of observations and
    returns those that match at its level."""
    axis = key[0]
    if axis == "batch":
        factor, mode, start = key[1], key[2], key[3]

        def nearest(pool: list[Observation]) -> list[Observation]:
            if not pool:
                return []
            distance = {o: abs(math.log2(o.key[3] / start)) for o in pool}
            least = min(distance.values())
            return [o for o in pool if distance[o] == least]

        return [lambda pool: [o for o in pool if o.key == key],
                lambda pool: nearest([o for o in pool if o.key[:3] == (axis, factor, mode)]),
                lambda pool: nearest([o for o in pool if o.key[:2] == (axis, factor)])]
    return [lambda pool: [o for o in pool if o.key == key],
            lambda pool: [o for o in pool if o.key[:3] == key[:3]],
            lambda pool: [o for o in pool if o.key[0] == axis and o.key[2] == key[2]]]


# ---------------------------------------------------------------- the committed table

# The committed H200 results the table is made from (benchmarks/gain_table.py).
COMMITTED_FILES = ("h200-2026-11-30-foundation-matrix.jsonl", "h200-2026-11-30-axes.jsonl",
                   "h200-2026-12-01-max-batch.jsonl", "h200-2026-12-01-tune-468m.jsonl",
                   "h200-2026-12-01-tune-135m.jsonl", "h200-2026-12-01-start-tune-eager.jsonl")


def committed_observations(folder) -> list[Observation]:
    """The observations of COMMITTED_FILES in `folder` (benchmarks/results), each record
    naming its file."""
    from pathlib import Path

    from stepbench.record import ResultsFile

    return _observations((r, name) for name in COMMITTED_FILES
                         for r in ResultsFile(Path(folder) / name).read())


# The committed table as a data file shipped in the package (benchmarks/gain_table.py writes it
# from COMMITTED_FILES; tests/test_tune.py checks it against them).
COMMITTED_DATA = "committed_gains.json"


def to_data(rows: list[Observation]) -> str:
    """The data file's text: a header, then one observation a line (a new result file shows as
    the lines it adds)."""
    head = {"about": "The committed gain table (stepbench/search/gains.py): one observation per "
                     "entry (change key, ratio of tokens/s after to before, the setups compared, "
                     "the files they are in, the GPU). Written by benchmarks/gain_table.py from "
                     "these files of benchmarks/results; do not edit, run the script again.",
            "files": list(COMMITTED_FILES)}
    lines = [json.dumps({"change": list(o.key), "ratio": o.ratio, "setups": o.what,
                         "where": o.where, "gpu": o.gpu}) for o in rows]
    text = json.dumps(head, indent=1)[:-2]
    return text + ',\n "observations": [\n  ' + ",\n  ".join(lines) + "\n ]\n}\n"


def from_data(text: str) -> list[Observation]:
    return [Observation(tuple(o["change"]), o["ratio"], o["setups"], o["where"], o.get("gpu"))
            for o in json.loads(text)["observations"]]


def committed() -> list[Observation]:
    """The committed observations, read from the package's data file."""
    from importlib.resources import files

    return from_data(files("stepbench.search").joinpath(COMMITTED_DATA).read_text())
