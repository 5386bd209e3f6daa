"""Per-lesion traits: the one table every lesion group and lesion-specific rule is read from.

Sources: ILS.md §2 (groups, instruction types), §4 (the cardiomegaly answer), §9.2 (Table 7), §9.4 (lesion
rules), §11 (negatives); CHEXPERCEPT.md §1.1-§1.3 (stages per lesion), §3 (question wording), §5.6, §7.1 and §9
(the cardiomegaly deformation exception), §15 (depth).

:data:`LESION_TRAITS` holds the seven lesions in the paper's table order; :mod:`cxrground.vocab.lesions` derives
``LESIONS``, ``ABBREVIATIONS``, ``LUNG_LESIONS``, ``DIFFUSE_LESIONS`` and ``LESION_INFERENCE_LESIONS`` from it
through :func:`groups`, and code elsewhere asks :func:`traits` (``traits(lesion).ctr_rule``), :func:`lives_in`
or :func:`is_diffuse` instead of comparing lesion names.

Adding a lesion (pneumothorax is the expected next one): build its :class:`LesionTraits`, add it to the table
(:func:`extend_traits` returns a checked copy with it appended, for tests and experiments), add its name to
``Lesion`` and ``EVAL_ORDER`` in :mod:`.lesions`, then write only the code that is truly new for it (its report
lexicon entry, its synthetic painter and phrases; a lesion darker than lung also needs its own spatial
extraction, since Algorithm 1's anomaly map only finds brighter lesions).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final, Literal, get_args

__all__ = [
    "LESION_TRAITS",
    "PERCEPT_STAGES",
    "Anatomy",
    "Contrast",
    "DeformScheme",
    "DetectionWording",
    "Extent",
    "LesionGroups",
    "LesionTraits",
    "PerceptTraits",
    "ThresholdGroup",
    "check_table",
    "extend_traits",
    "groups",
    "is_diffuse",
    "lesions_where",
    "lives_in",
    "traits",
]

Anatomy = Literal["heart", "lung", "pleura"]
Extent = Literal["focal", "diffuse"]
Contrast = Literal["brighter", "darker"]
ThresholdGroup = Literal["general", "edema"]
DetectionWording = Literal["plain", "suggestive"]
DeformScheme = Literal["lung", "organ"]

#: The four CheXpercept stages (detection, contour evaluation, contour revision, attributes).
PERCEPT_STAGES: Final[tuple[int, ...]] = (1, 2, 3, 4)


def _check_choice(owner: str, name: str, value: object, kind: object) -> None:
    allowed = get_args(kind)
    if value not in allowed:
        raise ValueError(f"lesion traits of {owner!r}: {name} must be one of {', '.join(allowed)}, got {value!r}")


@dataclass(frozen=True, kw_only=True)
class PerceptTraits:
    """How CheXpercept treats a lesion (CHEXPERCEPT.md §1.1-§1.3, §3, §5.6, §7.1, §9)."""

    stages: tuple[int, ...]
    """Stages a revision-required case is asked, from 1; a lesion without Stage 4 has no attribute questions
    (``attribute_extraction_qa`` null) and gets the §15 depth bonus."""
    detection: DetectionWording
    """Stage-1 stem: ``plain`` "Is any {lesion} visible …" or ``suggestive`` "Is any finding suggestive of …"."""
    heart_note: bool
    """Stage-2 stem and Stage-3 context end with "Note that lesions overlapping with the heart …"."""
    deform: DeformScheme
    """``lung``: overlap records with the 20 sub-regions, deformation anatomies are sub-regions at the lung
    depth, distractor points on the lungs, HybridGNet/CXAS lung default masks. ``organ`` (the §1.1 structural
    exception): lungs and zones only, anatomies are zones at the cardiomegaly depth, distractor points anywhere
    in the image, defaults keep / dilated / eroded."""

    @property
    def attributes(self) -> bool:
        """Whether RF and RR cases get the four Stage-4 attribute questions."""
        return max(PERCEPT_STAGES) in self.stages

    @property
    def depth_bonus(self) -> int:
        """Depth added to an RF/RR case whose last asked stage is End-to-End correct, so every lesion reaches
        the same maxima (§15: +1 for cardiomegaly, 0 otherwise)."""
        return max(PERCEPT_STAGES) - max(self.stages)

    def check(self, owner: str) -> None:
        """Raise ``ValueError`` naming ``owner`` when a value is out of its range."""
        if len(self.stages) < 3 or self.stages != PERCEPT_STAGES[: len(self.stages)]:
            raise ValueError(f"lesion traits of {owner!r}: percept stages must be 1, 2, 3[, 4], got {self.stages}")
        _check_choice(owner, "percept detection", self.detection, DetectionWording)
        _check_choice(owner, "percept deform", self.deform, DeformScheme)


@dataclass(frozen=True, kw_only=True)
class LesionTraits:
    """Everything the code branches on for one lesion (every field is stated in the table, none defaulted)."""

    name: str
    """The lesion word used verbatim in every template."""
    abbreviation: str
    """Two capital letters of the paper tables (CA, PN, …)."""
    anatomy: Anatomy
    """Where it lives: report sections, the ILS card's lung/pleural average, synthetic report order."""
    extent: Extent
    """``diffuse``: spread over both lungs (edema); ``focal``: one or a few regions."""
    contrast: Contrast
    """Brighter or darker than lung on the radiograph; Algorithm 1's anomaly map finds only brighter lesions."""
    lesion_inference: bool
    """Basic positives also yield a lesion-inference pair (ILS §2, §4)."""
    umbrella: bool
    """Umbrella hyperintense term (ILS §2): its negatives only at empty locations when any lung lesion is
    reported (§11)."""
    li_negative_target: bool
    """Its negatives may take the lesion-inference form (ILS §2: opacity is the target of all of them; the share
    is ``IlsConfig.opacity_lesion_inference_share``)."""
    heart_mask: bool
    """Its mask is the heart itself (ILS §9.4: no detector, no editing): only global pairs, location ``heart``,
    the bare ``[SEG]`` positive answer (§4), the location-free CheXpercept candidate instruction (§2)."""
    ctr_rule: bool
    """Negatives only when the cardiothoracic ratio is ≤ ``IlsConfig.ctr_negative_max`` (0.45, ILS §9.4)."""
    base_completion: bool
    """Algorithm 1's mask is completed down to the costophrenic angle (ILS §9.3 effusion base completion)."""
    zone_fill: bool
    """Under a zone guide (``ils build --zone-guide``), a flagged zone its Algorithm 1 mask leaves empty may be filled
    from the lesion probability map: airspace disease fills the part of a zone it occupies; atelectasis is a band,
    a plate or a collapsed lobe, so it is only cut to the flagged zones (rule in
    ``bench/records/zone_guide_fill_preregistration.md``)."""
    thresholds: ThresholdGroup
    """Column of ILS Table 7 (``IlsConfig.general`` or ``IlsConfig.edema``)."""
    colour: tuple[int, int, int]
    """Display colour (RGB 0-255) of its masks and tags (synthetic cohort preview)."""
    percept: PerceptTraits
    """CheXpercept treatment."""

    def __post_init__(self) -> None:
        owner = self.name
        if not owner or owner != owner.strip().lower():
            raise ValueError(f"lesion traits: name must be a non-empty lower-case word, got {owner!r}")
        if len(self.abbreviation) != 2 or not self.abbreviation.isalpha() or not self.abbreviation.isupper():
            raise ValueError(f"lesion traits of {owner!r}: abbreviation must be two capital letters, "
                             f"got {self.abbreviation!r}")
        _check_choice(owner, "anatomy", self.anatomy, Anatomy)
        _check_choice(owner, "extent", self.extent, Extent)
        _check_choice(owner, "contrast", self.contrast, Contrast)
        _check_choice(owner, "thresholds", self.thresholds, ThresholdGroup)
        if len(self.colour) != 3 or not all(isinstance(c, int) and 0 <= c <= 255 for c in self.colour):
            raise ValueError(f"lesion traits of {owner!r}: colour must be three integers 0-255, got {self.colour}")
        if self.ctr_rule and not self.heart_mask:
            raise ValueError(f"lesion traits of {owner!r}: the CTR rule needs heart_mask (the CTR measures the heart)")
        if self.zone_fill and self.anatomy != "lung":
            raise ValueError(f"lesion traits of {owner!r}: zone_fill is for lung lesions (the zone guide shapes "
                             "only those)")
        if self.heart_mask and (self.lesion_inference or self.li_negative_target or self.umbrella):
            raise ValueError(f"lesion traits of {owner!r}: a heart-mask lesion has global pairs only "
                             "(no lesion inference, no umbrella negatives)")
        self.percept.check(owner)


_LUNG: Final[PerceptTraits] = PerceptTraits(stages=PERCEPT_STAGES, detection="suggestive", heart_note=True,
                                             deform="lung")
_LUNG_PLAIN: Final[PerceptTraits] = PerceptTraits(stages=PERCEPT_STAGES, detection="plain", heart_note=True,
                                                   deform="lung")
_ORGAN: Final[PerceptTraits] = PerceptTraits(stages=(1, 2, 3), detection="suggestive", heart_note=False,
                                              deform="organ")

#: The seven lesions in the paper's table order (CA, PN, AT, OP, CO, ED, EF).
LESION_TRAITS: Final[dict[str, LesionTraits]] = {
    t.name: t
    for t in (
        LesionTraits(name="cardiomegaly", abbreviation="CA", anatomy="heart", extent="focal", contrast="brighter",
                     lesion_inference=False, umbrella=False, li_negative_target=False, heart_mask=True,
                     ctr_rule=True, base_completion=False, zone_fill=False, thresholds="general",
                     colour=(255, 200, 0), percept=_ORGAN),
        LesionTraits(name="pneumonia", abbreviation="PN", anatomy="lung", extent="focal", contrast="brighter",
                     lesion_inference=True, umbrella=False, li_negative_target=False, heart_mask=False,
                     ctr_rule=False, base_completion=False, zone_fill=True, thresholds="general",
                     colour=(255, 60, 60), percept=_LUNG),
        LesionTraits(name="atelectasis", abbreviation="AT", anatomy="lung", extent="focal", contrast="brighter",
                     lesion_inference=True, umbrella=False, li_negative_target=False, heart_mask=False,
                     ctr_rule=False, base_completion=False, zone_fill=False, thresholds="general",
                     colour=(0, 200, 255), percept=_LUNG),
        LesionTraits(name="opacity", abbreviation="OP", anatomy="lung", extent="focal", contrast="brighter",
                     lesion_inference=False, umbrella=True, li_negative_target=True, heart_mask=False,
                     ctr_rule=False, base_completion=False, zone_fill=True, thresholds="general",
                     colour=(255, 120, 255), percept=_LUNG_PLAIN),
        LesionTraits(name="consolidation", abbreviation="CO", anatomy="lung", extent="focal", contrast="brighter",
                     lesion_inference=False, umbrella=True, li_negative_target=False, heart_mask=False,
                     ctr_rule=False, base_completion=False, zone_fill=True, thresholds="general",
                     colour=(255, 140, 0), percept=_LUNG_PLAIN),
        LesionTraits(name="edema", abbreviation="ED", anatomy="lung", extent="diffuse", contrast="brighter",
                     lesion_inference=True, umbrella=False, li_negative_target=False, heart_mask=False,
                     ctr_rule=False, base_completion=False, zone_fill=True, thresholds="edema",
                     colour=(80, 255, 80), percept=_LUNG),
        LesionTraits(name="effusion", abbreviation="EF", anatomy="pleura", extent="focal", contrast="brighter",
                     lesion_inference=False, umbrella=False, li_negative_target=False, heart_mask=False,
                     ctr_rule=False, base_completion=True, zone_fill=False, thresholds="general",
                     colour=(60, 110, 255), percept=_LUNG),
    )
}


def check_table(table: Mapping[str, LesionTraits]) -> None:
    """Raise ``ValueError`` unless every key is its traits' name and names/abbreviations are unique."""
    for key, t in table.items():
        if not isinstance(t, LesionTraits):
            raise ValueError(f"lesion traits table: {key!r} maps to {type(t).__name__}, not LesionTraits")
        if key != t.name:
            raise ValueError(f"lesion traits table: key {key!r} holds the traits of {t.name!r}")
    abbreviations = [t.abbreviation for t in table.values()]
    duplicated = sorted({a for a in abbreviations if abbreviations.count(a) > 1})
    if duplicated:
        raise ValueError(f"lesion traits table: abbreviation(s) {', '.join(duplicated)} used twice")


def extend_traits(new: LesionTraits, table: Mapping[str, LesionTraits] | None = None) -> dict[str, LesionTraits]:
    """A checked copy of ``table`` (default :data:`LESION_TRAITS`) with ``new`` appended; the input is unchanged."""
    base = LESION_TRAITS if table is None else table
    if new.name in base:
        raise ValueError(f"lesion traits table: {new.name!r} is already a lesion")
    out = {**base, new.name: new}
    check_table(out)
    return out


def traits(lesion: str, table: Mapping[str, LesionTraits] | None = None) -> LesionTraits:
    """The traits of ``lesion``; ``ValueError`` naming the known lesions when it is not one."""
    tab = LESION_TRAITS if table is None else table
    try:
        return tab[lesion]
    except (KeyError, TypeError):
        raise ValueError(f"unknown lesion {lesion!r}; expected one of {', '.join(tab)}") from None


def lives_in(lesion: str) -> Anatomy:
    """The anatomy ``lesion`` lives in (``heart``, ``lung`` or ``pleura``)."""
    return traits(lesion).anatomy


def is_diffuse(lesion: str) -> bool:
    """Whether ``lesion`` spreads diffusely over the lungs."""
    return traits(lesion).extent == "diffuse"


def lesions_where(predicate: Callable[[LesionTraits], bool],
                  table: Mapping[str, LesionTraits] | None = None) -> tuple[str, ...]:
    """Names of the lesions whose traits satisfy ``predicate``, in table order."""
    tab = LESION_TRAITS if table is None else table
    return tuple(name for name, t in tab.items() if predicate(t))


@dataclass(frozen=True)
class LesionGroups:
    """Every lesion group derived from one traits table (each tuple in table order)."""

    lesions: tuple[str, ...]
    abbreviations: dict[str, str]
    colours: dict[str, tuple[int, int, int]]
    lung: tuple[str, ...]
    """Lesions inside the lungs (not the heart, not the pleura)."""
    non_heart: tuple[str, ...]
    """Lung and pleural lesions (the ILS card's lung/pleural recall average)."""
    diffuse: tuple[str, ...]
    lesion_inference: tuple[str, ...]
    umbrella: tuple[str, ...]
    heart_mask: tuple[str, ...]
    ctr_rule: tuple[str, ...]
    base_completion: tuple[str, ...]
    edema_thresholds: tuple[str, ...]
    brighter: tuple[str, ...]
    """Lesions Algorithm 1's anomaly map can ground."""
    plain_detection: tuple[str, ...]
    """CheXpercept Stage-1 stem without "finding suggestive of"."""
    no_heart_note: tuple[str, ...]
    percept_attributes: tuple[str, ...]
    """Lesions whose CheXpercept RF/RR cases have Stage 4."""
    organ_deform: tuple[str, ...]


def groups(table: Mapping[str, LesionTraits] | None = None) -> LesionGroups:
    """The lesion groups of ``table`` (default :data:`LESION_TRAITS`), after :func:`check_table`."""
    tab = LESION_TRAITS if table is None else table
    check_table(tab)

    def where(predicate: Callable[[LesionTraits], bool]) -> tuple[str, ...]:
        return lesions_where(predicate, tab)

    return LesionGroups(
        lesions=tuple(tab),
        abbreviations={n: t.abbreviation for n, t in tab.items()},
        colours={n: t.colour for n, t in tab.items()},
        lung=where(lambda t: t.anatomy == "lung"),
        non_heart=where(lambda t: t.anatomy != "heart"),
        diffuse=where(lambda t: t.extent == "diffuse"),
        lesion_inference=where(lambda t: t.lesion_inference),
        umbrella=where(lambda t: t.umbrella),
        heart_mask=where(lambda t: t.heart_mask),
        ctr_rule=where(lambda t: t.ctr_rule),
        base_completion=where(lambda t: t.base_completion),
        edema_thresholds=where(lambda t: t.thresholds == "edema"),
        brighter=where(lambda t: t.contrast == "brighter"),
        plain_detection=where(lambda t: t.percept.detection == "plain"),
        no_heart_note=where(lambda t: not t.percept.heart_note),
        percept_attributes=where(lambda t: t.percept.attributes),
        organ_deform=where(lambda t: t.percept.deform == "organ"),
    )
