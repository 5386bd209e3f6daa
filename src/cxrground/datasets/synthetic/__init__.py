"""The built-in synthetic cohort: procedural chest X-ray phantoms with MIMIC-style reports and exact truth.

TEST DATA. Every study has a frontal PA/AP phantom (``phantom``), lesions drawn as added radiodensity
with exact masks (``lesions``), a MIMIC-CXR style report (``report``) and a ground-truth record
(``records``). ``cohort`` writes, resumes, loads and summarises cohorts on disk.

- :class:`SynthConfig`: the generator configuration.
- :func:`generate_study`: one study in memory (:class:`SyntheticStudy`).
- :func:`write_cohort`: a cohort on disk (:class:`CohortSummary`); resumable, deterministic.
- :func:`load_truth`, :func:`summarize`: read a cohort back.
"""

from cxrground.datasets.synthetic.cohort import (
    CohortSummary,
    cohort_of_images,
    format_summary,
    load_truth,
    read_truth,
    summarize,
    write_cohort,
)
from cxrground.datasets.synthetic.config import GENERATOR_NAME, GENERATOR_VERSION, SynthConfig
from cxrground.datasets.synthetic.records import FindingTruth, MaskRef, StudyTruth
from cxrground.datasets.synthetic.report import HEDGE_WORDS, NEGATION_WORDS, normalise_whitespace
from cxrground.datasets.synthetic.study import StudyIds, SyntheticStudy, generate_study, study_ids

__all__ = [
    "GENERATOR_NAME",
    "GENERATOR_VERSION",
    "HEDGE_WORDS",
    "NEGATION_WORDS",
    "CohortSummary",
    "FindingTruth",
    "MaskRef",
    "StudyIds",
    "StudyTruth",
    "SynthConfig",
    "SyntheticStudy",
    "cohort_of_images",
    "format_summary",
    "generate_study",
    "load_truth",
    "normalise_whitespace",
    "read_truth",
    "study_ids",
    "summarize",
    "write_cohort",
]
