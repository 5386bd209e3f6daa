"""Instruction → fixed conditioning vector, and model outputs → templated answer.

The vector (length :data:`COND_DIM` = 20) concatenates:

- one-hot of the target word as written in the instruction over the 7 lesions of
  :data:`~cxrground.vocab.lesions.LESIONS` (``opacity`` for lesion-inference and tentative instructions);
- multi-hot of the ILS location labels named in the instruction, in the fixed order of
  :data:`~cxrground.vocab.locations.ILS_LOCATION_LABELS` (all zero for ``global``);
- one-hot of the instruction type over :data:`~cxrground.vocab.ils_templates.INSTRUCTION_TYPES`.

Answers are rendered only through :func:`~cxrground.vocab.ils_templates.positive_answer` and
:func:`~cxrground.vocab.ils_templates.negative_answer`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import numpy as np

from cxrground.errors import InputError
from cxrground.vocab.ils_templates import (
    INSTRUCTION_TYPES,
    ParsedInstruction,
    negative_answer,
    parse_instruction,
    positive_answer,
)
from cxrground.vocab.lesions import HEART_MASK_LESIONS, LESION_INFERENCE_LESIONS, LESIONS
from cxrground.vocab.locations import ILS_LOCATION_LABELS

__all__ = [
    "CERTAINTIES",
    "COND_DIM",
    "LI_LESIONS",
    "encode",
    "location_vector",
    "parse",
    "render_answer",
]

#: Classes of the lesion-inference heads.
LI_LESIONS: Final[tuple[str, ...]] = tuple(LESION_INFERENCE_LESIONS)
CERTAINTIES: Final[tuple[str, str]] = ("definitive", "tentative")
COND_DIM: Final[int] = len(LESIONS) + len(ILS_LOCATION_LABELS) + len(INSTRUCTION_TYPES)


def parse(text: str) -> ParsedInstruction:
    """Parse an ILS instruction; an unknown form, lesion word or location label is an :class:`InputError`."""
    parsed = parse_instruction(text)
    if parsed is None:
        raise InputError(f"instruction does not follow an ILS template: {text!r}")
    if parsed.target not in LESIONS:
        raise InputError(f"unknown lesion {parsed.target!r} in instruction {text!r}")
    unknown = [loc for loc in parsed.locations if loc not in ILS_LOCATION_LABELS]
    if unknown:
        raise InputError(f"unknown location label(s) {unknown} in instruction {text!r}")
    return parsed


def location_vector(labels: Sequence[str]) -> np.ndarray:
    """Multi-hot float32 vector over :data:`ILS_LOCATION_LABELS` (labels outside it are ignored)."""
    vec = np.zeros(len(ILS_LOCATION_LABELS), dtype=np.float32)
    for label in labels:
        if label in ILS_LOCATION_LABELS:
            vec[ILS_LOCATION_LABELS.index(label)] = 1.0
    return vec


def encode(parsed: ParsedInstruction) -> np.ndarray:
    """The conditioning vector of a parsed instruction (layout in the module docstring)."""
    lesion = np.zeros(len(LESIONS), dtype=np.float32)
    lesion[LESIONS.index(parsed.target)] = 1.0
    kind = np.zeros(len(INSTRUCTION_TYPES), dtype=np.float32)
    kind[INSTRUCTION_TYPES.index(parsed.kind)] = 1.0
    return np.concatenate([lesion, location_vector(parsed.locations), kind])


def render_answer(parsed: ParsedInstruction, present: bool, lesion: str | None = None,
                  certainty: str | None = None, locations: Sequence[str] = ()) -> str:
    """The templated answer: the negative form when not ``present``; else the positive form of the type.

    ``lesion``/``certainty`` are the lesion-inference head's reading; ``locations`` the predicted labels
    of a global positive (ignored for heart-mask lesions, i.e. cardiomegaly, whose global positive is ``[SEG]``).
    """
    if not present:
        return negative_answer(parsed.kind, parsed.target, parsed.locations or None)
    if parsed.kind == "lesion_inference":
        return positive_answer("lesion_inference", lesion or LI_LESIONS[0], certainty=certainty or CERTAINTIES[0])
    if parsed.kind == "global" and parsed.target not in HEART_MASK_LESIONS:
        return positive_answer("global", parsed.target, list(locations) or [ILS_LOCATION_LABELS[0]])
    return positive_answer(parsed.kind, parsed.target, parsed.locations or None)
