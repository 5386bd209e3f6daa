"""The CheXpercept benchmark file ``chexpercept.json`` (CHEXPERCEPT.md §12) as typed records.

``{key_id: Case}``. A lesion-free (LF) case holds only ``detection_qa``, ``pair_id`` and ``dicom_id``;
RF and RR cases add ``contour_qa`` and (not for cardiomegaly) ``attribute_extraction_qa``.
Implementations may add fields; consumers ignore unknown ones (``extra="allow"``). This toolkit adds
``case_id``, ``lesion``, ``qa_path``, ``image_size`` ``[H, W]`` and ``relative_path`` on
``detection_qa`` (the plain CXR), all optional so that a benchmark in the reference layout also loads.

Image paths (``relative_path``) are relative to the benchmark folder.

**Reference layout** (the reference repository's ``data/chexpercept/``, what its evaluator reads): the
images live under ``chexpercept/<key_id>/`` in fixed stage sub-folders (:data:`REFERENCE_CXR`,
``contour_qa/`` + ``contour_eval_qa.relative_path``, :data:`REFERENCE_POINTS`, ``contour_qa/contour_revision_qa/``
+ each revision option's ``relative_path``) and ``detection_qa`` has no ``relative_path``. A case without
``detection_qa.relative_path`` is read as a reference-layout case: :func:`with_root_paths` rewrites its image
paths relative to the benchmark folder when the file is parsed, so every consumer sees one convention.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, ValidationError

from cxrground.errors import InputError
from cxrground.ils.layout import DATASET_FILE as ILS_DATASET_FILE
from cxrground.ils.schema import SPLITS as ILS_SPLITS

__all__ = [
    "ATTRIBUTE_KEYS",
    "BENCHMARK_FILE",
    "PATHS",
    "REFERENCE_CONTOUR_DIR",
    "REFERENCE_CXR",
    "REFERENCE_IMAGE_DIR",
    "REFERENCE_OVERLAY",
    "REFERENCE_POINTS",
    "REFERENCE_REVISION_DIR",
    "SEVERITY_KEY",
    "AttributeQA",
    "Benchmark",
    "Case",
    "ChoiceQA",
    "ComparisonQA",
    "ContourQA",
    "DetectionQA",
    "DistributionQA",
    "ImageChoiceQA",
    "LocationQA",
    "MaskOption",
    "PointOption",
    "PointsQA",
    "RevisionResultQA",
    "SeverityQA",
    "case_path",
    "ground_truth_problems",
    "is_reference_case",
    "load_benchmark",
    "parse_benchmark",
    "with_root_paths",
]

BENCHMARK_FILE: Final[str] = "chexpercept.json"
#: §12 key of the third Stage-4 question (the reference evaluator asks it only under this key).
SEVERITY_KEY: Final[str] = "severity/measurement"
#: §12 keys of the Stage-4 questions, in the order they are asked (§13.2) and written.
ATTRIBUTE_KEYS: Final[tuple[str, ...]] = ("distribution", "location", SEVERITY_KEY, "comparison")

#: Reference layout: folder (beside ``chexpercept.json``) holding one image folder per ``key_id``.
REFERENCE_IMAGE_DIR: Final[str] = "chexpercept"
#: Reference layout, relative to ``chexpercept/<key_id>/``: the plain CXR (Stage 1).
REFERENCE_CXR: Final[str] = "detection_qa/xray.png"
#: Reference layout: folder ``contour_eval_qa.relative_path`` is relative to.
REFERENCE_CONTOUR_DIR: Final[str] = "contour_qa"
#: Reference layout, relative to :data:`REFERENCE_CONTOUR_DIR`: the Stage-2 overlay.
REFERENCE_OVERLAY: Final[str] = "contour_eval_qa/xray_with_mask.png"
#: Reference layout: folder of the Stage-3 images; revision options' ``relative_path`` is relative to it.
REFERENCE_REVISION_DIR: Final[str] = "contour_qa/contour_revision_qa"
#: Reference layout, relative to :data:`REFERENCE_REVISION_DIR`: the overlay with the coloured points.
REFERENCE_POINTS: Final[str] = "xray_with_mask_and_points.png"
#: qa_path values (§1.3).
PATHS: Final[tuple[str, str, str]] = ("lesion_free", "revision_free", "revision_required")
QAPath = Literal["lesion_free", "revision_free", "revision_required"]


class _Record(BaseModel):
    model_config = ConfigDict(extra="allow")


class ChoiceQA(_Record):
    """A single-answer question: ``question`` is the full formatted string (stem + options)."""

    question: str
    answer_options: list[str]
    answer: str
    answer_index: int


class DetectionQA(ChoiceQA):
    """Stage 1; ``relative_path`` (toolkit addition) is the plain CXR."""

    relative_path: str | None = None


class ImageChoiceQA(ChoiceQA):
    """Stage 2 (contour evaluation): the overlay image is ``relative_path``."""

    relative_path: str


class PointOption(_Record):
    """A coloured point option; the last option is ``{point: null, color: "None"}``."""

    point: list[int] | None
    color: str


class PointsQA(_Record):
    """Stage 3a/3b (multi-select): expansion or contraction points.

    ``relative_path`` (toolkit addition) is the overlay with points, shown with the expansion question.
    """

    question: str
    answer_options: list[PointOption]
    answer: str
    answer_index: list[int]
    relative_path: str | None = None


class MaskOption(_Record):
    """One revision-result option: the masks OR-ed into its image (None: not rendered, an RF case's unasked
    option)."""

    type: Literal["true", "fake"]
    masks: list[str]
    relative_path: str | None = None


class RevisionResultQA(_Record):
    """Stage 3c: choose the revised mask; one image per option."""

    question: str
    answer_options: list[MaskOption]
    answer: str
    answer_index: int


class DistributionQA(ChoiceQA):
    """Stage 4 distribution (number of zones)."""

    answer_zones: list[str] = Field(default_factory=list)


class LocationQA(_Record):
    """Stage 4 location (multi-select over three sub-regions + None)."""

    question: str
    answer_options: list[str]
    answer: str
    answer_index: list[int]
    answer_zones: list[str] = Field(default_factory=list)


class SeverityQA(ChoiceQA):
    """Stage 4 severity/measurement."""

    overlap_ratio: float
    selected_lung: str


class ComparisonQA(ChoiceQA):
    """Stage 4 left/right comparison."""

    left_size: float
    right_size: float
    left_has_overlap: bool
    right_has_overlap: bool


class AttributeQA(_Record):
    """Stage 4 questions, asked in this order: distribution, location, severity, comparison.

    §12 names the third one ``severity/measurement`` (:data:`SEVERITY_KEY`): it is written under that key
    (``model_dump(by_alias=True)``) and read from it or from ``severity`` / ``measurement`` (benchmarks
    written before); the attribute is ``severity``.
    """

    distribution: DistributionQA
    location: LocationQA
    severity: SeverityQA = Field(validation_alias=AliasChoices(SEVERITY_KEY, "severity", "measurement"),
                                 serialization_alias=SEVERITY_KEY)
    comparison: ComparisonQA


class ContourQA(_Record):
    """Stages 2-3 of a positive case; RF entries carry the revision QAs too (not asked)."""

    no_deformation: bool
    initial_context: str
    revision_before_masks: list[str] = Field(default_factory=list)
    revision_after_masks: list[str] = Field(default_factory=list)
    true_masks: dict[str, list[str]] = Field(default_factory=dict)
    fake_masks: dict[str, list[str]] = Field(default_factory=dict)
    true_combination: list[str] = Field(default_factory=list)
    fake_combinations: list[list[str]] = Field(default_factory=list)
    contour_eval_qa: ImageChoiceQA
    contour_revision_qa_expansion: PointsQA | None = None
    contour_revision_qa_contraction: PointsQA | None = None
    contour_revision_qa_revision_result: RevisionResultQA | None = None


class Case(_Record):
    """One benchmark case (one CXR × one lesion × one conversation)."""

    detection_qa: DetectionQA
    pair_id: str
    dicom_id: str
    contour_qa: ContourQA | None = None
    attribute_extraction_qa: AttributeQA | None = None
    case_id: str | None = None
    lesion: str | None = None
    qa_path: QAPath | None = None
    image_size: list[int] | None = None

    def path(self, key_id: str) -> str:
        """The case's path (§1.3), derived from the ground truth when ``qa_path`` is absent."""
        return self.qa_path or case_path(self)

    def lesion_of(self, key_id: str) -> str:
        """The target lesion: ``lesion`` if set, else the text of ``key_id`` before the first ``_``."""
        return self.lesion or key_id.split("_", 1)[0]


def case_path(case: Case) -> str:
    """§1.3 derivation: detection answer ≠ Yes → LF; ``no_deformation`` → RF; else RR."""
    if case.detection_qa.answer != "Yes":
        return "lesion_free"
    if case.contour_qa is None:
        raise ValueError(f"positive case {case.pair_id} has no contour_qa")
    return "revision_free" if case.contour_qa.no_deformation else "revision_required"


def ground_truth_problems(case: Case, path: str) -> list[str]:
    """Where the ground truth of ``case`` disagrees with itself or with its path ``path`` (a ``qa_path`` value,
    §1.3): the detection ``answer`` is not the option its ``answer_index`` names; the detection ``answer_index`` is
    not 1 (Yes) on a positive path or 2 (No) on the lesion-free path; ``contour_qa.no_deformation`` is not true on
    the revision-free path and false on the revision-required one. An index outside the options is left to the
    option checks."""
    det = case.detection_qa
    problems = []
    listed = 1 <= det.answer_index <= len(det.answer_options)
    if listed and det.answer_options[det.answer_index - 1] != det.answer:
        problems.append(f"detection answer {det.answer!r} disagrees with its answer_index {det.answer_index} "
                        f"({det.answer_options[det.answer_index - 1]!r})")
    want = 2 if path == "lesion_free" else 1
    if listed and det.answer_index != want:
        problems.append(f"{path.replace('_', '-')} detection answer must be {want} ({'No' if want == 2 else 'Yes'}), "
                        f"not answer_index {det.answer_index}")
    cq = case.contour_qa
    if path != "lesion_free" and cq is not None and cq.no_deformation != (path == "revision_free"):
        problems.append(f"qa_path {path} disagrees with contour_qa.no_deformation={cq.no_deformation}")
    return problems


def is_reference_case(case: Case) -> bool:
    """True for a case in the reference layout (its ``detection_qa`` names no image)."""
    return case.detection_qa.relative_path is None


def with_root_paths(key: str, case: Case) -> Case:
    """``case`` with its image paths relative to the benchmark folder: a reference-layout case gets a copy with
    ``chexpercept/<key>/…`` paths (module docstring); any other case is returned as it is."""
    if not is_reference_case(case):
        return case
    base = f"{REFERENCE_IMAGE_DIR}/{key}"
    out = case.model_copy(deep=True)
    out.detection_qa.relative_path = f"{base}/{REFERENCE_CXR}"
    cq = out.contour_qa
    if cq is None:
        return out
    cq.contour_eval_qa.relative_path = f"{base}/{REFERENCE_CONTOUR_DIR}/{cq.contour_eval_qa.relative_path}"
    revision = f"{base}/{REFERENCE_REVISION_DIR}"
    if cq.contour_revision_qa_expansion is not None and not cq.no_deformation:  # §10.2: RR only
        cq.contour_revision_qa_expansion.relative_path = f"{revision}/{REFERENCE_POINTS}"
    if cq.contour_revision_qa_revision_result is not None:
        for option in cq.contour_revision_qa_revision_result.answer_options:
            if option.relative_path is not None:
                option.relative_path = f"{revision}/{option.relative_path}"
    return out


class Benchmark(BaseModel):
    """The whole file: ``cases`` keyed by ``key_id``, and the folder the image paths are relative to."""

    cases: dict[str, Case]
    root: Path | None = None

    def image(self, relative_path: str) -> Path:
        """Absolute path of an image referenced by the benchmark."""
        if self.root is None:
            raise ValueError("benchmark has no root folder")
        return self.root / relative_path

    def dump(self) -> dict[str, Any]:
        """The JSON object ``{key_id: case}``."""
        return {k: c.model_dump(exclude_none=False, by_alias=True) for k, c in self.cases.items()}


_NOT_A_BENCHMARK: Final[str] = ("is an ILS dataset, not a CheXpercept benchmark; build one with `cxrground percept "
                                 "build`")


def _is_ils_dataset(data: Mapping[str, Any]) -> bool:
    """Whether ``data`` is the top level of an ILS dataset (``{split: {study_id: study}}``), not a benchmark."""
    return (bool(data) and set(data) <= set(ILS_SPLITS)
            and all(isinstance(v, Mapping) and "detection_qa" not in v for v in data.values()))


def parse_benchmark(data: Mapping[str, Any], root: Path | None = None, source: Path | None = None) -> Benchmark:
    """Validate a ``{key_id: case}`` mapping (either layout; image paths come out relative to the benchmark
    folder); errors name the case and the field."""
    if not isinstance(data, Mapping):
        raise InputError("benchmark JSON must be an object {key_id: case}", source)
    if _is_ils_dataset(data):
        raise InputError(_NOT_A_BENCHMARK, source)
    cases: dict[str, Case] = {}
    for key, value in data.items():
        try:
            cases[key] = with_root_paths(key, Case.model_validate(value))
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            raise InputError(f"case {key}: {where}: {first['msg']}", source) from exc
    return Benchmark(cases=cases, root=root)


def load_benchmark(path: str | Path) -> Benchmark:
    """Read ``chexpercept.json`` from a benchmark folder (or the file itself)."""
    path = Path(path)
    file = path / BENCHMARK_FILE if path.is_dir() else path
    if file.is_dir():
        raise InputError("is a folder, not the benchmark file", file)
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        if path.is_dir() and (path / ILS_DATASET_FILE).is_file():
            raise InputError(_NOT_A_BENCHMARK, path) from None
        raise InputError("benchmark file not found", file) from None
    except OSError as exc:
        raise InputError(f"cannot read the benchmark file ({exc.strerror or exc})", file) from exc
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise InputError(f"benchmark file is not valid JSON ({exc})", file) from exc
    return parse_benchmark(data, root=file.parent, source=file)
