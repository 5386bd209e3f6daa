"""The benchmark's ``MANIFEST.sha256``: one ``{sha256}  {path}`` line per file, sorted by path."""

from __future__ import annotations

from pathlib import Path

from cxrground.io.files import sha256_file
from cxrground.percept.layout import MANIFEST_FILE, WORK_DIR

__all__ = ["manifest_lines"]


def _files(root: Path) -> list[str]:
    out = []
    for p in root.rglob("*"):
        rel = p.relative_to(root).as_posix()
        if p.is_file() and rel != MANIFEST_FILE and not rel.startswith(WORK_DIR + "/"):
            out.append(rel)
    return sorted(out)


def manifest_lines(root: str | Path) -> list[str]:
    """``{sha256}  {path}`` for every file of the benchmark except the manifest itself and ``.work/``."""
    root = Path(root)
    return [f"{sha256_file(root / rel)}  {rel}" for rel in _files(root)]
