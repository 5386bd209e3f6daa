"""Commands on real data: the shared pack and a user's own folders."""

from __future__ import annotations

import click

COMMANDS: list[click.Command] = []
