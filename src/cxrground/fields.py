"""Dataclass fields that document themselves, for request records (the inputs of one library call).

:func:`option` declares a field together with what a user needs to know to fill it: its help text and, where
they apply, the kind of path it holds, its allowed values, its range, or the backend registry it names. The
documentation then lives next to the field it describes, and a front end offers one option per field
(:func:`cxrground.cli.common.request_options` turns a request into command-line options).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import MISSING, field, fields
from typing import Any, Literal

from cxrground.errors import ConfigError, OptionValueError

__all__ = ["PathKind", "check_bounds", "check_non_negative", "key_values", "option"]

#: What a path field holds: an existing folder / file / either, a folder or file to write, or any path; the
#: ``_or_url`` kinds also take an fsspec URL (``s3://``, ``gs://``, ``file://``), handed on as a string.
PathKind = Literal["dir", "file", "existing", "out_dir", "out_file", "path", "dir_or_url", "existing_or_url",
                   "out_dir_or_url"]


def option(default: Any = MISSING, *, help: str = "", flag: str | None = None, path: PathKind | None = None,
           choices: Sequence[str] | None = None, low: float | None = None, high: float | None = None,
           low_open: bool = False, registry: Any = None, metavar: str | None = None, envvar: str | None = None,
           show_default: bool | str | None = None, default_factory: Callable[[], Any] | None = None) -> Any:
    """A dataclass field (required when neither ``default`` nor ``default_factory`` is given) documented by its
    ``metadata``: ``help``; ``flag``, the option's name when it is not ``--field-name`` (``--a/--no-a`` for an
    on/off pair); ``path``, a :data:`PathKind`; ``choices``; ``low``/``high`` (``low_open``: ``low`` excluded);
    ``registry``, the :class:`~cxrground.registry.Registry` whose backend the field names; ``metavar``,
    ``envvar`` (the environment variable read when the option is not given) and ``show_default`` (a string: the
    default ``--help`` and the command reference show for a field whose ``None`` means "the stated default", kept
    ``None`` so that a conflicting backend option can be told from it)."""
    given = {"help": help or None, "flag": flag, "path": path, "choices": tuple(choices) if choices else None,
             "low": low, "high": high, "low_open": low_open or None, "registry": registry, "metavar": metavar,
             "envvar": envvar, "show_default": show_default}
    metadata = {key: value for key, value in given.items() if value is not None}
    if default_factory is not None:
        return field(default_factory=default_factory, metadata=metadata)
    return field(default=default, metadata=metadata)


def key_values(pairs: Sequence[str]) -> dict[str, str]:
    """``("a=1", "b=2")`` → ``{"a": "1", "b": "2"}`` (keys and values stripped); an item without ``=`` is an
    :class:`OptionValueError`."""
    out = {}
    for item in pairs:
        key, sep, value = item.partition("=")
        if not sep:
            raise OptionValueError(f"expected KEY=VALUE, got {item!r}")
        out[key.strip()] = value.strip()
    return out


def check_bounds(request: Any) -> None:
    """Raise :class:`OptionValueError` naming the option when a field of the dataclass ``request`` lies outside
    the range its :func:`~cxrground.fields.option` declares (``low``, ``high``, ``low_open``; None passes)."""
    for f in fields(request):
        low, high, value = f.metadata.get("low"), f.metadata.get("high"), getattr(request, f.name)
        if value is None or (low is None and high is None):
            continue
        flag = f.metadata.get("flag", f"--{f.name.replace('_', '-')}")
        is_open = bool(f.metadata.get("low_open"))
        if low is not None and (value < low or (is_open and value == low)):
            raise OptionValueError(f"{flag} must be {'>' if is_open else '>='} {low}, got {value}")
        if high is not None and value > high:
            raise OptionValueError(f"{flag} must be <= {high}, got {value}")


def check_non_negative(config: Any, names: Sequence[str]) -> None:
    """Raise :class:`ConfigError` naming the field when one of the fields ``names`` of ``config`` is not a finite number
    >= 0 (a learning rate, a loss weight, a decay)."""
    for name in names:
        value = float(getattr(config, name))
        if not math.isfinite(value) or value < 0:
            raise ConfigError(f"{name} must be a finite number >= 0, got {getattr(config, name)!r}")
