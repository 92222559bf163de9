"""The package's imports, read from the source (every import statement, also those inside
functions): no module is part of a cycle, and no layer imports one above it."""

import ast
import functools
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src"


def modules() -> dict[str, Path]:
    found = {}
    for path in (SRC / "stepbench").rglob("*.py"):
        name = ".".join(path.relative_to(SRC).with_suffix("").parts)
        found[name.removesuffix(".__init__")] = path
    return found


@functools.cache
def tree(path: Path) -> ast.Module:
    """A source file's syntax tree, parsed once per test process (several tests read them all)."""
    return ast.parse(path.read_text())


def graph() -> dict[str, set[str]]:
    """module -> the stepbench modules it imports (a name imported from a package is the
    submodule where one of that name exists)."""
    return {name: set(targets) for name, targets in _graph().items()}


@functools.cache
def _graph() -> dict[str, set[str]]:
    known = modules()
    edges: dict[str, set[str]] = {name: set() for name in known}
    for name, path in known.items():
        for node in ast.walk(tree(path)):
            if isinstance(node, ast.Import):
                edges[name] |= {a.name for a in node.names if a.name in known}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for alias in node.names:
                    full = f"{node.module}.{alias.name}"
                    if full in known:
                        edges[name].add(full)
                    elif node.module in known:
                        edges[name].add(node.module)
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module, or of one that imports itself
    (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 or v in edges[v]:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycle_anywhere_in_the_package():
    assert cycles(graph()) == []


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"a"}}) == [["a"]]


def test_no_layer_imports_one_above_it():
    # measure/ runs inside a setup's process; search/ proposes setups; report/ reads records
    # (and a search's result) and never what runs them; cli/ is on top.
    above = {"stepbench.measure": ("stepbench.execute", "stepbench.search", "stepbench.report",
                                   "stepbench.cli"),
             "stepbench.search": ("stepbench.report", "stepbench.cli"),
             "stepbench.report": ("stepbench.execute", "stepbench.measure", "stepbench.cli"),
             "stepbench.execute": ("stepbench.search", "stepbench.report", "stepbench.cli")}
    wrong = [(module, target) for module, targets in graph().items() for target in targets
             for layer, banned in above.items()
             if module.startswith(layer + ".") and target.startswith(banned)]
    assert wrong == []


def test_the_report_never_imports_torch():
    for path in (SRC / "stepbench" / "report").rglob("*.py"):
        for node in ast.walk(tree(path)):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            assert not any(n == "torch" or n.startswith("torch.") for n in names), path


def test_the_report_imports_only_the_tunes_result_types():
    # report/ draws a tune's result; the strategy, its budget and its measurements stay in
    # search/tune/ (the report reads TuneResult and never runs a search).
    edges = graph()
    used = {target for module, targets in edges.items() if module.startswith("stepbench.report")
            for target in targets if target.startswith("stepbench.search.tune")}
    assert used == {"stepbench.search.tune.results"}


def test_no_search_or_report_module_is_over_500_lines():
    long = [str(p.relative_to(SRC)) for folder in ("search", "report")
            for p in (SRC / "stepbench" / folder).rglob("*.py")
            if len(p.read_text().splitlines()) > 500]
    assert long == []
