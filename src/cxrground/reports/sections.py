"""Section parsing of MIMIC-style free-text reports and the section choice of ILS §6.

Semantics follow the official MIMIC-CXR ``section_parser.py`` (mimic-cxr repository), with the
deviations listed here:

* A heading is an upper-case label followed by ``:`` at the start of a line (``FINDINGS:``,
  ``WET READ:``, ``CHEST, PA AND LATERAL:``). Known headings (the keys of :data:`HEADINGS`) are also
  accepted in any case at the start of a line (``Impression:``), alone on a line without the colon
  (``IMPRESSION``), and in the middle of a line when they follow sentence punctuation or two spaces
  (``... cough.  FINDINGS: ...``). The official parser only knows the first form.
* Heading names are normalised with :data:`HEADINGS`, then the official fallbacks: a name containing
  ``impression``, ``findings``, ``history``, ``comparison`` or ``addendum`` maps to it; a name that
  describes the views (``chest``, ``portable``, ``pa and lateral``, ``two views``, ...) maps to
  ``findings``. As in the official table, combined headings (``FINDINGS AND IMPRESSION``,
  ``FINDINGS/IMPRESSION``) map to ``impression``; ``IMPRESSIONS`` and ``CONCLUSION`` also map to
  ``impression``. Other upper-case labels keep their lower-cased name, and count as headings only at
  the start of a paragraph: inside a paragraph (``ETT: 4 cm above the carina``) they are text.
* ``FINAL REPORT``/``PRELIMINARY REPORT`` title lines and long ``____``/``----`` rules are removed.
  Text before the first heading is the ``preamble`` section.
* Empty sections are dropped (the official parser drops empty findings/impression). When a name
  occurs twice, the last non-empty occurrence wins (as ``create_section_files.py`` does).
* ``last_paragraph`` exists only when the report has neither findings nor impression, and is the last
  non-empty paragraph (blank-line separated) that contains no heading. The official parser
  instead joins every paragraph after the first one of the report's last section. When every paragraph holds a
  heading (a one-paragraph clinical note such as ``PC: Dyspnea and fever. ... Patchy opacification
  bilaterally.``), it is the text of the last section whose heading is not a known one (:data:`HEADINGS`:
  indication, history, comparison, technique, ...): a known heading's text is never read as findings, except a
  ``WET READ`` (the radiologist's preliminary reading) of a report that has nothing else to read.

:func:`choose_section` applies the ILS §6 order ``findings`` → ``impression`` → ``last_paragraph``.
A section whose text has no word other than de-identification blanks (``___``, ``XXXX``) counts as
absent.

Section policies (:func:`select_section`, ``--sections`` of ``ils build``, ``reports structure``, ``reports label``
and ``reports sections``):

* ``findings`` (default, the paper's ILS §6 choice): one section, findings → impression → last_paragraph.
* ``impression``: one section, impression → findings → last_paragraph.
* ``findings+impression``: both sections when the report has both, merged by :func:`merge_sections` into one
  :class:`~cxrground.reports.model.SectionChoice` named ``findings+impression``. **Sentence numbering**: the
  findings sentences keep their numbers ``(1)``..``(n)`` and the impression sentences follow as
  ``(n+1)``..``(n+m)``; ``section_content`` is the numbered text of both and ``parts`` records which numbers
  come from which section, so every ``sent_idx`` points into ``section_content`` as in ILS §6. A report with
  only one of the two sections gets that section alone (named ``findings`` or ``impression``), else the last
  paragraph. Duplicate findings (one lesion + location reported in both sections) are removed after
  structuring (:func:`cxrground.reports.structure.resolve_findings`): the findings section wins.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from cxrground.reports.model import (
    DEFAULT_SECTION_POLICY,
    MERGED_SECTION,
    SECTION_POLICIES,
    Report,
    SectionChoice,
    SectionPart,
    Sentence,
)
from cxrground.reports.sentences import number_sentences, split_sentences

__all__ = [
    "HEADINGS",
    "NO_SECTION_REASON",
    "POLICY_ORDERS",
    "SECTION_ORDER",
    "Heading",
    "check_section_policy",
    "choose_section",
    "describe_choice",
    "find_headings",
    "last_paragraph",
    "make_section_choice",
    "merge_sections",
    "normalise_heading",
    "parse_sections",
    "sections_and_headings",
    "select_section",
]

#: ILS §6 fallback order.
SECTION_ORDER: Final[tuple[str, ...]] = ("findings", "impression", "last_paragraph")
#: Fallback order of the single-section policies.
POLICY_ORDERS: Final[dict[str, tuple[str, ...]]] = {
    "findings": SECTION_ORDER,
    "impression": ("impression", "findings", "last_paragraph"),
}
#: Failure reason callers record when :func:`choose_section` returns None.
NO_SECTION_REASON: Final[str] = "no usable section"

#: Heading (lower case, as written) → canonical section name. The official table plus common variants.
HEADINGS: Final[dict[str, str]] = {
    # findings
    "findings": "findings",
    "finding": "findings",
    "findins": "findings",
    "findindgs": "findings",
    "findgings": "findings",
    "findngs": "findings",
    "findnings": "findings",
    "finidngs": "findings",
    "reference findings": "findings",
    "chest, two views": "findings",
    # impression (the official parser files combined findings/impression headings under impression)
    "impression": "impression",
    "impressions": "impression",
    "conclusion": "impression",
    "conclusions": "impression",
    "findings and impression": "impression",
    "findings/impression": "impression",
    "findings/ impression": "impression",
    "impression and findings": "impression",
    "impresson": "impression",
    "imprression": "impression",
    "imoression": "impression",
    "impressoin": "impression",
    "imprssion": "impression",
    "impresion": "impression",
    "imperssion": "impression",
    "mpression": "impression",
    "impession": "impression",
    "ndication": "impression",  # sic: official table
    # indication
    "indication": "indication",
    "indications": "indication",
    "idication": "indication",
    "clinical indication": "indication",
    "reason for examination": "indication",
    "reason for exam": "indication",
    "reason for this examination": "indication",
    "reason for study": "indication",
    # history
    "history": "history",
    "clinical history": "history",
    "clinical information": "history",
    "patient history": "history",
    "medical condition": "history",
    "underlying medical condition": "history",
    "pfi": "history",
    "provisional findings impression (pfi)": "history",
    # comparison
    "comparison": "comparison",
    "comparisons": "comparison",
    "comparison exam": "comparison",
    "comparison film": "comparison",
    "comparision": "comparison",
    "comparsion": "comparison",
    "comparrison": "comparison",
    "comparisions": "comparison",
    "reference exam": "comparison",
    # examination / technique
    "examination": "examination",
    "exam": "examination",
    "type of examination": "examination",
    "technique": "technique",
    # others kept by the official parser
    "wet read": "wet read",
    "wetread": "wet read",
    "notification": "notification",
    "recommendation": "recommendations",
    "recommendations": "recommendations",
    "recommendation(s)": "recommendations",
    "addendum": "addendum",
    "comment": "comment",
    "comments": "comment",
    "date": "date",
}

_MAIN_SECTIONS: Final[tuple[str, ...]] = ("impression", "findings", "history", "comparison", "addendum")
_VIEW_WORDS = re.compile(
    r"chest|portable|pa and lat|lateral and pa|ap and lateral|lateral and ap|frontal and|two views|"
    r"frontal view|pa view|ap view|one view|lateral view|bone window|frontal upright|frontal semi-upright|ribs"
)
_LINE_HEADING = re.compile(r"^[ \t]*(?P<name>[A-Za-z][A-Za-z0-9 ()/,&'\-]{0,59}?)[ \t]*:(?=\s|$)", re.M)
_BARE_HEADING = re.compile(r"^[ \t]*(?P<name>[A-Za-z][A-Za-z ()/]{2,40}?)[ \t]*$", re.M)
# "(?:(?<=[.!?;])[ \t]+|[ \t]{2,})" with the first blank taken out in front: the same matches, and the leading
# character class lets the search skip to the next blank
_INLINE_HEADING = re.compile(
    r"[ \t](?:(?<=[.!?;][ \t])[ \t]*|[ \t]+)(?P<name>"
    + "|".join(re.escape(k.upper()) for k in sorted(HEADINGS, key=len, reverse=True))
    + r")[ \t]*:(?=\s|$)"
)
_TITLE_OR_RULE = re.compile(r"^[ \t]*(?:(?:FINAL|PRELIMINARY) REPORT|[_=*\-]{10,})[ \t]*$", re.M | re.I)
_BLANKS = re.compile(r"_{2,}|\bX{2,}\b")
_WORD = re.compile(r"[A-Za-z0-9]")
_WORD_NOT_X = re.compile(r"[A-WYZa-z0-9]")  # a word character no blank (runs of "_" or "X") can hold


@dataclass(frozen=True)
class Heading:
    """A heading found in a report: ``raw`` as written, ``name`` canonical, ``start``/``end`` offsets."""

    raw: str
    name: str
    start: int
    end: int


def normalise_heading(raw: str) -> str | None:
    """Return the canonical section name of heading ``raw``, or None when it is not a known heading."""
    name = " ".join(raw.lower().split())
    if name in HEADINGS:
        return HEADINGS[name]
    for main in _MAIN_SECTIONS:
        if main in name:
            return main
    if _VIEW_WORDS.search(name):
        return "findings"
    return None


def _clean(text: str) -> str:
    """Return ``text`` with titles and rules removed and ``\\r\\n`` line ends normalised."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    return _TITLE_OR_RULE.sub("", text)


def _is_upper(name: str) -> bool:
    return any(c.isalpha() for c in name) and name == name.upper()


def _paragraph_start(text: str, line_start: int) -> bool:
    """True when the line starting at ``line_start`` is the first of its paragraph."""
    if line_start == 0:
        return True
    previous_end = line_start - 1
    previous_start = text.rfind("\n", 0, previous_end) + 1
    return not text[previous_start:previous_end].strip()


def _find_headings(text: str) -> list[Heading]:
    """Return the headings of already-cleaned ``text``, in order."""
    found: dict[int, Heading] = {}
    for m in _LINE_HEADING.finditer(text):
        raw = m.group("name").strip()
        name = normalise_heading(raw)
        if name is None:
            if not _is_upper(raw) or not _paragraph_start(text, text.rfind("\n", 0, m.start("name")) + 1):
                continue
            name = " ".join(raw.lower().split())
        elif raw.lower().strip() not in HEADINGS and not _is_upper(raw):
            continue  # fallback rules apply to upper-case labels only ("Chest wall: ..." is text)
        found[m.start("name")] = Heading(raw, name, m.start("name"), m.end())
    for m in _BARE_HEADING.finditer(text):
        raw = m.group("name").strip()
        if raw.lower() in HEADINGS and _is_upper(raw):
            found.setdefault(m.start("name"), Heading(raw, HEADINGS[raw.lower()], m.start("name"), m.end()))
    for m in _INLINE_HEADING.finditer(text):
        raw = m.group("name")
        found.setdefault(m.start("name"), Heading(raw, HEADINGS[raw.lower()], m.start("name"), m.end()))
    return [found[k] for k in sorted(found)]


def find_headings(text: str) -> list[Heading]:
    """Return the headings of ``text`` in order (offsets refer to the text after title/rule removal)."""
    return _find_headings(_clean(text))


def _tidy(text: str) -> str:
    """Return section text with each line stripped and runs of blank lines reduced to one."""
    lines = [line.strip() for line in text.split("\n")]
    out: list[str] = []
    for line in lines:
        if line or (out and out[-1]):
            out.append(line)
    return "\n".join(out).strip()


def _has_words(text: str) -> bool:
    """True when ``text`` has a letter or digit outside de-identification blanks."""
    if _WORD_NOT_X.search(text):
        return True
    return bool(_WORD.search(_BLANKS.sub(" ", text)))


def _paragraphs(text: str) -> list[tuple[int, int]]:
    """Return (start, end) offsets of the blank-line separated paragraphs of ``text``."""
    spans: list[tuple[int, int]] = []
    start: int | None = None
    offset = 0
    for line in text.split("\n"):
        end = offset + len(line)
        if line.strip():
            if start is None:
                start = offset
        elif start is not None:
            spans.append((start, offset - 1))
            start = None
        offset = end + 1
    if start is not None:
        spans.append((start, len(text)))
    return spans


def _last_paragraph(text: str, headings: Sequence[Heading]) -> str | None:
    starts = [h.start for h in headings]
    for start, end in reversed(_paragraphs(text)):
        if any(start <= s < end for s in starts):
            continue
        paragraph = _tidy(text[start:end])
        if paragraph:
            return paragraph
    return None


def last_paragraph(text: str) -> str | None:
    """Return the last non-empty paragraph of ``text`` that contains no heading, or None."""
    cleaned = _clean(text)
    return _last_paragraph(cleaned, _find_headings(cleaned))


def parse_sections(text: str) -> dict[str, str]:
    """Return the sections of a free-text report as an ordered dict canonical name → text.

    Includes ``preamble`` (text before the first heading) and ``last_paragraph`` (only when
    neither findings nor impression is present); empty sections are left out. A text without
    any heading yields at most ``{"last_paragraph": ...}``.
    """
    return sections_and_headings(text)[0]


def sections_and_headings(text: str) -> tuple[dict[str, str], list[Heading]]:
    """``(parse_sections(text), find_headings(text))``, finding the headings once."""
    cleaned = _clean(text)
    headings = _find_headings(cleaned)
    sections: dict[str, str] = {}
    if headings:
        preamble = _tidy(cleaned[: headings[0].start])
        if preamble:
            sections["preamble"] = preamble
    for i, heading in enumerate(headings):
        end = headings[i + 1].start if i + 1 < len(headings) else len(cleaned)
        body = _tidy(cleaned[heading.end : end])
        if body:
            sections[heading.name] = body
    if "findings" not in sections and "impression" not in sections:
        paragraph = (_last_paragraph(cleaned, headings) or _unknown_heading_text(sections, headings)
                     or sections.get("wet read"))
        if paragraph:
            sections["last_paragraph"] = paragraph
    return sections, headings


_KNOWN_NAMES: Final[frozenset[str]] = frozenset(HEADINGS.values()) | {"preamble"}


def _unknown_heading_text(sections: dict[str, str], headings: Sequence[Heading]) -> str | None:
    """The text of the last section under a heading that is not a known one (``PC:``, ``NOTE:``), or None."""
    for heading in reversed(headings):
        if heading.name not in _KNOWN_NAMES and sections.get(heading.name):
            return sections[heading.name]
    return None


def _section_sentences(text: str) -> list[str]:
    """The sentences of section text ``text``; none when it has no usable words."""
    if not text or not _has_words(text):
        return []
    return split_sentences(text)


def _choice(name: str, text: str, sentences: Sequence[str]) -> SectionChoice:
    """The :class:`SectionChoice` of section ``name`` with ``text`` split into ``sentences`` (numbered from 1)."""
    numbered = tuple(Sentence(i, s) for i, s in enumerate(sentences, start=1))
    return SectionChoice(name, text, numbered, number_sentences(numbered))  # type: ignore[arg-type]


def make_section_choice(name: str, text: str) -> SectionChoice | None:
    """Return the :class:`SectionChoice` for section ``name`` with ``text``, or None when it has no usable words."""
    sentences = _section_sentences(text)
    return _choice(name, text, sentences) if sentences else None


def choose_section(report: Report, order: Sequence[str] = SECTION_ORDER) -> SectionChoice | None:
    """Return the first usable section of ``report`` in ILS §6 order, or None (record :data:`NO_SECTION_REASON`)."""
    for name in order:
        if name not in SECTION_ORDER:
            raise ValueError(f"unknown section {name!r}; expected names from {SECTION_ORDER}")
        choice = make_section_choice(name, report.sections.get(name, ""))
        if choice is not None:
            return choice
    return None


def check_section_policy(policy: str) -> str:
    """Return ``policy`` if it is a known section policy (:data:`.model.SECTION_POLICIES`), else raise ValueError."""
    if policy not in SECTION_POLICIES:
        raise ValueError(f"unknown section policy {policy!r}; expected one of {', '.join(SECTION_POLICIES)}")
    return policy


def merge_sections(choices: Sequence[SectionChoice]) -> SectionChoice:
    """Return ``choices`` (single sections, in order) as one section: sentences numbered on, ``parts`` recorded."""
    if len(choices) == 1:
        return choices[0]
    return _merged([(c.name, c.text, [s.text for s in c.sentences]) for c in choices])


def _merged(sections: Sequence[tuple[str, str, Sequence[str]]]) -> SectionChoice:
    """The merged :class:`SectionChoice` of (name, text, sentences) of two or more sections, numbered on."""
    sentences: list[Sentence] = []
    parts: list[SectionPart] = []
    for name, _text, texts in sections:
        first = len(sentences) + 1
        sentences.extend(Sentence(len(sentences) + 1, t) for t in texts)
        parts.append(SectionPart(name, first, len(sentences)))
    text = "\n\n".join(t for _, t, _ in sections)
    return SectionChoice(MERGED_SECTION, text, tuple(sentences), number_sentences(sentences),  # type: ignore[arg-type]
                         tuple(parts))


def select_section(report: Report, policy: str = DEFAULT_SECTION_POLICY) -> SectionChoice | None:
    """Return the section of ``report`` that ``policy`` reads (see the module docstring), or None.

    None means the report has no usable section: record :data:`NO_SECTION_REASON`.
    """
    if check_section_policy(policy) in POLICY_ORDERS:
        return choose_section(report, POLICY_ORDERS[policy])
    found = [(name, text, sentences) for name in ("findings", "impression")
             if (sentences := _section_sentences(text := report.sections.get(name, "")))]
    if len(found) == 1:
        return _choice(*found[0])
    if found:  # merged without numbering each section on its own first
        return _merged(found)
    return choose_section(report, ("last_paragraph",))


def describe_choice(report: Report, as_json: bool = False, policy: str = DEFAULT_SECTION_POLICY) -> str:
    """The sections of ``report`` and the one ``policy`` reads (:func:`select_section`; the default is the ILS §6
    choice), its sentences numbered as the structurer, ``ils build`` and ``reports label`` number them under that
    policy: one JSON line, or indented text."""
    choice = select_section(report, policy)
    if as_json:
        return json.dumps({"report_id": report.report_id, "source": report.source, "sections": list(report.sections),
                           "mesh_major": list(report.mesh_major), "policy": policy,
                           "choice": choice.to_dict() if choice else None})
    lines = [f"{report.report_id} [{report.format}] sections: {', '.join(report.sections) or '-'}",
             f"  {NO_SECTION_REASON}" if choice is None else f"  {choice.name}: {choice.section_content}"]
    if report.mesh_major:
        lines.append(f"  MeSH major: {'; '.join(report.mesh_major)}")
    return "\n".join(lines)
