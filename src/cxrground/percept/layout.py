"""The folder layout of a CheXpercept benchmark and its byte-stable JSON.

File names of the build's outputs, the neutral case folder names (§10.3) and :func:`stable_json` (sorted
keys, but the Stage-4 questions in their asking order; floats rounded to 6 decimals), so that the same inputs and
seed give byte-identical files.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Final

import numpy as np

from cxrground.io.files import sha256_bytes
from cxrground.percept.schema import ATTRIBUTE_KEYS

__all__ = [
    "BUILD_SETTINGS_FILE",
    "CARD_FILE",
    "CASES_DIR",
    "DEFORMATION_FILE",
    "FAILURES_FILE",
    "GALLERY_FILE",
    "MANIFEST_FILE",
    "WORK_DIR",
    "case_folder",
    "stable_json",
]

CARD_FILE: Final[str] = "card.md"
#: The settings of the finished build (and their hash), kept with the benchmark to guard a rebuild into its folder.
BUILD_SETTINGS_FILE: Final[str] = "build_settings.json"
MANIFEST_FILE: Final[str] = "MANIFEST.sha256"
DEFORMATION_FILE: Final[str] = "deformation_results.json"
FAILURES_FILE: Final[str] = "failures.jsonl"
#: The review page ``percept gallery`` writes into the benchmark folder by default (not in the manifest).
GALLERY_FILE: Final[str] = "gallery.html"
#: Plan units and finished cases of a build in progress (deleted after a complete build unless kept).
WORK_DIR: Final[str] = ".work"
CASES_DIR: Final[str] = "cases"
_FLOAT_DIGITS: Final[int] = 6
#: Mappings written in a fixed key order rather than sorted: the key they stand under → their keys in order (keys
#: not listed follow, sorted).
_KEY_ORDER: Final[Mapping[str, tuple[str, ...]]] = {"attribute_extraction_qa": ATTRIBUTE_KEYS}


def _ordered_keys(keys: Sequence[str], order: Sequence[str]) -> list[str]:
    """``keys`` in ``order`` first, the rest sorted."""
    return sorted(keys, key=lambda k: (order.index(k), "") if k in order else (len(order), k))


def _stable(value: Any, order: Sequence[str] = ()) -> Any:
    if isinstance(value, float | np.floating):
        return round(float(value), _FLOAT_DIGITS)
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.bool_):
        return bool(value)
    if isinstance(value, Mapping):
        items = {str(k): v for k, v in value.items()}
        return {k: _stable(items[k], _KEY_ORDER.get(k, ())) for k in _ordered_keys(list(items), order)}
    if isinstance(value, list | tuple):
        return [_stable(v) for v in value]
    if isinstance(value, np.ndarray):
        return _stable(value.tolist())
    return value


def stable_json(value: Any, indent: int | None = 1) -> str:
    """JSON with sorted keys (the Stage-4 questions of a case in their asking order, §13.2) and floats rounded to 6
    decimals: byte-stable across runs."""
    return json.dumps(_stable(value), indent=indent, ensure_ascii=False) + "\n"


def case_folder(seed: int, key: str) -> str:
    """Neutral case folder name ``c{first 12 hex of sha256(f"{seed}{key_id}")}`` (§10.3)."""
    return "c" + sha256_bytes(f"{seed}{key}".encode())[:12]
