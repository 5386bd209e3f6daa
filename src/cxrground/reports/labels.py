"""Per-report lesion labels, CheXpert-labeler / NegBio style, rolled up from a structured report's findings.

One label per report and label field: ``present`` (code 1), ``uncertain`` (-1), ``absent`` (0), or None when the
report does not mention it (blank). The label fields are the seven lesions of :data:`cxrground.vocab.LESIONS`, on
the structurer's lesion field, and :data:`OPACITY_OBSERVED`, the opacity *observation*: ``opacity`` findings plus
the opacity-class phrases ("opacity", "airspace disease", "infiltrate", ... of the lexicon) that the structurer
attributed to another lesion ("right basilar opacity, likely atelectasis" is an atelectasis finding, and it still
states an opacity).

The rules (:func:`mention_assertion`, :func:`roll_up`, :func:`label_report`):

1. A *mention* is a finding whose lesion is one of the seven, or whose phrase is opacity-class
   (:func:`is_opacity_phrase`); other findings (nodule, pneumothorax, ...) are ignored. Its sides are the
   ``right`` / ``left`` of its reported location (``bilateral`` labels are none: ILS labels name each lung). A
   finding without a location phrase lies in both lungs by the default of ILS §7.2 and so names both sides
   ("Small pleural effusion." is ``right+left``, as "Bilateral pleural effusions." is): rules version 49's change 6
   (only the sides the report states) was reverted by its check, because the Open-i MeSH coders code an unplaced
   plural ("minimal posterior pleural effusions") as bilateral and the side agreement fell
   (``bench/records/rules_v49_preregistration.md``).
2. A mention states its own assertion about its lesion. About :data:`OPACITY_OBSERVED` it states its own assertion
   when it is an ``opacity`` finding or an opacity-class phrase with no lesion, and ``present`` when it is an
   opacity-class phrase attributed to another lesion and not negated: a hedged *cause* ("opacity, likely
   atelectasis", "opacity, possibly pneumonia") does not hedge the opacity that is seen. In the same way a
   consolidation phrase attributed to another lesion and not negated ("Consolidation of the left lower lobe,
   consistent with pneumonia.") is a second mention, of ``consolidation`` present (version 49,
   :func:`label_mentions`): the consolidation the report states is labelled; the finding itself, and so ILS, keeps
   its lesion (ILS §7: the predicted type).
3. Per label field, present beats uncertain beats absent: the status is the strongest assertion stated; no
   mention = None. The label's sentence numbers are those of the mentions with that status only, and so are its
   sides ("right effusion; possible small left effusion" is present on the right, sentence 1). An absent label
   has no sides: a negation's location says where a lesion was looked for, and one without a location phrase
   gets both lungs by default (ILS §7.2).
4. A statement that the heart is of normal size ("Heart size is normal.", "Normal heart size.", "The
   cardiomediastinal silhouette is within normal limits."; :data:`~.structure.lexicon.HEART_NORMAL_RE`) labels
   cardiomegaly absent (0) when no finding states it present or uncertain, as CheXpert-style labelers read it. It
   is a labels-only rule: the structured findings, and so ILS, have no finding for it (ILS §7.1 allows only explicit
   negation). "Top normal" and "upper limits of normal" say nothing either way.

:func:`mention_assertion` and :func:`roll_up` are also what the MeSH agreement scores of
:mod:`cxrground.evaluation.report_quality` count, so the labels and those scores cannot drift apart.
:class:`LabelRequest` / :func:`label_files` run the whole chain on report files for ``cxrground reports label``.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal, Protocol, TypeVar, get_args

from cxrground.errors import Failure, first_failure
from cxrground.fields import option
from cxrground.reports.findings import (
    Assertion,
    Finding,
    StructuredReport,
    finding_lines,
    rejection_notes,
    write_failure_lines,
)
from cxrground.reports.model import MERGED_SECTION, SECTION_POLICIES
from cxrground.reports.request import StructureOutput, StructureRequest, stats_notes, structure_paths
from cxrground.reports.structure.lexicon import ENTITY_KINDS, ENTITY_RE, HEART_NORMAL_RE
from cxrground.vocab import LESIONS
from cxrground.vocab.lesions import HEART_MASK_LESIONS

__all__ = [
    "LABEL_COLUMNS",
    "LABEL_FIELDS",
    "LABEL_FORMATS",
    "LABEL_STATUSES",
    "OPACITY_OBSERVED",
    "STATUS_CODES",
    "UNCERTAIN_POLICIES",
    "LabelFormat",
    "LabelMention",
    "LabelRequest",
    "LabelStatus",
    "LesionLabel",
    "Observation",
    "ReportLabels",
    "finding_sides",
    "is_consolidation_phrase",
    "is_opacity_phrase",
    "label_files",
    "label_lines",
    "label_mentions",
    "label_report",
    "mention_assertion",
    "roll_up",
    "write_labels",
]

LabelStatus = Literal["present", "uncertain", "absent"]
LabelFormat = Literal["csv", "jsonl"]

#: Statuses, strongest first: the roll-up keeps the first one any mention states.
LABEL_STATUSES: Final[tuple[str, ...]] = get_args(LabelStatus)
#: CheXpert-labeler codes of the statuses (a field not mentioned has no code: a blank cell).
STATUS_CODES: Final[dict[str, int]] = {"present": 1, "uncertain": -1, "absent": 0}
#: Label field of the opacity observation: opacity findings plus opacity-class phrases attributed to other lesions.
OPACITY_OBSERVED: Final[str] = "opacity_observed"
#: Label fields of :class:`ReportLabels`, in column order: the seven lesions, then :data:`OPACITY_OBSERVED`.
LABEL_FIELDS: Final[tuple[str, ...]] = (*LESIONS, OPACITY_OBSERVED)
#: What an uncertain mention counts as in :func:`roll_up`: itself (CheXpert's -1; the default), present when its
#: hedge is of the ``likely`` grade ("probable pneumonia", "opacity, likely atelectasis": the reader's best guess;
#: human coders such as Open-i's MeSH coders code these, and not the "may represent" kind), or present whatever
#: its hedge (the "U-Ones" view).
UNCERTAIN_POLICIES: Final[tuple[str, ...]] = ("uncertain", "likely", "present")
#: Output formats of :func:`label_lines` / :func:`write_labels`.
LABEL_FORMATS: Final[tuple[str, ...]] = get_args(LabelFormat)
#: Columns of the CSV output: report id, section read, one code per field, then one sides column per field.
LABEL_COLUMNS: Final[tuple[str, ...]] = ("report_id", "section", *LABEL_FIELDS,
                                         *(f"{name}_sides" for name in LABEL_FIELDS))
_SIDES: Final[tuple[str, ...]] = ("right", "left")
#: The label field of an attributed consolidation phrase (rule 2 of the module docstring).
_CONSOLIDATION: Final[str] = "consolidation"


def is_opacity_phrase(entity: str) -> bool:
    """Whether the finding phrase ``entity`` is, as a whole, one of the lexicon's opacity-class phrases."""
    m = ENTITY_RE.fullmatch(entity.lower())
    return m is not None and m.lastgroup is not None and ENTITY_KINDS[m.lastgroup].lesion == "opacity"


def is_consolidation_phrase(entity: str) -> bool:
    """Whether the finding phrase ``entity`` is, as a whole, one of the lexicon's consolidation phrases (version 49)."""
    m = ENTITY_RE.fullmatch(entity.lower())
    return m is not None and m.lastgroup is not None and ENTITY_KINDS[m.lastgroup].lesion == _CONSOLIDATION


def finding_sides(reported_location: Iterable[str]) -> frozenset[str]:
    """The sides (``right`` / ``left``) named by ILS location labels (``right lung base`` -> right)."""
    return frozenset(side for label in reported_location for side in _SIDES if label.startswith(side))


class Observation(Protocol):
    """What the roll-up reads of a mention (:class:`LabelMention`, or the MeSH scorer's own records)."""

    @property
    def lesion(self) -> str | None: ...

    @property
    def opacity_phrase(self) -> bool: ...

    @property
    def assertion(self) -> str: ...

    @property
    def sides(self) -> frozenset[str]: ...

    @property
    def hedge(self) -> str | None: ...


M = TypeVar("M", bound=Observation)


@dataclass(frozen=True)
class LabelMention:
    """One finding as the labeller sees it: lesion (None: an opacity-class phrase of no target lesion), whether its
    phrase is opacity-class, its assertion, its sides, and its 1-based sentence number."""

    lesion: str | None
    opacity_phrase: bool
    assertion: Assertion
    sides: frozenset[str]
    sent_idx: int
    hedge: str | None = None

    @classmethod
    def from_finding(cls, finding: Finding) -> LabelMention | None:
        """The mention of ``finding``, or None when it is neither a lesion finding nor an opacity-class phrase."""
        opacity_phrase = is_opacity_phrase(finding.entity)
        if finding.lesion is None and not opacity_phrase:
            return None
        return cls(finding.lesion, opacity_phrase, finding.assertion, finding_sides(finding.reported_location),
                   finding.sent_idx, finding.hedge)


def mention_assertion(mention: Observation, name: str) -> str | None:
    """What ``mention`` states about the label field ``name`` (a lesion or :data:`OPACITY_OBSERVED`): an assertion,
    or None when it says nothing about it (rule 2 of the module docstring)."""
    if name != OPACITY_OBSERVED:
        if name not in LESIONS:
            raise ValueError(f"unknown label field {name!r}; expected one of {LABEL_FIELDS}")
        return mention.assertion if mention.lesion == name else None
    if mention.lesion != "opacity" and not mention.opacity_phrase:
        return None
    attributed = mention.opacity_phrase and mention.lesion not in (None, "opacity")
    return "present" if attributed and mention.assertion != "absent" else mention.assertion


def roll_up(mentions: Iterable[M], name: str, uncertain: str = "uncertain") -> tuple[str, tuple[M, ...]] | None:
    """The status of the label field ``name`` over ``mentions`` and the mentions that state it (in input order), or
    None when none mentions it. Present beats uncertain beats absent; ``uncertain="present"`` counts uncertain
    mentions as present, ``uncertain="likely"`` only those whose hedge is of the ``likely`` grade
    (:data:`UNCERTAIN_POLICIES`)."""
    if uncertain not in UNCERTAIN_POLICIES:
        raise ValueError(f"unknown uncertain policy {uncertain!r}; expected one of {UNCERTAIN_POLICIES}")
    stated: list[tuple[M, str]] = []
    for m in mentions:
        said = mention_assertion(m, name)
        if said is not None:
            promoted = said == "uncertain" and (
                uncertain == "present" or (uncertain == "likely" and m.hedge == "likely"))
            stated.append((m, "present" if promoted else said))
    for status in LABEL_STATUSES:
        support = tuple(m for m, said in stated if said == status)
        if support:
            return status, support
    return None


@dataclass(frozen=True)
class LesionLabel:
    """The report-level label of one field: status, the sides and the sentence numbers of its supporting mentions."""

    status: LabelStatus
    sides: frozenset[str] = frozenset()
    sentences: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.status not in LABEL_STATUSES:
            raise ValueError(f"unknown label status {self.status!r}; expected one of {LABEL_STATUSES}")
        object.__setattr__(self, "sides", frozenset(self.sides))
        if not self.sides <= set(_SIDES):
            raise ValueError(f"label sides must be right / left, got {sorted(self.sides)}")
        object.__setattr__(self, "sentences", tuple(self.sentences))
        if any(i < 1 for i in self.sentences):
            raise ValueError(f"sentence numbers are 1-based, got {self.sentences}")

    @classmethod
    def from_support(cls, status: str, support: Sequence[LabelMention]) -> LesionLabel:
        """The label of ``status`` supported by ``support``: their sentence numbers sorted and, unless absent, their
        sides united."""
        sides = frozenset() if status == "absent" else frozenset().union(*(m.sides for m in support))
        return cls(status, sides, tuple(sorted({m.sent_idx for m in support})))  # type: ignore[arg-type]

    def code(self) -> int:
        """The CheXpert-labeler code: 1 present, -1 uncertain, 0 absent."""
        return STATUS_CODES[self.status]

    def sides_text(self) -> str:
        """``right``, ``left``, ``right+left`` or ``""``."""
        return "+".join(side for side in _SIDES if side in self.sides)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form: status, code, sides (right before left), sentences."""
        return {"status": self.status, "code": self.code(), "sides": [s for s in _SIDES if s in self.sides],
                "sentences": list(self.sentences)}


@dataclass(frozen=True)
class ReportLabels:
    """The labels of one report: its id, the section read (``findings``, ``impression``, ``findings+impression``,
    ...), one :class:`LesionLabel` or None (not mentioned) per lesion, and the opacity observation
    (:data:`OPACITY_OBSERVED`: opacity findings plus opacity-class phrases attributed to other lesions)."""

    report_id: str
    section: str
    lesions: dict[str, LesionLabel | None]
    opacity_observed: LesionLabel | None = None

    def __post_init__(self) -> None:
        if set(self.lesions) != set(LESIONS):
            raise ValueError(f"labels must cover exactly the lesions {LESIONS}, got {sorted(self.lesions)}")

    def label(self, name: str) -> LesionLabel | None:
        """The label of field ``name`` (a lesion or :data:`OPACITY_OBSERVED`); None = not mentioned."""
        if name == OPACITY_OBSERVED:
            return self.opacity_observed
        if name not in self.lesions:
            raise KeyError(f"unknown label field {name!r}; expected one of {LABEL_FIELDS}")
        return self.lesions[name]

    def code(self, name: str) -> int | None:
        """The CheXpert-labeler code of field ``name``: 1 / -1 / 0, None when not mentioned."""
        label = self.label(name)
        return None if label is None else label.code()

    def codes(self) -> dict[str, int | None]:
        """Code of every field of :data:`LABEL_FIELDS`."""
        return {name: self.code(name) for name in LABEL_FIELDS}

    def csv_row(self) -> dict[str, str]:
        """One CSV row (:data:`LABEL_COLUMNS`): codes and sides, blank where a field is not mentioned."""
        codes = {name: "" if (label := self.label(name)) is None else str(label.code()) for name in LABEL_FIELDS}
        sides = {f"{name}_sides": "" if (label := self.label(name)) is None else label.sides_text()
                 for name in LABEL_FIELDS}
        return {"report_id": self.report_id, "section": self.section, **codes, **sides}

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form: report id, section, and per field its label (:meth:`LesionLabel.to_dict`) or null."""
        labels = {name: None if (label := self.label(name)) is None else label.to_dict() for name in LABEL_FIELDS}
        return {"report_id": self.report_id, "section": self.section, "labels": labels}


def label_mentions(structured: StructuredReport) -> tuple[LabelMention, ...]:
    """The mentions of a structured report (rule 1 of the module docstring), in finding order; a consolidation phrase
    attributed to another lesion and not negated adds a present ``consolidation`` mention after its own (rule 2)."""
    out: list[LabelMention] = []
    for f in structured.findings:
        m = LabelMention.from_finding(f)
        if m is not None:
            out.append(m)
        if (f.lesion is not None and f.lesion != _CONSOLIDATION and f.assertion != "absent"
                and is_consolidation_phrase(f.entity)):
            out.append(LabelMention(_CONSOLIDATION, False, "present", finding_sides(f.reported_location), f.sent_idx))
    return tuple(out)


def label_report(structured: StructuredReport, uncertain: str = "uncertain") -> ReportLabels:
    """The report-level labels of ``structured``, by the rules of the module docstring.

    Per lesion: the strongest assertion of the findings of that lesion (present > uncertain > absent; a lesion only
    negated is absent, one not mentioned is None), with the sides and sentence numbers of the findings that state
    it. :attr:`ReportLabels.opacity_observed` rolls up the same way over opacity findings and opacity-class phrases,
    an attributed phrase counting as present whatever the hedge on its cause. The section policy and the
    alternatives policy are the structurer's business: they decide which sentences there are and how an
    "atelectasis or scarring" is asserted, before the roll-up. ``uncertain`` (:data:`UNCERTAIN_POLICIES`) decides
    what an uncertain finding counts as: uncertain (-1, the default), present when hedged with a ``likely``-grade
    hedge, or always present.
    """
    mentions = label_mentions(structured)

    def label(name: str) -> LesionLabel | None:
        rolled = roll_up(mentions, name, uncertain)
        return None if rolled is None else LesionLabel.from_support(*rolled)

    lesions = {lesion: label(lesion) for lesion in LESIONS}
    for heart in HEART_MASK_LESIONS:  # cardiomegaly
        lesions[heart] = _with_normal_heart(lesions[heart], structured)
    return ReportLabels(structured.report_id, structured.section.name, lesions, label(OPACITY_OBSERVED))


def _with_normal_heart(label: LesionLabel | None, structured: StructuredReport) -> LesionLabel | None:
    """Rule 4 of the module docstring: a heart-size-normal statement negates cardiomegaly in the labels."""
    if label is not None and label.status != "absent":
        return label
    normal = [s.index for s in structured.section.sentences if HEART_NORMAL_RE.search(s.text.lower())]
    if not normal:
        return label
    return LesionLabel("absent", frozenset(), tuple(sorted({*normal, *(label.sentences if label else ())})))


def label_lines(labels: Iterable[ReportLabels], fmt: str = "csv") -> list[str]:
    """The output lines of ``labels``: a CSV header and one row per report, or one JSON object per report."""
    if fmt == "jsonl":
        return [json.dumps(r.to_dict(), ensure_ascii=False) for r in labels]
    if fmt != "csv":
        raise ValueError(f"unknown label format {fmt!r}; expected one of {LABEL_FORMATS}")
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=LABEL_COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(r.csv_row() for r in labels)
    return buffer.getvalue().splitlines()


def write_labels(out: Path, labels: Sequence[ReportLabels], failures: Sequence[Failure], fmt: str = "csv",
                 ) -> Path | None:
    """Write ``labels`` to ``out`` in ``fmt`` and the failures to ``OUT.failures.jsonl`` (removed when there are
    none); returns the failures file, or None."""
    lines = label_lines(labels, fmt)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return write_failure_lines(out, failures)


@dataclass(frozen=True, kw_only=True)
class LabelRequest(StructureRequest):
    """A :class:`StructureRequest` whose findings are rolled up into per-report labels, in which format.

    The section policy defaults to ``findings+impression``: a report-level label reads the whole report, as MeSH
    coders do (``reports structure`` and ``ils build`` keep the ILS §6 default, findings).
    """

    sections: str = option(MERGED_SECTION, choices=SECTION_POLICIES, help="Report section policy: findings "
                           "(ILS §6), impression, or findings+impression (both; the default for labels).")
    out: Path | None = option(None, path="out_file", help="Write the labels here (failures go to "
                              "OUT.failures.jsonl) instead of stdout ('-': stdout).")
    uncertain: str = option("uncertain", choices=UNCERTAIN_POLICIES,
                            help="What a hedged finding counts as: uncertain (-1, default), likely (present when "
                                 "the hedge is 'likely' / 'probable' / 'favored'; -1 for 'may' / 'possible' / "
                                 "'cannot exclude'), or present (every hedge).")
    label_format: str = option("csv", flag="--format", choices=LABEL_FORMATS,
                               help="CSV (one row per report: a 1/-1/0/blank column and a sides column per lesion) "
                                    "or JSON lines (one object per report).")


def label_files(paths: Sequence[Path], request: LabelRequest,
                note: Callable[[str], None] | None = None) -> StructureOutput:
    """Read, structure and label report files (or folders of them).

    Lines for stdout: the labels (and, as JSON lines, ``{"failure": ...}`` lines), or none when written to
    ``request.out``; notes for stderr: what was written, and with CSV on stdout the failure lines (so that stdout
    stays one CSV table). ``failed``: something failed and nothing was labelled. ``note`` gets the structurer's
    notes during the run (:func:`~cxrground.reports.request.structure_paths`).
    """
    done, failures, structurer = structure_paths(paths, request, note)
    labels = [label_report(s, request.uncertain) for s in done]
    lines: list[str] = []
    notes: list[str] = []
    if request.out is not None:
        fail_path = write_labels(request.out, labels, failures, request.label_format)
        where = f"; failures in {fail_path}" if fail_path else ""
        first = first_failure(failures)
        notes.append(f"{len(labels)} reports labelled -> {request.out}; {len(failures)} failures{where}{first}")
    elif request.label_format == "jsonl":
        lines = [*label_lines(labels, "jsonl"), *finding_lines((), failures)]
    else:
        lines = label_lines(labels, "csv")
        notes.extend(finding_lines((), failures))
    notes.extend(rejection_notes(structurer, request.out))
    notes.extend(stats_notes(structurer))
    return StructureOutput(lines, notes, bool(failures) and not labels, len(labels), len(failures))
