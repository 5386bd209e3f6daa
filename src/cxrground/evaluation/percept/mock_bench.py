"""Tiny mock CheXpercept benchmarks for dry runs of the harness, its tests and its bench (tiny PNGs).

The questions are real (vocab templates) but the images are not radiographs: use a mock benchmark to
check a model server, the cache, concurrency and scoring end to end before paying for a real run.

:func:`make_benchmark` writes ``chexpercept.json`` and one small PNG per image into ``root``: LF, RF and RR
cases for the given lesions (cardiomegaly gets no Stage 4). Every CXR differs (its pixels encode the case
number), so a server can tell conversations apart by their first image. Question strings come from
:mod:`cxrground.vocab.percept_templates`; ground truths are drawn from ``seed``.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from PIL import Image

from cxrground.percept.schema import (
    AttributeQA,
    Case,
    ComparisonQA,
    ContourQA,
    DetectionQA,
    DistributionQA,
    ImageChoiceQA,
    LocationQA,
    MaskOption,
    PointOption,
    PointsQA,
    RevisionResultQA,
    SeverityQA,
)
from cxrground.vocab import percept_templates as pt
from cxrground.vocab.traits import traits

SUBREGIONS = ("right lateral lung & right lung base", "left medial lung & left mid zone lung",
              "right peripheral lung & right upper zone lung", "left costophrenic angle")


def _png(path: Path, value: int, size: int) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    arr = np.zeros((size, size, 3), np.uint8)
    flat = arr.reshape(-1)
    for i in range(4):
        flat[i] = (value >> (8 * i)) & 0xFF
    Image.fromarray(arr).save(path)
    return path.as_posix()


def _points_qa(stem: str, colors: Sequence[str], gt: list[int], rel: str | None) -> PointsQA:
    opts = [PointOption(point=[3 * i, 2 * i], color=c) for i, c in enumerate(colors)]
    opts.append(PointOption(point=None, color=pt.NONE_OPTION))
    texts = pt.point_options(colors)
    answer = pt.NONE_OPTION if gt == [len(texts)] else ", ".join(texts[i - 1] for i in gt)
    return PointsQA(question=pt.format_question(stem, texts), answer_options=opts, answer=answer,
                    answer_index=gt, relative_path=rel)


def _choice(cls, stem: str, options: Sequence[str], gt: int, **extra):
    return cls(question=pt.format_question(stem, options), answer_options=list(options), answer=options[gt - 1],
               answer_index=gt, **extra)


def make_case(root: Path, key: str, lesion: str, path: str, number: int, rng: random.Random,
              size: int = 8, n_points: int | None = None, n_masks: int = 4) -> Case:
    """One case with its images under ``root/cases/c{hash}/``."""
    folder = f"cases/c{hashlib.sha256(key.encode()).hexdigest()[:12]}"
    rel = lambda name: _png(root / folder / name, number * 16 + len(name), size).removeprefix(root.as_posix() + "/")  # noqa: E731
    cxr = f"{folder}/stage1.png"
    _png(root / cxr, number, size)
    positive = path != "LF"
    det = _choice(DetectionQA, pt.detection_stem(lesion), pt.YES_NO, 1 if positive else 2, relative_path=cxr)
    case = Case(detection_qa=det, pair_id=key.split("_", 1)[1], dicom_id=f"d{number}", lesion=lesion,
                qa_path={"LF": "lesion_free", "RF": "revision_free", "RR": "revision_required"}[path])
    if not positive:
        return case
    k = n_points or rng.randint(1, 3)
    colors = pt.POINT_COLORS[:k]

    def subset() -> list[int]:
        picked = sorted(i for i in range(1, k + 1) if rng.random() < 0.4)
        return picked or [k + 1]

    points_rel = rel("stage3_points.png")
    masks = [MaskOption(type="true" if i == 0 else "fake", masks=[f"m{i}"],
                        relative_path=rel(f"stage3_option_{i + 1}.png")) for i in range(n_masks)]
    order = list(range(n_masks))
    rng.shuffle(order)
    options = [masks[i] for i in order]
    rev_gt = order.index(0) + 1
    case.contour_qa = ContourQA(
        no_deformation=path == "RF", initial_context=pt.initial_context(lesion),
        contour_eval_qa=_choice(ImageChoiceQA, pt.contour_eval_stem(lesion), pt.YES_NO, 1 if path == "RR" else 2,
                                relative_path=rel("stage2.png")),
        contour_revision_qa_expansion=_points_qa(pt.EXPANSION.format(lesion=lesion), colors, subset(), points_rel),
        contour_revision_qa_contraction=_points_qa(pt.CONTRACTION.format(lesion=lesion), colors, subset(), None),
        contour_revision_qa_revision_result=RevisionResultQA(
            question=pt.format_question(pt.REVISION_RESULT, pt.mask_options(n_masks)), answer_options=options,
            answer=pt.mask_options(n_masks)[rev_gt - 1], answer_index=rev_gt),
    )
    if not traits(lesion).percept.attributes:
        return case
    loc_opts = [pt.subregion_text(s) for s in SUBREGIONS[:3]] + [pt.LOCATION_NONE_OPTION]
    loc_gt = sorted(i for i in (1, 2, 3) if rng.random() < 0.4) or [4]
    lung = rng.choice(["left lung", "right lung"])
    case.attribute_extraction_qa = AttributeQA(
        distribution=_choice(DistributionQA, pt.DISTRIBUTION.format(lesion=lesion), pt.DISTRIBUTION_OPTIONS,
                             rng.randint(1, 4)),
        location=LocationQA(question=pt.format_question(pt.LOCATION.format(lesion=lesion), loc_opts),
                            answer_options=loc_opts, answer=", ".join(loc_opts[i - 1] for i in loc_gt),
                            answer_index=loc_gt),
        severity=_choice(SeverityQA, pt.SEVERITY.format(lung=lung, lesion=lesion), pt.severity_options(lung),
                         rng.randint(1, 3), overlap_ratio=0.1, selected_lung=lung),
        comparison=_choice(ComparisonQA, pt.COMPARISON, pt.COMPARISON_OPTIONS, rng.randint(1, 4), left_size=1.0,
                           right_size=1.0, left_has_overlap=True, right_has_overlap=True),
    )
    return case


def make_benchmark(root: Path, counts: dict[str, int] | None = None,
                   lesions: Sequence[str] = ("edema", "cardiomegaly"), seed: int = 0, size: int = 8) -> Path:
    """Write a benchmark with ``counts`` = ``{"LF": n, "RF": n, "RR": n}`` cases per lesion; returns ``root``."""
    counts = counts or {"LF": 1, "RF": 1, "RR": 1}
    rng = random.Random(seed)
    root.mkdir(parents=True, exist_ok=True)
    cases: dict[str, dict] = {}
    number = 1
    for lesion in lesions:
        for path in ("LF", "RF", "RR"):
            for i in range(counts.get(path, 0)):
                key = f"{lesion}_p{path.lower()}{i}"
                data = make_case(root, key, lesion, path, number, rng, size).model_dump(by_alias=True)
                cases[key] = {k: v for k, v in data.items() if v is not None}  # LF: no contour / attribute QAs
                number += 1
    (root / "chexpercept.json").write_text(json.dumps(cases, indent=1), encoding="utf-8")
    return root
