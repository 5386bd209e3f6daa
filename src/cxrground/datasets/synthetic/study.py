"""One synthetic study in memory: ids, plan, phantom, lesions, report and truth record.

Study ``i`` of seed ``s`` depends only on ``(s, i, config)``: its random numbers come from
``numpy.random.default_rng([s, i])`` and its ids from hashes of ``(s, i)``, so it is the same whatever
the number of studies in the cohort.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Final

import numpy as np

from cxrground.anatomy.ils_locations import ils_location_masks
from cxrground.datasets.synthetic.config import GENERATOR_NAME, GENERATOR_VERSION, SynthConfig
from cxrground.datasets.synthetic.lesions import (
    CARDIOMEGALY_CTR,
    LUNG_FOCAL,
    SEVERITIES,
    SITE_WEIGHTS,
    SITES,
    LesionSpec,
    choose,
    choose_appearance,
    draw_lesion,
    overlapped_labels,
)
from cxrground.datasets.synthetic.phantom import build_anatomy, render
from cxrground.datasets.synthetic.records import FindingTruth, MaskRef, StudyTruth
from cxrground.datasets.synthetic.report import compose_report
from cxrground.errors import ConfigError
from cxrground.io.masks import encode_rle
from cxrground.vocab import ILS_LOCATION_LABELS, LESIONS
from cxrground.vocab.traits import traits

#: CTR bands of the heart states that are not cardiomegaly.
NORMAL_CTR: Final[tuple[float, float]] = (0.38, 0.445)
BORDERLINE_CTR: Final[tuple[float, float]] = (0.46, 0.495)
ANATOMY_NAMES: Final[tuple[str, str, str]] = ("right_lung", "left_lung", "heart")

# subject grouping: consecutive studies share a subject in blocks of four indices
_GROUP_PATTERNS: Final[tuple[tuple[int, ...], ...]] = (
    *((1, 1, 1, 1),) * 6, (2, 1, 1), (1, 2, 1), (1, 1, 2), (2, 2), (3, 1), (1, 3),
)


def _hash_int(*parts: object) -> int:
    text = ":".join(str(p) for p in ("cxrground-synth", *parts))
    return int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "big")


@dataclass(frozen=True)
class StudyIds:
    """MIMIC-like identifiers of a study and where its files go (paths relative to the cohort folder)."""

    subject_id: str
    study_id: str
    dicom_id: str
    has_prior: bool

    def image_path(self, fmt: str) -> str:
        return f"files/{self.subject_id[:3]}/{self.subject_id}/{self.study_id}/{self.dicom_id}.{fmt}"

    @property
    def report_path(self) -> str:
        return f"files/{self.subject_id[:3]}/{self.subject_id}/{self.study_id}.txt"

    @property
    def truth_path(self) -> str:
        return f"truth/{self.study_id}.json"

    @property
    def mask_dir(self) -> str:
        return f"masks/{self.study_id}"


def study_ids(seed: int, index: int) -> StudyIds:
    """Ids of study ``index``: ``p1`` + 7 digits, ``s5`` + 7 digits, a MIMIC-like hex ``dicom_id``.

    Study and subject numbers are bijective in the index (no collisions below 10 million studies);
    about one subject in three has two or three studies (``has_prior`` for the later ones).
    """
    if index < 0:
        raise ValueError(f"study index must be >= 0, got {index}")
    block, pos = divmod(index, 4)
    pattern = _GROUP_PATTERNS[_hash_int(seed, "group", block) % len(_GROUP_PATTERNS)]
    start = 0
    for size in pattern:
        if pos < start + size:
            break
        start += size
    first = block * 4 + start
    study_num = (7_654_321 * index + _hash_int(seed, "study")) % 10**7
    subject_num = (3_214_567 * first + _hash_int(seed, "subject")) % 10**7
    hexd = hashlib.sha256(f"cxrground-synth:{seed}:{index}:dicom".encode()).hexdigest()[:40]
    dicom = "-".join(hexd[k : k + 8] for k in range(0, 40, 8))
    return StudyIds(f"p1{subject_num:07d}", f"s5{study_num:07d}", dicom, index > first)


# --- planning -------------------------------------------------------------------------------------

@dataclass
class StudyPlan:
    """Everything decided before drawing."""

    normal: bool
    view: str
    height: int
    specs: list[LesionSpec] = field(default_factory=list)
    heart_status: str = "normal"
    ctr_band: tuple[float, float] = NORMAL_CTR
    sternotomy: bool = False
    impression_only: bool = False


def _spec(rng: np.random.Generator, lesion: str, site_key: str, config: SynthConfig) -> LesionSpec:
    site = SITES[site_key]
    severity = choose(rng, SEVERITIES[lesion])
    if site_key in ("eff_rcpa", "eff_lcpa"):
        severity = "small"
    side_sev: dict[str, str] = {}
    if site_key == "eff_bilateral":
        other = severity
        if rng.random() < 0.35:
            steps = ("small", "moderate", "large")
            other = steps[min(steps.index(severity) + 1, 2)] if severity != "large" else "moderate"
        pair = [severity, other]
        rng.shuffle(pair)
        side_sev = {"right": pair[0], "left": pair[1]}
        severity = min(pair, key=("small", "moderate", "large").index)
    reported = not rng.random() < config.unreported_fraction
    certainty = ("tentative" if rng.random() < config.tentative_fraction else "definitive") if reported else None
    return LesionSpec(
        lesion=lesion,
        site=site,
        certainty=certainty or "definitive",
        reported=reported,
        severity=severity,
        appearance=choose_appearance(rng, lesion, site),
        side_severity=side_sev,
    )


def plan_study(rng: np.random.Generator, config: SynthConfig) -> StudyPlan:
    """Draw view, size, lesions (site, severity, certainty, reported) and heart state."""
    lo, hi = config.height_ratio_range
    height = round(config.width * rng.uniform(lo, hi))
    view = "AP" if rng.random() < config.ap_fraction else "PA"
    normal = rng.random() < config.normal_fraction or not any(config.prevalence.values())
    plan = StudyPlan(normal=normal, view=view, height=height)
    if not normal:
        prev = dict(config.prevalence)
        drawn = [les for les in LESIONS if rng.random() < prev[les]]
        if "edema" in drawn:  # edema travels with effusions and big hearts
            for extra in ("effusion", "cardiomegaly"):
                if extra not in drawn and prev[extra] > 0 and rng.random() < 0.3:
                    drawn.append(extra)
        if not drawn:
            drawn = [choose(rng, {k: v for k, v in prev.items() if v > 0})]
        drawn = [les for les in LESIONS if les in drawn]
        for lesion in drawn:
            site_key = choose(rng, SITE_WEIGHTS[lesion])
            spec = _spec(rng, lesion, site_key, config)
            plan.specs.append(spec)
            if lesion in LUNG_FOCAL and rng.random() < config.second_instance_fraction:
                taken = set(spec.site.sides)
                others = {k: w for k, w in SITE_WEIGHTS[lesion].items() if not taken & set(SITES[k].sides)}
                if others:
                    plan.specs.append(_spec(rng, lesion, choose(rng, others), config))
    cardio = [s for s in plan.specs if traits(s.lesion).heart_mask]
    if cardio:
        plan.heart_status = "enlarged"
        plan.ctr_band = CARDIOMEGALY_CTR[cardio[0].severity]
    elif not normal and rng.random() < config.borderline_heart_fraction:
        plan.heart_status = "borderline"
        plan.ctr_band = BORDERLINE_CTR
    plan.sternotomy = rng.random() < (0.2 if cardio else 0.06)
    plan.impression_only = rng.random() < config.impression_only_fraction
    return plan


# --- generation -----------------------------------------------------------------------------------

@dataclass
class SyntheticStudy:
    """A generated study in memory. ``lesion_masks[k]`` belongs to the finding with ``mask_index == k``."""

    truth: StudyTruth
    image: np.ndarray
    report: str
    anatomy_masks: dict[str, np.ndarray]
    lesion_masks: list[np.ndarray]

    def lesion_mask_path(self, k: int) -> str:
        finding = next(f for f in self.truth.findings if f.mask_index == k)
        assert finding.mask is not None
        return finding.mask.path


def _mask_ref(path: str, mask: np.ndarray) -> MaskRef:
    return MaskRef(path=path, area=int(mask.sum()), rle=encode_rle(mask))


def generate_study(seed: int, index: int, config: SynthConfig | None = None) -> SyntheticStudy:
    """Generate study ``index`` of the cohort with ``seed`` (pixels, masks, report and truth)."""
    config = config or SynthConfig()
    if not isinstance(seed, int | np.integer) or seed < 0:
        raise ConfigError(f"seed must be a non-negative integer, got {seed!r}")
    ids = study_ids(int(seed), int(index))
    rng = np.random.default_rng([int(seed), int(index)])
    plan = plan_study(rng, config)
    width = config.width
    anatomy = build_anatomy(rng, plan.height, width, plan.view, plan.ctr_band, plan.sternotomy)
    locations = ils_location_masks(anatomy.right_lung, anatomy.left_lung)
    drawn = [draw_lesion(rng, spec, anatomy, locations) for spec in plan.specs]
    density = anatomy.density.copy()
    for d in drawn:
        if d.density is not None:
            density += d.density
    image = render(rng, density, width)
    rep = compose_report(rng, plan.specs, plan.view, plan.heart_status, plan.sternotomy, plan.impression_only,
                         ids.has_prior)

    anatomy_masks = {"right_lung": anatomy.right_lung, "left_lung": anatomy.left_lung, "heart": anatomy.heart}
    anatomy_refs = {name: _mask_ref(f"{ids.mask_dir}/{name}.png", m) for name, m in anatomy_masks.items()}
    findings: list[FindingTruth] = []
    lesion_masks: list[np.ndarray] = []
    for i, d in enumerate(drawn):
        spec = d.spec
        k = len(lesion_masks)
        lesion_masks.append(d.mask)
        sentence, section, phrase, imp = rep.findings.get(i, (None, None, None, None))
        heart_lesion = traits(spec.lesion).heart_mask
        overlap = ["heart"] if heart_lesion else overlapped_labels(d.mask, locations, ILS_LOCATION_LABELS)
        if phrase is None and spec.site.adjs:
            phrase = spec.site.adjs[0]
        findings.append(FindingTruth(
            lesion=spec.lesion,
            present=True,
            reported=spec.reported,
            certainty=spec.certainty if spec.reported else None,
            sentence=sentence,
            section=section,
            impression_sentence=imp,
            location_phrase=phrase,
            site=spec.site.key,
            reported_location=list(spec.site.labels),
            overlap_location=overlap,
            placed_location=["heart"] if heart_lesion else [lab for lab in d.placed if lab != "heart"],
            severity=spec.severity or None,
            appearance=spec.appearance or None,
            mask_index=k,
            mask=_mask_ref(f"{ids.mask_dir}/lesion_{k}_{spec.lesion}.png", d.mask),
        ))
    for lesion in LESIONS:
        if lesion in rep.negations:
            text, section = rep.negations[lesion]
            findings.append(FindingTruth(lesion=lesion, present=False, reported=True, sentence=text, section=section))

    truth = StudyTruth(
        generator=GENERATOR_NAME,
        generator_version=GENERATOR_VERSION,
        seed=int(seed),
        index=int(index),
        config_hash=config.config_hash(),
        subject_id=ids.subject_id,
        study_id=ids.study_id,
        dicom_id=ids.dicom_id,
        view=plan.view,
        height=anatomy.height,
        width=anatomy.width,
        image_path=ids.image_path(config.format),
        report_path=ids.report_path,
        has_findings_section=rep.has_findings,
        normal=not plan.specs,
        heart_status=plan.heart_status,
        ctr=round(float(anatomy.ctr), 4),
        anatomy=anatomy_refs,
        findings=findings,
        other_sentences=rep.other,
    )
    return SyntheticStudy(truth=truth, image=image, report=rep.text, anatomy_masks=anatomy_masks,
                          lesion_masks=lesion_masks)
