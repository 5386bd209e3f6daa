"""Typed records of the report stage: :class:`Report`, :class:`Sentence`, :class:`SectionChoice`, :class:`SectionPart`.

All four are frozen dataclasses. Sequences are stored as tuples; ``Report.sections`` and
``Report.metadata`` are ordinary (ordered) dicts that must be treated as read-only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final, Literal, get_args

ReportFormat = Literal["mimic", "iu_xml", "text"]
SectionName = Literal["findings", "impression", "last_paragraph", "findings+impression"]
SectionPolicy = Literal["findings", "impression", "findings+impression"]

#: Formats a :class:`Report` can come from.
REPORT_FORMATS: Final[tuple[str, ...]] = get_args(ReportFormat)
#: Names a :class:`SectionChoice` can carry: the single sections in the fallback order of ILS §6, then the merged
#: findings + impression section of the ``findings+impression`` policy.
SECTION_NAMES: Final[tuple[str, ...]] = get_args(SectionName)
#: Name of the merged section (findings sentences first, then impression sentences, numbered on).
MERGED_SECTION: Final[str] = "findings+impression"
#: Section policies (see :func:`cxrground.reports.sections.select_section`); the first is the paper's (ILS §6).
SECTION_POLICIES: Final[tuple[str, ...]] = get_args(SectionPolicy)
#: The paper's choice: one section, findings, else impression, else the last paragraph.
DEFAULT_SECTION_POLICY: Final[str] = "findings"


@dataclass(frozen=True)
class Report:
    """One radiology report, split into named sections.

    ``sections`` maps canonical section names (``findings``, ``impression``, ``indication``,
    ``comparison``, ``last_paragraph``, ...) to their text, in report order; only non-empty
    sections are present. ``mesh_major``/``mesh_minor`` are the human-coded MeSH terms of IU
    reports, verbatim (empty for other formats). ``image_ids`` are the IU ``parentImage`` ids.
    ``text`` is the full decoded text for free-text reports (None for XML).
    """

    report_id: str
    format: ReportFormat
    sections: dict[str, str]
    source: str | None = None
    mesh_major: tuple[str, ...] = ()
    mesh_minor: tuple[str, ...] = ()
    image_ids: tuple[str, ...] = ()
    metadata: dict[str, str] = field(default_factory=dict)
    text: str | None = None

    def __post_init__(self) -> None:
        if not self.report_id:
            raise ValueError("report_id must be a non-empty string")
        if self.format not in REPORT_FORMATS:
            raise ValueError(f"unknown report format {self.format!r}; expected one of {REPORT_FORMATS}")
        for name in ("mesh_major", "mesh_minor", "image_ids"):
            object.__setattr__(self, name, tuple(getattr(self, name)))

    def section(self, name: str) -> str | None:
        """Return the text of section ``name``, or None when the report has no such (non-empty) section."""
        text = self.sections.get(name)
        return text if text and text.strip() else None

    @property
    def findings(self) -> str | None:
        """The FINDINGS section, or None."""
        return self.section("findings")

    @property
    def impression(self) -> str | None:
        """The IMPRESSION section, or None."""
        return self.section("impression")

    @property
    def indication(self) -> str | None:
        """The INDICATION section, or None."""
        return self.section("indication")

    @property
    def comparison(self) -> str | None:
        """The COMPARISON section, or None."""
        return self.section("comparison")

    @property
    def last_paragraph(self) -> str | None:
        """The ``last_paragraph`` pseudo-section (free text only), or None."""
        return self.section("last_paragraph")

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-ready dict (tuples become lists)."""
        return {
            "report_id": self.report_id,
            "format": self.format,
            "source": self.source,
            "sections": dict(self.sections),
            "mesh_major": list(self.mesh_major),
            "mesh_minor": list(self.mesh_minor),
            "image_ids": list(self.image_ids),
            "metadata": dict(self.metadata),
            "text": self.text,
        }


@dataclass(frozen=True)
class Sentence:
    """One sentence of a chosen section; ``index`` is the 1-based ``(n)`` number of ILS §6."""

    index: int
    text: str

    def __post_init__(self) -> None:
        if self.index < 1:
            raise ValueError(f"sentence index must be >= 1, got {self.index}")
        if not self.text.strip():
            raise ValueError(f"sentence {self.index} is empty")


@dataclass(frozen=True)
class SectionPart:
    """The sentences ``first``..``last`` (1-based, inclusive) of a :class:`SectionChoice` come from section ``name``."""

    name: str
    first: int
    last: int


@dataclass(frozen=True)
class SectionChoice:
    """The report section used for a study (ILS §6), or findings and impression merged into one.

    ``text`` is the section as found in the report (merged: findings text, a blank line, impression text);
    ``sentences`` its split sentences; ``section_content`` the numbered form ``"(1) First. (2) Second."``.
    ``parts`` says which sentences come from which report section: one part for a single section (filled in
    when not given); for the merged section the findings sentences keep their numbers 1..n and the
    impression sentences are numbered on from n + 1.
    """

    name: SectionName
    text: str
    sentences: tuple[Sentence, ...]
    section_content: str
    parts: tuple[SectionPart, ...] = ()

    def __post_init__(self) -> None:
        if self.name not in SECTION_NAMES:
            raise ValueError(f"unknown section {self.name!r}; expected one of {SECTION_NAMES}")
        object.__setattr__(self, "sentences", tuple(self.sentences))
        for position, sentence in enumerate(self.sentences, start=1):
            if sentence.index != position:
                raise ValueError(f"sentence at position {position} has index {sentence.index}")
        parts = tuple(self.parts) or ((SectionPart(self.name, 1, len(self.sentences)),) if self.sentences else ())
        expected = 1
        for part in parts:
            if part.first != expected or part.last < part.first:
                raise ValueError(f"section parts must cover sentences 1..{len(self.sentences)} in order: {parts}")
            expected = part.last + 1
        if expected != len(self.sentences) + 1:
            raise ValueError(f"section parts must cover sentences 1..{len(self.sentences)} in order: {parts}")
        object.__setattr__(self, "parts", parts)

    def part_of(self, index: int) -> str:
        """Name of the report section that sentence ``index`` (1-based) comes from."""
        for part in self.parts:
            if part.first <= index <= part.last:
                return part.name
        raise IndexError(f"sentence index {index} out of range 1..{len(self.sentences)}")

    def sentence(self, index: int) -> Sentence:
        """Return the sentence numbered ``index`` (1-based); ``IndexError`` if there is none."""
        if not 1 <= index <= len(self.sentences):
            raise IndexError(f"sentence index {index} out of range 1..{len(self.sentences)}")
        return self.sentences[index - 1]

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-ready dict."""
        return {
            "name": self.name,
            "text": self.text,
            "sentences": [{"index": s.index, "text": s.text} for s in self.sentences],
            "section_content": self.section_content,
            **({"parts": [{"name": p.name, "first": p.first, "last": p.last} for p in self.parts]}
               if len(self.parts) > 1 else {}),
        }
