"""The ``cxrground`` command line: a thin layer over the library, one module per command group."""

from __future__ import annotations

import importlib

import click

from cxrground import __version__
from cxrground.cli.common import CleanGroup
from cxrground.hf_offline import keep_hub_offline

keep_hub_offline()  # before any command module imports a Hugging Face library


@click.group(cls=CleanGroup, context_settings={"help_option_names": ["-h", "--help"], "show_default": True})
@click.version_option(__version__, prog_name="cxrground")
def main() -> None:
    """cxrground: lesion grounding in chest X-rays (ILS datasets and models, the CheXpercept benchmark)."""


#: Command modules, in the order their commands are listed; each exports ``COMMANDS`` (top-level commands and
#: groups) and may attach subcommands to a group of an earlier module when imported.
_MODULES = ("data_cmds", "report_cmds", "structure_cmds", "anatomy_cmds", "segment_cmds", "ils_cmds",
            "ils_model_cmds", "detector_cmds", "percept_build_cmds", "percept_eval_cmds", "serve_cmds",
            "review_cmds", "doctor_cmds")

for _name in _MODULES:
    for _command in importlib.import_module(f"cxrground.cli.{_name}").COMMANDS:
        main.add_command(_command)
