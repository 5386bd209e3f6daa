"""The seven lesion types of ILS and CheXpercept (ILS.md §2, CHEXPERCEPT.md §1.1)."""

from __future__ import annotations

from typing import Final, Literal

Lesion = Literal["cardiomegaly", "pneumonia", "atelectasis", "opacity", "consolidation", "edema", "effusion"]

#: Paper table order (CA, PN, AT, OP, CO, ED, EF).
LESIONS: Final[tuple[str, ...]] = (
    "cardiomegaly",
    "pneumonia",
    "atelectasis",
    "opacity",
    "consolidation",
    "edema",
    "effusion",
)

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

ABBREVIATIONS: Final[dict[str, str]] = {
    "cardiomegaly": "CA",
    "pneumonia": "PN",
    "atelectasis": "AT",
    "opacity": "OP",
    "consolidation": "CO",
    "edema": "ED",
    "effusion": "EF",
}

#: Lesions whose basic positives also yield a lesion-inference pair.
LESION_INFERENCE_LESIONS: Final[tuple[str, ...]] = ("pneumonia", "atelectasis", "edema")

#: Lesions that lie inside the lungs (everything but the heart and the pleura).
LUNG_LESIONS: Final[tuple[str, ...]] = ("pneumonia", "atelectasis", "opacity", "consolidation", "edema")

#: The lesion that takes the edema thresholds of ILS Table 7.
DIFFUSE_LESIONS: Final[tuple[str, ...]] = ("edema",)


def check_lesion(name: str) -> str:
    """Return ``name`` if it is one of the seven lesions, else raise ``ValueError``."""
    if name not in LESIONS:
        raise ValueError(f"unknown lesion {name!r}; expected one of {', '.join(LESIONS)}")
    return name
