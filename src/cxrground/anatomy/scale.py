"""The CHEXPERCEPT.md §0 scale rule: pixel constants are given at 1024 px (longest side).

For an image whose longest side is ``L`` the factor is ``s = L / 1024``; lengths scale by ``s``,
areas by ``s²``, and kernel sizes are rounded to the nearest integer (halves round up), at least 1.
"""

from __future__ import annotations

import math
from typing import Final

#: The reference working size (longest side, px) at which every ``@1024`` constant is given.
REFERENCE_SIDE: Final[int] = 1024


def _check_side(longest_side: float) -> float:
    value = float(longest_side)
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"longest side must be a positive number of pixels, got {longest_side!r}")
    return value


def scale_factor(longest_side: float) -> float:
    """Return ``s = longest_side / 1024``."""
    return _check_side(longest_side) / REFERENCE_SIDE


def scale_length(px_at_1024: float, longest_side: float) -> float:
    """Return the length ``px_at_1024 · s`` (not rounded)."""
    return float(px_at_1024) * scale_factor(longest_side)


def scale_kernel(px_at_1024: float, longest_side: float) -> int:
    """Return the kernel size ``px_at_1024 · s`` rounded to the nearest integer (halves up), at least 1."""
    return max(1, math.floor(scale_length(px_at_1024, longest_side) + 0.5))


def scale_area(px2_at_1024: float, longest_side: float) -> float:
    """Return the area ``px2_at_1024 · s²`` (not rounded)."""
    return float(px2_at_1024) * scale_factor(longest_side) ** 2
