"""`stepbench report`'s settings declared here: its predicted section (`--predict`). The
report's older flags (prices, filters, formats) are still added by cli/report.py itself."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from stepbench.errors import UserError
from stepbench.settings.declare import setting

REPORT = "report"


def gpu_list(value: str, name: str) -> None:
    """A comma list with at least one name (the names themselves are looked up in the GPU
    table by the command, which says the closest ones)."""
    if not names(value):
        raise UserError(f'{name} takes GPU names separated by commas, e.g. {name} '
                        '"L40S,H100 PCIe"', kind="bad_value")


def names(value: str) -> tuple[str, ...]:
    return tuple(n.strip() for n in value.split(",") if n.strip())


@dataclass(frozen=True, kw_only=True)
class ReportSettings:
    command: ClassVar[str] = REPORT

    # One comma list as given (a str flag), held as its names (a tuple: `names`).
    predict: str | None = setting(
        None, metavar="GPUS", check=gpu_list, convert=names,
        help="also predict each profiled setup's step time, fit and tokens per dollar on these "
             'GPUs, comma-separated ("L40S,H100 PCIe"): a table of its own, marked predicted '
             "(stepbench predict's; docs/predict.md). The records need `run --profile`",
        doc="adds the table `stepbench predict` builds for these GPUs (comma list, names as "
            "`stepbench predict --gpu` takes them) as a section of its own, every column "
            "marked predicted; its source records are those the report reads (after "
            "`--model`, `--setup`, `--gpu`) that hold a profile (`run --profile DIR`), its "
            "prices the report's ([predict.md](predict.md))")


__all__ = ["REPORT", "ReportSettings"]
