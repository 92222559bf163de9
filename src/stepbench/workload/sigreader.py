"""A factory's keyword parameters read from its module's source, in the standard library alone:
spec.py reads them here, and a remote backend runs this very file (`python -c SOURCE MODEL`) where
the setups run, for a package that is not importable on this machine (execute/elsewhere.py). One
reader on both sides gives one Signature.

The answer is one JSON line (`answer`, read back by `parse`): the fields, or `{"error": KIND,
...}` where the module is not there (`missing`), does not parse (`syntax`), lacks the function
(`nofunc`) or fails to import (`import`). Defaults travel as their repr, read back with
ast.literal_eval: a tuple stays a tuple.
"""

from __future__ import annotations

import ast
import importlib.util
import inspect
import json
import sys

MARK = "stepbench-signature "       # the answer's line, among what the remote shell prints


def find_def(tree: ast.Module, name: str):
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            return node
    return None


def binds(tree: ast.Module, name: str) -> bool:
    """The module binds `name` some other way: an assignment, an import, a class."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == name:
            return True
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            if any((a.asname or a.name.split(".")[0]) == name for a in node.names):
                return True
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                return True
    return False


def defined(tree: ast.Module) -> list[str]:
    return sorted(n.name for n in tree.body
                  if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)))


def of_def(node) -> dict:
    """The fields of a Signature from a `def`: names, literal defaults, **kwargs, required."""
    args = node.args
    positional = [*args.posonlyargs, *args.args]
    names = [a.arg for a in [*args.args, *args.kwonlyargs]]
    defaults = {}
    for arg, default in zip(positional[len(positional) - len(args.defaults):], args.defaults):
        defaults[arg.arg] = default
    for arg, default in zip(args.kwonlyargs, args.kw_defaults):
        if default is not None:
            defaults[arg.arg] = default
    literal = {}
    for key, node_default in defaults.items():
        try:
            literal[key] = ast.literal_eval(node_default)
        except ValueError:
            pass
    # (Positional-only parameters cannot be passed by keyword: not the user's axes.)
    required = [a.arg for a in positional[:len(positional) - len(args.defaults)]
                if a.arg in names]
    required += [a.arg for a, d in zip(args.kwonlyargs, args.kw_defaults) if d is None]
    return {"names": tuple(names), "defaults": tuple(sorted(literal.items(), key=lambda kv: kv[0])),
            "var_keyword": args.kwarg is not None, "required": tuple(required)}


def of_function(function) -> dict:
    """The same fields from an imported function (one that is not a plain `def` in its source)."""
    params = inspect.signature(function).parameters.values()
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return {"names": tuple(p.name for p in params if p.kind in kinds),
            "defaults": tuple((p.name, p.default) for p in params
                              if p.kind in kinds and p.default is not inspect.Parameter.empty
                              and isinstance(p.default, (int, float, str, bool))),
            "var_keyword": any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params),
            "required": tuple(p.name for p in params
                              if p.kind in kinds and p.default is inspect.Parameter.empty)}


def module_file(where: str) -> tuple[str | None, str]:
    """The source file of module `where` as this Python finds it (None where it finds none),
    and why not (" (the error)", or "")."""
    try:
        spec = importlib.util.find_spec(where)
    except (ImportError, ValueError) as exc:
        return None, f" ({exc})"
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return None, ""
    return spec.origin, ""


def read(model: str) -> dict:
    """`package.module:FUNCTION`'s fields as this Python sees it, or {"error": KIND, ...}."""
    where, _, name = model.rpartition(":")
    origin, why = module_file(where)
    if origin is None:
        return {"error": "missing", "why": why}
    try:
        with open(origin, encoding="utf-8") as f:
            tree = ast.parse(f.read(), filename=origin)
    except SyntaxError as exc:
        return {"error": "syntax", "path": origin, "line": exc.lineno, "msg": exc.msg}
    except (OSError, UnicodeDecodeError) as exc:
        return {"error": "import", "why": f"cannot read {origin}: {exc}"}
    found = find_def(tree, name)
    if found is not None:
        return of_def(found)
    if not binds(tree, name):
        return {"error": "nofunc", "path": origin, "defined": defined(tree)}
    try:
        function = getattr(importlib.import_module(where), name, None)
        if function is None or not callable(function):
            return {"error": "nofunc", "path": origin, "defined": defined(tree)}
        return of_function(function)
    except Exception as exc:  # noqa: BLE001 - the user's module failed to import
        return {"error": "import", "why": f"{type(exc).__name__}: {exc}"}


def answer(fields: dict) -> str:
    """`read`'s result as the one line the remote side prints."""
    if "error" not in fields:
        fields = {**fields, "defaults": [[k, repr(v)] for k, v in fields["defaults"]]}
    return MARK + json.dumps(fields)


def parse(output: str) -> dict | None:
    """The fields an answer's line carries (the last such line of `output`), defaults read
    back as they were; None where no answer came (the command failed before printing one)."""
    lines = [line for line in output.splitlines() if line.startswith(MARK)]
    if not lines:
        return None
    try:
        fields = json.loads(lines[-1][len(MARK):])
    except ValueError:
        return None
    if not isinstance(fields, dict) or "error" in fields:
        return fields if isinstance(fields, dict) else None
    defaults = []
    for key, text in fields.get("defaults", ()):
        try:
            defaults.append((key, ast.literal_eval(text)))
        except (ValueError, SyntaxError):
            pass        # a default no literal spells (inf): as if it had none readable
    return {"names": tuple(fields["names"]), "defaults": tuple(defaults),
            "var_keyword": bool(fields["var_keyword"]), "required": tuple(fields["required"])}


if __name__ == "__main__":
    # Not this folder first: the setup's process runs elsewhere, and sees what PYTHONPATH and
    # the installed packages give it.
    if sys.path and sys.path[0] in ("", "."):
        sys.path.pop(0)
    print(answer(read(sys.argv[1])), flush=True)
