"""The "sentence | findings" tables of the rule records' tests, as pytest parameters."""

from __future__ import annotations

import pytest

from test_structure_rules import _v44_rows as _rows  # the "sentence | findings" table reader


def table_params(tables: dict[str, str]) -> list:
    """One ``(text, expected)`` parameter per row of each named table (a row may go on after a trailing ``\\``)."""
    return [pytest.param(text, expected, id=f"{name}: {text[:40]}")
            for name, table in tables.items()
            for text, expected in _rows(table.replace("\\\n", " "))]
