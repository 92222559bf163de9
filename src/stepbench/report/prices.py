"""GPU prices in dollars per hour, from a price file and `--price` flags; and the price of
electricity (`--energy-price`, dollars per kWh).

Cost per token is the one number that changes daily while the measurements do not, so prices
live outside the result files and are joined in by the report. A price is keyed by the GPU name
as the records store it (`machine.gpu`, the driver's name such as "NVIDIA H100 PCIe"); a key may
leave out the "NVIDIA " prefix and case does not matter.

TOML file:                          CSV file:
    [prices]                            gpu,price_per_hour
    "NVIDIA H100 PCIe" = 3.86           NVIDIA H100 PCIe,3.86
    "NVIDIA L40S" = 0.54                NVIDIA L40S,0.54
"""

from __future__ import annotations

import csv
import math
import tomllib
from pathlib import Path

from stepbench.errors import UserError

FLAG_EXAMPLE = '--price "NVIDIA H100 PCIe=3.86"'


def load_price_file(path: str | Path) -> dict[str, float]:
    """Read a .toml or .csv price file into {gpu name: dollars per hour}."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"price file '{path}' not found; pass an existing .toml or .csv file "
                        "to --prices")
    suffix = path.suffix.lower()
    if suffix == ".toml":
        return _from_toml(path)
    if suffix == ".csv":
        return _from_csv(path)
    raise UserError(f"price file '{path}': unknown format '{suffix or path.name}'; "
                    "name it *.toml or *.csv (see docs/report.md)")


def _from_toml(path: Path) -> dict[str, float]:
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise UserError(f"price file '{path}': not valid TOML ({exc})") from None
    table = data.get("prices")
    if not isinstance(table, dict):
        raise UserError(f"price file '{path}': no [prices] table; write lines like "
                        '"NVIDIA H100 PCIe" = 3.86 under [prices]')
    return {str(gpu): _price(value, f"price file '{path}': price of '{gpu}'")
            for gpu, value in table.items()}


def _from_csv(path: Path) -> dict[str, float]:
    with path.open(newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        if reader.fieldnames is None or not {"gpu", "price_per_hour"} <= set(reader.fieldnames):
            raise UserError(f"price file '{path}': the first line must be the header "
                            "gpu,price_per_hour")
        prices = {}
        for row in reader:
            where = f"price file '{path}' line {reader.line_num}"
            gpu = (row["gpu"] or "").strip()
            if not gpu:
                raise UserError(f"{where}: empty gpu name")
            prices[gpu] = _price(row["price_per_hour"], f"{where}: price of '{gpu}'")
    return prices


def parse_price_flags(flags: list[str]) -> dict[str, float]:
    """Parse repeated `--price "GPU NAME=DOLLARS"` flags."""
    prices = {}
    for flag in flags:
        gpu, sep, value = flag.rpartition("=")
        if not sep or not gpu.strip():
            raise UserError(f"--price '{flag}': expected GPU=DOLLARS_PER_HOUR, e.g. {FLAG_EXAMPLE}")
        prices[gpu.strip()] = _price(value, f"--price '{flag}'")
    return prices


def parse_energy_price(value: str | None) -> float | None:
    """`--energy-price DOLLARS_PER_KWH` as a positive number, or None when not given."""
    if value is None:
        return None
    price = _positive_number(value)
    if price is None:
        raise UserError(f"--energy-price {value!r}: expected dollars per kWh as a positive "
                        "number, e.g. --energy-price 0.15")
    return price


def _price(value, what: str) -> float:
    price = _positive_number(value)
    if price is None:
        raise UserError(f"{what} is {value!r}; expected dollars per hour as a positive number")
    return price


def _positive_number(value) -> float | None:
    """A flag's, TOML's or CSV's value as a finite positive float; None if it is not one."""
    if value is None or isinstance(value, bool):
        return None
    try:
        number = float(str(value).strip())
    except ValueError:
        return None
    return number if math.isfinite(number) and number > 0 else None


def _norm(name: str) -> str:
    name = " ".join(name.lower().split())
    return name.removeprefix("nvidia ")


def price_for(prices: dict[str, float], gpu: str) -> float | None:
    """The price of `gpu`: an exact key first, else the same name ignoring case and "NVIDIA "."""
    if gpu in prices:
        return prices[gpu]
    wanted = _norm(gpu)
    for key, value in prices.items():
        if _norm(key) == wanted:
            return value
    return None


def unused_keys(prices: dict[str, float], gpus: list[str]) -> list[str]:
    """Price keys that match none of `gpus` (often a typo in the name)."""
    names = {_norm(g) for g in gpus}
    return [key for key in prices if _norm(key) not in names]
