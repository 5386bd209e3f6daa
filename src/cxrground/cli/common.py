"""Helpers shared by the command modules: KEY=VALUE options, backend choices from a registry, clean errors."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import click

from cxrground.errors import CXRGroundError
from cxrground.registry import Registry

F = TypeVar("F", bound=Callable[..., Any])


def kv(pairs: tuple[str, ...]) -> dict[str, str]:
    """``("a=1", "b=2")`` → ``{"a": "1", "b": "2"}``; an item without ``=`` is a usage error."""
    out = {}
    for item in pairs:
        key, sep, value = item.partition("=")
        if not sep:
            raise click.BadParameter(f"expected KEY=VALUE, got {item!r}")
        out[key.strip()] = value.strip()
    return out


def backend_option(flag: str, registry: Registry[Any], default: str | None, what: str = "") -> Callable[[F], F]:
    """A ``--flag`` whose choices and help come from ``registry`` (one ``name: help`` per backend)."""
    return click.option(flag, type=click.Choice(registry.names()), default=default, show_default=default is not None,
                        help=f"{what}{registry.help('; ')}.")


def backend_options(stage: str, registry: Registry[Any], default: str | None, what: str = "",
                    opt_help: str = "") -> Callable[[F], F]:
    """``--STAGE`` (see :func:`backend_option`) and ``--STAGE-opt KEY=VALUE`` (repeatable, passed on as a dict)."""

    def add(fn: F) -> F:
        fn = click.option(f"--{stage}-opt", multiple=True, callback=lambda _ctx, _param, value: kv(value),
                          help=f"KEY=VALUE for the {stage} (repeatable){opt_help}.")(fn)
        return backend_option(f"--{stage}", registry, default, what)(fn)

    return add


def clean_errors(*extra: type[Exception]) -> Callable[[F], F]:
    """Report cxrground's errors (and ``extra``) raised by a command as ``Error: <message>``, exit status 1."""

    def wrap(fn: F) -> F:
        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> Any:
            try:
                return fn(*args, **kwargs)
            except (CXRGroundError, *extra) as exc:
                raise click.ClickException(str(exc)) from exc

        return run  # type: ignore[return-value]

    return wrap
