"""The seven lesion types of ILS and CheXpercept (ILS.md §2, CHEXPERCEPT.md §1.1).

Every group here is derived from the trait table of :mod:`cxrground.vocab.traits` (one source of truth).
"""

from __future__ import annotations

from typing import Final, Literal

from cxrground.vocab.traits import LESION_TRAITS, groups

Lesion = Literal["cardiomegaly", "pneumonia", "atelectasis", "opacity", "consolidation", "edema", "effusion"]

_GROUPS = groups(LESION_TRAITS)

#: Paper table order (CA, PN, AT, OP, CO, ED, EF): the order of the trait table.
LESIONS: Final[tuple[str, ...]] = _GROUPS.lesions

#: Iteration order of the reference evaluation code.
EVAL_ORDER: Final[tuple[str, ...]] = (
    "cardiomegaly",
    "consolidation",
    "atelectasis",
    "edema",
    "effusion",
    "opacity",
    "pneumonia",
)
if sorted(EVAL_ORDER) != sorted(LESIONS):
    raise ValueError(f"EVAL_ORDER {EVAL_ORDER} must list exactly the lesions of the trait table {LESIONS}")

#: Lesion order of the reference's CheXpercept source-data curation (``LESIONS`` of its
#: ``00_sample_mimic_ils_case.py``, the key order of the negative-candidate file that
#: ``03_prepare_negative_annotation.py`` walks): the order in which lesions claim their negative (LF) CXRs, a CXR
#: going to the first lesion that takes it (CHEXPERCEPT.md §11).
CURATION_ORDER: Final[tuple[str, ...]] = (
    "cardiomegaly",
    "consolidation",
    "edema",
    "atelectasis",
    "pneumonia",
    "opacity",
    "effusion",
)
if sorted(CURATION_ORDER) != sorted(LESIONS):
    raise ValueError(f"CURATION_ORDER {CURATION_ORDER} must list exactly the lesions of the trait table {LESIONS}")

ABBREVIATIONS: Final[dict[str, str]] = _GROUPS.abbreviations

#: Lesions whose basic positives also yield a lesion-inference pair.
LESION_INFERENCE_LESIONS: Final[tuple[str, ...]] = _GROUPS.lesion_inference

#: Lesions that lie inside the lungs (everything but the heart and the pleura).
LUNG_LESIONS: Final[tuple[str, ...]] = _GROUPS.lung

#: Lesions that spread diffusely over the lungs (edema; it takes the edema column of ILS Table 7).
DIFFUSE_LESIONS: Final[tuple[str, ...]] = _GROUPS.diffuse

#: Lesions whose mask is the heart itself (global pairs only, location ``heart``, answer ``[SEG]``).
HEART_MASK_LESIONS: Final[tuple[str, ...]] = _GROUPS.heart_mask


def check_lesion(name: str) -> str:
    """Return ``name`` if it is one of the seven lesions, else raise ``ValueError``."""
    if name not in LESIONS:
        raise ValueError(f"unknown lesion {name!r}; expected one of {', '.join(LESIONS)}")
    return name
