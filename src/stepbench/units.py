"""How a number reads in a sentence: a fraction as a percentage, seconds as a duration, what a
throughput counts (tokens, or a user's workload's own unit).

The loss guard, the searches and the report all write sentences with these numbers; one home
keeps "2%" and "18 min" the same wherever they appear.
"""

from __future__ import annotations


def percent(fraction: float | None) -> str:
    """Two significant digits: 0.0212 -> "2.1%", 0.00019 -> "0.019%"; whole percents from 100%
    on, "105%" (two digits would print "1e+02%"); "?" for None."""
    if fraction is None:
        return "?"
    return f"{fraction * 100:,.0f}%" if fraction >= 0.995 else f"{fraction * 100:.2g}%"


def duration(seconds: float, exact: bool = False) -> str:
    """A time span as a reader rounds it: "71 s", "18 min", "3.1 h". `exact`: to the second,
    "23 min 1 s" (a budget and what was spent of it)."""
    if exact:
        minutes, secs = divmod(int(round(seconds)), 60)
        return f"{minutes} min {secs} s" if minutes else f"{secs} s"
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def gigabytes(value: float) -> str:
    """GB (1e9 bytes) to two significant digits, whole ones from 10 on: "0.27 GB", "1.4 GB",
    "137 GB"."""
    return f"{value:.0f} GB" if value >= 10 else f"{value:.2g} GB"


# What a throughput counts where a record names no unit: a transformers model's tokens.
TOKENS = "tokens"


def unit_of(*units: str | None) -> str:
    """What one workload's throughput counts, from its records' `units`: the first one named (a
    user's "images"), else tokens (a transformers model's records name none)."""
    return next((u for u in units if u), TOKENS)


def common_unit(units) -> str | None:
    """The one unit every record counts, from the records' `units` (of any workloads; None is
    tokens); tokens where there are none; None where they differ."""
    found = {unit_of(u) for u in units} or {TOKENS}
    return found.pop() if len(found) == 1 else None
