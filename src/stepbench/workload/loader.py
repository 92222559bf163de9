"""A factory's name (`FILE.py:NAME` or `pkg.mod:NAME`), and importing its module to get the
function.

A file is imported under a private module name with its own folder first on sys.path, so that
it may import modules beside it; a package module is imported as itself.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import re
import sys
from pathlib import Path

from stepbench.errors import UserError

# `file.py:make` (any path) or `pkg.module:make`.
_SPEC = re.compile(r"(?P<where>.+\.py|[A-Za-z_][\w.]*):(?P<name>[A-Za-z_]\w*)")


def is_factory(model: str | None) -> bool:
    """`model` names a factory (`FILE.py:NAME`, `pkg.mod:NAME`), not a preset or a config."""
    return bool(model) and _SPEC.fullmatch(str(model)) is not None


def split(model: str) -> tuple[str, str]:
    """(`file.py` or `pkg.module`, the function's name)."""
    match = _SPEC.fullmatch(model)
    if match is None:
        raise UserError(f"--model {model!r} is not FILE.py:FUNCTION or package.module:FUNCTION")
    return match["where"], match["name"]


def load_module(where: str):
    """The factory's module; a module it cannot find is a ModuleNotFoundError that names the fix
    (on another machine: the module beside the file that did not travel, the package that is
    not installed there)."""
    try:
        return _load_module(where)
    except ModuleNotFoundError as exc:
        if exc.name and where.endswith(".py"):
            fix = (f"imported by {where}: a module beside the file travels to another machine "
                   "only with --workload-dir (the folder that holds both); a package must be "
                   "installed where the setup runs")
        elif exc.name and (where + ".").startswith(exc.name + "."):
            fix = (f"--model {where}:... is imported as installed where the setup runs: install "
                   "it there or add its folder to PYTHONPATH there (on SSH hosts: --remote-setup "
                   "'export PYTHONPATH=DIR')")
        else:
            fix = f"imported by {where}; install it where the setup runs"
        # This record resumes as done, like any other: the fix is measured with --rerun.
        raise ModuleNotFoundError(f"{exc} ({fix}; then run again with --rerun)", name=exc.name,
                                  path=exc.path) from exc


def _load_module(where: str):
    if not where.endswith(".py"):
        return importlib.import_module(where)
    path = Path(where).resolve()
    name = "stepbench_workload_" + "".join(c if c.isalnum() else "_" for c in str(path))
    if name in sys.modules:
        return sys.modules[name]
    folder = str(path.parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise UserError(f"cannot import {where}; pass a Python file")
    module = importlib.util.module_from_spec(spec)
    # What was imported, for the FLOP cache (flopcache.py): a file changed since is not keyed.
    module.__stepbench_sha256__ = digest([path])
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


def load_function(model: str):
    where, name = split(model)
    module = load_module(where)
    function = getattr(module, name, None)
    if function is None or not callable(function):
        raise UserError(f"{where} has no function {name!r}; fix --model {where}:FUNCTION")
    return function


def digest(paths) -> str:
    """One sha256 over the files' paths and contents (the FLOP cache's key, flopcache.py)."""
    h = hashlib.sha256()
    for path in paths:
        h.update(str(path).encode() + b"\0" + Path(path).read_bytes() + b"\0")
    return h.hexdigest()


def loaded_digest(module) -> str | None:
    """The digest of a factory file as it was imported (`digest`); None for a package module,
    imported as itself."""
    return getattr(module, "__stepbench_sha256__", None)
