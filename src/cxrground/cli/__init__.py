"""The ``cxrground`` command line: a thin layer over the library, one module per command group."""

from __future__ import annotations

import click

from cxrground import __version__


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="cxrground")
def main() -> None:
    """cxrground: lesion grounding in chest X-rays (ILS datasets and models, the CheXpercept benchmark)."""


def _register() -> None:
    from cxrground.cli import (
        anatomy_cmds,
        data_cmds,
        eval_cmds,
        ils_cmds,
        ils_model_cmds,
        lisa_convert_cmds,
        percept_build_cmds,
        percept_cmds,
        percept_eval_cmds,
        report_cmds,
        review_cmds,
        segment_cmds,
        serve_cmds,
        structure_cmds,
        synth_cmds,
    )

    for module in (synth_cmds, data_cmds, report_cmds, structure_cmds, anatomy_cmds, segment_cmds, ils_cmds,
                   eval_cmds, ils_model_cmds, lisa_convert_cmds, percept_cmds, percept_build_cmds,
                   percept_eval_cmds, serve_cmds, review_cmds):
        for command in module.COMMANDS:
            main.add_command(command)


_register()
