"""Ground-truth records of a synthetic study (``truth/s5XXXXXXX.json``), as frozen pydantic models."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, field_validator

from cxrground.vocab import HEART, ILS_LOCATION_LABELS, LESIONS

_LOCATION_VALUES = (*ILS_LOCATION_LABELS, HEART)


def _check_labels(labels: list[str]) -> list[str]:
    bad = [lab for lab in labels if lab not in _LOCATION_VALUES]
    if bad:
        raise ValueError(f"unknown location label(s) {bad}")
    return labels


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (field order as declared)."""
        return self.model_dump(mode="json")

    @classmethod
    def from_dict(cls, data: dict[str, Any]):
        """Validate and build from :meth:`to_dict` output."""
        return cls.model_validate(data)


class MaskRef(_Frozen):
    """A mask stored both as a PNG (path relative to the cohort folder) and as COCO RLE."""

    path: str
    area: int
    rle: dict[str, Any]


class FindingTruth(_Frozen):
    """One finding: a present lesion (drawn, with a mask) or a lesion negated in the report.

    ``reported_location`` holds the ILS labels the report's location phrase maps to (ILS.md §7.2
    lexicon; ``["heart"]`` for cardiomegaly; for unreported lesions, the phrase the generator placed
    it by). ``overlap_location`` holds the ILS labels whose
    :func:`~cxrground.anatomy.ils_location_masks` region the mask overlaps. ``certainty`` is set for
    present, reported findings (``tentative`` = hedged sentence) and null otherwise.
    """

    lesion: str
    present: bool
    reported: bool
    certainty: Literal["definitive", "tentative"] | None = None
    sentence: str | None = None
    section: Literal["findings", "impression"] | None = None
    impression_sentence: str | None = None
    location_phrase: str | None = None
    site: str | None = None
    reported_location: list[str] = []
    overlap_location: list[str] = []
    placed_location: list[str] = []
    severity: str | None = None
    appearance: str | None = None
    mask_index: int | None = None
    mask: MaskRef | None = None

    @field_validator("lesion")
    @classmethod
    def _lesion(cls, v: str) -> str:
        if v not in LESIONS:
            raise ValueError(f"unknown lesion {v!r}")
        return v

    @field_validator("reported_location", "overlap_location", "placed_location")
    @classmethod
    def _labels(cls, v: list[str]) -> list[str]:
        return _check_labels(v)

    @property
    def negated(self) -> bool:
        return not self.present and self.reported


class StudyTruth(_Frozen):
    """Ground truth of one synthetic study. ``synthetic`` is always true: this is test data."""

    synthetic: Literal[True] = True
    generator: str
    generator_version: str
    seed: int
    index: int
    config_hash: str
    subject_id: str
    study_id: str
    dicom_id: str
    view: Literal["PA", "AP"]
    height: int
    width: int
    image_path: str
    report_path: str
    has_findings_section: bool
    normal: bool
    heart_status: Literal["normal", "borderline", "enlarged"]
    ctr: float
    anatomy: dict[str, MaskRef]
    findings: list[FindingTruth]
    other_sentences: list[str] = []

    @property
    def present_findings(self) -> list[FindingTruth]:
        return [f for f in self.findings if f.present]

    @property
    def negated_findings(self) -> list[FindingTruth]:
        return [f for f in self.findings if f.negated]

    @property
    def lesions_present(self) -> list[str]:
        """Lesion types with at least one drawn instance (first-appearance order)."""
        return list(dict.fromkeys(f.lesion for f in self.present_findings))
