"""The one rule of the bench scripts that fit or train a file of the kind shipped under
``src/cxrground/**/weights``: the result is written only where ``--out`` (``--save`` for ``zone_sim.py``) names it,
and a file already there is replaced only with ``--overwrite``. Rerunning a script to print its figures therefore
never changes a shipped file; rebuilding one is ``--out src/cxrground/.../FILE --overwrite``."""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from pathlib import Path

OVERWRITE_HELP = "replace the file(s) at --out when they exist (without it, an existing file stops the run)"


def add_out_options(parser: argparse.ArgumentParser, what: str, *, flag: str = "--out",
                    required: bool = False) -> None:
    """Add ``flag`` (where to write ``what``; optional unless ``required``: without it nothing is written) and
    ``--overwrite``."""
    tail = "" if required else " (default: write nothing, only print the figures)"
    parser.add_argument(flag, type=Path, required=required, default=None, help=f"write {what} here{tail}")
    parser.add_argument("--overwrite", action="store_true", help=OVERWRITE_HELP.replace("--out", flag))


def refuse_existing(parser: argparse.ArgumentParser, paths: Iterable[Path | None], overwrite: bool,
                    flag: str = "--out") -> None:
    """Stop with a usage error (exit 2, no traceback) when any of ``paths`` (None: nothing to write) exists and
    ``overwrite`` is off; call it before the fit, so a long run does not end in a refusal."""
    if overwrite:
        return
    for path in paths:
        if path is not None and Path(path).exists():
            parser.error(f"{path} exists: pass --overwrite to replace it, or give {flag} another path")
