"""MkDocs hook: the command reference shows "None" where an option has no default.

mkdocs-click writes each option's ``default`` into the table as code; with click ≥ 8.2 an option without a default
holds click's ``UNSET`` sentinel, which would print as ``Sentinel.UNSET``. mkdocs-click's own text for "no default"
is ``None``, so the hook writes that instead.
"""

from __future__ import annotations

from typing import Any

#: What mkdocs-click renders for click's "no default" sentinel, and what the reference shows instead.
UNSET_CELL = "<code>Sentinel.UNSET</code>"
NO_DEFAULT = "None"


def fix_unset(html: str) -> str:
    """``html`` with every rendered ``Sentinel.UNSET`` default replaced by ``None``."""
    return html.replace(UNSET_CELL, NO_DEFAULT)


def on_page_content(html: str, **_: Any) -> str:
    """MkDocs hook entry point."""
    return fix_unset(html)
