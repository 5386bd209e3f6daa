"""The benchmark's ``MANIFEST.sha256``: one ``{sha256}  {path}`` line per file, sorted by path.

The review page ``gallery.html`` (written beside the benchmark by ``percept gallery``, e.g. by ``make demo``) is a
view of the benchmark, not part of it, and is not listed.
"""

from __future__ import annotations

from pathlib import Path

from cxrground.io.files import sha256_file
from cxrground.percept.layout import GALLERY_FILE, MANIFEST_FILE, WORK_DIR

__all__ = ["UNLISTED", "manifest_lines", "read_manifest"]

#: Files of the benchmark folder the manifest never lists: itself and the review page.
UNLISTED: frozenset[str] = frozenset({MANIFEST_FILE, GALLERY_FILE})


def _files(root: Path) -> list[str]:
    out = []
    for p in root.rglob("*"):
        rel = p.relative_to(root).as_posix()
        if p.is_file() and rel not in UNLISTED and not rel.startswith(WORK_DIR + "/"):
            out.append(rel)
    return sorted(out)


def manifest_lines(root: str | Path) -> list[str]:
    """``{sha256}  {path}`` for every file of the benchmark except :data:`UNLISTED` and ``.work/``."""
    root = Path(root)
    return [f"{sha256_file(root / rel)}  {rel}" for rel in _files(root)]


def read_manifest(root: str | Path) -> dict[str, str]:
    """The files ``MANIFEST.sha256`` of the benchmark folder ``root`` lists, path → sha256 ({} without a manifest);
    :data:`UNLISTED` names an older manifest may hold are left out."""
    manifest = Path(root) / MANIFEST_FILE
    if not manifest.is_file():
        return {}
    listed: dict[str, str] = {}
    for line in manifest.read_text(encoding="utf-8", errors="replace").splitlines():
        digest, _, rel = line.partition("  ")
        if rel and rel not in UNLISTED:
            listed[rel] = digest
    return listed
