"""The output folder of an export (``ils export``, ``percept export``): refused when it holds files, unless
``overwrite``; written in full in a staging folder beside it and moved into place only when complete.

- **Refusal:** an ``out`` that exists and is not empty is a :class:`ConfigError` naming it, unless
  ``overwrite``. With ``overwrite`` it is replaced only when it holds nothing but what this kind of export
  writes (its top-level ``names``, glob patterns): a folder that is not an earlier export is never deleted. An
  ``out`` that is a symbolic link, or whose parent folder cannot be written, is refused naming ``out`` and why.
- **One export at a time:** the export holds the output lock of ``out`` (:mod:`cxrground.io.output_lock`) from its
  check to its move into place, so a second export to the same ``out`` meanwhile is refused naming the first.
- **Staging:** the export is written to ``.{out.name}.export.{pid}`` in ``out``'s parent folder. On success an
  earlier ``out`` is moved aside and the staging folder renamed to ``out`` (within one file system), so no file of
  an earlier export survives. An existing empty ``out`` that cannot be renamed (a mount point, an immutable
  folder) is filled in place instead: the staged entries are moved into it (a move that fails takes back what it
  moved). On failure the staging folder is removed and ``out`` is left as it was: a failed export leaves nothing
  that looks like a valid one. A killed export's staging folder is removed by the next export to the same ``out``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterable, Iterator
from contextlib import ExitStack, contextmanager
from fnmatch import fnmatch
from pathlib import Path

from cxrground.errors import ConfigError
from cxrground.io.files import remove_stale_temp_dirs
from cxrground.io.output_lock import output_lock

__all__ = ["check_export_out", "export_folder"]


def _stage_prefix(out: Path) -> str:
    return f".{out.name}.export."


def check_export_out(out: Path, overwrite: bool, names: Iterable[str], what: str) -> None:
    """Raise :class:`ConfigError` when ``out`` may not receive a ``what`` export: it is a symbolic link or not a
    folder, or it holds files and ``overwrite`` is off, or it holds files no ``what`` export writes (``names``,
    module docstring)."""
    if out.is_symlink():
        raise ConfigError(f"{out} is a symbolic link (to {os.readlink(out)}); give the folder itself as the output")
    if out.exists() and not out.is_dir():
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
    """Yield an empty staging folder to write the ``what`` export of ``out`` in, holding ``out``'s output lock; it
    becomes ``out`` when the block ends without an exception and is removed in every other case (module
    docstring; ``names``: the top-level entries the export writes, glob patterns, which ``overwrite`` may
    replace)."""
    out = Path(out)
    check_export_out(out, overwrite, names, what)
    with ExitStack() as held:
        try:
            held.enter_context(output_lock(out, f"{what} export"))
            check_export_out(out, overwrite, names, what)  # again under the lock: another run may have written it
            stage = _make_stage(out)
        except OSError as exc:
            raise ConfigError(f"cannot write {out}: {_reason(exc)}") from exc
        try:
            yield stage
            _swap(stage, out)
        finally:
            shutil.rmtree(stage, ignore_errors=True)


def _reason(exc: OSError) -> str:
    """What an ``OSError`` says, with the folder it concerns, without the staging folder's own name."""
    where = Path(exc.filename).parent if exc.filename else None
    return f"{exc.strerror or exc} (in {where})" if where else str(exc.strerror or exc)


def _make_stage(out: Path) -> Path:
    """Create ``out``'s empty staging folder beside it (a killed export's is removed first)."""
    parent = out.parent
    parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temp_dirs(parent, _stage_prefix(out))
    stage = parent / f"{_stage_prefix(out)}{os.getpid()}"
    shutil.rmtree(stage, ignore_errors=True)
    stage.mkdir()
    return stage


def _swap(stage: Path, out: Path) -> None:
    """Put ``stage`` in the place of ``out`` (an earlier ``out`` is moved aside first, then deleted; an empty ``out``
    that cannot be moved is filled in place)."""
    if not out.exists():
        stage.rename(out)
        return
    old = out.with_name(f".{out.name}.replaced.{os.getpid()}")
    shutil.rmtree(old, ignore_errors=True)
    try:
        out.rename(old)
    except OSError as exc:
        if any(out.iterdir()):
            raise ConfigError(f"cannot replace {out}: {exc.strerror or exc}; remove its files and export again, "
                              "or choose another folder") from exc
        _fill(stage, out, exc)
        return
    try:
        stage.rename(out)
    except BaseException:
        old.rename(out)
        raise
    shutil.rmtree(old)


def _fill(stage: Path, out: Path, cause: OSError) -> None:
    """Move the entries of ``stage`` into the empty folder ``out``; a move that fails takes back what it moved and
    is a :class:`ConfigError` naming ``out``, why it could not be replaced (``cause``) and why it could not be
    filled."""
    names = sorted(p.name for p in stage.iterdir())
    try:
        for name in names:
            shutil.move(str(stage / name), str(out / name))
    except OSError as exc:
        for name in names:
            target = out / name
            if target.is_dir() and not target.is_symlink():
                shutil.rmtree(target, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    target.unlink()
        raise ConfigError(f"cannot write {out}: it cannot be replaced ({cause.strerror or cause}) nor filled in "
                          f"place ({exc.strerror or exc})") from exc
