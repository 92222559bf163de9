"""The one exception type that means "the user asked for something we cannot do", how an
error's text is shortened to one line wherever stepbench shows it, and how a warning looks.

The CLI turns a UserError into one line on stderr and exit code 2 (or the error's own
`exit_code`), with no traceback; every other exception is a bug and keeps its traceback.
Warnings, stepbench's own (a skipped line of a results file) and its libraries', are one line
each in every command: `stepbench COMMAND: warning: ...` (`warning_line`, `show_warnings`).
"""

from __future__ import annotations

import math
import sys
import warnings
from pathlib import Path


class UserError(Exception):
    """Bad input. The message names the fix, e.g. "unknown attention 'sdp'; choose one of: ...".

    `kind` says which family of mistake it is, for code and tests that must not depend on the
    wording (one of KINDS, or None where no family was named); users never see it."""

    kind: str | None = None

    def __init__(self, message: str = "", *, kind: str | None = None):
        super().__init__(message)
        if kind is not None:
            if kind not in KINDS:
                raise ValueError(f"unknown UserError kind {kind!r}; choose one of: "
                                 + ", ".join(KINDS))
            self.kind = kind


# The families of bad input, by what the user must fix.
KINDS = (
    "unknown_value",   # a name not among the valid ones (the message lists them)
    "bad_value",       # a value of the wrong type or out of range ("must be an integer >= 1")
    "bad_list",        # a comma list that cannot be split or read ("without empty items")
    "conflict",        # settings that cannot go together ("drop --host ... (or --ray)")
    "results_file",    # the results file cannot be written or appended to
)


# The largest integer a setting takes: torch's (int64), which seeds, sizes and counts go into.
INT_MOST = 2**63 - 1


def check_number(value, name: str, kind: type, least: float | None = None,
                 unit: str = "") -> None:
    """A UserError naming `name` (its flag or plan key) unless `value` is a number of `kind`
    that a setting can take: an integer (int) >= `least` and at most INT_MOST, or a finite
    number (float) above `least`. The one check of every flag's and plan key's number."""
    if kind is int:
        if isinstance(value, bool) or not isinstance(value, int) or \
                (least is not None and value < least):
            at_least = f" >= {least:g}" if least is not None else ""
            raise UserError(f"{name} must be an integer{at_least}, got {value!r}",
                            kind="bad_value")
        if value > INT_MOST:
            raise UserError(f"{name} must be an integer up to {INT_MOST} (torch's largest), got "
                            f"{value}", kind="bad_value")
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise UserError(f"{name} must be a number, got {value!r}", kind="bad_value")
    if not math.isfinite(value):
        raise UserError(f"{name} must be a finite number, got {value!r}", kind="bad_value")
    if least is not None and not value > least:
        raise UserError(f"{name} must be > {least:g}{f' {unit}' if unit else ''}, got "
                        f"{value:g}", kind="bad_value")


def first_line(text: str | None, limit: int = 200, last: bool = False) -> str:
    """The first (or, with `last`, the last) non-empty line of `text`, stripped, cut to `limit`
    characters with "..." at the end; "" when there is none. An exception's first line names
    it; a crash's stderr ends in the line that says why it died."""
    lines = [line.strip() for line in str(text or "").splitlines() if line.strip()]
    if not lines:
        return ""
    line = lines[-1] if last else lines[0]
    if len(line) <= limit:
        return line
    cut = line[:limit - 3]
    space = cut.rfind(" ")
    if space >= limit * 3 // 4:      # a word boundary near the end: cut there, not mid-word
        cut = cut[:space]
    return cut.rstrip(" ,;:(") + "..."


def warning_line(command: str, message: str) -> str:
    """A warning as every command prints it: `stepbench COMMAND: warning: MESSAGE`, one line."""
    return f"stepbench {command}: warning: {first_line(message, 500)}"


def each_once(values, where: str, spelled=None) -> tuple:
    """`values` in order, each once; a value given again is dropped with one warning that names
    it (`spelled`: each value as written, where checking changed it: "1e-1" is 0.1), so that a
    comma list's repeat is not measured twice nor dropped unsaid."""
    kept: dict = {}
    again = []
    for i, value in enumerate(values):
        said = str(spelled[i] if spelled is not None else value)
        if value not in kept:
            kept[value] = said
        elif said == kept[value]:
            again.append(said)
        else:
            again.append(f"{said} (the same as {kept[value]})")
    if again:
        warnings.warn(f"{where} gives {', '.join(dict.fromkeys(again))} more than once; each "
                      "value is measured once", stacklevel=3)
    return tuple(kept)


_OURS = str(Path(__file__).resolve().parent)
# The command running in this process, which every warning names (set by show_warnings).
_COMMAND = {"name": "report"}


def command_name() -> str:
    """The command this process runs ("run", "report", "compare", ...), as warnings name it."""
    return _COMMAND["name"]


def show_warnings(command: str) -> None:
    """Print Python's warnings as `warning_line`s on stderr, without the source line Python
    adds; a library's warning names its category and file ("(UserWarning, torch/...)"). The
    report's own warnings (report/document.warn) name `command` too."""
    _COMMAND["name"] = command

    def show(message, category, filename, lineno, file=None, line=None):
        text = str(message)
        if not str(filename).startswith(_OURS):
            parts = Path(filename).parts
            where = "/".join(parts[-2:]) if len(parts) > 1 else filename
            text += f" ({category.__name__}, {where}:{lineno})"
        print(warning_line(command, text), file=file or sys.stderr)

    warnings.showwarning = show


# std::bad_alloc: C++ code (torch's, under --memory-limit-gb on a CPU) that could not allocate.
OOM_MARKERS = ("out of memory", "can't allocate memory", "cannot allocate memory", "bad_alloc")


def out_of_memory(exc: BaseException) -> bool:
    """Whether `exc` says an allocation failed (torch's OutOfMemoryError, a CPU allocator's
    RuntimeError, Python's MemoryError), without importing torch."""
    if isinstance(exc, MemoryError):
        return True
    oom_type = getattr(sys.modules.get("torch"), "OutOfMemoryError", None)
    if oom_type is not None and isinstance(exc, oom_type):
        return True
    return isinstance(exc, RuntimeError) and any(m in str(exc).lower() for m in OOM_MARKERS)


class Unsupported(NotImplementedError):
    """This setup cannot run here (a missing package, a device feature); the reason says why.
    Raised in the measuring process (measure/options.py); the worker records the setup as
    `unsupported` with the reason alone."""
