"""What a report says beyond its chosen section's findings: whether it reads the film at all, and what an addendum
names.

ILS §11.2 turns a lesion the report does not mention into a negative pair. A radiology report always reads the
film (its findings, or "No acute cardiopulmonary process."), but a free-text note may not: "Fever and two days of
odynophagia" mentions no lesion because it describes no image, not because the image is clear.

ILS §6 reads one section, as the official MIMIC-CXR section parser does, so an addendum never reaches the pairs,
even one that corrects the findings ("ADDENDUM: On further review, a small left pleural effusion is present.").
:func:`addendum_lesions` says which lesions an addendum names, so that a build can list those studies for review.
"""

from __future__ import annotations

from cxrground.reports.findings import StructuredReport
from cxrground.reports.model import Report
from cxrground.reports.structure.lexicon import NORMAL_STATEMENT_RE
from cxrground.reports.structure.rules import structure_text

__all__ = ["ADDENDUM_SECTION", "addendum_lesions", "reads_the_film"]

#: Section name of a report's addendum (:data:`cxrground.reports.sections.HEADINGS`).
ADDENDUM_SECTION = "addendum"


def reads_the_film(report: StructuredReport) -> bool:
    """True when the report says something about the film: a finding of any kind (a lesion or not; present,
    uncertain or absent) or a normal-examination statement (:data:`~cxrground.reports.structure.lexicon.
    NORMAL_STATEMENT_RE`) in its chosen section."""
    return bool(report.findings) or NORMAL_STATEMENT_RE.search(report.section.text.lower()) is not None


def addendum_lesions(report: Report) -> tuple[str, ...] | None:
    """The lesions the addendum of ``report`` names (present, uncertain or negated; sorted), read by the rule
    structurer; None when the report has no addendum with usable words."""
    try:
        findings = structure_text(report.sections.get(ADDENDUM_SECTION, ""), report.report_id).findings
    except ValueError:  # no addendum, or one without usable words
        return None
    return tuple(sorted({f.lesion for f in findings if f.lesion is not None}))
