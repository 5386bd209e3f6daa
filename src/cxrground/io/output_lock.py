"""One run at a time per output: the batch commands hold an exclusive lock on their output folder or file while they
write it, so a second run started on the same output is refused instead of mixing its results with the first's.

The lock is an advisory ``flock`` on a small file beside the output, ``.{name}.cxrground-lock`` in the output's
parent folder (so it never shows among the output's own files), opened without following a symbolic link. It holds
the holder's pid, command line and start time for the refusal message. The operating system releases the lock when
the holder exits, however it ends (a kill included), so a lock never outlives its run; a run that ends normally also
removes the file; processes forked by the holder (worker pools) close their copy, so a killed run's workers do not
keep it. Two names of one output (a symlink, a relative path) resolve to one lock. The lock is re-entrant within a
thread (a function that holds it may call another that asks for it); another thread of the process is refused like
another process. Under a distributed launcher (``RANK`` and ``WORLD_SIZE`` > 1 set, as ``torchrun``,
``accelerate`` and ``deepspeed`` do) only rank 0 takes it, for all the ranks of the run. No lock is taken where the
output's parent folder cannot be written and holds no lock file (a lock file there, made by a user who can, is
locked read-only), for an output that is a file-system root, or where ``fcntl`` is missing (Windows).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import json
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Final, TypeVar

from cxrground.errors import ConfigError

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

__all__ = ["LOCK_SUFFIX", "OutputBusyError", "lock_path", "locks_output", "output_lock"]

F = TypeVar("F", bound=Callable[..., Any])

#: The lock file's suffix; its name is ``.{output name}{LOCK_SUFFIX}`` beside the output.
LOCK_SUFFIX: Final[str] = ".cxrground-lock"
#: Outputs this process holds: the holding thread and how many nested holders it has.
_HELD: dict[Path, tuple[int, int]] = {}
_HELD_GUARD = threading.Lock()
#: The lock descriptors this process holds, closed in a child it forks (a worker must not keep its parent's lock).
_FORKED_CLOSE: set[int] = set()


def _close_in_child() -> None:
    """In a forked child: close the parent's lock descriptors and forget what the parent holds."""
    for fd in list(_FORKED_CLOSE):
        with contextlib.suppress(OSError):
            os.close(fd)
    _FORKED_CLOSE.clear()
    _HELD.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_close_in_child)


class OutputBusyError(ConfigError):
    """Another run is writing the output this run was asked to write."""


def lock_path(out: str | Path) -> Path:
    """The lock file of the output folder or file ``out``, beside it."""
    target = Path(out).resolve()
    return target.parent / f".{target.name}{LOCK_SUFFIX}"


def _other_rank() -> bool:
    """Whether this process is a rank other than 0 of a distributed launch (``RANK``, ``WORLD_SIZE`` > 1)."""
    try:
        return int(os.environ.get("WORLD_SIZE", "1")) > 1 and int(os.environ.get("RANK", "0")) != 0
    except ValueError:
        return False


@contextlib.contextmanager
def output_lock(out: str | Path, command: str) -> Iterator[None]:
    """Hold the lock of output ``out`` (a folder or file, existing or not) for the ``with`` block; an
    :class:`OutputBusyError` naming the other run (its pid, command and start time) when another process holds it.
    ``command`` names this run in the lock file (e.g. ``"ils build"``)."""
    path = lock_path(out)
    if fcntl is None or _other_rank() or not Path(out).resolve().name:  # no locks here; rank 0 locks; a root
        yield
        return
    me = threading.get_ident()
    with _HELD_GUARD:
        holder, depth = _HELD.get(path, (None, 0))
        if holder is not None and holder != me:
            raise OutputBusyError(f"{out} is being written by another thread of this process (pid {os.getpid()}); "
                                  "wait for it to end, or write to another output")
        if holder == me:
            _HELD[path] = (me, depth + 1)
    if holder == me:
        try:
            yield
        finally:
            with _HELD_GUARD:
                _HELD[path] = (me, _HELD[path][1] - 1)
        return
    created = _make_folders(path.parent)
    fd = None
    failed = True
    try:
        writable = os.access(path.parent, os.W_OK | os.X_OK)
        if writable or path.exists():
            fd = _acquire(path, Path(out), writable)
            _FORKED_CLOSE.add(fd)
            with _HELD_GUARD:
                _HELD[path] = (me, 1)
            if writable:
                os.ftruncate(fd, 0)
                os.write(fd, json.dumps({"pid": os.getpid(), "command": command, "argv": sys.argv,
                                         "output": str(out),
                                         "started": time.strftime("%Y-%m-%d %H:%M:%S %Z")}).encode("utf-8"))
        _check_writable(Path(out))
        yield
        failed = False
    finally:
        if fd is not None:
            with _HELD_GUARD:
                _HELD.pop(path, None)
            with contextlib.suppress(OSError):
                os.unlink(path)  # before the release: a run waiting on this file finds it gone and takes a new one
            _FORKED_CLOSE.discard(fd)
            os.close(fd)
        for folder in reversed(created if failed else ()):  # a failed or refused run leaves no folder made for it
            with contextlib.suppress(OSError):
                folder.rmdir()


def _make_folders(folder: Path) -> list[Path]:
    """Create ``folder`` and the missing folders above it; the folders created, outermost first."""
    missing = []
    while not folder.exists() and folder != folder.parent:
        missing.append(folder)
        folder = folder.parent
    for made in reversed(missing):
        made.mkdir(exist_ok=True)
    return missing[::-1]


def _check_writable(out: Path) -> None:
    """Raise the ``OSError`` a write into the existing output ``out`` would meet (a folder: a file created and
    removed in it; a file: opened for appending), so a run that cannot write fails before its work, not after."""
    if out.is_dir():
        with tempfile.TemporaryFile(dir=out):
            pass
    elif out.is_file():
        with out.open("ab"):
            pass


def _acquire(path: Path, out: Path, writable: bool) -> int:
    """An open descriptor of ``path`` holding its exclusive lock (retried when the file was replaced meanwhile);
    ``writable``: whether the file may be created (else an existing one is opened read-only)."""
    flags = (os.O_RDWR | os.O_CREAT if writable else os.O_RDONLY) | getattr(os, "O_NOFOLLOW", 0)
    while True:
        fd = os.open(path, flags, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            os.close(fd)
            raise OutputBusyError(f"{out} is being written by another run ({holder}); wait for it to end, or write to "
                                  "another output") from None
        try:
            same = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            return fd
        os.close(fd)  # the holder removed the file as it ended: lock the new one


def _holder(fd: int) -> str:
    """How the lock file open at ``fd`` names its holder."""
    with contextlib.suppress(OSError, ValueError):
        info = json.loads(os.pread(fd, 65536, 0).decode("utf-8"))
        argv = _command_line(info.get("argv") or [])
        return f"pid {info.get('pid')}, `{argv or info.get('command')}`, started {info.get('started')}"
    return "a process that has not said which"


def _command_line(argv: list[object]) -> str:
    """A recorded ``sys.argv`` as a command line, the program by its file name."""
    words = [str(a) for a in argv]
    return " ".join([Path(words[0]).name, *words[1:]]) if words else ""


def locks_output(command: str, arg: str, target: Callable[[Any], str | Path | None] | None = None
                 ) -> Callable[[F], F]:
    """Decorate a function that writes the output its argument ``arg`` names so that it runs holding that output's
    lock (:func:`output_lock`, as ``command``). ``target`` maps the argument to the path to lock (None: no lock,
    e.g. an object-storage URL)."""

    def wrap(fn: F) -> F:
        signature = inspect.signature(fn)

        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> Any:
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            value = bound.arguments[arg]
            path = target(value) if target is not None else value
            if path is None:
                return fn(*args, **kwargs)
            try:
                with output_lock(path, command):
                    return fn(*args, **kwargs)
            except OutputBusyError as exc:  # named as the user named it (a bucket URL, not its local stage)
                if str(path) == str(value) or str(path) not in str(exc):
                    raise
                raise OutputBusyError(str(exc).replace(str(path), str(value), 1)) from None

        return run  # type: ignore[return-value]

    return wrap
