"""Architecture rule: a stage imports only from itself and from stages earlier in the data flow."""

from __future__ import annotations

import ast
from pathlib import Path

import cxrground

#: The data flow, earliest first. Every top-level module or package of cxrground must be listed.
STAGES = [
    "errors",
    "registry",
    "vocab",
    "io",
    "llm",
    "reports",
    "anatomy",
    "datasets",
    "ils",
    "models",
    "percept",
    "evaluation",
    "review",
    "serve",
    "cli",
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
    for path in sorted(bench.glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            else:
                continue
            if any(n == "cxrground.cli" or n.startswith("cxrground.cli.") for n in names):
                offenders.append(f"bench/{path.name}:{node.lineno}")
    assert bench.is_dir(), f"bench/ not found at {bench}"
    assert not offenders, f"bench scripts import cxrground.cli: {offenders}"
