"""Coded concepts of the seven lesions for DICOM Segmentation objects (``ils export --format dicom-seg``).

Each lesion's Segmented Property Type is a SNOMED CT concept where one exists, and DICOM's own code otherwise
(:data:`LESION_CODES`: ``(coding scheme designator, code value, code meaning)``). Sources: the codes listed in
DICOM PS3.16 (as shipped in ``pydicom.sr.codedict``: cardiomegaly, pulmonary edema, pleural effusion, and the DCM
code "Opacity" of CID 6102/6104, because DICOM lists no SNOMED CT concept for a radiographic lung opacity) and
SNOMED CT International disorders (pneumonia, atelectasis, lung consolidation). Every segment's Segmented
Property Category is SNOMED CT "Morphologically Abnormal Structure" (:data:`LESION_CATEGORY`, DICOM CID 7150).
"""

from __future__ import annotations

from typing import Final

from cxrground.vocab.lesions import LESIONS

__all__ = ["LESION_CATEGORY", "LESION_CODES"]

#: Segmented Property Category of every lesion segment.
LESION_CATEGORY: Final[tuple[str, str, str]] = ("SCT", "49755003", "Morphologically Abnormal Structure")

#: Segmented Property Type of each lesion: (scheme, value, meaning).
LESION_CODES: Final[dict[str, tuple[str, str, str]]] = {
    "cardiomegaly": ("SCT", "287272002", "Cardiomegaly"),
    "pneumonia": ("SCT", "233604007", "Pneumonia"),
    "atelectasis": ("SCT", "46621007", "Atelectasis"),
    "opacity": ("DCM", "112001", "Opacity"),
    "consolidation": ("SCT", "95436008", "Lung consolidation"),
    "edema": ("SCT", "19242006", "Pulmonary edema"),
    "effusion": ("SCT", "60046008", "Pleural effusion"),
}
if set(LESION_CODES) != set(LESIONS):
    raise ValueError(f"LESION_CODES must code exactly the lesions {LESIONS}")
