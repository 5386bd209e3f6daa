"""Readable names of the internal keys that pages show to people (the review viewer): report sections, ILS
instruction types and CheXpercept paths. A key without a name here is shown as it is."""

from __future__ import annotations

from typing import Final

from cxrground.vocab.ils_templates import INSTRUCTION_TYPES
from cxrground.vocab.percept_templates import PATH_ABBREVIATIONS

#: The report section an ILS study's sentences come from (ILS §6), by its ``section_name``.
SECTION_LABELS: Final[dict[str, str]] = {
    "findings": "findings",
    "impression": "impression",
    "last_paragraph": "last paragraph (the report has no findings or impression)",
    "findings+impression": "findings and impression",
}

#: ILS instruction types (ILS §4), by their ``type``.
INSTRUCTION_TYPE_LABELS: Final[dict[str, str]] = dict(zip(
    INSTRUCTION_TYPES, ("basic instruction", "global instruction", "lesion-inference instruction"), strict=True))

#: CheXpercept case paths (§1.4), by their abbreviation (``RR``, ``RF``, ``LF``).
PATH_LABELS: Final[dict[str, str]] = {abbr: path.replace("_", " ") for path, abbr in PATH_ABBREVIATIONS.items()}


def section_label(name: str) -> str:
    """``last_paragraph`` -> ``last paragraph (the report has no findings or impression)``; unknown: as given."""
    return SECTION_LABELS.get(name, name)


def ils_item_type_label(item_type: str) -> str:
    """An ILS review item's ``{type} positive|negative`` as words: ``lesion_inference positive`` ->
    ``lesion-inference instruction, positive pair``; unknown: as given."""
    kind, _, polarity = item_type.partition(" ")
    if kind not in INSTRUCTION_TYPE_LABELS or polarity not in ("positive", "negative"):
        return item_type
    return f"{INSTRUCTION_TYPE_LABELS[kind]}, {polarity} pair"


def path_label(abbreviation: str) -> str:
    """``RR`` -> ``revision required (RR)``; unknown: as given."""
    return f"{PATH_LABELS[abbreviation]} ({abbreviation})" if abbreviation in PATH_LABELS else abbreviation
