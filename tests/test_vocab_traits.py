"""The per-lesion trait table: derived groups equal the former literals, every lesion is complete, and a new
lesion added to a copy of the table is picked up by the helpers that should see it."""

from __future__ import annotations

import dataclasses

import pytest

from cxrground.ils.config import EDEMA_THRESHOLDS, GENERAL_THRESHOLDS, IlsConfig
from cxrground.percept.config import DeformConfig
from cxrground.vocab import ils_templates as ils
from cxrground.vocab import lesions
from cxrground.vocab import percept_templates as pt
from cxrground.vocab.traits import (
    LESION_TRAITS,
    PERCEPT_STAGES,
    LesionTraits,
    PerceptTraits,
    extend_traits,
    groups,
    is_diffuse,
    lesions_where,
    lives_in,
    traits,
)

#: The literals these constants had before the trait table existed.
FORMER = {
    "LESIONS": ("cardiomegaly", "pneumonia", "atelectasis", "opacity", "consolidation", "edema", "effusion"),
    "ABBREVIATIONS": {"cardiomegaly": "CA", "pneumonia": "PN", "atelectasis": "AT", "opacity": "OP",
                      "consolidation": "CO", "edema": "ED", "effusion": "EF"},
    "LESION_INFERENCE_LESIONS": ("pneumonia", "atelectasis", "edema"),
    "LUNG_LESIONS": ("pneumonia", "atelectasis", "opacity", "consolidation", "edema"),
    "DIFFUSE_LESIONS": ("edema",),
}
FORMER_COLOURS = {"cardiomegaly": (255, 200, 0), "pneumonia": (255, 60, 60), "atelectasis": (0, 200, 255),
                  "opacity": (255, 120, 255), "consolidation": (255, 140, 0), "edema": (80, 255, 80),
                  "effusion": (60, 110, 255)}

PNEUMOTHORAX = LesionTraits(
    name="pneumothorax", abbreviation="PX", anatomy="pleura", extent="focal", contrast="darker",
    lesion_inference=False, umbrella=False, li_negative_target=False, heart_mask=False, ctr_rule=False,
    base_completion=False, zone_fill=False, thresholds="general", colour=(200, 200, 200),
    percept=PerceptTraits(stages=PERCEPT_STAGES, detection="suggestive", heart_note=True, deform="lung"),
)


@pytest.mark.parametrize("name", sorted(FORMER))
def test_derived_constants_equal_former_literals(name):
    got = getattr(lesions, name)
    assert got == FORMER[name]
    assert type(got) is type(FORMER[name])
    if isinstance(got, dict):
        assert list(got) == list(FORMER[name])  # same order too


def test_table_order_and_other_derived_groups():
    assert tuple(LESION_TRAITS) == FORMER["LESIONS"]
    g = groups()
    assert g.colours == FORMER_COLOURS
    assert lesions.HEART_MASK_LESIONS == g.heart_mask == g.ctr_rule == ("cardiomegaly",)
    assert g.umbrella == ("opacity", "consolidation")
    assert pt.DETECTION_PLAIN_LESIONS == g.plain_detection == ("opacity", "consolidation")
    assert lesions_where(lambda t: t.li_negative_target) == (ils.TENTATIVE_WORD,)
    assert g.base_completion == ("effusion",)
    assert g.edema_thresholds == ("edema",)
    assert g.non_heart == FORMER["LESIONS"][1:]
    assert g.no_heart_note == g.organ_deform == ("cardiomegaly",)
    assert g.percept_attributes == FORMER["LESIONS"][1:]
    assert g.brighter == FORMER["LESIONS"]
    assert sorted(lesions.EVAL_ORDER) == sorted(LESION_TRAITS)


def test_every_lesion_has_complete_traits():
    fields = {f.name for f in dataclasses.fields(LesionTraits)}
    for name, t in LESION_TRAITS.items():
        assert t.name == name
        for f in fields:
            assert getattr(t, f) is not None, (name, f)
        assert t.anatomy in ("heart", "lung", "pleura")
        assert t.extent in ("focal", "diffuse")
        assert t.contrast in ("brighter", "darker")
        assert t.thresholds in ("general", "edema")
        assert t.percept.stages[:3] == (1, 2, 3)
    assert len({t.abbreviation for t in LESION_TRAITS.values()}) == len(LESION_TRAITS)
    assert len(set(FORMER_COLOURS.values())) == len(LESION_TRAITS)


def test_traits_match_the_specs():
    ca = traits("cardiomegaly")
    assert (ca.anatomy, ca.heart_mask, ca.ctr_rule, ca.lesion_inference) == ("heart", True, True, False)
    assert ca.percept.stages == (1, 2, 3) and not ca.percept.attributes and ca.percept.depth_bonus == 1
    assert traits("edema").percept.depth_bonus == 0 and traits("edema").percept.attributes
    assert lives_in("effusion") == "pleura" and traits("effusion").base_completion
    assert is_diffuse("edema") and not is_diffuse("pneumonia")
    assert all(t.contrast == "brighter" for t in LESION_TRAITS.values())  # ILS §2: hypo-intense lesions excluded


def test_helpers_read_the_traits():
    cfg = IlsConfig()
    assert cfg.thresholds_for("edema") == EDEMA_THRESHOLDS
    assert all(cfg.thresholds_for(x) == GENERAL_THRESHOLDS for x in LESION_TRAITS if x != "edema")
    deform = DeformConfig()
    assert deform.depth("cardiomegaly") == deform.cardiomegaly_depth
    assert {deform.depth(x) for x in FORMER["LESIONS"][1:]} == {deform.lung_depth}
    assert ils.positive_answer("global", "cardiomegaly") == "[SEG]"
    assert pt.contour_eval_stem("cardiomegaly").endswith("(shown in the overlay). Is any major revision needed?")
    assert pt.contour_eval_stem("effusion").endswith(pt.HEART_NOTE)
    assert pt.initial_context("opacity").endswith(pt.HEART_NOTE)


def test_unknown_lesion_is_a_clear_error():
    with pytest.raises(ValueError, match=r"unknown lesion 'nodule'.*cardiomegaly"):
        traits("nodule")
    with pytest.raises(ValueError, match="unknown lesion"):
        IlsConfig().thresholds_for("nodule")


def test_bad_traits_are_rejected_with_the_lesion_named():
    with pytest.raises(ValueError, match=r"'pneumothorax'.*contrast"):
        dataclasses.replace(PNEUMOTHORAX, contrast="dark")
    with pytest.raises(ValueError, match=r"'pneumothorax'.*CTR rule needs heart_mask"):
        dataclasses.replace(PNEUMOTHORAX, ctr_rule=True)
    with pytest.raises(ValueError, match=r"'pneumothorax'.*abbreviation"):
        dataclasses.replace(PNEUMOTHORAX, abbreviation="px")
    with pytest.raises(ValueError, match=r"'pneumothorax'.*percept stages"):
        dataclasses.replace(PNEUMOTHORAX, percept=dataclasses.replace(PNEUMOTHORAX.percept, stages=(1, 3)))
    with pytest.raises(ValueError, match=r"abbreviation.*PN used twice"):
        extend_traits(dataclasses.replace(PNEUMOTHORAX, abbreviation="PN"))
    with pytest.raises(ValueError, match="already a lesion"):
        extend_traits(dataclasses.replace(PNEUMOTHORAX, name="edema", abbreviation="XX"))


def test_an_eighth_lesion_in_a_copy_of_the_table():
    before = dict(LESION_TRAITS)
    table = extend_traits(PNEUMOTHORAX)
    assert before == LESION_TRAITS  # the global table is untouched
    assert "pneumothorax" not in LESION_TRAITS
    assert tuple(table) == (*FORMER["LESIONS"], "pneumothorax")
    g = groups(table)
    # picked up: the lesion list, abbreviations, colours, and the groups its traits put it in
    assert g.lesions[-1] == "pneumothorax" and g.abbreviations["pneumothorax"] == "PX"
    assert g.colours["pneumothorax"] == (200, 200, 200)
    assert g.non_heart[-1] == "pneumothorax"
    assert g.percept_attributes[-1] == "pneumothorax"
    assert lesions_where(lambda t: t.anatomy == "pleura", table) == ("effusion", "pneumothorax")
    assert traits("pneumothorax", table).contrast == "darker"
    # not picked up: groups whose traits it does not have (darker: Algorithm 1 cannot ground it)
    for name in ("lung", "diffuse", "lesion_inference", "umbrella", "heart_mask", "ctr_rule", "base_completion",
                 "edema_thresholds", "brighter", "plain_detection", "no_heart_note", "organ_deform"):
        assert "pneumothorax" not in getattr(g, name), name
        assert getattr(g, name) == getattr(groups(), name), name
    # the module constants stay those of the built-in table
    assert FORMER["LESIONS"] == lesions.LESIONS
    assert "pneumothorax" not in lesions.ABBREVIATIONS
    with pytest.raises(ValueError, match="unknown lesion 'pneumothorax'"):
        traits("pneumothorax")


def test_special_cases_follow_the_table_not_the_name(monkeypatch):
    """Give effusion cardiomegaly-like percept traits and edema thresholds (restored after the test): the code
    that used to compare names now follows the traits."""
    from cxrground.percept.attributes import attribute_qas
    from cxrground.percept.cases import count_arithmetic
    from cxrground.percept.distractors import default_mask_names

    eff = LESION_TRAITS["effusion"]
    assert IlsConfig().thresholds_for("effusion") == GENERAL_THRESHOLDS
    assert default_mask_names("effusion", "left", True) == ["default_keep", "default_left_lung_chex",
                                                             "default_left_lung_cxas"]
    items = count_arithmetic((1, 1, 1)).items_per_lesion["effusion"]
    changed = dataclasses.replace(eff, thresholds="edema", percept=PerceptTraits(
        stages=(1, 2, 3), detection="suggestive", heart_note=False, deform="organ"))
    monkeypatch.setitem(LESION_TRAITS, "effusion", changed)
    assert IlsConfig().thresholds_for("effusion") == EDEMA_THRESHOLDS
    assert DeformConfig().depth("effusion") == DeformConfig().cardiomegaly_depth
    assert default_mask_names("effusion", "left", True) == ["default_keep", "default_dilated", "default_eroded"]
    assert attribute_qas([], "effusion", None) is None  # type: ignore[arg-type]
    assert count_arithmetic((1, 1, 1)).items_per_lesion["effusion"] == items - 2 * 4  # no Stage 4 on RF and RR
