"""JSON text as `json.dumps(value, indent=2, allow_nan=False)` writes it, character for
character, in about half the time for a report's thousands of rows.

Python's json module writes indented text with its pure-Python encoder (its C encoder knows no
indent): a 3,200-row report spent a tenth of its time there. Here each run of items whose values
print on one line (numbers, strings, booleans, null, empty lists and objects) is written by the C
encoder in one call, its item separator holding the newline and the indent of its level; only
nested lists and objects are walked in Python. A value this does not write as json.dumps would
(a key that is not a string, a type json does not know) is left to json.dumps itself.
"""

from __future__ import annotations

import functools
import json
import math
from json import encoder

_NESTED = (list, tuple, dict)     # written over several lines unless empty


class _Unusual(Exception):
    """Something json.dumps writes by rules of its own (a key that is not a string, before a
    nested list or object)."""


def dumps(value) -> str:
    """json.dumps(value, indent=2, allow_nan=False): the same text, the same ValueError for a
    NaN or an infinity."""
    if encoder.c_make_encoder is None:       # a Python without the C encoder
        return json.dumps(value, indent=2, allow_nan=False)
    try:
        return _text(value, 0)
    except (_Unusual, TypeError):
        return json.dumps(value, indent=2, allow_nan=False)


def _text(value, level: int) -> str:
    if isinstance(value, dict):
        if not value:
            return "{}"
        parts, run = [], {}
        for key, item in value.items():
            if not (isinstance(item, _NESTED) and item):
                run[key] = item         # the C encoder writes keys as json.dumps does
                continue
            if not isinstance(key, str):
                raise _Unusual
            if run:
                parts.append(_encode(run, level + 1)[1:-1])
                run = {}
            parts.append(f"{encoder.encode_basestring_ascii(key)}: {_text(item, level + 1)}")
        if run:
            parts.append(_encode(run, level + 1)[1:-1])
        return _join("{", parts, "}", level)
    if isinstance(value, (list, tuple)):
        if not value:
            return "[]"
        parts, run = [], []
        for item in value:
            if not (isinstance(item, _NESTED) and item):
                run.append(item)
                continue
            if run:
                parts.append(_encode(run, level + 1)[1:-1])
                run = []
            parts.append(_text(item, level + 1))
        if run:
            parts.append(_encode(run, level + 1)[1:-1])
        return _join("[", parts, "]", level)
    return _encode(value, level)


def _join(opening: str, parts: list[str], closing: str, level: int) -> str:
    inner = "\n" + "  " * (level + 1)
    return f"{opening}{inner}{(',' + inner).join(parts)}\n{'  ' * level}{closing}"


def _encode(value, level: int) -> str:
    """`value` (a one-line value, or a list or object of them) by the C encoder, its items
    separated as at indent `level`."""
    return "".join(_encoder(level)(value, 0))


@functools.lru_cache(maxsize=16)
def _encoder(level: int):
    # markers None: no check for circular references (a report's rows have none).
    return encoder.c_make_encoder(None, _unknown, encoder.encode_basestring_ascii, None, ": ",
                                  ",\n" + "  " * level, False, False, False)


def _unknown(value):
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def finite(value):
    """`value` with NaN and infinity (a diverged loss) as null: JSON has no such numbers."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def strict(value, **options) -> str:
    """json.dumps(value, **options) as standard JSON: a NaN or an infinity (which Python writes
    as NaN and Infinity, and strict parsers refuse) as null. The commands' `--format json`
    output on stdout; the results file keeps them (a diverged loss is a result)."""
    try:
        return json.dumps(value, allow_nan=False, **options)
    except ValueError:
        return json.dumps(finite(value), allow_nan=False, **options)
