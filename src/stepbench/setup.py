"""What one benchmark run is: a frozen Setup value, its identity, and the matrix a command asks for.

Setup's fields are the axis registry's (axes.py): one field per Axis, in the table's order, built
when this module is imported. `Setup.key()` is the one identity of what was measured: resume, the
report's rows and the eager twin of a compiled setup are all built on it. Every field is part of
it, so two records that differ in any setting (steps, a memory limit, a seed) are never taken for
repeats of one setup. A field added after stepbench 0.1 has a `legacy` value that records written
before it existed read as; a setup holding it leaves the field out of its key and its `setup`
object, so old results files keep resuming and reporting as they did.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import shlex
from typing import Mapping

from stepbench.axes import AXES, CUDA, Axis, model_label
from stepbench.workload.spec import is_factory

# The dtype the matrix products run in, for the matmul peak and MFU (float8: against bf16's).
COMPUTE_DTYPES = {"autocast-bf16": "bf16", "float8": "bf16", "mixed-bf16": "bf16"}
# A precision that only a wrapper gives (FSDP2's mixed precision) -> what one GPU without a
# wrapper trains instead as the baseline of scaling efficiency.
BASELINE_PRECISIONS = {"mixed-bf16": "bf16"}
# What FSDP2's AdamW steps over (axis fsdp_optimizer; measure/parallel.py LocalShards).
OPTIMIZER_ON = {"local": "local shards", "dtensor": "DTensors"}
# torch.compile's modes that capture CUDA graphs (cudagraph trees) on a GPU.
CUDAGRAPH_COMPILE_MODES = ("reduce-overhead", "max-autotune")
# What a run does unless told, beyond the setups' own fields: per-setup timeout.
TIMEOUT_S = {"cuda": 1800.0, "cpu": 600.0}
REQUIRED = ("model", "mode", "attn")      # a Setup names these; every other field has a default
AXIS_NAMES = frozenset(a.name for a in AXES)     # a Setup's fields


def field_default(axis: Axis):
    """A Setup field's default: its legacy value for a field added later, else a run's default
    on a GPU (the first value of a matrix axis)."""
    if axis.later:
        return axis.legacy
    value = axis.default_for(CUDA)
    return value[0] if isinstance(value, tuple) else value


def _applies(axis: Axis, fields: Mapping) -> bool:
    return axis.applies is None or axis.applies(fields)


# The axes whose value a Setup may change as it is made (__post_init__), each with the default
# it then holds; and every axis as (name, later, legacy), what Setup.fields reads.
_ADJUSTED = [(a, field_default(a)) for a in AXES
             if a.applies is not None or a.normalize is not None]
_FIELDS = [(a.name, a.later, a.legacy) for a in AXES]

# The axes that name a setup, in their name's order (Setup.name).
_NAME_PARTS = [a for _, _, a in sorted((a.name_slot, i, a) for i, a in enumerate(AXES)
                                       if a.name_slot is not None)]


class SetupMethods:
    """Setup's behaviour; its fields come from the registry (below)."""

    def __post_init__(self):
        # Canonical values, so that equal settings give equal keys: a field that means nothing
        # here (a compile mode without compilation) holds its default; 3 and 3.0 GB are one.
        fields = dict(self.__dict__)       # the fields as given (asdict() would deep-copy)
        for axis, default in _ADJUSTED:
            value = fields[axis.name]
            if not _applies(axis, fields):
                value = default
            elif axis.normalize is not None:
                value = axis.normalize(value, fields)
            if value is not fields[axis.name]:
                object.__setattr__(self, axis.name, value)

    def check(self):
        """Raise a UserError naming the fix when a field is not one stepbench can run."""
        for axis in AXES:
            axis.check(getattr(self, axis.name))
        return self

    def fields(self) -> dict:
        """Every field, less the later ones that hold their legacy value."""
        values = self.__dict__
        return {name: values[name] for name, later, legacy in _FIELDS
                if not (later and values[name] == legacy)}

    def key(self) -> str:
        """THE identity of what was measured: every field, canonical JSON."""
        return self.__dict__.get("_key") or self._kept(
            "_key", lambda: json.dumps(self.fields(), sort_keys=True))

    def match_key(self) -> str:
        """The identity less the axes that only say how long the setup was measured
        (`Axis.timing`: warm-up, timed steps): what `stepbench compare` matches a before and an
        after setup by."""
        timing = {a.name for a in AXES if a.timing}
        return self._kept("_match_key", lambda: json.dumps(
            {k: v for k, v in self.fields().items() if k not in timing}, sort_keys=True))

    def _kept(self, attribute: str, make):
        """`make()`, made once per Setup (which never changes once built): a report asks a
        setup's key and name tens of thousands of times."""
        kept = self.__dict__.get(attribute)
        if kept is None:
            kept = make()
            object.__setattr__(self, attribute, kept)
        return kept

    def replace(self, **changes):
        """A Setup with `changes` (dataclasses.replace), made once per Setup and changes: the
        tune asks for the same one (a setup at batch 1, its family) hundreds of thousands of
        times, and each new Setup runs every axis's normalization."""
        memo = self.__dict__.get("_replaced")
        if memo is None:
            memo = {}
            object.__setattr__(self, "_replaced", memo)
        # The value's type too: True == 1 and 3 == 3.0 as dict keys, not as fields.
        key = tuple((name, type(value), value) for name, value in sorted(changes.items()))
        try:
            found = memo.get(key)
        except TypeError:       # an unhashable value: made each time
            return dataclasses.replace(self, **changes)
        if found is None:
            found = memo[key] = dataclasses.replace(self, **changes)
        return found

    @property
    def compute_dtype(self) -> str:
        """bf16, fp16 or fp32: what the matrix products run in (the matmul peak's dtype)."""
        return COMPUTE_DTYPES.get(self.dtype, self.dtype)

    @property
    def uses_cudagraphs(self) -> bool:
        return (self.device == "cuda" and self.mode == "compile"
                and self.compile_mode in CUDAGRAPH_COMPILE_MODES)

    @property
    def name(self) -> str:
        """"compile+sdpa"; the registry's name parts: "compile:max-autotune/layer+sdpa" (glued
        to the mode), "eager+sdpa+liger+ckpt+foreach" (after the attention)."""
        return self.__dict__.get("_name") or self._kept("_name", self._make_name)

    def _make_name(self) -> str:
        parts = _NAME_PARTS
        head, tail = "", []
        fields = self.fields_all()
        for axis in parts:
            if not _applies(axis, fields):
                continue        # its value is the canonical one, and says nothing here
            text = axis.text(getattr(self, axis.name))
            if axis.name_slot == 0:
                head += text
            elif text:
                tail.append(text)
        return "+".join([head, *tail])

    @property
    def model_label(self) -> str:
        """A short name for the model: the preset, or the config's file or folder name."""
        return model_label(self.model)

    @property
    def world_size(self) -> int:
        """Processes of the job (one device each): nproc per node x nodes."""
        return self.nproc * self.nnodes

    @property
    def distributed(self) -> bool:
        """Runs as a torchrun job (also a one-process DDP or FSDP2 job)."""
        return self.parallel != "none"

    @property
    def rank_tokens_per_step(self) -> int:
        """Tokens one process trains per step: `batch` is per process (per GPU)."""
        return self.batch * self.seq

    @property
    def tokens_per_step(self) -> int:
        """Tokens the whole job trains per step (global batch = batch x world size)."""
        return self.batch * self.seq * self.world_size

    @property
    def parallel_label(self) -> str:
        """"1 process" (no wrapper), "ddp x2", "fsdp2 x16 (2 nodes)"."""
        if not self.distributed:
            return "1 process"
        nodes = f" ({self.nnodes} nodes)" if self.nnodes > 1 else ""
        return f"{self.parallel} x{self.world_size}{nodes}"

    def single_process_twin(self):
        """The same setup on one device without a wrapper: the baseline of scaling efficiency.
        Where the wrapper decides something one GPU chooses freely, the baseline is one GPU's
        default: compiled whole (FSDP2 compiles per layer; DDP may) and pure bf16 for FSDP2's
        mixed precision, so that every job of a model is held to the same one-GPU step."""
        return dataclasses.replace(self, nproc=1, nnodes=1, parallel="none", compile_scope="model",
                                   dtype=BASELINE_PRECISIONS.get(self.dtype, self.dtype))

    @property
    def has_seq(self) -> bool:
        """False for a user's factory that takes no `seq_len`: its setups hold seq 1
        (workload/plan.py), no length of its own to show."""
        return not (self.seq == 1 and is_factory(self.model))

    @property
    def batch_words(self) -> str:
        """"compile+sdpa batch 4 seq 2048": the name, batch and sequence length of a progress
        line; "eager batch 4" where the setup has no sequence length."""
        return f"{self.name} batch {self.batch}{self.seq_words}"

    @property
    def seq_words(self) -> str:
        """" seq 2048" for labels ("batch 4 seq 2048"); "" where the setup has no sequence
        length."""
        return f" seq {self.seq}" if self.has_seq else ""

    @property
    def at_seq(self) -> str:
        """" at seq 2048" for labels; "" where the setup has no sequence length."""
        return f" at{self.seq_words}" if self.has_seq else ""

    @property
    def shape(self) -> str:
        """"4 x 2048": batch x sequence length; "4" where the setup has no sequence length."""
        return f"{self.batch} x {self.seq}" if self.has_seq else str(self.batch)

    @property
    def wrapping(self) -> str:
        """How the job wraps the model, in words: "" without a wrapper; "DDP, compiled whole";
        FSDP2's units and choices: "per layer + root, reshard, implicit prefetch, bf16 params"."""
        return self.wrapped_as()

    def wrapped_as(self, block: str | None = None) -> str:
        """`wrapping`, with FSDP2's units as the model gave them: `block` None, a transformers
        model's decoder layers; a user's block class's name ("per Block + root, ..."); "", no
        block (the root alone, one unit: reshard and prefetch have nothing to act on)."""
        if self.parallel == "ddp":
            scope = {"model": ", compiled whole", "layer": ", layers compiled"}
            return "DDP" + (scope[self.compile_scope] if self.mode == "compile" else "")
        if self.parallel != "fsdp2":
            return ""
        params = ("fp32 params, bf16 compute, fp32 reduce" if self.dtype == "mixed-bf16"
                  else f"{self.dtype} params")
        kept = [params, f"optimizer on {OPTIMIZER_ON[self.fsdp_optimizer]}"]
        compiled = self.mode == "compile"
        if block == "":
            return ", ".join(["root alone (no block class named)", *kept]
                             + (["compiled whole"] if compiled else []))
        name = block or "layer"
        units = f"per {name}" if self.fsdp_unit == 1 else f"per {self.fsdp_unit} {name}s"
        return ", ".join([f"{units} + root", "reshard" if self.fsdp_reshard else "no reshard",
                          "explicit prefetch" if self.fsdp_prefetch else "implicit prefetch",
                          *kept]
                         + ([f"{'blocks' if block else 'layers'} compiled"] if compiled else []))

    def eager_twin(self):
        """The same workload and attention without torch.compile (every compile-only field at
        its default): what a compiled setup is compared with (speed, memory, losses)."""
        return self._kept("_eager_twin", lambda: dataclasses.replace(self, mode="eager"))

    def workload(self):
        """This setup with its variant fields (how the step runs) blanked: setups with equal
        workloads train the same model on the same tokens and can be compared. Made once per
        Setup: a report asks it of every row several times."""
        return self._kept("_workload", self._make_workload)

    def _make_workload(self):
        copy = object.__new__(type(self))     # no __post_init__: blanks are not values
        for axis in AXES:
            object.__setattr__(copy, axis.name, "" if axis.variant else getattr(self, axis.name))
        return copy

    def to_dict(self) -> dict:
        return {"name": self.name, **self.fields()}

    @classmethod
    def from_dict(cls, data: dict):
        """A Setup from a record's `setup` object; fields it lacks take their defaults, fields
        it does not know (a newer stepbench's) are left out."""
        return cls(**{k: v for k, v in data.items() if k in AXIS_NAMES})

    def to_flags(self) -> list[str]:
        """The `stepbench run` flags whose matrix is this one setup (same key): the fields of
        stepbench 0.1 always (where they apply), later ones where they differ from a run's
        default. `device` first: the other defaults depend on it."""
        flags = ["--device", self.device]
        for axis in AXES:
            value = getattr(self, axis.name)
            if axis.name == "device" or value is None or not _applies(axis, self.fields_all()):
                continue
            default = axis.default_for(self.device)
            if axis.later and (default == value or default == (value,)):
                continue
            text = ("on" if value else "off") if axis.kind is bool else f"{value:g}" \
                if isinstance(value, float) else str(value)
            flags += [axis.flag, text]
        return flags

    def command(self, repeats: int = 1) -> str:
        """The reproduce command: `stepbench run` of this setup."""
        extra = ["--repeats", str(repeats)] if repeats > 1 else []
        return shlex.join(["stepbench", "run", *self.to_flags(), *extra])

    def fields_all(self) -> dict:
        return {a.name: getattr(self, a.name) for a in AXES}


def _make_setup():
    specs = []
    for axis in AXES:
        if axis.name in REQUIRED:
            specs.append((axis.name, axis.kind))
        else:
            specs.append((axis.name, axis.kind | None if axis.optional else axis.kind,
                          dataclasses.field(default=field_default(axis))))
    cls = dataclasses.make_dataclass(
        "Setup", specs, bases=(SetupMethods,), frozen=True,
        namespace={"__doc__": "One training-step configuration, run in its own process; one "
                              "field per axis of the registry (stepbench.axes.AXES)."})
    cls.__module__ = __name__
    return cls


Setup = _make_setup()


def matrix(values: Mapping[str, object]) -> list:
    """Every combination of the axes' values, checked, in a stable order: matrix axes nest by
    their `nest` (parallel outermost, then model, batch, seq, precision, ..., attention, then
    eager before compiled); a combination a field does not apply to (a compile mode in eager
    mode) appears once. `values`: axis name -> a tuple (a matrix axis) or one value."""
    values = workload_values(values)
    axes = sorted(AXES, key=lambda a: a.nest)
    names = [a.name for a in axes]
    choices = [values[n] if isinstance(values[n], tuple) else (values[n],) for n in names]
    plan = [planned(Setup(**dict(zip(names, combo)))).check()
            for combo in itertools.product(*choices)]
    return list(dict.fromkeys(plan))


def workload_values(values: Mapping[str, object]) -> Mapping[str, object]:
    """`values` with the workload's own part settled: a factory's `--param` specs expanded into
    every combination, its declared axes passed to it, the axes that do not apply refused
    (workload/plan.py); a transformers model takes no `--param`."""
    from stepbench.workload.plan import factory_values, no_params

    if is_factory(values.get("model")):
        return factory_values(values)
    no_params(values)
    return values


def planned(setup):
    """`setup` as a new run measures it: FSDP2 compiles each decoder layer on its own
    (measure/parallel.py), so a planned compiled fsdp2 setup says scope `layer`. fsdp2 records
    written before the scope was recorded hold the default, `model`, although they too compiled
    per layer: they keep their keys, and no new setup is taken for them."""
    if setup.parallel == "fsdp2" and setup.mode == "compile" and setup.compile_scope == "model":
        return setup.replace(compile_scope="layer")
    return setup


def setup_line(setup) -> str:
    """A setup on one line, as --dry-run lists it."""
    return (f"{setup.name}  batch {setup.shape}  {setup.dtype}  {setup.model_label}  "
            + (f"{setup.params}  " if setup.params else "")
            + (f"{setup.parallel_label}  " if setup.distributed else "") + setup.device)
