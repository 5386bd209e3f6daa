"""Plug-in modules: modules that register backends (segmenters, structurers, deformers, clients ...) when imported.

The command line imports them before it builds its backend choices, so a plug-in reaches ``cxrground`` without
editing the installed package. They come from two places, in this order:

- the entry points of the group :data:`ENTRY_POINT_GROUP` of installed distributions (each names a module), and
- the environment variable :data:`PLUGINS_ENV`: comma-separated module names, importable from ``sys.path``
  (``PYTHONPATH``).

A module named twice is imported once. :func:`load_plugins` never raises for a plug-in of its own: a module that
fails to import is a :class:`PluginFailure` naming it and where it was named, and the command line refuses to run
a command with it (its help and ``cxrground doctor`` still work).
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from importlib import metadata
from typing import Final

__all__ = ["ENTRY_POINT_GROUP", "PLUGINS_ENV", "Plugin", "PluginFailure", "Plugins", "load_plugins",
           "plugin_modules"]

#: The entry-point group whose entry points name plug-in modules.
ENTRY_POINT_GROUP: Final[str] = "cxrground.plugins"
#: The environment variable naming plug-in modules (comma-separated).
PLUGINS_ENV: Final[str] = "CXRGROUND_PLUGINS"


@dataclass(frozen=True)
class Plugin:
    """A plug-in module and where it was named (``entry point 'x' of dist``, or ``$CXRGROUND_PLUGINS``)."""

    module: str
    source: str


@dataclass(frozen=True)
class PluginFailure:
    """A plug-in module that could not be imported, and why."""

    plugin: Plugin
    error: str

    def message(self) -> str:
        """One line naming the module, where it was named and the error."""
        return (f"plug-in module {self.plugin.module!r} (named by {self.plugin.source}) failed to import: "
                f"{self.error}")

    def fix(self) -> str:
        """What to do about it."""
        if self.plugin.source == f"${PLUGINS_ENV}":
            return f"fix the module, or leave it out of ${PLUGINS_ENV}"
        return "fix the module, or uninstall the distribution that declares the entry point"


@dataclass(frozen=True)
class Plugins:
    """What :func:`load_plugins` did: the modules imported, in order, and those that failed."""

    loaded: tuple[Plugin, ...] = ()
    failed: tuple[PluginFailure, ...] = field(default_factory=tuple)


def _entry_point_plugins() -> list[Plugin]:
    """The plug-ins named by the entry points of :data:`ENTRY_POINT_GROUP`."""
    found = []
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        dist = getattr(ep.dist, "name", None)
        found.append(Plugin(ep.module, f"entry point {ep.name!r} of group {ENTRY_POINT_GROUP!r}"
                                       + (f" ({dist})" if dist else "")))
    return found


def plugin_modules(environ: Mapping[str, str] | None = None,
                   entry_points: Callable[[], Iterable[Plugin]] = _entry_point_plugins) -> tuple[Plugin, ...]:
    """The plug-in modules to import: the entry points', then those of :data:`PLUGINS_ENV`, each module once."""
    environ = os.environ if environ is None else environ
    named = [*entry_points(), *(Plugin(m.strip(), f"${PLUGINS_ENV}")
                                for m in environ.get(PLUGINS_ENV, "").split(",") if m.strip())]
    first: dict[str, Plugin] = {}
    for plugin in named:
        first.setdefault(plugin.module, plugin)
    return tuple(first.values())


def load_plugins(environ: Mapping[str, str] | None = None,
                 entry_points: Callable[[], Iterable[Plugin]] = _entry_point_plugins) -> Plugins:
    """Import the plug-in modules (:func:`plugin_modules`); one that fails is recorded, not raised, and the rest are
    imported. A module imported already (by this process) is not imported again."""
    loaded: list[Plugin] = []
    failed: list[PluginFailure] = []
    for plugin in plugin_modules(environ, entry_points):
        try:
            importlib.import_module(plugin.module)
        except Exception as exc:  # a plug-in's own error, whatever it is: reported by name, never a traceback
            failed.append(PluginFailure(plugin, f"{type(exc).__name__}: {exc}"))
        else:
            loaded.append(plugin)
    return Plugins(tuple(loaded), tuple(failed))
