"""What one benchmark run is: a frozen Setup value, and the matrix of them a command asks for.

A Setup holds everything that changes what is measured, so that a results record carries it whole
and a resumed run can tell which setups are already done. New axes are new fields with defaults:
old records without them read back as the default.
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass

from stepbench.errors import UserError

MODES = ("eager", "compile")
# transformers' attn_implementation names; flash_attention_2/3 need their packages (a missing one
# is reported as "unsupported" by the child, not rejected here).
ATTENTIONS = ("eager", "sdpa", "flex_attention", "flash_attention_2", "flash_attention_3")
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
DTYPES = ("bf16", "fp16", "fp32")
DEVICES = ("cuda", "cpu")


def choose(kind: str, value: str, valid: tuple[str, ...]) -> str:
    """Return `value` if valid, else raise a UserError that lists the valid choices."""
    if value not in valid:
        raise UserError(f"unknown {kind} {value!r}; choose one of: {', '.join(valid)}")
    return value


@dataclass(frozen=True)
class Setup:
    """One training-step configuration, run in its own process."""

    model: str                     # preset name (see models.PRESETS) or path to an HF config
    mode: str                      # "eager" or "compile"
    attn: str                      # transformers attn_implementation
    batch: int = 4                 # sequences per step
    seq: int = 2048                # tokens per sequence
    dtype: str = "bf16"            # weights, grads and optimizer state (pure, as in the post)
    device: str = "cuda"
    compile_mode: str = "default"  # torch.compile(mode=...); ignored in eager mode
    warmup: int = 4                # steps after the first one, before timing
    steps: int = 20                # timed steps
    seed: int = 0                  # weights and tokens; equal seeds make losses comparable
    memory_limit_gb: float | None = None  # cap the child's memory to see what fits a smaller card

    def __post_init__(self):
        choose("mode", self.mode, MODES)
        choose("attention", self.attn, ATTENTIONS)
        choose("compile mode", self.compile_mode, COMPILE_MODES)
        choose("dtype", self.dtype, DTYPES)
        choose("device", self.device, DEVICES)
        for flag, value, least in (("--batch", self.batch, 1), ("--seq", self.seq, 1),
                                   ("--steps", self.steps, 1), ("--warmup", self.warmup, 0)):
            if not isinstance(value, int) or value < least:
                raise UserError(f"{flag} must be an integer >= {least}, got {value!r}")
        if self.memory_limit_gb is not None and self.memory_limit_gb <= 0:
            raise UserError(f"--memory-limit-gb must be > 0, got {self.memory_limit_gb}")

    @property
    def name(self) -> str:
        """"compile+sdpa"; a non-default compile mode shows as "compile:max-autotune+sdpa"."""
        mode = self.mode
        if self.mode == "compile" and self.compile_mode != "default":
            mode = f"compile:{self.compile_mode}"
        return f"{mode}+{self.attn}"

    @property
    def tokens_per_step(self) -> int:
        return self.batch * self.seq

    def to_dict(self) -> dict:
        return {"name": self.name, **dataclasses.asdict(self)}

    @classmethod
    def from_dict(cls, data: dict) -> "Setup":
        fields = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in fields})


def matrix(*, models: list[str], modes: list[str], attns: list[str], batches: list[int],
           seqs: list[int], compile_modes: tuple[str, ...] = ("default",), **common) -> list[Setup]:
    """Every combination, in the post's order: per attention, eager then compiled (once per
    compile mode; the compile mode does not apply to eager)."""
    return [Setup(model=model, mode=mode, attn=attn, batch=batch, seq=seq, compile_mode=cm, **common)
            for model, batch, seq, attn, mode in itertools.product(models, batches, seqs, attns, modes)
            for cm in (compile_modes if mode == "compile" else ("default",))]


def parse_list(flag: str, text: str, cast=str) -> list:
    """Split a comma-separated flag value; empty items and bad numbers are user errors."""
    items = [item.strip() for item in str(text).split(",")]
    if any(not item for item in items):
        raise UserError(f"{flag} needs a comma-separated list without empty items, got {text!r}")
    try:
        return [cast(item) for item in items]
    except ValueError:
        raise UserError(f"{flag} needs comma-separated integers, got {text!r}") from None
