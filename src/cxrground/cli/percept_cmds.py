"""``cxrground percept``: the CheXpercept command group.

Its commands live in :mod:`cxrground.cli.percept_build_cmds` (build / validate / gallery) and
:mod:`cxrground.cli.percept_eval_cmds` (eval / score / report), which attach themselves to this group.
"""

from __future__ import annotations

import click


@click.group("percept")
def percept() -> None:
    """CheXpercept: build, validate and browse the benchmark; evaluate VLMs on it and report."""


COMMANDS = [percept]
