"""Which records a report or a comparison reads: `--model`, `--setup` and `--gpu` filters, and
`--label`s that keep the records of each input apart.

A filter value is a shell-style glob (`*`, `?`, `[...]`) or an exact name, matched without
regard to case: `--model llama-468m`, `--setup 'compile*'`, `--gpu H100` (a GPU matches with or
without the driver's leading "NVIDIA "). A flag may be given several times and takes comma
lists; a record is kept when it matches some value of every flag given. A value that matches
no record is an error naming what the records hold, so a typo never yields an empty report.
"""

from __future__ import annotations

from dataclasses import dataclass
from fnmatch import fnmatchcase

from stepbench.errors import UserError
from stepbench.record import Record


@dataclass(frozen=True)
class Filters:
    """The values of `--model`, `--setup` and `--gpu` (each a tuple of globs; () keeps all)."""

    models: tuple[str, ...] = ()
    setups: tuple[str, ...] = ()
    gpus: tuple[str, ...] = ()

    @classmethod
    def parse(cls, models=(), setups=(), gpus=()) -> "Filters":
        """From the flags' values (each given once or more, each a comma list)."""
        return cls(_split("--model", models), _split("--setup", setups), _split("--gpu", gpus))

    def __bool__(self) -> bool:
        return bool(self.models or self.setups or self.gpus)

    def apply(self, records: list[Record]) -> list[Record]:
        """The records every given flag keeps; a value that matches no record, or flags that
        together keep none, is a UserError."""
        kept = records
        for flag, values, names in (("--model", self.models, _model_names),
                                    ("--setup", self.setups, _setup_names),
                                    ("--gpu", self.gpus, _gpu_names)):
            if not values:
                continue
            for value in values:
                if not any(_matches(value, names(r)) for r in records):
                    held = ", ".join(dict.fromkeys(names(r)[0] for r in records))
                    raise UserError(f"{flag} {value!r} matches no record; the records hold: "
                                    f"{held}")
            kept = [r for r in kept if any(_matches(v, names(r)) for v in values)]
        if not kept:
            raise UserError(f"no record matches {self.describe()} together")
        return kept

    def describe(self) -> str:
        """The filters as flags: "--model llama-468m --gpu 'H100*'"."""
        return " ".join(f"{flag} {','.join(values)}" for flag, values in
                        (("--model", self.models), ("--setup", self.setups),
                         ("--gpu", self.gpus)) if values)


def _split(flag: str, given) -> tuple[str, ...]:
    values = [v.strip() for text in (given or ()) for v in str(text).split(",")]
    if any(not v for v in values):
        raise UserError(f"{flag} needs names or globs, comma-separated, without empty items",
                        kind="bad_list")
    return tuple(dict.fromkeys(values))


def _matches(pattern: str, names: tuple[str, ...]) -> bool:
    return any(fnmatchcase(name.casefold(), pattern.casefold()) for name in names)


def _model_names(record: Record) -> tuple[str, ...]:
    return record.setup.model_label, record.setup.model


def _setup_names(record: Record) -> tuple[str, ...]:
    return (record.setup.name,)


def _gpu_names(record: Record) -> tuple[str, ...]:
    gpu = record.machine.gpu
    short = gpu[len("NVIDIA "):] if gpu.upper().startswith("NVIDIA ") else gpu
    return gpu, short


def labels_for(files: list[str], labels: list[str] | None) -> list[str | None]:
    """One label per FILE argument from `--label NAME` given once per file, in order; Nones
    without labels. A label count that does not match the files is a UserError."""
    if not labels:
        return [None] * len(files)
    if len(labels) != len(files):
        raise UserError(f"--label was given {len(labels)} time{'s' if len(labels) != 1 else ''} "
                        f"for {len(files)} FILE argument{'s' if len(files) != 1 else ''}; give "
                        "one --label per FILE, in the same order")
    if any(not label.strip() for label in labels):
        raise UserError("--label needs a name")
    return [label.strip() for label in labels]
