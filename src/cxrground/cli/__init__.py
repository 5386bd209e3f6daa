"""The ``cxrground`` command line: a thin layer over the library, one module per command group.

Plug-in modules (:mod:`cxrground.plugins`: entry points of ``cxrground.plugins``, ``$CXRGROUND_PLUGINS``) are
imported first, so that the backends they register are among the choices the command modules build on import.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

import click

from cxrground import __version__
from cxrground.cli.common import CleanGroup
from cxrground.errors import ConfigError
from cxrground.hf_offline import keep_hub_offline
from cxrground.plugins import Plugins, load_plugins

keep_hub_offline()  # before any command module imports a Hugging Face library

#: The plug-in modules imported (and those that failed), before the command modules build their choices.
PLUGINS: Plugins = load_plugins()

#: Commands that run with a plug-in that failed to import (they report it).
_RUN_WITH_FAILED_PLUGINS = frozenset({"doctor"})


#: Exit status of a command stopped by Ctrl-C (SIGINT), as shells report it: 128 + 2.
INTERRUPTED_EXIT = 130


class _MainGroup(CleanGroup):
    """The top-level group: a plug-in that failed to import stops every command but help and ``doctor``; a command
    stopped by Ctrl-C exits with status 130 and one line (not click's ``Aborted!`` and status 1, which an input
    error has too)."""

    def invoke(self, ctx: click.Context) -> Any:
        """Run the chosen command; Ctrl-C ends it with one line on stderr and exit status 130."""
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            start = "\n" if sys.stderr.isatty() else ""  # off a progress bar's line
            click.echo(f"{start}Interrupted (Ctrl-C); the batch commands resume where they stopped when rerun",
                       err=True)
            ctx.exit(INTERRUPTED_EXIT)

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        """Notes whether help was asked for, and warns on stderr of each plug-in that failed when it was."""
        ctx.meta["cxrground.help"] = asks_help = any(a in ("-h", "--help") for a in args) or not args
        if asks_help:
            for failure in PLUGINS.failed:
                click.echo(f"Warning: {failure.message()}; its backends are not listed", err=True)
        return super().parse_args(ctx, args)


@click.group(cls=_MainGroup, context_settings={"help_option_names": ["-h", "--help"], "show_default": True})
@click.version_option(__version__, prog_name="cxrground")
@click.pass_context
def main(ctx: click.Context) -> None:
    """cxrground: lesion grounding in chest X-rays (ILS datasets and models, the CheXpercept benchmark).

    Plug-in modules named by $CXRGROUND_PLUGINS (comma-separated) or by entry points of the group cxrground.plugins
    are imported first; `cxrground doctor` lists them.
    """
    _refuse_failed_plugins(ctx)


def _refuse_failed_plugins(ctx: click.Context) -> None:
    """A :class:`ConfigError` naming the first plug-in module that failed to import, unless help was asked for or
    the command reports it itself."""
    if PLUGINS.failed and not ctx.meta.get("cxrground.help") and ctx.invoked_subcommand not in _RUN_WITH_FAILED_PLUGINS:
        first = PLUGINS.failed[0]
        more = f" (and {len(PLUGINS.failed) - 1} more: cxrground doctor lists them)" if len(PLUGINS.failed) > 1 else ""
        raise ConfigError(f"{first.message()}{more}; {first.fix()}")


#: Command modules, in the order their commands are listed; each exports ``COMMANDS`` (top-level commands and
#: groups) and may attach subcommands to a group of an earlier module when imported.
_MODULES = ("data_cmds", "report_cmds", "structure_cmds", "anatomy_cmds", "segment_cmds", "ils_cmds",
            "ils_model_cmds", "detector_cmds", "percept_build_cmds", "percept_eval_cmds", "serve_cmds",
            "review_cmds", "doctor_cmds")

for _name in _MODULES:
    for _command in importlib.import_module(f"cxrground.cli.{_name}").COMMANDS:
        main.add_command(_command)
