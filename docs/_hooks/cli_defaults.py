"""MkDocs hook: the command reference's Default column shows the default ``--help`` shows.

mkdocs-click writes each option's ``default`` into the table as code, and ``None`` where the option has none.
:func:`default_cell` gives the cells that need more than that:

- an option whose ``show_default`` is a string (``--max-tokens``: its ``None`` stands for the stated 2048, kept so
  that a conflicting ``--structurer-opt`` can be told from it) shows that string, as ``--help`` does;
- an option without a default whose help text states one in words ("default: the shipped normative_v1") shows
  ``see description`` rather than ``None``;
- a required option shows ``required``, and an on/off flag without a default (``--overwrite``) ``False``;
- with click ≥ 8.2 an option without a default holds click's ``UNSET`` sentinel, which mkdocs-click would print as
  ``Sentinel.UNSET``; it reads as the cases above say.

The hook replaces mkdocs-click's row formatter when MkDocs loads it, before any page is rendered.
"""

from __future__ import annotations

import re
from typing import Any

import click

#: The Default cell of an option with no default whose help text states one.
SEE_DESCRIPTION = "see description"
#: The Default cell of a required option.
REQUIRED = "required"
#: What mkdocs-click writes for an option with no default.
NO_DEFAULT = "None"
#: A help text that states a default in words.
STATES_DEFAULT = re.compile(r"\bdefault\b", re.IGNORECASE)


def _has_no_default(option: click.Option) -> bool:
    """Whether ``option`` has no default value (None, or click's ``UNSET`` sentinel)."""
    return option.default is None or type(option.default).__name__ == "Sentinel"


def default_cell(option: click.Option) -> str | None:
    """The Default cell the reference shows for ``option`` where it differs from mkdocs-click's own, else None."""
    if option.required and _has_no_default(option):
        return REQUIRED
    if isinstance(option.show_default, str):
        return f"`{option.show_default}`"
    if _has_no_default(option) and option.is_flag and not option.secondary_opts:
        return "`False`"
    if _has_no_default(option):
        return SEE_DESCRIPTION if STATES_DEFAULT.search(option.help or "") else NO_DEFAULT
    return None


def _wrap(original: Any) -> Any:
    """mkdocs-click's ``_format_table_option_row`` with the last cell from :func:`default_cell`."""

    def row(option: click.Option) -> str:
        text = original(option)
        cell = default_cell(option)
        if cell is None:
            return text
        head, sep, _ = text.rstrip().removesuffix("|").rstrip().rpartition(" | ")
        return f"{head}{sep}{cell} |"

    row.wrapped = original  # type: ignore[attr-defined]
    return row


def install() -> None:
    """Replace mkdocs-click's table row formatter (once)."""
    from mkdocs_click import _docs

    if not hasattr(_docs._format_table_option_row, "wrapped"):
        _docs._format_table_option_row = _wrap(_docs._format_table_option_row)


def on_config(config: Any, **_: Any) -> Any:
    """MkDocs hook entry point: install the formatter before the pages are rendered."""
    install()
    return config
