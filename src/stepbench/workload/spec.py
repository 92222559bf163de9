"""A user factory named on the command line, read without running it: `path/file.py:make` or
`package.module:make`, the function's keyword parameters, and the setups' own parameters
(`--param NAME=V1,V2`).

The parent process checks a factory before any setup's process starts, so a missing file, a
missing function, a syntax error or a parameter the factory does not take is one line and
exit 2, not a failed setup per process. It reads the source with `ast` (the file is not run
here: importing it would import torch and whatever the model needs into the parent); only a
function it cannot find as a `def` in the source (assigned, or imported from elsewhere) is
imported to read its signature.
"""

from __future__ import annotations

import ast
import functools
from dataclasses import dataclass
from pathlib import Path

from stepbench.errors import UserError, each_once
from stepbench.workload import sigreader
from stepbench.workload.loader import is_factory, load_function, split  # noqa: F401

# Keywords stepbench itself passes, and the axes a factory may take as keywords of that name
# (`attn`, `kernels`: else they are refused for its setups).
PASSED = ("batch_size", "device", "seq_len")
DECLARABLE_AXES = {"attn": "attn", "kernels": "kernels"}


@dataclass(frozen=True)
class Signature:
    """The factory's keyword parameters as the source declares them."""

    model: str                          # as given
    names: tuple[str, ...]              # parameters that can be passed by keyword
    defaults: tuple[tuple[str, object], ...] = ()   # literal defaults, where readable
    var_keyword: bool = False           # takes **kwargs: any keyword goes
    required: tuple[str, ...] = ()      # keyword parameters without a default
    # False: accepted unread, its module not importable here and the backend unable to read it
    # where the setups run (execute/elsewhere.py); each setup's process checks what it is given.
    checked: bool = True

    def takes(self, name: str) -> bool:
        return name in self.names or self.var_keyword

    def declares(self, name: str) -> bool:
        """Named in the signature itself (not only through **kwargs)."""
        return name in self.names

    @property
    def user_params(self) -> tuple[str, ...]:
        """The keyword parameters that are the user's own axes (`--param`)."""
        return tuple(n for n in self.names if n not in PASSED and n not in DECLARABLE_AXES)


class NotHere(UserError):
    """The factory's module is not importable on this machine (it may be where the setups run)."""


# Signatures of factories whose module is not importable here, read where the setups run or
# accepted unread (execute/elsewhere.py); set by a remote run before its plan is made.
_ELSEWHERE: dict[str, Signature] = {}


def read_elsewhere(sig: Signature) -> None:
    """Use `sig` for its model, whose module is not importable here."""
    _ELSEWHERE[sig.model] = sig


def forget_elsewhere() -> None:
    _ELSEWHERE.clear()


def unchecked(model: str) -> Signature:
    """A factory accepted unread: it takes any keyword, requires none."""
    return Signature(model, (), var_keyword=True, checked=False)


def from_fields(model: str, fields: dict) -> Signature:
    """A Signature from sigreader's fields (read on another machine), checked as one read here
    is: it takes batch_size."""
    return _takes_batch(Signature(model, **fields))


def signature(model: str) -> Signature:
    """The factory's signature, read from its source; a UserError naming the fix when the file
    or module is missing, does not parse, lacks the function, or the function lacks
    `batch_size`. A module not importable here: the signature read where the setups run
    (read_elsewhere), else NotHere."""
    try:
        return _signature_here(model)
    except NotHere:
        if model in _ELSEWHERE:
            return _ELSEWHERE[model]
        raise


signature.cache_clear = lambda: _signature_here.cache_clear()     # (what tests reset)


def importable_here(model: str) -> bool:
    """A `package.module:FUNCTION` whose module this machine can import (a FILE.py: True, as
    its file travels with the run)."""
    where = split(model)[0]
    return where.endswith(".py") or sigreader.module_file(where)[0] is not None


@functools.lru_cache(maxsize=64)
def _signature_here(model: str) -> Signature:
    where, name = split(model)
    source_path = _source(where, model)
    try:
        tree = ast.parse(source_path.read_text(), filename=str(source_path))
    except SyntaxError as exc:
        raise UserError(f"{source_path}:{exc.lineno}: syntax error ({exc.msg}); fix the file "
                        f"that --model {model} names") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"cannot read {source_path} ({exc}); pass a readable Python file") from None
    found = sigreader.find_def(tree, name)
    if found is None:
        if not sigreader.binds(tree, name):
            defined = sigreader.defined(tree)
            hint = f"; it defines: {', '.join(defined)}" if defined else ""
            raise UserError(f"{source_path} has no function {name!r}{hint}; "
                            f"fix --model {where}:FUNCTION")
        sig = _imported_signature(where, name, model)
    else:
        sig = _from_def(model, found)
    return _takes_batch(sig)


def _takes_batch(sig: Signature) -> Signature:
    if not sig.takes("batch_size"):
        raise UserError(no_batch_size(sig.model))
    return sig


# The texts of what a factory does not take, said by the parent (UserError, before any process)
# and by a setup's process (WorkloadError, for a factory the parent could not read).

def no_batch_size(model: str) -> str:
    return (f"{model} does not take batch_size; add a `batch_size` keyword parameter "
            "(stepbench passes batch_size and device)")


def no_such_param(sig: Signature, name: str) -> str:
    takes = ", ".join(sig.user_params) or "none"
    return (f"--param {name}: {sig.model} takes no parameter {name!r} (its own parameters: "
            f"{takes}); fix the name or add it to the factory")


def no_default(model: str, name: str) -> str:
    return (f"{model} needs `{name}`, which has no default; give --param {name}=V1,V2 (or a "
            "default in the factory)")


def not_an_axis(model: str, flag: str, keyword: str) -> str:
    return (f"{flag} does not apply to {model}: it takes no `{keyword}` keyword; drop {flag} "
            f"(or let the factory take `{keyword}`, which then gets the value)")


def _source(where: str, model: str) -> Path:
    if where.endswith(".py"):
        path = Path(where)
        if not path.is_file():
            raise UserError(f"--model {model}: no such file {where}; pass the path of the "
                            "Python file that defines the factory")
        return path
    origin, why = sigreader.module_file(where)
    if origin is None:
        raise NotHere(f"--model {model}: no module {where!r} importable here{why}; install "
                      "it, add its folder to PYTHONPATH, or pass FILE.py:FUNCTION")
    return Path(origin)


def _from_def(model: str, node) -> Signature:
    return Signature(model, **sigreader.of_def(node))


def _imported_signature(where: str, name: str, model: str) -> Signature:
    """Import the module to read a factory that is not a plain `def` in its source."""
    try:
        function = load_function(model)
        return Signature(model, **sigreader.of_function(function))
    except UserError:
        raise
    except Exception as exc:  # noqa: BLE001 - the user's module failed to import
        raise UserError(f"--model {model}: importing {where} failed ({type(exc).__name__}: "
                        f"{exc}); fix the module") from None


# ---------------------------------------------------------------- the user's own axes

def parse_param_specs(specs) -> dict[str, tuple[str, ...]]:
    """`--param` values (each `NAME=V1,V2`, several joined by `;`) -> {NAME: (V1, V2)}."""
    out: dict[str, tuple[str, ...]] = {}
    for spec in specs or ():
        for part in str(spec).split(";"):
            name, eq, values = part.partition("=")
            name = name.strip()
            items = tuple(v.strip() for v in values.split(","))
            if not eq or not name.isidentifier() or not all(items):
                raise UserError(f"--param takes NAME=V1,V2 (a keyword parameter of the factory "
                                f"and its values), got {part!r}")
            if name in out:
                raise UserError(f"--param {name} is given twice; give its values once, comma "
                                "separated")
            out[name] = each_once(items, f"--param {name}")
    return out


def combos(params: dict[str, tuple[str, ...]]) -> tuple[str | None, ...]:
    """Every combination of the parameters' values, canonical: "depth=2;width=64" (names
    sorted); (None,) without parameters."""
    import itertools

    if not params:
        return (None,)
    names = sorted(params)
    return tuple(";".join(f"{n}={v}" for n, v in zip(names, values))
                 for values in itertools.product(*(params[n] for n in names)))


def param_parts(text: str | None) -> list[tuple[str, str | None]]:
    """A setup's `params` ("a=1;b=2") as [(NAME, value text)] in order; a part without "=" (a
    hand-edited results file's; combos never writes one) as (part, None)."""
    return [(name, value if eq else None)
            for name, eq, value in (part.partition("=") for part in (text or "").split(";") if part)]


def params_of(text: str | None) -> dict[str, str]:
    """A setup's canonical `params` back as {NAME: value text}; a part without "=" is a
    ValueError (a factory is passed only what --param made)."""
    parts = param_parts(text)
    bad = [name for name, value in parts if value is None]
    if bad:
        raise ValueError(f"params part {bad[0]!r} is not NAME=VALUE")
    return dict(parts)


def typed(value: str, default=None, name: str = "value"):
    """A parameter's value as the factory gets it: the type of its default where it has one
    (int, float, bool), else an int, a float, true/false/none, or the text; `name` the
    parameter's, for the error."""
    lowered = value.lower()
    if isinstance(default, str):
        return value
    if isinstance(default, bool) or (default is None and lowered in ("true", "false")):
        if lowered in ("true", "on", "yes", "1"):
            return True
        if lowered in ("false", "off", "no", "0"):
            return False
        raise UserError(f"--param {name}={value}: not a boolean; give true or false")
    if default is None and lowered == "none":
        return None
    for kind in ((type(default),) if isinstance(default, (int, float)) else (int, float)):
        try:
            return kind(value)
        except ValueError:
            if default is not None:
                what = "an integer" if kind is int else "a number"
                raise UserError(f"--param {name}={value}: not {what}, as the default of "
                                f"{name} is; give {what}") from None
    return value


def canonical_value(value: str, default=None, name: str = "value") -> str:
    """One spelling per value, as `typed` reads it: `08` is `8`, `1e-1` is `0.1`, `False`,
    `off` and `0` of a bool are `false` (a setup's identity, so a resume, a compare and an
    API run's `False` match a command line's `false`); text stays as given."""
    value = value.strip()
    read = typed(value, default, name)
    if isinstance(read, bool):
        return "true" if read else "false"
    if read is None:
        return "none"
    return repr(read) if isinstance(read, (int, float)) else value


def check_params(sig: Signature, params: dict[str, tuple[str, ...]]
                 ) -> dict[str, tuple[str, ...]]:
    """Every `--param` names a keyword the factory takes, not one stepbench passes itself;
    returns the values in their canonical spelling (canonical_value), each once."""
    defaults = dict(sig.defaults)
    for name, values in params.items():
        if name in PASSED or name in DECLARABLE_AXES:
            flag = {"batch_size": "--batch", "seq_len": "--seq", "device": "--device",
                    "attn": "--attn", "kernels": "--kernels"}[name]
            raise UserError(f"--param {name}: stepbench passes {name} itself; use {flag}")
        if not sig.takes(name):
            raise UserError(no_such_param(sig, name))
    return {name: each_once([canonical_value(v, defaults.get(name), name) for v in values],
                            f"--param {name}", values) for name, values in params.items()}
