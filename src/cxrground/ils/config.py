"""Every threshold and proposed default of ILS generation in one configuration object (ILS.md §18.15).

The object is written into each dataset's provenance record. Values marked "Table 7" are the
paper's; everything else is a documented choice where the paper is silent ("Proposed default" in
ILS.md unless said otherwise).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any, Final

from cxrground.errors import ConfigError
from cxrground.io.files import sha256_json
from cxrground.reports.model import DEFAULT_SECTION_POLICY, SECTION_POLICIES
from cxrground.vocab.traits import traits


@dataclass(frozen=True)
class Thresholds:
    """Algorithm 1 thresholds (ILS Table 7)."""

    tau_ano: float
    """Anomaly map level of the signal pixels ``A`` (``x_ano ≥ τ_ano``)."""
    tau_anatomy: float
    """c1: IoU of a box with the union of the anatomy masks (lungs and heart)."""
    tau_conf: float
    """c2: detector confidence of a box."""
    tau_signal: float
    """c3: share of a box's pixels that are signal pixels."""
    tau_size: float
    """c4: IoU of a box with the right or the left lung."""

    def scaled(self, factor: float) -> Thresholds:
        """Every threshold multiplied by ``factor`` (0.5 = the paper's "half τ" ablation)."""
        return Thresholds(*(v * factor for v in asdict(self).values()))


#: Table 7, all lesions except edema.
GENERAL_THRESHOLDS = Thresholds(tau_ano=0.10, tau_anatomy=0.25, tau_conf=0.20, tau_signal=0.20, tau_size=0.10)
#: Table 7, edema (diffuse lesion).
EDEMA_THRESHOLDS = Thresholds(tau_ano=0.01, tau_anatomy=0.25, tau_conf=0.01, tau_signal=0.20, tau_size=0.10)


@dataclass(frozen=True)
class RefineConfig:
    """Refinement of ILS §9.3 (all proposed defaults, sizes at the working resolution)."""

    opening_kernel: int = 5
    """Elliptical kernel side for erosion-then-dilation noise removal."""
    opening_iterations: int = 1
    growth_tolerance: float = 0.05 * 255
    """Region expansion: grow while ``|x − mean_mask(x)| ≤`` this (8-neighbour, inside the lungs)."""
    growth_passes: int = 2
    effusion_base_fraction: float = 0.25
    """Effusion base completion: lung pixels of that side with y ≥ the lesion's top row within the lung's
    bottom 25 %."""
    min_component_fraction: float = 0.0005
    """Drop components smaller than this share of the image area (0.05 %)."""
    connectivity: int = 8


@dataclass(frozen=True)
class QCConfig:
    """Step-0 quality control (ILS §6)."""

    views: tuple[str, ...] = ("PA", "AP")
    """Accepted views; an unknown view is accepted and recorded as unknown."""
    lung_x_disagreement: float = 0.05
    """Cross-check of two segmenters: max |Δ outermost lung x| as a share of the image width."""
    heart_y_disagreement: float = 0.05
    """Cross-check: max |Δ lowest heart y| as a share of the image height."""
    min_lung_fraction: float = 0.05
    """A study whose lungs cover less than this share of the image is rejected (truncation, non-chest)."""
    orientation_check: bool = False
    """Reject a film that looks stored in a wrong pose (:mod:`cxrground.anatomy.segment.orientation`, read by the
    built-in U-Net): of the pack's films that pass the lung checks it rejects 97 % of those turned 180°, 96 % of
    those flipped top-bottom, 95 % of those turned 90° and 0.2 % of upright ones; a film mirrored left-right is not
    detected. Three U-Net passes per film on a 256-px grid."""
    pose_warning: bool = True
    """Read each film's pose with the pose reader (:mod:`cxrground.anatomy.segment.pose_net`) and record in its unit
    and on the card the films that look stored mirrored, turned or flipped: a list to look at, nothing is rejected.
    On held-out films it finds 98-100 % of mirrored films and lists 3-6 % of upright ones. Needs torch."""
    pose_weights: str | None = None
    """Weights of the pose reader (``.safetensors`` with its sidecar, e.g. from ``cxrground segment train-pose
    --images``); None: the shipped ``pose_net_v1``. Their sha256 is part of the build settings, not their path."""
    lung_shape_min_iou: float = 0.50
    """A study whose lungs overlap the mean annotated lung shape less than this (IoU of the shape descriptors,
    :mod:`cxrground.anatomy.segment.plausibility`) is rejected: the segmenter took the arm, the abdomen or a marker
    for lung. 0 turns the shape check off."""


#: Image checks of negative pairs ``IlsConfig.negative_check`` accepts.
NEGATIVE_CHECKS: Final[tuple[str, ...]] = ("none", "algorithm1", "zone_prior_v1", "zone_prior_v2", "zone_prior_v3")
#: The negative check that asks Algorithm 1 itself (no zone reader), :mod:`cxrground.ils.negative_flags`.
ALGORITHM1_CHECK: Final[str] = "algorithm1"

#: Zone readers that can guide lung-lesion masks (``IlsConfig.zone_guide``; ``none`` = Algorithm 1 alone).
ZONE_GUIDES: Final[tuple[str, ...]] = ("none", "zone_prior_v1", "zone_prior_v2", "zone_prior_v3")

#: How GL is read (``IlsConfig.grounded_location``): within the drawn mask, or from the selected boxes (ILS §10).
GROUNDED_LOCATION_SOURCES: Final[tuple[str, str]] = ("mask", "boxes")
#: How far a finding the report mentions keeps lung-lesion negatives away (``IlsConfig.negative_exclusion``).
NEGATIVE_EXCLUSIONS: Final[tuple[str, ...]] = ("location", "lung")


@dataclass(frozen=True)
class IlsConfig:
    """The whole generation configuration; ``config_hash`` identifies a dataset's settings."""

    general: Thresholds = GENERAL_THRESHOLDS
    edema: Thresholds = EDEMA_THRESHOLDS
    refine: RefineConfig = field(default_factory=RefineConfig)
    qc: QCConfig = field(default_factory=QCConfig)
    working_size: int = 512
    """Image stages run on a working canvas letterboxed to this side; masks map back to native pixels."""
    ctr_negative_max: float = 0.45
    """Cardiomegaly negatives only when CTR ≤ this (physician-calibrated, ILS §9.4)."""
    box_class_must_match: bool = False
    """ILS §8: a kept detector box counts for any lesion type (the paper does not require a match)."""
    refine_whole_lung_grounding: bool = True
    """ILS §10 proposed default: a grounded whole-lung label is refined into that side's zone labels that
    intersect the selected boxes."""
    lung_lesions_off_centre: bool = True
    """A lung-lesion mask never covers the heart outline or the mediastinum (per row, the gap between the lungs'
    medial edges; :func:`cxrground.lesions.lesion_zones.central_mask` with no margin): lung masks include the
    lung behind the heart, and every lesion reader sees the heart and mediastinum as brighter than lung."""
    tentative_cardiomegaly_pairs: bool = False
    """ILS §9.4 proposed default: a tentative cardiomegaly yields no pair at all."""
    negative_global_share: dict[str, float] = field(default_factory=lambda: {
        "cardiomegaly": 1.0, "pneumonia": 0.021, "atelectasis": 0.116, "opacity": 0.002,
        "consolidation": 0.044, "edema": 0.022, "effusion": 0.233,
    })
    """Share of each lesion's negatives in the global form (targets from the train split, ILS §11.2)."""
    opacity_lesion_inference_share: float = 0.494
    """Share of opacity negatives in the lesion-inference form (ILS §11.2)."""
    global_negative_needs_region: bool = False
    """True: a global lung negative ("There is no edema.") is made only where a basic negative of the lesion could
    be placed (the report mentions no finding, or some location label is empty, EL), so that the global share of
    each lesion's emitted negatives is the ILS §11.2 target. False (default): a global negative whatever EL holds;
    on reports whose findings cover every location the basic negatives vanish and the global ones stay, so the
    realised global shares exceed the targets (on the pack's COVID-19 notes about twice)."""
    exclude_studies: tuple[str, ...] = ()
    """Study ids never used (e.g. MS-CXR studies); recorded in the card."""
    seed: int = 0
    sections: str = DEFAULT_SECTION_POLICY
    """Report section policy (:func:`cxrground.reports.sections.select_section`): ``findings`` (the paper's ILS §6
    choice: findings, else impression, else the last paragraph), ``impression`` (impression first) or
    ``findings+impression`` (both, numbered on; a lesion + location in both counts once, findings first)."""

    negative_check: str = "none"
    """Image check of lung-lesion negatives for every synthesizer: ``none``, or ``zone_prior_v1`` (the zones that
    the position-prior zone reader flags, in a film where the lesion segmenter finds a lesion, are read before the
    pairs are composed; a lung-lesion negative is placed in a region naming no flagged zone, and dropped only when
    none is left; both counted on the card; :mod:`cxrground.lesions.zone_prior`,
    :class:`cxrground.ils.compose.NegativePlacement`), ``zone_prior_v2`` (the same with the reader whose film
    severity also reads the lesion segmenter), ``zone_prior_v3`` (that reader with its severity refitted on the
    shipped lungs) or ``algorithm1`` (a zone is flagged when Algorithm 1, asked to
    ground an opacity reported in that zone, draws a mask covering at least 1 % of it: the chain's own anomaly map
    and boxes, no zone reader; :mod:`cxrground.ils.negative_flags`). Every check clears the zones that a present
    or uncertain lung finding of the report names (:func:`cxrground.ils.negative_flags.unexplained`)."""

    negative_exclusion: str = "location"
    """Where a finding the report mentions keeps lung-lesion negatives away. ``location`` (ILS §10): the labels
    whose mask overlaps its reported location. ``lung``: the whole lung of each side it is reported in (``right
    lung base`` blocks the right lung), and a global lung negative ("There is no edema.") only when no finding is
    reported in either lung (otherwise a basic negative over the empty labels). Reports name where disease is worst,
    not everywhere it is."""

    silent_report_negatives: bool = False
    """Whether a report that does not read the film (no finding of any kind and no normal-examination statement,
    :func:`cxrground.reports.reading.reads_the_film`: "Fever and two days of odynophagia") still yields lung and
    pleural negatives. False (default): it yields none, counted on the card, because its silence about a lesion says
    nothing about the image; the cardiomegaly negative, decided by the CTR, stays. True: ILS §11.2 read literally."""

    zone_guide: str = "zone_prior_v2"
    """Lung-lesion masks guided by a zone reader, ``zone_prior_v2`` (default), ``zone_prior_v1`` or
    ``zone_prior_v3``: a reported lung
    lesion keeps a mask only in the zones of its reported location that the reader flags (Algorithm 1's mask cut
    to them; for airspace lesions, trait ``zone_fill``, a flagged zone it leaves empty is filled where the lesion
    segmenter's smoothed probability is highest), and gets no pair when the reader flags none of them
    (:mod:`cxrground.ils.zone_guide`). ``none``: Algorithm 1 alone, as ILS.md describes it."""

    grounded_location: str = "mask"
    """How GL (ILS §10) is read: ``mask`` (default), the reported labels whose anatomy mask meets the drawn mask
    within the selected boxes, so a box spanning two zones grounds only the zone the mask lies in; ``boxes``, the
    labels whose anatomy mask meets a selected box, as ILS.md §10 states it."""

    prominent_heart_negative: bool = False
    """Whether a heart the report calls "prominent" (neither enlarged nor normal) still gets the CTR-decided
    cardiomegaly negative. False (default): it gets no cardiomegaly pair, counted on the card. True: ILS §11.2 read
    literally (a lesion the report does not mention)."""

    def __post_init__(self) -> None:
        if self.grounded_location not in GROUNDED_LOCATION_SOURCES:
            raise ConfigError(f"unknown grounded-location source {self.grounded_location!r}; expected one of "
                              f"{', '.join(GROUNDED_LOCATION_SOURCES)}")
        if self.zone_guide not in ZONE_GUIDES:
            raise ConfigError(f"unknown zone guide {self.zone_guide!r}; expected one of {', '.join(ZONE_GUIDES)}")
        if self.negative_exclusion not in NEGATIVE_EXCLUSIONS:
            raise ConfigError(f"unknown negative exclusion {self.negative_exclusion!r}; expected one of "
                              f"{', '.join(NEGATIVE_EXCLUSIONS)}")
        if self.negative_check not in NEGATIVE_CHECKS:
            raise ConfigError(f"unknown negative check {self.negative_check!r}; expected one of "
                              f"{', '.join(NEGATIVE_CHECKS)}")
        if self.sections not in SECTION_POLICIES:
            raise ConfigError(f"unknown report section policy {self.sections!r}; expected one of "
                              f"{', '.join(SECTION_POLICIES)}")

    def thresholds_for(self, lesion: str) -> Thresholds:
        """Table 7 thresholds of ``lesion`` (its ``thresholds`` trait: the edema column or the general one)."""
        return self.edema if traits(lesion).thresholds == "edema" else self.general

    def with_threshold_scale(self, factor: float) -> IlsConfig:
        """The same configuration with both threshold sets scaled (half τ: 0.5)."""
        return replace(self, general=self.general.scaled(factor), edema=self.edema.scaled(factor))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (for the provenance record)."""
        d = asdict(self)
        d["qc"]["views"] = list(self.qc.views)
        d["exclude_studies"] = list(self.exclude_studies)
        return d

    def config_hash(self) -> str:
        """Short hash of the settings (seed included; the pose weights by their sha256 in the build settings, not by
        their path, so moving the file does not change it)."""
        d = self.to_dict()
        d["qc"].pop("pose_weights", None)
        return sha256_json(d)[:12]
