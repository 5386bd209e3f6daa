"""Helpers shared by the command modules: path types, KEY=VALUE options, backend choices, options from a request
dataclass, the clean-error group."""

from __future__ import annotations

import dataclasses
import errno
import functools
import types
import typing
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

import click

from cxrground.datasets.pack import PACK_HELP
from cxrground.errors import CXRGroundError, OptionError, OptionValueError
from cxrground.extras import import_error_text, is_own_import
from cxrground.fields import key_values
from cxrground.ils.layout import DATASET_HELP
from cxrground.registry import Registry

F = TypeVar("F", bound=Callable[..., Any])

#: Path types of the options and arguments (click hands the commands a :class:`~pathlib.Path`).
DIR = click.Path(path_type=Path, exists=True, file_okay=False)  # an existing folder
FILE = click.Path(path_type=Path, exists=True, dir_okay=False)  # an existing file
EXISTING = click.Path(path_type=Path, exists=True)  # an existing file or folder


class _Writable(click.Path):
    """A path to write (a folder or a file, existing or not) whose nearest existing parent is a folder: a path below
    a file is a usage error naming that file, not a traceback when the command writes."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        path = super().convert(value, param, ctx)
        for parent in Path(path).absolute().parents:
            if parent.exists():
                if not parent.is_dir():
                    self.fail(f"cannot write {path}: {parent} is a file, not a folder", param, ctx)
                break
        return path


OUT_DIR = _Writable(path_type=Path, file_okay=False)  # a folder, not checked for existence (to write, mostly)
OUT_FILE = _Writable(path_type=Path, dir_okay=False)  # a file to write (may exist)


class _OrUrl(click.ParamType):
    """A local path of type ``path`` (checked as it checks), or an fsspec URL (``s3://``, ``gs://``,
    ``file://``) passed on as a string."""

    def __init__(self, path: click.Path) -> None:
        self.path = path
        self.name = f"{path.name} or URL"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str) and "://" in value:
            return value
        return self.path.convert(value, param, ctx)


PATH_TYPES = {"dir": DIR, "file": FILE, "existing": EXISTING, "out_dir": OUT_DIR, "out_file": OUT_FILE,
              "path": click.Path(path_type=Path), "dir_or_url": _OrUrl(DIR), "existing_or_url": _OrUrl(EXISTING),
              "out_dir_or_url": _OrUrl(OUT_DIR)}  # by :data:`cxrground.fields.PathKind`

#: Options that several commands share (same flag, type and help everywhere).
PACK_OPT = click.option("--pack", "pack_dir", type=OUT_DIR, default=None, help=PACK_HELP)
DATASET_OPT = click.option("--dataset", type=EXISTING, required=True, help=DATASET_HELP)


def kv(pairs: tuple[str, ...]) -> dict[str, str]:
    """:func:`cxrground.fields.key_values` for a click callback or command: a malformed item is a usage error."""
    try:
        return key_values(pairs)
    except OptionValueError as exc:
        raise click.BadParameter(str(exc)) from None


def backend_option(flag: str, registry: Registry[Any], default: str | None, what: str = "",
                   name: str | None = None) -> Callable[[F], F]:
    """A ``--flag`` whose choices and help come from ``registry`` (one ``name: help`` per backend); ``name``: the
    parameter it fills (default: from the flag)."""
    return click.option(flag, *([name] if name else []), type=click.Choice(registry.names()), default=default,
                        show_default=default is not None, help=f"{what}{registry.help('; ')}.")


def _field_option(f: dataclasses.Field[Any], hint: Any) -> Callable[[F], F]:
    """The option of one request field declared with :func:`cxrground.fields.option`."""
    meta, flag = f.metadata, f.metadata.get("flag", f"--{f.name.replace('_', '-')}")
    given = {} if f.default is dataclasses.MISSING else {"default": f.default}
    if "registry" in meta:
        return backend_option(flag, meta["registry"], given.get("default"), meta.get("help", ""), f.name)
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    base = args[0] if typing.get_origin(hint) in (typing.Union, types.UnionType, tuple, dict) else hint
    kw: dict[str, Any] = {k: meta[k] for k in ("help", "metavar", "envvar", "show_default") if k in meta}
    if typing.get_origin(hint) in (tuple, dict):
        kw["multiple"] = True
    if typing.get_origin(hint) is dict:
        kw["callback"] = lambda _ctx, _param, value: kv(value)
    elif base is bool:
        kw.update({} if "/" in flag else {"is_flag": True})
    elif "path" in meta:
        kw["type"] = PATH_TYPES[meta["path"]]
    elif "choices" in meta:
        kw["type"] = click.Choice(meta["choices"])
    elif "low" in meta or "high" in meta:
        bounds = click.IntRange if base is int else click.FloatRange
        kw["type"] = bounds(meta.get("low"), meta.get("high"), min_open=meta.get("low_open", False))
    else:
        kw["type"] = base
    required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    return click.option(flag, f.name, required=required, **given, **kw)


def request_options(cls: type[Any]) -> Callable[[F], F]:
    """One option per field of the dataclass ``cls`` (see :func:`cxrground.fields.option`), in field order; the
    command receives them as one ``request``, an instance of ``cls``, before its other options."""
    hints, fields = typing.get_type_hints(cls), dataclasses.fields(cls)

    def add(fn: F) -> F:
        @functools.wraps(fn)
        def run(**kwargs: Any) -> Any:
            return fn(cls(**{f.name: kwargs.pop(f.name) for f in fields}), **kwargs)

        for f in reversed(fields):
            run = _field_option(f, hints[f.name])(run)
        return run  # type: ignore[return-value]

    return add


#: Help of ``--threads`` (:func:`threads_option`).
THREADS_HELP = ("torch intra-op threads of this command (of each worker, where it has workers). One is the "
                "fastest per core when several processes share the CPU; give more to one process on an idle machine.")


def threads_option(fn: F) -> F:
    """Add ``--threads N`` (default 1) to a command that runs torch; the command runs with torch and OpenMP
    set to N threads (:func:`cxrground.models.torch_state.use_threads`) and does not receive the value."""

    @functools.wraps(fn)
    def run(*args: Any, threads: int, **kwargs: Any) -> Any:
        from cxrground.models.torch_state import use_threads

        use_threads(threads)
        return fn(*args, **kwargs)

    return click.option("--threads", type=click.IntRange(1), default=1, help=THREADS_HELP)(run)  # type: ignore[return-value]


#: Exit status of a batch command run with ``--strict`` that finished but recorded failures (1: nothing could be
#: done, every item failed, or an error stopped the run; 2: a usage error).
PARTIAL_EXIT = 3


class PartialFailure(click.ClickException):
    """A batch run with ``--strict`` that finished with failures: ``Error: <message>``, exit status
    :data:`PARTIAL_EXIT`."""

    exit_code = PARTIAL_EXIT


def strict_option(items: str, where: str) -> Callable[[F], F]:
    """``--strict``: exit :data:`PARTIAL_EXIT` when the run finished but some of its ``items`` failed (recorded
    ``where``); the command receives ``strict`` and calls :func:`exit_if_failed`."""
    return click.option("--strict", is_flag=True,
                        help=f"Exit with status {PARTIAL_EXIT} when the run finished but some {items} failed (they "
                             f"are recorded {where}). Without it such a run exits 0; a run in which every one of "
                             "them failed exits 1 either way.")


def exit_if_failed(strict: bool, failed: int, what: str, where: str) -> None:
    """With ``strict``: when ``failed`` (a count) is not 0, stop with ``Error: <what>; <where> (--strict)`` and exit
    status :data:`PARTIAL_EXIT` (after the command's output); nothing otherwise."""
    if strict and failed:
        raise PartialFailure(f"{what}; {where} (--strict: exit status {PARTIAL_EXIT})")


def echo_lines(lines: Iterable[str], err: bool = False) -> None:
    """Print each line (nothing for none), on stderr with ``err``."""
    for line in lines:
        click.echo(line, err=err)


def exit_if_none_read(read: int, failed: int, out: Path) -> None:
    """Exit 1 when films were given and none could be read (the folder commands' convention): the message points at
    ``out/failures.jsonl``."""
    if failed and not read:
        raise click.ClickException(f"no film could be read: all {failed} failed (the reasons are in "
                                   f"{out / 'failures.jsonl'})")


def exit_folder_run(read: int, failed: int, out: Path, strict: bool) -> None:
    """End a film-folder command: exit 1 when no film could be read (:func:`exit_if_none_read`), and with
    ``strict`` exit :data:`PARTIAL_EXIT` when some films failed (their reasons in ``out/failures.jsonl``)."""
    exit_if_none_read(read, failed, out)
    exit_if_failed(strict, failed, f"{failed} of {read + failed} films failed",
                   f"the reasons are in {out / 'failures.jsonl'}")


def note(message: str) -> None:
    """Print ``message`` on stderr."""
    click.echo(message, err=True)


def warn(message: str) -> None:
    """Print ``message`` in yellow on stderr."""
    click.secho(message, fg="yellow", err=True)


def _command_path() -> str | None:
    """``anatomy zones``: the command being run, without the program's name (None outside click or for the
    program itself)."""
    ctx = click.get_current_context(silent=True)
    if ctx is None:
        return None
    path = ctx.command_path
    if isinstance(ctx.command, click.Group) and ctx.invoked_subcommand:  # a group's context: name its command
        path = f"{path} {ctx.invoked_subcommand}"
    return path[len(ctx.find_root().command_path):].strip() or None


def error_text(exc: BaseException) -> str:
    """An error's message followed by its notes (``add_note``: what the command found before it failed); a file
    system error as the file, the reason and what to do (:func:`os_error_text`); a failed import as the extra
    that provides the library and the line that installs it (:func:`cxrground.extras.import_error_text`)."""
    if isinstance(exc, OSError):
        text = os_error_text(exc)
    elif isinstance(exc, ImportError):
        text = import_error_text(exc, _command_path())
    else:
        text = str(exc)
    return "\n".join([text, *getattr(exc, "__notes__", ())])


#: What to do about the common file-system errors (the batch commands resume where they stopped when rerun).
_OS_ERROR_HINTS: dict[int, str] = {
    errno.ENOSPC: "free some space and rerun the command; the batch commands resume where they stopped",
    errno.EDQUOT: "the disk quota is used up: free some space and rerun the command; the batch commands resume",
    errno.EFBIG: "a file would exceed the size limit of this file system or process (ulimit -f)",
    errno.EACCES: "this user may not use that file or folder: fix its permissions or choose another path",
    errno.EPERM: "this user may not use that file or folder: fix its permissions or choose another path",
    errno.EROFS: "the file system is read-only: choose another output",
}


def os_error_text(exc: OSError) -> str:
    """One line for a file-system error: the file(s), the reason and, for the common ones, what to do."""
    where = " -> ".join(str(name) for name in (exc.filename, exc.filename2) if name is not None)
    reason = exc.strerror or str(exc) or type(exc).__name__
    hint = _OS_ERROR_HINTS.get(exc.errno or -1)
    return f"{where + ': ' if where else ''}{reason}{f' ({hint})' if hint else ''}"


def clean_errors(*extra: type[Exception]) -> Callable[[F], F]:
    """Report ``extra`` errors (and cxrground's) raised by a command as ``Error: <message>``, exit status 1."""

    def wrap(fn: F) -> F:
        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> Any:
            try:
                return fn(*args, **kwargs)
            except BrokenPipeError:  # the reader of the output went away (`| head`): not an error of the command
                raise
            except (CXRGroundError, OSError, *extra) as exc:
                raise click.ClickException(error_text(exc)) from exc

        return run  # type: ignore[return-value]

    return wrap


class CleanCommand(click.Command):
    """A command that reports an :class:`OptionError` as a usage error of the command (exit 2)."""

    def invoke(self, ctx: click.Context) -> Any:
        """Run the command; an :class:`OptionError` becomes a :class:`click.UsageError` (or ``BadParameter``)."""
        try:
            return super().invoke(ctx)
        except OptionValueError as exc:
            raise click.BadParameter(str(exc), ctx) from exc
        except OptionError as exc:
            raise click.UsageError(str(exc), ctx) from exc


class CleanGroup(click.Group):
    """A command group that reports cxrground's errors raised by its commands as ``Error: <message>``, exit 1; a
    library that is not installed as the extra that provides it (``... needs the 'models' extra: pip install
    'cxrground[models]'``). A failed import of cxrground's own modules stays a traceback (a bug)."""

    command_class = CleanCommand

    def invoke(self, ctx: click.Context) -> Any:
        """Run the chosen subcommand; a :class:`CXRGroundError`, an :class:`OSError` or a missing library becomes a
        :class:`click.ClickException`."""
        try:
            return super().invoke(ctx)
        except BrokenPipeError:  # the reader of the output went away (`| head`): not an error of the command
            raise
        except ImportError as exc:
            if is_own_import(exc):
                raise
            raise click.ClickException(error_text(exc)) from exc
        except (CXRGroundError, OSError) as exc:
            raise click.ClickException(error_text(exc)) from exc


def group(name: str) -> Callable[[Callable[..., Any]], CleanGroup]:
    """``@click.group(name)`` with :class:`CleanGroup` (the clean error reports of every command in it)."""
    return click.group(name, cls=CleanGroup, context_settings={"show_default": True})
