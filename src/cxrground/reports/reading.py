"""Whether a report reads the film at all, the condition for taking its silence about a lesion as a negative.

ILS §11.2 turns a lesion the report does not mention into a negative pair. A radiology report always reads the
film (its findings, or "No acute cardiopulmonary process."), but a free-text note may not: "Fever and two days of
odynophagia" mentions no lesion because it describes no image, not because the image is clear.
"""

from __future__ import annotations

from cxrground.reports.findings import StructuredReport
from cxrground.reports.structure.lexicon import NORMAL_STATEMENT_RE

__all__ = ["reads_the_film"]


def reads_the_film(report: StructuredReport) -> bool:
    """True when the report says something about the film: a finding of any kind (a lesion or not; present,
    uncertain or absent) or a normal-examination statement (:data:`~cxrground.reports.structure.lexicon.
    NORMAL_STATEMENT_RE`) in its chosen section."""
    return bool(report.findings) or NORMAL_STATEMENT_RE.search(report.section.text.lower()) is not None
