"""What one benchmark run is: a frozen Setup value, its identity, and the matrix a command asks for.

`Setup.key()` is the one identity of what was measured: resume, the report's rows and the eager
twin of a compiled setup are all built on it. Every field is part of it, so two records that
differ in any setting (steps, a memory limit, a seed) are never taken for repeats of one setup.
A field added later gets a default, and a record written before it existed reads back as that
default: old results files keep resuming and reporting as they did.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
from dataclasses import dataclass
from pathlib import Path

from stepbench.errors import UserError

MODES = ("eager", "compile")
# transformers' attn_implementation names; flash_attention_2/3 need their packages (a missing one
# is reported as "unsupported" by the child, not rejected here).
ATTENTIONS = ("eager", "sdpa", "flex_attention", "flash_attention_2", "flash_attention_3")
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
# torch.compile's modes that capture CUDA graphs (cudagraph trees) on a GPU.
CUDAGRAPH_COMPILE_MODES = ("reduce-overhead", "max-autotune")
# What torch.compile wraps: the whole model, or each decoder layer on its own (as FSDP2 wraps).
COMPILE_SCOPES = ("model", "layer")
# The precision of the step (the `dtype` field, for old results files): pure bf16/fp16/fp32 hold
# weights, gradients and optimizer state in that dtype; autocast-bf16 keeps fp32 master weights
# and runs the forward under torch.autocast(bf16); float8 trains the linear layers in float8
# (torchao's convert_to_float8_training, tensorwise scaling) on bf16 weights.
DTYPES = ("bf16", "fp16", "fp32", "autocast-bf16", "float8")
# The dtype the matrix products run in, for the matmul peak and MFU (float8: against bf16's).
COMPUTE_DTYPES = {"bf16": "bf16", "fp16": "fp16", "fp32": "fp32", "autocast-bf16": "bf16",
                  "float8": "bf16"}
# Fused kernels: liger-kernel's RMSNorm, RoPE, SwiGLU and fused linear cross-entropy, or the same
# without the fused cross-entropy (the one that departs most from the model's own loss code).
KERNELS = ("none", "liger", "liger-no-flce")
OPTIMIZERS = ("fused", "foreach")   # torch.optim.AdamW's implementation
DEVICES = ("cuda", "cpu")
# Where the random weights are drawn. "device": on the setup's own device (a GPU draws the post's
# model in milliseconds; the default of a run). "cpu": on the CPU, as stepbench 0.1 and the post's
# script did (seconds of single-threaded random numbers), the weights older records started from.
# The two give other numbers for one seed, so losses compare only within one value.
INITS = ("device", "cpu")
# How one setup's step is spread over several processes: "none" is one process on one device;
# "ddp" (DistributedDataParallel) and "fsdp2" (fully_shard) run a torchrun job of `nproc`
# processes per node, one device each (execute/executor.py, measure/distributed.py).
PARALLELS = ("none", "ddp", "fsdp2")

# How the step runs, as opposed to what it trains: the fields a report compares side by side
# within one workload (compiled against eager, one attention kernel against another).
VARIANT_FIELDS = ("mode", "compile_mode", "attn", "compile_scope", "kernels", "checkpointing",
                  "optimizer")

# Fields added after stepbench 0.1, written into a record and the identity only when they differ
# from their default: a setup that leaves them alone keeps the key and the `setup` object it had
# before they existed, so old results files resume and read back byte for byte.
LATER_FIELDS = {"compile_scope": "model", "kernels": "none", "checkpointing": False,
                "optimizer": "fused", "init": "cpu", "nproc": 1, "parallel": "none", "nnodes": 1}

# Defaults that depend on where the setups run: the post's model and sequence on a GPU, a model
# small enough for a couple of minutes on a laptop CPU otherwise.
DEVICE_DEFAULTS = {
    "cuda": {"model": "llama-468m", "seq": 2048, "timeout_s": 1800.0},
    "cpu": {"model": "llama-tiny", "seq": 256, "timeout_s": 600.0},
}


def choose(kind: str, value: str, valid: tuple[str, ...]) -> str:
    """Return `value` if valid, else raise a UserError that lists the valid choices."""
    if value not in valid:
        raise UserError(f"unknown {kind} {value!r}; choose one of: {', '.join(valid)}")
    return value


@dataclass(frozen=True)
class Setup:
    """One training-step configuration, run in its own process."""

    model: str                     # preset name (measure/models.py) or path to an HF config
    mode: str                      # "eager" or "compile"
    attn: str                      # transformers attn_implementation
    batch: int = 4                 # sequences per step
    seq: int = 2048                # tokens per sequence
    dtype: str = "bf16"            # weights, grads and optimizer state (pure, as in the post)
    device: str = "cuda"
    compile_mode: str = "default"  # torch.compile(mode=...); always "default" in eager mode
    warmup: int = 4                # steps after the first one, before timing
    steps: int = 20                # timed steps
    seed: int = 0                  # weights and tokens; equal seeds make losses comparable
    memory_limit_gb: float | None = None  # cap the child's memory to see what fits a smaller card
    compile_scope: str = "model"   # torch.compile the whole model, or each decoder layer
    kernels: str = "none"          # fused kernels: none, liger, liger-no-flce
    checkpointing: bool = False    # activation checkpointing (recompute in the backward)
    optimizer: str = "fused"       # AdamW implementation: fused or foreach
    init: str = "cpu"              # where the weights are drawn (INITS); records before it: cpu
    nproc: int = 1                 # processes (GPUs) per node of a distributed job
    parallel: str = "none"         # none, ddp or fsdp2: how the step is spread over processes
    nnodes: int = 1                # hosts the job spans (torchrun --nnodes)

    def __post_init__(self):
        # Normalised so that equal settings give equal keys: 3 and 3.0 GB are one limit, the
        # compile mode means nothing without compilation, and on the CPU the device is the CPU.
        if self.memory_limit_gb is not None:
            object.__setattr__(self, "memory_limit_gb", float(self.memory_limit_gb))
        if self.mode == "eager":
            object.__setattr__(self, "compile_mode", "default")
        if self.device == "cpu":
            object.__setattr__(self, "init", "cpu")

    def check(self) -> "Setup":
        """Raise a UserError naming the fix when a field is not one stepbench can run."""
        choose("mode", self.mode, MODES)
        choose("attention", self.attn, ATTENTIONS)
        choose("compile mode", self.compile_mode, COMPILE_MODES)
        choose("precision", self.dtype, DTYPES)
        choose("device", self.device, DEVICES)
        choose("init", self.init, INITS)
        choose("compile scope", self.compile_scope, COMPILE_SCOPES)
        choose("fused kernels", self.kernels, KERNELS)
        choose("optimizer", self.optimizer, OPTIMIZERS)
        if not isinstance(self.checkpointing, bool):
            raise UserError(f"--checkpointing takes off or on, got {self.checkpointing!r}")
        if self.mode == "eager" and self.compile_scope != "model":
            raise UserError(f"compile scope {self.compile_scope!r} needs torch.compile; eager mode "
                            "compiles nothing: add compile to --modes or drop --compile-scope")
        for flag, value, least in (("--batch", self.batch, 1), ("--seq", self.seq, 1),
                                   ("--steps", self.steps, 1), ("--warmup", self.warmup, 0),
                                   ("--seed", self.seed, 0)):
            if not isinstance(value, int) or isinstance(value, bool) or value < least:
                raise UserError(f"{flag} must be an integer >= {least}, got {value!r}")
        if self.memory_limit_gb is not None and not self.memory_limit_gb > 0:
            raise UserError(f"--memory-limit-gb must be > 0, got {self.memory_limit_gb:g}")
        choose("parallel style (--parallel)", self.parallel, PARALLELS)
        for flag, value in (("--nproc", self.nproc), ("--nnodes", self.nnodes)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise UserError(f"{flag} must be an integer >= 1, got {value!r}")
        if self.parallel == "none" and self.world_size > 1:
            raise UserError(f"--nproc {self.nproc} --nnodes {self.nnodes} runs {self.world_size} "
                            "processes: add --parallel ddp or --parallel fsdp2")
        return self

    def fields(self) -> dict:
        """Every field, less the later ones (LATER_FIELDS) that hold their default."""
        return {k: v for k, v in dataclasses.asdict(self).items()
                if not (k in LATER_FIELDS and v == LATER_FIELDS[k])}

    def key(self) -> str:
        """THE identity of what was measured: every field, canonical JSON."""
        return json.dumps(self.fields(), sort_keys=True)

    @property
    def precision(self) -> str:
        """The precision axis (stored as `dtype`, its name before it had more than dtypes)."""
        return self.dtype

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
        """"compile+sdpa"; a non-default compile mode shows as "compile:max-autotune+sdpa",
        per-layer compilation as "compile/layer+sdpa", and the other options after the
        attention: "eager+sdpa+liger+ckpt+foreach"."""
        mode = self.mode
        if self.mode == "compile" and self.compile_mode != "default":
            mode = f"compile:{self.compile_mode}"
        if self.compile_scope != "model":
            mode = f"{mode}/{self.compile_scope}"
        extras = [self.kernels if self.kernels != "none" else "",
                  "ckpt" if self.checkpointing else "",
                  self.optimizer if self.optimizer != "fused" else ""]
        return "+".join([mode, self.attn, *filter(None, extras)])

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

    def single_process_twin(self) -> "Setup":
        """The same setup on one device without a wrapper: the baseline of scaling efficiency."""
        return dataclasses.replace(self, nproc=1, nnodes=1, parallel="none")

    def eager_twin(self) -> "Setup":
        """The same workload and attention without torch.compile: what a compiled setup is
        compared with (speed, memory, loss parity)."""
        return dataclasses.replace(self, mode="eager", compile_mode="default", compile_scope="model")

    def workload(self) -> "Setup":
        """This setup with its variant fields (VARIANT_FIELDS) blanked: setups with equal
        workloads train the same model on the same tokens and can be compared."""
        return dataclasses.replace(self, **{name: "" for name in VARIANT_FIELDS})

    def to_dict(self) -> dict:
        return {"name": self.name, **self.fields()}

    @classmethod
    def from_dict(cls, data: dict) -> "Setup":
        """A Setup from a record's `setup` object; fields it lacks take their defaults."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


def model_label(model: str) -> str:
    """'llama-468m' for a preset; 'smollm2' for .../smollm2.json; 'qwen' for .../qwen/config.json.

    Tables and plots show this; the record keeps the path.
    """
    path = Path(model)          # a preset name is its own file name
    if path.name == "config.json" and path.parent.name:
        return path.parent.name
    return (path.stem if path.suffix == ".json" else path.name) or model


def matrix(*, models: list[str], modes: list[str], attns: list[str], batches: list[int],
           seqs: list[int], compile_modes: tuple[str, ...] = ("default",),
           compile_scopes: tuple[str, ...] = ("model",), dtypes: tuple[str, ...] = ("bf16",),
           kernels: tuple[str, ...] = ("none",), checkpointing: tuple[bool, ...] = (False,),
           optimizers: tuple[str, ...] = ("fused",), parallels: tuple[str, ...] = ("none",),
           nproc: int = 1, nnodes: int = 1, **common) -> list[Setup]:
    """Every combination, checked, in the post's order: per attention, eager then compiled (once
    per compile mode and scope; neither applies to eager). Per parallel style in the order given,
    outermost: "none" runs one process (the baseline of scaling efficiency), ddp and fsdp2
    `nproc` processes on each of `nnodes` nodes.

    A combination that can never run is refused here, before any process starts: compile
    scopes other than "model" without a compiled mode to apply them to, say.
    """
    for parallel in parallels:
        choose("parallel style (--parallel)", parallel, PARALLELS)
    if "compile" not in modes and set(compile_scopes) != {"model"}:
        raise UserError(f"--compile-scope {','.join(compile_scopes)} needs torch.compile; eager "
                        "mode compiles nothing: add compile to --modes or drop --compile-scope")
    plan = []
    for parallel, model, batch, seq, dtype, kern, ckpt, opt, attn, mode in itertools.product(
            parallels, models, batches, seqs, dtypes, kernels, checkpointing, optimizers, attns,
            modes):
        variants = (itertools.product(compile_modes, compile_scopes) if mode == "compile"
                    else [("default", "model")])
        for cm, scope in variants:
            plan.append(Setup(model=model, mode=mode, attn=attn, batch=batch, seq=seq, dtype=dtype,
                              compile_mode=cm, compile_scope=scope, kernels=kern,
                              checkpointing=ckpt, optimizer=opt, parallel=parallel,
                              nproc=1 if parallel == "none" else nproc,
                              nnodes=1 if parallel == "none" else nnodes, **common).check())
    return list(dict.fromkeys(plan))


def parse_list(flag: str, text: str, cast=str) -> list:
    """Split a comma-separated flag value; empty items and bad numbers are user errors."""
    items = [item.strip() for item in str(text).split(",")]
    if any(not item for item in items):
        raise UserError(f"{flag} needs a comma-separated list without empty items, got {text!r}")
    try:
        return list(dict.fromkeys(cast(item) for item in items))
    except ValueError:
        raise UserError(f"{flag} needs comma-separated integers, got {text!r}") from None


SWITCHES = {"on": True, "off": False, "true": True, "false": False, "yes": True, "no": False,
            "1": True, "0": False}


def parse_switches(flag: str, text) -> list[bool]:
    """"off,on" (or a TOML list of booleans) as [False, True]; anything else is a user error."""
    items = text if isinstance(text, list) else parse_list(flag, text)
    values = []
    for item in items:
        value = item if isinstance(item, bool) else SWITCHES.get(str(item).strip().lower())
        if value is None:
            raise UserError(f"{flag} takes a comma list of off and on, got {item!r}")
        values.append(value)
    return list(dict.fromkeys(values))
