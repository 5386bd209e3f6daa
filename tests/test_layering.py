"""Architecture rule: a stage imports only from itself and from stages earlier in the data flow."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import cxrground

#: The data flow, earliest first. Every top-level module or package of cxrground must be listed.
STAGES = [
    "errors",
    "extras",
    "registry",
    "plugins",
    "fields",
    "hf_offline",
    "vocab",
    "io",
    "llm",
    "net",
    "reports",
    "anatomy",
    "datasets",
    "lesions",
    "ils",
    "models",
    "percept",
    "evaluation",
    "review",
    "serve",
    "doctor",
    "cli",
    "testing",
]
ROOT = Path(cxrground.__file__).resolve().parent


def _stage_of(path: Path) -> str | None:
    rel = path.relative_to(ROOT)
    name = rel.parts[0].removesuffix(".py")
    return None if name in ("__init__", "__main__") else name


def _imported_stages(path: Path) -> set[tuple[str, int]]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: set[tuple[str, int]] = set()
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        for name in names:
            parts = name.split(".")
            if parts[0] == "cxrground" and len(parts) > 1:
                found.add((parts[1], node.lineno))
    return found


def test_every_module_belongs_to_a_known_stage():
    unknown = {_stage_of(p) for p in ROOT.rglob("*.py")} - set(STAGES) - {None}
    assert not unknown, f"add these to STAGES in data-flow order: {sorted(unknown)}"


def test_no_import_from_a_later_stage():
    order = {s: i for i, s in enumerate(STAGES)}
    problems = []
    for path in ROOT.rglob("*.py"):
        stage = _stage_of(path)
        if stage is None:
            continue
        for imported, line in _imported_stages(path):
            if imported in order and order[imported] > order[stage]:
                problems.append(f"{path.relative_to(ROOT)}:{line} ({stage}) imports {imported}")
    assert not problems, problems


def test_bench_scripts_use_the_library_not_the_cli():
    """``bench/`` measures the library: it must not import ``cxrground.cli`` (whose logic lives in the stages)."""
    bench = ROOT.parents[1] / "bench"
    offenders = []
    for path in sorted(bench.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            else:
                continue
            if any(n == "cxrground.cli" or n.startswith("cxrground.cli.") for n in names):
                offenders.append(f"bench/{path.relative_to(bench)}:{node.lineno}")
    assert bench.is_dir(), f"bench/ not found at {bench}"
    assert not offenders, f"bench scripts import cxrground.cli: {offenders}"


# --- no import cycles between modules -------------------------------------------------------------


def _module_files(root: Path, package: str) -> dict[str, tuple[Path, bool]]:
    """Dotted module name -> (file, is a package ``__init__``) for every ``.py`` file under ``root``."""
    out: dict[str, tuple[Path, bool]] = {}
    for path in sorted(root.rglob("*.py")):
        parts = [package, *path.relative_to(root).with_suffix("").parts]
        is_pkg = parts[-1] == "__init__"
        out[".".join(parts[:-1] if is_pkg else parts)] = (path, is_pkg)
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _import_nodes(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement at any depth (functions, methods, try blocks), except under ``if TYPE_CHECKING``."""
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        stack.extend(ast.iter_child_nodes(node))


def import_graph(root: Path, package: str) -> dict[str, set[str]]:
    """Module -> the modules of ``package`` it imports.

    Counted: ``import a.b`` and ``from a.b import c`` at any depth, inside functions too, relative imports
    resolved; ``from a import b`` where ``a.b`` is a module counts as importing ``a.b`` (so a package
    ``__init__`` that re-exports from its submodules imports them); a name that is not a module counts as
    importing the nearest enclosing module. Not counted: imports under ``if TYPE_CHECKING:`` (never run),
    and the implicit import of a parent package that Python performs before a submodule.
    """
    modules = _module_files(root, package)

    def owner(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, (path, is_pkg) in modules.items():
        here = name if is_pkg else name.rpartition(".")[0]
        for node in _import_nodes(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                base = node.module or ""
                if node.level:
                    parent = here.split(".")[: len(here.split(".")) - node.level + 1]
                    base = ".".join([*parent, *([node.module] if node.module else [])])
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            for target in targets:
                found = owner(target) if target.split(".")[0] == package else None
                if found is not None and found != name:
                    graph[name].add(found)
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle (``[a, b, ..., a]``) per strongly connected component of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                components.append(comp)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return [_cycle_in(graph, comp) for comp in components]


def _cycle_in(graph: dict[str, set[str]], comp: set[str]) -> list[str]:
    """A shortest path from the component's first module back to itself, inside the component."""
    start = min(comp)
    paths = {w: [start, w] for w in sorted(graph[start] & comp)}
    frontier = list(paths)
    while start not in paths:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v] & comp):
                if w not in paths:
                    paths[w] = [*paths[v], w]
                    nxt.append(w)
        frontier = nxt
    return paths[start]


def test_no_import_cycles_between_modules():
    """No module of cxrground imports another that imports it back, directly or through others.

    Imports inside functions count (a cycle hidden in a function is still a cycle); imports under
    ``if TYPE_CHECKING:`` do not (they never run); see :func:`import_graph` for what counts.
    """
    cycles = import_cycles(import_graph(ROOT, "cxrground"))
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_the_cycle_check_sees_imports_in_functions_and_package_reexports(tmp_path: Path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    files = {
        "__init__.py": "",
        "a.py": "from pkg.b import thing\n",
        "b.py": "def thing():\n    from pkg import a\n    return a\n",  # a <-> b, hidden in a function
        "c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.d import X\n",
        "d.py": "from pkg.c import TYPE_CHECKING\n",  # c -> d only under TYPE_CHECKING: no cycle
        "sub/__init__.py": "from .impl import f\n",  # re-export: sub -> sub.impl
        "sub/impl.py": "def f():\n    import pkg.sub\n",  # sub.impl -> sub
    }
    for rel, text in files.items():
        (pkg / rel).write_text(text)
    graph = import_graph(pkg, "pkg")
    assert graph["pkg.c"] == set() and graph["pkg.d"] == {"pkg.c"}
    cycles = sorted(import_cycles(graph))
    assert cycles == [["pkg.a", "pkg.b", "pkg.a"], ["pkg.sub", "pkg.sub.impl", "pkg.sub"]]
