"""MkDocs hook: configuration tables generated from the dataclasses themselves, so they cannot drift.

A page writes ``<!-- config-table: cxrground.ils.config:IlsConfig -->`` on a line of its own; the hook replaces the
line with a table of the dataclass's fields: name, type, default and description. The description is the field's
``help`` (fields declared with :func:`cxrground.fields.option`), else the string literal that follows the field
in the class body, else the comment at the end of its line (where the spec section is written, e.g. ``# §7.2: ...``).
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import re
import textwrap
from typing import Any

MARKER = re.compile(r"^<!-- config-table: ([\w.]+):(\w+) -->$", re.MULTILINE)
#: A Sphinx cross-reference role in a docstring (``:mod:`a.b```, ``:func:`~a.b```): shown as the code ``a.b``.
ROLE = re.compile(r":(?:mod|func|class|data|meth|attr|obj):`~?([^`]+)`")


def _source_notes(cls: type) -> dict[str, str]:
    """Field name → the docstring after it, else its end-of-line comment, read from the class's source."""
    lines, _ = inspect.getsourcelines(cls)
    source = textwrap.dedent("".join(lines))
    body = ast.parse(source).body[0].body  # type: ignore[attr-defined]
    src_lines = source.splitlines()
    notes: dict[str, str] = {}
    group = ""
    prev_end = body[0].lineno - 1 if body else 0
    for i, node in enumerate(body):
        between = [ln.strip() for ln in src_lines[prev_end:node.lineno - 1]]
        prev_end = node.end_lineno or node.lineno
        comments = [ln[1:].strip() for ln in between if ln.startswith("#") and not ln.startswith("#:")]
        if comments:
            group = " ".join(comments)
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        name = node.target.id
        if group:
            notes[name] = f"*{group}*"
        nxt = body[i + 1] if i + 1 < len(body) else None
        if isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant) and isinstance(nxt.value.value, str):
            notes[name] = (notes.get(name, "") + " " + " ".join(nxt.value.value.split())).strip()
            continue
        line = src_lines[node.end_lineno - 1]  # type: ignore[operator]
        if "#" in line:
            notes[name] = (notes.get(name, "") + " " + line.split("#", 1)[1].strip()).strip()
    return notes


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        return f.default_factory()  # type: ignore[misc]
    return dataclasses.MISSING


def _show(value: Any) -> str:
    if value is dataclasses.MISSING:
        return "*required*"
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        text = ", ".join(f"{k}={v!r}" for k, v in dataclasses.asdict(value).items())
    else:
        text = repr(value)
    if len(text) > 120:
        text = text[:117] + "..."
    return "`" + text.replace("|", "\\|").replace("`", "'") + "`"


def _type_name(f: dataclasses.Field) -> str:
    t = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
    return "`" + str(t).replace("|", "\\|") + "`"


def config_rows(module: str, name: str) -> list[tuple[str, str, str, str]]:
    """The (field, type, default, description) rows of dataclass ``module:name``."""
    cls = getattr(importlib.import_module(module), name)
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{module}:{name} is not a dataclass")
    notes = _source_notes(cls)
    rows = []
    for f in dataclasses.fields(cls):
        if f.name.startswith("_"):
            continue
        meta = dict(f.metadata)
        text = meta.get("help") or notes.get(f.name, "")
        extras = []
        if meta.get("choices"):
            extras.append("choices: " + ", ".join(f"`{c}`" for c in meta["choices"]))
        if meta.get("envvar"):
            extras.append(f"env `{meta['envvar']}`")
        if meta.get("flag"):
            extras.append(f"option `{meta['flag'].split('/')[0]}`")
        if extras:
            text = (text + " (" + "; ".join(extras) + ")").strip()
        default = _default(f)
        if not text and dataclasses.is_dataclass(default) and not isinstance(default, type):
            text = f"a `{type(default).__name__}`: its fields are in their own table"
        text = ROLE.sub(lambda m: f"`{m.group(1)}`", text)
        rows.append((f"`{f.name}`", _type_name(f), _show(default), " ".join(text.split()).replace("|", "\\|")))
    return rows


def config_table(module: str, name: str) -> str:
    """The Markdown table of dataclass ``module:name``."""
    out = [f"*Generated from `{module}.{name}`.*", "", "| field | type | default | description |",
           "|---|---|---|---|"]
    out += ["| " + " | ".join(row) + " |" for row in config_rows(module, name)]
    return "\n".join(out)


def expand(markdown: str) -> str:
    """``markdown`` with every config-table marker replaced by its table."""
    return MARKER.sub(lambda m: config_table(m.group(1), m.group(2)), markdown)


def on_page_markdown(markdown: str, **_: Any) -> str:
    """MkDocs hook entry point."""
    return expand(markdown)
