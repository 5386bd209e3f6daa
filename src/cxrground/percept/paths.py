"""Containment of a benchmark's image paths: a path from ``chexpercept.json`` is read only inside the benchmark;
and an export never writes into the benchmark it reads (:func:`check_export_target`).

Shared by the builder's readers (:mod:`cxrground.percept.validate`, :mod:`cxrground.percept.gallery`) and the
evaluation harness (:mod:`cxrground.evaluation.percept.conversation`), so that no benchmark file can make any of
them read, send or embed a file outside the benchmark folder (absolute paths, ``..`` components, symlinks out).
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath, PureWindowsPath

from cxrground.errors import ConfigError, InputError

__all__ = ["check_export_target", "check_outside_benchmark", "safe_image_path", "unsafe_reason"]


def safe_image_path(root: Path, rel: str) -> Path:
    """The file ``root/rel``; raises :class:`InputError` unless ``rel`` is a relative path without ``..``
    components that resolves (symlinks followed) inside ``root``."""
    reason = unsafe_reason(Path(root).resolve(), rel)
    if reason is not None:
        raise InputError(f"image path {rel!r} {reason}; refusing to read it", root)
    return Path(root) / rel


def unsafe_reason(base: Path, rel: str) -> str | None:
    """Why ``rel`` must not be read below the resolved folder ``base`` (None when it may)."""
    if not rel or "\x00" in rel:
        return "is empty or holds a NUL byte"
    pure = PurePosixPath(rel)
    if pure.is_absolute() or PureWindowsPath(rel).is_absolute() or PureWindowsPath(rel).drive:
        return "is absolute"
    if ".." in pure.parts or ".." in PureWindowsPath(rel).parts:
        return "has a '..' component"
    try:
        inside = (base / rel).resolve().is_relative_to(base)
    except (OSError, RuntimeError):  # a symlink loop
        return "cannot be resolved (symlink loop)"
    return None if inside else "resolves outside the benchmark folder (symlink)"


def check_outside_benchmark(root: Path, path: Path, what: str) -> None:
    """Raise :class:`ConfigError` when ``path`` (a run folder or file, named ``what`` in the message) is the
    benchmark folder ``root`` or lies inside it: it would become part of the benchmark, whose manifest then no
    longer matches (``percept validate`` and ``export`` refuse it)."""
    bench, target = Path(root).resolve(), Path(path).resolve()
    if target == bench or target.is_relative_to(bench):
        raise ConfigError(f"{what} {path} is inside the benchmark folder {root}; it would become part of the "
                          "benchmark (its manifest would no longer match): choose a place outside it")


def check_export_target(root: Path, out: Path) -> None:
    """Raise :class:`ConfigError` when the export folder ``out`` is the benchmark folder ``root``, lies inside it
    (the export would become part of the benchmark) or holds it (the export would write over it)."""
    bench, target = Path(root).resolve(), Path(out).resolve()
    if target == bench:
        raise ConfigError(f"export into the benchmark's own folder {out} is refused")
    if target.is_relative_to(bench):
        raise ConfigError(f"export folder {out} is inside the benchmark folder {root}; it would become part of the "
                          "benchmark (its manifest would no longer match): choose a folder outside it")
    if bench.is_relative_to(target):
        raise ConfigError(f"export folder {out} holds the benchmark folder {root}; the export would write over it: "
                          "choose a folder outside it")
