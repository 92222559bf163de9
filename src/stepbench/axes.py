"""The axis registry: every field of a Setup, declared once, with everything the rest of stepbench
needs to know about it.

`Setup`'s fields (setup.py), the `run` and `tune` flags (cli/flags.py), the plan-file keys
(plan.py), the matrix, `Setup.name`, `Setup.to_flags()` (the reproduce command), tune's search
space, the loss guard's order of plainness and what this machine cannot run all come from the
table `AXES` below. Adding an axis is one entry here and its code in measure/options.py;
docs/architecture.md shows a worked example.

The table lives apart from setup.py because Setup is built from it when setup.py is imported: an
axis registered before that (a plugin, or the test that adds a throwaway axis) is a field like
any other. Nothing here imports torch: the report reads setups too.
"""

from __future__ import annotations

import functools
import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from stepbench.errors import UserError, check_number, each_once
from stepbench.workload.spec import is_factory

CUDA, CPU = "cuda", "cpu"
DEVICES = (CUDA, CPU)


class _Absent:
    """`Axis.legacy` of a field stepbench 0.1 already wrote: records always carry it."""

    def __repr__(self) -> str:
        return "ABSENT"


ABSENT = _Absent()


@dataclass(frozen=True)
class Axis:
    """One field of a Setup: what it means, how it is given, checked, named and searched."""

    name: str                   # the Setup field
    kind: type                  # str, int, float or bool
    default: Any                # what a run uses unless told; per device: {"cuda": v, "cpu": v}
    help: str                   # the flag's help; also the docs' table
    key: str = ""               # settings and plan-file key (default: name); flag: --key-with-dashes
    aliases: tuple[str, ...] = ()   # other keys and flags it answers to (--dtype for --precision)
    many: bool = False          # a comma list of values: every combination runs (a matrix axis)
    split: bool = True          # False: the flag is repeated, each value whole (--param N=1,2)
    choices: tuple = ()         # the values it takes; () = any value of `kind` (and >= least)
    least: float | None = None  # the smallest number it takes
    optional: bool = False      # None is a value (no memory limit)
    # The value a record written before this field existed reads as. A setup holding it leaves
    # the field out of its key and its `setup` object, so old results files resume and read
    # back unchanged. ABSENT: stepbench 0.1 wrote the field already.
    legacy: Any = ABSENT
    # The canonical value given the setup's other fields ({name: value}); equal settings must
    # give equal keys (3 and 3.0 GB are one limit; eager mode has no compile mode).
    normalize: Callable[[Any, dict], Any] | None = None
    # Setup.name: slot 0 is glued to the mode ("compile:max-autotune/layer"), 1 is the
    # attention, 2 comes after it ("+liger+ckpt"); `text` gives the part ("" for none).
    name_slot: int | None = None
    text: Callable[[Any], str] = str
    # In a row's label where rows differ in it, from the setup ("seed 1", "4x2048"); None:
    # never shown there (the name shows it, or another axis's detail does).
    detail: Callable[[Any], str] | None = None
    variant: bool = False       # how the step runs, not what it trains (compared side by side)
    start: bool = False         # setups that differ in it start from other weights or tokens
    # How long a setup is measured, not what it runs (warm-up, timed steps): `stepbench compare`
    # matches a before and an after setup that differ only in these (Setup.match_key).
    timing: bool = False
    nest: int = 50              # matrix order: smaller varies slower (outer loop)
    # Values measured before the others, whatever order the flag gives them in.
    leads: tuple = ()
    # Whether the field means something given the setup's other fields ({name: value}); where
    # it does not, a setup holds its default (eager mode has no compile mode).
    applies: Callable[[dict], bool] | None = None
    # The loss guard: a setup with a value outside `reference` cannot be the others' reference
    # (() = any value can); among references, those with a value in `plain` come first, axes
    # with a smaller `plain_rank` counting first.
    reference: tuple = ()
    plain: tuple = ()
    plain_rank: int = 99
    # tune: "screen" (every value at the start batch), "option" (one value at a time on the best
    # setup, in `tune_order`), "memory" (only to make a batch fit), "fixed" (one value, a flag
    # of tune's; batch: where it starts), None (a run's default); the values it searches by
    # default per device (start value first), `expensive` ones after every other option.
    tune: str | None = None
    tune_values: Any = None
    tune_order: int = 50
    expensive: tuple = ()
    # Why this machine cannot run a value, or None: (value, device) -> reason. Measured: the
    # setup's process records `unsupported` with it.
    unsupported: Callable[[Any, str], str | None] | None = None
    # Why a value means nothing on a device, or None: (value, device) -> the reason and its fix.
    # Refused when the plan is made (settings' check_device), as a run would measure another
    # value under its name; tune never searches it there.
    refuses: Callable[[Any, str], str | None] | None = None

    @property
    def flag(self) -> str:
        return "--" + self.key.replace("_", "-")

    @property
    def flags(self) -> list[str]:
        return [self.flag] + ["--" + a.replace("_", "-") for a in self.aliases]

    @property
    def later(self) -> bool:
        """Added after stepbench 0.1: left out of keys and records while it holds `legacy`."""
        return self.legacy is not ABSENT

    def __post_init__(self):
        if not self.key:
            object.__setattr__(self, "key", self.name)

    # -- values ------------------------------------------------------------------------------

    def default_for(self, device: str):
        """The run's default on `device`: a tuple for a matrix axis, else one value."""
        value = self.default[device] if isinstance(self.default, dict) else self.default
        return tuple(value) if self.many and isinstance(value, (list, tuple)) else value

    def check(self, value, what: str | None = None, where: str | None = None):
        """`value` if it is one this axis takes, else a UserError naming the fix. Numbers must
        be >= `least` (integers) or above it (numbers with a fraction), and fit torch
        (errors.check_number). `where`: how the error
        names the setting (a plan file's key as the plan spells it); its flag otherwise."""
        if value is None and self.optional:
            return value
        name = where or self.flag
        if self.choices:
            if value in self.choices and type(value) is type(self.choices[0]):
                return value
            if self.kind is bool:
                raise UserError(f"{name} takes off or on, got {value!r}", kind="bad_value")
            raise UserError(f"unknown {what or self.noun} {value!r}"
                            + (f" in {where}" if where else "") + "; choose one of: "
                            + ", ".join(map(str, self.choices)), kind="unknown_value")
        if self.kind in (int, float):
            check_number(value, name, self.kind, self.least)
        elif not isinstance(value, self.kind) or (self.kind is str and not value):
            raise UserError(f"{name} takes a {self.kind.__name__}, got {value!r}", kind="bad_value")
        return value

    @property
    def noun(self) -> str:
        return NOUNS.get(self.name, self.name.replace("_", " "))

    def parse(self, text, where: str | None = None) -> tuple:
        """A flag's or plan's value as this axis's values, checked: "sdpa,eager" -> ("sdpa",
        "eager"); "off,on" -> (False, True); a TOML list as its items. `where`: how errors name
        the setting (a plan file's key); its flag otherwise."""
        name = where or self.flag
        if not self.split and not isinstance(text, (list, tuple)):
            text = [text]
        items = list(text) if isinstance(text, (list, tuple)) else _split(name, str(text))
        values = []
        for item in items:
            if self.kind is bool:
                value = item if isinstance(item, bool) else SWITCHES.get(str(item).strip().lower())
                if value is None:
                    raise UserError(f"{name} takes a comma list of off and on, got {item!r}",
                                    kind="bad_value")
            elif self.kind in (int, float) and not isinstance(item, (int, float)):
                try:
                    value = self.kind(str(item).strip())
                except ValueError:
                    raise UserError(f"{name} needs comma-separated "
                                    f"{'integers' if self.kind is int else 'numbers'}, got "
                                    f"{text!r}", kind="bad_value") from None
            else:
                value = item
            values.append(self.check(value, where=where))
        # Stable: the others in the order given.
        return tuple(sorted(each_once(values, name, items), key=lambda v: v not in self.leads))

    def why_not(self, value, device: str) -> str | None:
        """Why `value` cannot run on `device` here; None when nothing stands in its way."""
        return self.unsupported(value, device) if self.unsupported else None

    def searched(self, device: str) -> tuple[list, list[str]]:
        """(the values tune tries by default on `device`, start first; a note for each value it
        leaves out because this machine cannot run it)."""
        values = self.tune_values
        values = values.get(device, ()) if isinstance(values, dict) else (values or self.choices)
        kept, notes = [], []
        for value in values:
            reason = self.why_not(value, device) or (self.refuses and self.refuses(value, device))
            if reason is None:
                kept.append(value)
            else:
                notes.append(f"{self.text(value) or value}: not tried ({reason})")
        return kept, notes


NOUNS = {"attn": "attention", "dtype": "precision", "compile_mode": "compile mode",
         "compile_scope": "compile scope", "kernels": "fused kernels",
         "parallel": "parallel style (--parallel)"}
SWITCHES = {"on": True, "off": False, "true": True, "false": False, "yes": True, "no": False,
            "1": True, "0": False}


def _split(where: str, text: str) -> list[str]:
    items = [item.strip() for item in text.split(",")]
    if any(not item for item in items):
        raise UserError(f"{where} needs a comma-separated list without empty items, got {text!r}",
                        kind="bad_list")
    return items


# ---------------------------------------------------------------- what a machine cannot run

def _installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


# transformers' attention names that need a package of their own: (module, pip name).
FLASH_PACKAGES = {"flash_attention_2": ("flash_attn", "flash-attn"),
                  "flash_attention_3": ("flash_attn_interface", "flash-attn 3 (built from "
                                        "flash-attention's hopper/ folder)")}
# torchao's float8 matmuls need compute capability 8.9 or newer (Ada, Hopper, Blackwell).
FLOAT8_MIN_CAPABILITY = (8, 9)


def _missing(module: str, package: str, what: str) -> str | None:
    if _installed(module):
        return None
    return f"{what} needs {package}, which is not installed here (pip install {package.split(' ')[0]})"


def _attention_unsupported(value: str, device: str) -> str | None:
    if value == "flex_attention" and device == CPU:
        return "its backward pass needs a CUDA GPU (FlexAttention does not support backward on CPU)"
    if value in FLASH_PACKAGES:
        if device != CUDA:
            return f"{value} runs on a CUDA GPU only; use --device cuda"
        module, package = FLASH_PACKAGES[value]
        return _missing(module, package, value)
    return None


def _kernels_unsupported(value: str, device: str) -> str | None:
    if value == "none":
        return None
    if device != CUDA:
        return (f"--kernels {value}: liger-kernel's Triton kernels need a CUDA GPU; use "
                "--device cuda or --kernels none")
    return _missing("liger_kernel", "liger-kernel", f"--kernels {value}")


def _precision_unsupported(value: str, device: str) -> str | None:
    if value != "float8":
        return None
    if device != CUDA:
        return ("float8 training needs a CUDA GPU of compute capability 8.9 or newer; use "
                "--device cuda or another --precision")
    missing = _missing("torchao", "torchao", "--precision float8")
    if missing:
        return missing
    capability = compute_capability()
    if capability is not None and capability < FLOAT8_MIN_CAPABILITY:
        return (f"float8 training needs compute capability 8.9 or newer; this GPU has "
                f"{capability[0]}.{capability[1]}")
    return None


def _compile_mode_refused(value: str, device: str) -> str | None:
    if value == "reduce-overhead" and device == CPU:
        return ("its CUDA graphs are left out by inductor on the CPU, so the step measured "
                "would be the default mode's; drop it, or pass --device cuda")
    return None


def compute_capability(index: int = 0) -> tuple[int, int] | None:
    """The GPU's compute capability, from NVML (so the parent never starts CUDA), else from
    torch where this process already started it; None when neither can tell."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            return tuple(pynvml.nvmlDeviceGetCudaComputeCapability(handle))
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 - no NVML (CPU machines): ask torch if it runs CUDA already
        import sys

        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_initialized():
            return tuple(torch.cuda.get_device_capability(index))
        return None


# ---------------------------------------------------------------- the table

def compiled(fields: dict) -> bool:
    """`Axis.applies` of the fields that only torch.compile reads."""
    return fields.get("mode") == "compile"


def distributed(fields: dict) -> bool:
    """`Axis.applies` of the fields that only a torchrun job reads."""
    return fields.get("parallel", "none") != "none"


def sharded(fields: dict) -> bool:
    """`Axis.applies` of FSDP2's wrapping choices."""
    return fields.get("parallel") == "fsdp2"


def canonical_params(text: str | None) -> str | None:
    """A setup's own parameters in one spelling: "b=2;a=1" -> "a=1;b=2"; None or "" -> None."""
    if not text:
        return None
    return ";".join(sorted(part.strip() for part in str(text).split(";") if part.strip()))


def transformers_model(fields: dict) -> bool:
    """`Axis.applies` of what only a transformers model takes (attention kernels, liger): a
    factory that declares such a keyword gets it through its own parameters (`params`)."""
    return not is_factory(fields.get("model"))



AXES: list[Axis] = [
    Axis("model", str, {CUDA: "llama-468m", CPU: "llama-tiny"},
         "preset (llama-468m, llama-135m, llama-small, llama-tiny), path to an HF config.json "
         "/ folder, or your own model's factory: FILE.py:FUNCTION or package.module:FUNCTION "
         "(docs/workloads.md)",
         start=True, nest=10, detail=lambda s: model_label(s.model), tune="fixed"),
    Axis("mode", str, ("eager", "compile"), "comma list of eager, compile", key="modes",
         aliases=("mode",), many=True, choices=("eager", "compile"), name_slot=0, variant=True,
         nest=90, reference=("eager",), tune="screen", tune_values=("eager", "compile")),
    Axis("attn", str, ("sdpa", "eager"),
         "comma list of attention implementations: eager, sdpa, flex_attention, "
         "flash_attention_2, flash_attention_3", aliases=("attention",), many=True,
         choices=("eager", "sdpa", "flex_attention", "flash_attention_2", "flash_attention_3"),
         name_slot=1, variant=True, nest=80, plain=("sdpa",), plain_rank=2, tune="screen",
         applies=transformers_model,
         tune_values={CUDA: ("sdpa", "flash_attention_3", "flash_attention_2", "flex_attention",
                             "eager"),
                      CPU: ("sdpa", "flex_attention", "eager")},
         unsupported=_attention_unsupported),
    Axis("batch", int, (4,), "batch size(s), comma list", many=True, least=1, start=True,
         nest=30, detail=lambda s: s.shape.replace(" ", ""), tune="fixed"),
    Axis("seq", int, {CUDA: (2048,), CPU: (256,)},
         "sequence length(s), comma list", many=True,
         least=1, start=True, nest=40, tune="fixed"),
    Axis("dtype", str, ("bf16",),
         "bf16, fp16, fp32 (pure: weights, grads and optimizer state), autocast-bf16 (fp32 "
         "master weights, bf16 autocast), float8 (torchao float8 linear layers on bf16 "
         "weights), mixed-bf16 (FSDP2 jobs only: fp32 master weights, FSDP2's "
         "MixedPrecisionPolicy computing in bf16 and reducing gradients in fp32); comma list; "
         "--dtype is an alias", key="precision", aliases=("dtype",),
         many=True, choices=("bf16", "fp16", "fp32", "autocast-bf16", "float8", "mixed-bf16"),
         nest=50, detail=lambda s: s.dtype,
         reference=("bf16", "fp16", "fp32", "autocast-bf16", "mixed-bf16"), plain=("bf16",),
         plain_rank=1, tune="option", tune_order=30, tune_values=("bf16", "float8"),
         unsupported=_precision_unsupported),
    Axis("device", str, CUDA, "cuda or cpu",
         choices=DEVICES, start=True, detail=lambda s: s.device),
    Axis("compile_mode", str, ("default",),
         "torch.compile mode(s): default, reduce-overhead, max-autotune, "
         "max-autotune-no-cudagraphs", many=True,
         choices=("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"),
         applies=compiled, nest=95, name_slot=0,
         text=lambda v: "" if v == "default" else f":{v}", variant=True, tune="option",
         tune_order=10,
         tune_values={CUDA: ("default", "reduce-overhead", "max-autotune-no-cudagraphs"),
                      CPU: ("default",)},
         expensive=("max-autotune", "max-autotune-no-cudagraphs"),
         refuses=_compile_mode_refused),
    Axis("warmup", int, 4, "untimed steps after the first", least=0, timing=True,
         detail=lambda s: f"{s.warmup}+{s.steps} steps", tune="fixed"),
    Axis("steps", int, 20, "timed steps", least=1, timing=True, tune="fixed"),
    Axis("seed", int, 0, "weights and tokens", least=0, start=True,
         detail=lambda s: f"seed {s.seed}", tune="fixed"),
    Axis("memory_limit_gb", float, None,
         "cap each child's memory (GPU: a fraction of the card) to see what fits a smaller one",
         optional=True, least=0, normalize=lambda v, _: None if v is None else float(v),
         detail=lambda s: "no limit" if s.memory_limit_gb is None
         else f"{s.memory_limit_gb:g} GB limit", tune="fixed"),
    Axis("compile_scope", str, ("model",),
         "what torch.compile wraps: model (whole) or layer (each decoder layer on its own); "
         "comma list (an FSDP2 job always compiles each layer)", many=True,
         choices=("model", "layer"), legacy="model", name_slot=0,
         text=lambda v: "" if v == "model" else f"/{v}", variant=True, applies=compiled,
         nest=96, tune="option", tune_order=50, tune_values=("model", "layer")),
    Axis("kernels", str, ("none",),
         "fused kernels: none, liger (liger-kernel RMSNorm, RoPE, SwiGLU, fused linear "
         "cross-entropy), liger-no-flce (the same without the fused cross-entropy); comma list",
         many=True, choices=("none", "liger", "liger-no-flce"), legacy="none", name_slot=2,
         text=lambda v: "" if v == "none" else v, variant=True, nest=60, reference=("none",),
         applies=transformers_model,
         tune="option", tune_order=20, tune_values=("none", "liger-no-flce", "liger"),
         unsupported=_kernels_unsupported),
    Axis("checkpointing", bool, (False,), "activation checkpointing: off, on, or off,on",
         many=True, choices=(False, True), legacy=False, name_slot=2,
         text=lambda v: "ckpt" if v else "", variant=True, nest=65, plain=(False,),
         plain_rank=3, tune="memory", tune_values=(False, True)),
    Axis("optimizer", str, ("fused",), "AdamW implementation: fused, foreach; comma list",
         many=True, choices=("fused", "foreach"), legacy="fused", name_slot=2,
         text=lambda v: "" if v == "fused" else v, variant=True, nest=70, plain=("fused",),
         plain_rank=4, tune="option", tune_order=40, tune_values=("fused", "foreach")),
    Axis("init", str, "device",
         "where the random weights are drawn: device (fast) or cpu (as stepbench 0.1 did: the "
         "same weights as its records)", choices=("device", "cpu"),
         legacy="cpu", normalize=lambda v, f: "cpu" if f.get("device") == CPU else v,
         start=True, detail=lambda s: f"weights drawn on {s.init}"),
    Axis("nproc", int, 1, "processes (GPUs) per node of each distributed job, with --parallel; "
         "--batch is per process", least=1, legacy=1, start=True, applies=distributed),
    Axis("parallel", str, ("none",),
         "comma list of none, ddp, fsdp2: run each setup as a torchrun job of --nproc processes "
         "with DistributedDataParallel or FSDP2 (none: one process, measured first: the "
         "baseline of scaling efficiency)", many=True, choices=("none", "ddp", "fsdp2"),
         legacy="none", start=True,
         # none first: a user's model's FLOPs, counted there, are what its ddp and fsdp2 jobs
         # read (workload/factory.py single_process_count), and scaling's baseline.
         nest=0, leads=("none",), detail=lambda s: s.parallel_label),
    Axis("nnodes", int, 1, "hosts one distributed job spans (torchrun --nnodes)", least=1,
         legacy=1, start=True, applies=distributed),
    # FSDP2's wrapping (measure/parallel.py). The legacy values are what every fsdp2 record
    # before these axes ran, so those records keep their keys.
    Axis("fsdp_reshard", bool, (True,),
         "with --parallel fsdp2: free each decoder layer's gathered weights after its forward "
         "and gather them again for its backward (on), or keep them until the backward (off); "
         "the root unit is kept either way; comma list of off, on",
         many=True, choices=(False, True), legacy=True, applies=sharded, name_slot=2,
         text=lambda v: "" if v else "no-reshard", variant=True, nest=72),
    Axis("fsdp_unit", int, (1,),
         "with --parallel fsdp2: decoder layers per FSDP2 unit, each unit gathered and reduced "
         "as one (fewer, larger units run FSDP2's hooks fewer times and hold more gathered "
         "weights at once); comma list",
         many=True, least=1, legacy=1, applies=sharded, name_slot=2,
         text=lambda v: "" if v == 1 else f"unit{v}", variant=True, nest=73),
    Axis("fsdp_prefetch", bool, (False,),
         "with --parallel fsdp2: explicit prefetching, each layer's forward gathering the next "
         "layer's weights and each backward the previous layer's (on), or FSDP2's implicit "
         "order (off); comma list of off, on",
         many=True, choices=(False, True), legacy=False, applies=sharded, name_slot=2,
         text=lambda v: "prefetch" if v else "", variant=True, nest=74),
    Axis("fsdp_optimizer", str, ("dtensor",),
         "with --parallel fsdp2: AdamW over the DTensor parameters (dtensor: as torchtitan does) "
         "or over each rank's local shards (local: the same update without DTensor's dispatch "
         "per op); comma list",
         many=True, choices=("dtensor", "local"), legacy="dtensor", applies=sharded,
         name_slot=2, text=lambda v: "local-optim" if v == "local" else "", variant=True,
         nest=76),
    # A factory's own keyword parameters (workload/spec.py): "depth=2;width=64", names sorted;
    # None for a transformers model. What the model is, so setups that differ in it start
    # from other weights.
    Axis("params", str, None,
         "a keyword parameter of your factory and its values, NAME=V1,V2; repeat the flag for "
         "more (every combination runs)", key="param", many=True, split=False, optional=True,
         legacy=None, normalize=lambda v, _: canonical_params(v),
         start=True, nest=20, detail=lambda s: s.params or "no params", tune="fixed"),
]


@functools.lru_cache(maxsize=1024)     # a report asks it for each of thousands of rows, often
def model_label(model: str) -> str:
    """'llama-468m' for a preset; 'smollm2' for .../smollm2.json; 'qwen' for .../qwen/config.json.

    Tables and plots show this; the record keeps the path.
    """
    path = Path(model)          # a preset name is its own file name
    if path.name == "config.json" and path.parent.name:
        return path.parent.name
    return (path.stem if path.suffix == ".json" else path.name) or model


def axis(name: str) -> Axis:
    """The axis of a Setup field, by name."""
    for a in AXES:
        if a.name == name:
            return a
    raise KeyError(name)


def by_key(key: str) -> Axis | None:
    """The axis a settings key, plan key or alias names (dashes or underscores), or None."""
    key = key.replace("-", "_")
    return next((a for a in AXES if key == a.key or key in a.aliases), None)


def register(new: Axis) -> None:
    """Add an axis. Setup is built from the table when stepbench.setup is first imported, so
    register before that (a plugin's import, or a test)."""
    import sys

    if "stepbench.setup" in sys.modules:
        raise RuntimeError("register axes before stepbench.setup is imported")
    if any(a.name == new.name or a.key == new.key for a in AXES):
        raise ValueError(f"an axis named {new.name!r} exists already")
    AXES.append(new)
