"""(filled in by its owner)."""

COMMANDS: list = []
