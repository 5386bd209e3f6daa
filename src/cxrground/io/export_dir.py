"""The output folder of an export (``ils export``, ``percept export``): refused when it holds files, unless
``overwrite``; written in full in a staging folder beside it and moved into place only when complete.

- **Refusal:** an ``out`` that exists and is not empty is a :class:`ConfigError` naming it, unless
  ``overwrite``. With ``overwrite`` it is replaced only when it holds nothing but what this kind of export
  writes (its top-level ``names``, glob patterns): a folder that is not an earlier export is never deleted.
- **Staging:** the export is written to ``.{out.name}.export.{pid}`` in ``out``'s parent folder. On success an
  earlier ``out`` is moved aside and the staging folder renamed to ``out`` (within one file system), so no file of
  an earlier export survives. On failure the staging folder is removed and ``out`` is left as it was: a failed
  export leaves nothing that looks like a valid one. A killed export's staging folder is removed by the next
  export to the same ``out``.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from fnmatch import fnmatch
from pathlib import Path

from cxrground.errors import ConfigError
from cxrground.io.files import remove_stale_temp_dirs

__all__ = ["check_export_out", "export_folder"]


def _stage_prefix(out: Path) -> str:
    return f".{out.name}.export."


def check_export_out(out: Path, overwrite: bool, names: Iterable[str], what: str) -> None:
    """Raise :class:`ConfigError` when ``out`` may not receive a ``what`` export: it is not a folder, or it holds
    files and ``overwrite`` is off, or it holds files no ``what`` export writes (``names``, module docstring)."""
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        raise ConfigError(f"{out} exists and is not a folder")
    entries = sorted(p.name for p in out.iterdir()) if out.is_dir() else []
    if not entries:
        return
    if not overwrite:
        raise ConfigError(f"{out} is not empty; choose another folder or pass --overwrite")
    patterns = tuple(names)
    foreign = [e for e in entries if not any(fnmatch(e, p) for p in patterns)]
    if foreign:
        more = f" (and {len(foreign) - 5} more)" if len(foreign) > 5 else ""
        raise ConfigError(f"{out} holds files that are not part of a {what} export ({', '.join(foreign[:5])}{more}); "
                          "--overwrite replaces only an earlier export: remove them or choose another folder")


@contextmanager
def export_folder(out: str | Path, overwrite: bool, names: Iterable[str], what: str) -> Iterator[Path]:
    """Yield an empty staging folder to write the ``what`` export of ``out`` in; it becomes ``out`` when the block
    ends without an exception and is removed when it raises (module docstring; ``names``: the top-level entries
    the export writes, glob patterns, which ``overwrite`` may replace)."""
    out = Path(out)
    check_export_out(out, overwrite, names, what)
    parent = out.parent
    parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temp_dirs(parent, _stage_prefix(out))
    stage = parent / f"{_stage_prefix(out)}{os.getpid()}"
    shutil.rmtree(stage, ignore_errors=True)
    stage.mkdir()
    try:
        yield stage
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    _swap(stage, out)


def _swap(stage: Path, out: Path) -> None:
    """Put ``stage`` in the place of ``out`` (an earlier ``out`` is moved aside first, then deleted)."""
    if not out.exists():
        stage.rename(out)
        return
    old = out.with_name(f".{out.name}.replaced.{os.getpid()}")
    shutil.rmtree(old, ignore_errors=True)
    out.rename(old)
    try:
        stage.rename(out)
    except BaseException:
        old.rename(out)
        shutil.rmtree(stage, ignore_errors=True)
        raise
    shutil.rmtree(old)
