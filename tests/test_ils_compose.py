"""Pair composition (ILS.md §4, §11): templates, cardiomegaly exception, tentative -> opacity,
lesion inference only for PN/AT/ED, at most one negative per lesion, CTR rule, EL regions."""

from __future__ import annotations

from collections import Counter

import numpy as np

from cxrground.ils.compose import GroundedFinding, compose_pairs
from cxrground.ils.config import IlsConfig
from cxrground.ils.schema import validate_dataset
from cxrground.reports.findings import Finding
from cxrground.vocab.lesions import LESIONS
from cxrground.vocab.locations import ILS_LOCATION_LABELS

SHAPE = (20, 20)


def mask() -> np.ndarray:
    m = np.zeros(SHAPE, bool)
    m[5:9, 3:7] = True
    return m


def f(lesion, assertion="present", rl=("right lung base",), sent=1, entity=None):
    return Finding(entity or lesion or "nodule", sent, assertion, lesion, (), tuple(rl))


def g(finding, gl=None, complete=True, grounded=True):
    return GroundedFinding(finding, mask() if grounded else None,
                           tuple(gl if gl is not None else finding.reported_location), complete)


def test_basic_global_and_lesion_inference_positive():
    pn = f("pneumonia", rl=("right mid zone lung", "right lung base"), sent=2)
    out = compose_pairs("s1", [pn], [g(pn)], [], None, None, IlsConfig())
    pos = out.positive_pairs
    assert [p["type"] for p in pos] == ["basic", "global", "lesion_inference"]
    assert pos[0]["instruction"] == "Segment the pneumonia in the right mid zone lung and right lung base."
    assert pos[0]["answer"] == "[SEG]"
    assert pos[1]["instruction"] == "Segment the pneumonia."
    assert pos[1]["answer"] == "[SEG] It is located in the right mid zone lung and right lung base."
    assert pos[2]["instruction"] == (
        "Segment the opacity in the right mid zone lung and right lung base and predict its type."
    )
    assert pos[2]["answer"] == "[SEG] It is highly suggestive of pneumonia."
    assert {p["seg_mask_path"] for p in pos} == {"s1/s1_pneumonia_0.png"}
    assert [p["pair_id"] for p in pos] == ["s1_positive_0", "s1_positive_1", "s1_positive_2"]
    assert all(p["sent_idx"] == "2" and p["target"] == "pneumonia" for p in pos)
    assert len(out.masks) == 1 and out.reported == [("pneumonia", True)]


def test_tentative_uses_opacity_word_and_keeps_target():
    at = f("atelectasis", "uncertain", rl=("left lung base",))
    pos = compose_pairs("s1", [at], [g(at)], [], None, None, IlsConfig()).positive_pairs
    assert pos[0]["instruction"] == "Segment the opacity in the left lung base." and pos[0]["target"] == "atelectasis"
    assert pos[1]["instruction"] == "Segment the opacity."
    assert pos[2]["answer"] == "[SEG] It possibly reflects atelectasis."


def test_lesion_inference_only_for_pn_at_ed_and_global_only_when_complete():
    ef = f("effusion", rl=("right lung", "left lung base"))
    co = f("consolidation", rl=("left upper zone lung",))
    out = compose_pairs("s1", [ef, co], [g(ef, gl=("left lung base",), complete=False), g(co)], [], None, None,
                        IlsConfig())
    types = [(p["target"], p["type"]) for p in out.positive_pairs]
    assert types == [("effusion", "basic"), ("consolidation", "basic"), ("consolidation", "global")]
    assert out.positive_pairs[0]["reported_location"] == ["right lung", "left lung base"]
    assert out.positive_pairs[0]["grounded_location"] == ["left lung base"]
    assert [m.path for m in out.masks] == ["s1/s1_effusion_0.png", "s1/s1_consolidation_1.png"]


def test_two_findings_of_one_lesion_get_no_global():
    a = f("effusion", rl=("right lung base",), sent=1)
    b = f("effusion", rl=("left lung base",), sent=3)
    out = compose_pairs("s1", [a, b], [g(a), g(b)], [], None, None, IlsConfig())
    assert [p["type"] for p in out.positive_pairs] == ["basic", "basic"]


def test_cardiomegaly_exception_and_ctr_rule():
    ca = f("cardiomegaly", rl=("heart",))
    heart = mask()
    out = compose_pairs("s1", [ca], [g(ca)], [], 0.6, heart, IlsConfig())
    (p,) = out.positive_pairs
    assert (p["instruction"], p["answer"], p["type"]) == ("Segment the cardiomegaly.", "[SEG]", "global")
    assert p["reported_location"] == ["heart"] and p["grounded_location"] == ["heart"]
    assert not any(n["target"] == "cardiomegaly" for n in out.negative_pairs)
    # negatives: only when CTR <= 0.45 (inclusive)
    at_limit = compose_pairs("s2", [], [], list(ILS_LOCATION_LABELS), 0.45, heart, IlsConfig())
    ca_neg = [n for n in at_limit.negative_pairs if n["target"] == "cardiomegaly"]
    assert len(ca_neg) == 1 and ca_neg[0]["instruction"] == "Segment the cardiomegaly."
    assert ca_neg[0]["answer"] == "[SEG] There is no cardiomegaly." and ca_neg[0]["location"] == ["heart"]
    above = compose_pairs("s2", [], [], list(ILS_LOCATION_LABELS), 0.4501, heart, IlsConfig())
    assert not any(n["target"] == "cardiomegaly" for n in above.negative_pairs)
    # tentative cardiomegaly: no pair at all (proposed default) and no negative
    tent = f("cardiomegaly", "uncertain", rl=("heart",))
    out = compose_pairs("s3", [tent], [g(tent)], [], 0.3, heart, IlsConfig())
    assert not out.positive_pairs and not any(n["target"] == "cardiomegaly" for n in out.negative_pairs)


def test_at_most_one_negative_per_lesion_and_empty_locations():
    ef = f("effusion", rl=("left lung base",))
    nodule = f(None, rl=("right upper zone lung",), entity="nodule")
    el = ["right apical zone lung", "right mid zone lung"]
    for seed in range(40):
        out = compose_pairs(f"s{seed}", [ef, nodule], [g(ef)], el, 0.3, mask(), IlsConfig(seed=seed))
        targets = Counter(n["target"] for n in out.negative_pairs)
        assert max(targets.values()) == 1
        for n in out.negative_pairs:
            if n["type"] != "global" and n["target"] != "cardiomegaly":
                assert set(n["location"]) <= set(el), n
        # the reported effusion only gets an N2 negative at an empty location
        ef_neg = [n for n in out.negative_pairs if n["target"] == "effusion"]
        assert all(n["type"] == "basic" and n["kind"] == "grounding_no_location_extension" for n in ef_neg)


def test_no_negative_for_reported_ungrounded_location_and_no_global_opacity_when_lung_lesion():
    pn = f("pneumonia", "uncertain", rl=("right lung base",))
    for seed in range(60):
        out = compose_pairs("s9", [pn], [g(pn, grounded=False)], ["left apical zone lung"], None, None,
                            IlsConfig(seed=seed))
        assert not out.positive_pairs and out.reported == [("pneumonia", False)]
        for n in out.negative_pairs:
            assert "right lung base" not in n["location"]
            if n["target"] in ("opacity", "consolidation"):
                assert n["type"] != "global"


def test_negative_templates_and_shares():
    counts: Counter = Counter()
    for seed in range(400):
        out = compose_pairs(f"s{seed}", [], [], list(ILS_LOCATION_LABELS), 0.3, mask(), IlsConfig(seed=seed))
        assert len(out.negative_pairs) == 7
        for n in out.negative_pairs:
            counts[(n["target"], n["type"])] += 1
            if n["type"] == "basic":
                loc = " and ".join(n["location"]) if len(n["location"]) <= 2 else None
                assert n["answer"] == f"[SEG] There is no {n['target']} in the {loc}."
            if n["type"] == "lesion_inference":
                assert n["target"] == "opacity" and n["instruction"].endswith("and predict its type.")
                assert n["answer"].startswith("[SEG] There is no opacity in the ")
            if n["type"] == "global" and n["target"] != "cardiomegaly":
                assert n["location"] == ["lung"] and n["answer"] == f"[SEG] There is no {n['target']}."
    # opacity: about half lesion-inference; effusion: about a quarter global (spec §11.2 targets)
    assert 0.4 < counts[("opacity", "lesion_inference")] / 400 < 0.6
    assert 0.15 < counts[("effusion", "global")] / 400 < 0.32


def test_deterministic_per_study_and_valid_schema():
    pn = f("pneumonia", rl=("left lung",))
    a = compose_pairs("s5", [pn], [g(pn)], ["right apical zone lung"], 0.3, mask(), IlsConfig(seed=3))
    b = compose_pairs("s5", [pn], [g(pn)], ["right apical zone lung"], 0.3, mask(), IlsConfig(seed=3))
    assert a.negative_pairs == b.negative_pairs and a.positive_pairs == b.positive_pairs
    study = {"subject_id": "p1", "dicom_id": "d", "image_path": "p1/p1/s5/d.jpg", "section_name": "findings",
             "section_content": "(1) Left lung pneumonia.",
             "instruction_answer_pairs": {"positive_pairs": a.positive_pairs, "negative_pairs": a.negative_pairs}}
    assert validate_dataset({"train": {"s5": study}}) == []
    broken = {**study, "instruction_answer_pairs": {"positive_pairs": [{**a.positive_pairs[0], "answer": "x"}]}}
    assert validate_dataset({"train": {"s5": broken}})
    assert set(LESIONS) >= {n["target"] for n in a.negative_pairs}


def test_exact_duplicate_pairs_are_dropped_and_masks_merged():
    a = f("opacity", rl=("right lung base",), sent=1)
    b = f("opacity", rl=("right lung base",), sent=3)
    other = np.zeros(SHAPE, bool)
    other[12:15, 12:15] = True
    gb = GroundedFinding(b, other, ("right lung base",), True)
    out = compose_pairs("s1", [a, b], [g(a), gb], [], None, None, IlsConfig())
    pairs = out.positive_pairs + out.negative_pairs
    keys = [(p["instruction"], p["answer"]) for p in pairs]
    assert len(keys) == len(set(keys)) and sum(out.dropped.values()) >= 1
    assert [p["pair_id"] for p in out.positive_pairs] == [f"s1_positive_{i}" for i in range(len(out.positive_pairs))]
    assert len(out.masks) == 1 and out.masks[0].mask.sum() == mask().sum() + other.sum()
    assert {p["seg_mask_path"] for p in out.positive_pairs} == {out.masks[0].path}


def _identity(out) -> tuple[int, int]:
    """(#lesion-inference positives, #basic positives of pneumonia, atelectasis and edema): ILS §4 rule 4."""
    pos = out.positive_pairs
    return (sum(p["type"] == "lesion_inference" for p in pos),
            sum(p["type"] == "basic" and p["target"] in ("pneumonia", "atelectasis", "edema") for p in pos))


def _grounded(finding, rows: slice) -> GroundedFinding:
    m = np.zeros(SHAPE, bool)
    m[rows, 2:8] = True
    return GroundedFinding(finding, m, finding.reported_location, True)


def test_twin_tentative_findings_keep_the_lesion_inference_count_identity():
    """A tentative pneumonia and a tentative atelectasis of one place both ask "Segment the opacity in the right
    lung base.": one basic pair is kept (the first), with both masks; the atelectasis' lesion-inference pair goes
    with its basic twin, and the pneumonia's shares the joined mask (same region)."""
    pn = f("pneumonia", "uncertain", rl=("right lung base",), sent=1)
    at = f("atelectasis", "uncertain", rl=("right lung base",), sent=2)
    out = compose_pairs("s1", [pn, at], [_grounded(pn, slice(2, 4)), _grounded(at, slice(10, 14))], [], None,
                        None, IlsConfig())
    assert _identity(out) == (1, 1)
    basic = [p for p in out.positive_pairs if p["type"] == "basic"]
    li = [p for p in out.positive_pairs if p["type"] == "lesion_inference"]
    assert [(p["instruction"], p["target"]) for p in basic] == [("Segment the opacity in the right lung base.",
                                                                 "pneumonia")]
    assert [p["answer"] for p in li] == ["[SEG] It possibly reflects pneumonia."]
    assert li[0]["seg_mask_path"] == basic[0]["seg_mask_path"] == "s1/s1_pneumonia_0.png"
    assert [m.path for m in out.masks] == ["s1/s1_pneumonia_0.png"] and out.masks[0].mask.sum() == 2 * 6 + 4 * 6
    keys = [(p["instruction"], p["answer"]) for p in out.positive_pairs]
    assert len(keys) == len(set(keys))


def test_a_twin_with_lesion_inference_pairs_is_the_one_kept():
    """A definite opacity, then a tentative pneumonia of the same zone: both ask "Segment the opacity in the left
    lung base."; the pneumonia's basic pair is kept (its lesion-inference pair stays paired), holding both masks,
    and the opacity's mask is no longer used, so the pneumonia's mask becomes the study's mask 0."""
    op = f("opacity", rl=("left lung base",), sent=1)
    pn = f("pneumonia", "uncertain", rl=("left lung base",), sent=2)
    out = compose_pairs("s2", [op, pn], [_grounded(op, slice(2, 4)), _grounded(pn, slice(10, 14))], [], None,
                        None, IlsConfig())
    assert _identity(out) == (1, 1)
    basic = [p for p in out.positive_pairs if p["type"] == "basic"]
    assert [(p["instruction"], p["target"]) for p in basic] == [("Segment the opacity in the left lung base.",
                                                                 "pneumonia")]
    # the two global pairs ("Segment the opacity." -> "... left lung base.") are twins too: the pneumonia's is kept
    assert [p["type"] for p in out.positive_pairs] == ["basic", "global", "lesion_inference"]
    assert [m.path for m in out.masks] == ["s2/s2_pneumonia_0.png"]  # was the study's second mask (k = 1)
    used = {p["seg_mask_path"] for p in out.positive_pairs}
    assert used == {m.path for m in out.masks}
    by_path = {m.path: m.mask for m in out.masks}
    assert by_path[basic[0]["seg_mask_path"]].sum() == 2 * 6 + 4 * 6


def test_a_dropped_twin_takes_its_global_pair_with_it():
    """A tentative edema and a tentative effusion of one place ask the same basic question; the edema is kept (it has
    lesion-inference pairs) and the effusion's global pair goes with its basic twin: no global positive without its
    basic positive (ILS §11.1)."""
    rl = ("right upper zone lung", "right mid zone lung", "right lung base")
    ed = f("edema", "uncertain", rl=rl, sent=1)
    ef = f("effusion", "uncertain", rl=rl, sent=2)
    grounded = [GroundedFinding(ed, _grounded(ed, slice(2, 4)).mask, rl, False),
                GroundedFinding(ef, _grounded(ef, slice(10, 14)).mask, rl, True)]
    out = compose_pairs("s4", [ed, ef], grounded, [], None, None, IlsConfig())
    assert [(p["type"], p["target"]) for p in out.positive_pairs] == [("basic", "edema"), ("lesion_inference", "edema")]
    assert out.dropped["duplicate (instruction, answer) in the study"] == 2  # the effusion's basic and global
    assert [m.path for m in out.masks] == ["s4/s4_edema_0.png"] and out.masks[0].mask.sum() == 2 * 6 + 4 * 6


def test_one_lesion_inference_question_gets_one_answer():
    """A definitive and a tentative pneumonia of one place both ask "Segment the opacity in the right lung base and
    predict its type."; the definitive one is kept with its basic pair, the tentative one goes with all its pairs."""
    tentative = f("pneumonia", "uncertain", rl=("right lung base",), sent=1)
    definitive = f("pneumonia", "present", rl=("right lung base",), sent=2)
    out = compose_pairs("s5", [tentative, definitive], [_grounded(tentative, slice(2, 4)),
                                                        _grounded(definitive, slice(2, 4))], [], None, None,
                        IlsConfig())
    assert [(p["type"], p["instruction"], p["answer"]) for p in out.positive_pairs] == [
        ("basic", "Segment the pneumonia in the right lung base.", "[SEG]"),
        ("lesion_inference", "Segment the opacity in the right lung base and predict its type.",
         "[SEG] It is highly suggestive of pneumonia.")]
    assert _identity(out) == (1, 1) and len(out.masks) == 1


def test_mask_indices_have_no_gaps_after_pairs_are_left_out():
    """ILS §12.1: ``k`` runs over the study's masks; a mask left without a pair does not leave a gap."""
    pn = f("pneumonia", rl=("right lung base",), sent=1)
    op = f("opacity", rl=("right lung base",), sent=2)
    op2 = f("opacity", rl=("right lung base",), sent=3)
    ef = f("effusion", rl=("left lung base",), sent=4)
    grounded = [_grounded(pn, slice(1, 2)), _grounded(op, slice(3, 4)), _grounded(op2, slice(5, 6)),
                _grounded(ef, slice(7, 8))]
    out = compose_pairs("s3", [pn, op, op2, ef], grounded, [], None, None, IlsConfig())
    ks = sorted(int(m.path.rsplit("_", 1)[1].removesuffix(".png")) for m in out.masks)
    assert ks == list(range(len(out.masks))) and len(out.masks) == 3
    assert {p["seg_mask_path"] for p in out.positive_pairs} == {m.path for m in out.masks}


def test_lesion_inference_count_identity_holds_over_random_studies():
    """Random mixes of findings (lesions, certainties, places, repeats): ILS §4's identity always holds and no
    exact (instruction, answer) repeats within a study."""
    rng = np.random.default_rng(0)
    places = [("right lung base",), ("left lung base",), ("right lung",), ("right lung base", "left lung base")]
    lung = ["pneumonia", "atelectasis", "edema", "opacity", "consolidation", "effusion"]
    for study in range(300):
        findings = [f(lung[rng.integers(len(lung))], ["present", "uncertain"][rng.integers(2)],
                      rl=places[rng.integers(len(places))], sent=i + 1) for i in range(int(rng.integers(1, 6)))]
        grounded = [_grounded(x, slice(i % 18, i % 18 + 2)) for i, x in enumerate(findings)]
        out = compose_pairs(f"s{study}", findings, grounded, [], None, None, IlsConfig(seed=study))
        li, basic = _identity(out)
        assert li == basic, [(p["type"], p["target"], p["instruction"]) for p in out.positive_pairs]
        keys = [(p["instruction"], p["answer"]) for p in out.positive_pairs + out.negative_pairs]
        assert len(keys) == len(set(keys))
        assert {p["seg_mask_path"] for p in out.positive_pairs} == {m.path for m in out.masks}
        questions = [p["instruction"] for p in out.positive_pairs if p["type"] == "lesion_inference"]
        assert len(questions) == len(set(questions))  # one answer per question
        basics = {p["seg_mask_path"] for p in out.positive_pairs if p["type"] == "basic"}
        assert all(p["seg_mask_path"] in basics for p in out.positive_pairs)  # every global / LI has its basic


def test_global_lung_negatives_need_both_lungs_free_under_lung_exclusion():
    ef = f("effusion", rl=("left lung base",))
    left_free = [lab for lab in ILS_LOCATION_LABELS if lab.startswith("right")]
    kinds: Counter = Counter()
    for seed in range(300):
        ils = compose_pairs(f"s{seed}", [ef], [g(ef)], left_free, 0.3, mask(), IlsConfig(seed=seed))
        lung = compose_pairs(f"s{seed}", [ef], [g(ef)], left_free, 0.3, mask(),
                             IlsConfig(seed=seed, negative_exclusion="lung"))
        kinds.update(n["type"] for n in ils.negative_pairs if n["target"] != "cardiomegaly")
        for n in lung.negative_pairs:
            if n["target"] != "cardiomegaly":
                assert n["type"] != "global" and set(n["location"]) <= set(left_free), n
        assert len(lung.negative_pairs) == len(ils.negative_pairs)  # the global ones became basic ones
    assert kinds["global"] > 0  # the ILS exclusion does draw global lung negatives here
    clear = compose_pairs("s1", [], [], list(ILS_LOCATION_LABELS), 0.3, mask(),
                          IlsConfig(seed=0, negative_exclusion="lung"))
    default = compose_pairs("s1", [], [], list(ILS_LOCATION_LABELS), 0.3, mask(), IlsConfig(seed=0))
    assert clear.negative_pairs == default.negative_pairs  # a clear report: nothing changes


def test_report_that_does_not_read_the_film_gives_no_lung_negatives() -> None:
    """A silent report ("Fever and odynophagia") gives no lung or pleural negative, counted on the card; the
    cardiomegaly negative, decided by the CTR, stays; ``silent_report_negatives`` restores the literal rule."""
    from cxrground.ils.compose import WITHHELD_SILENT_REPORT

    silent = compose_pairs("s1", [], [], list(ILS_LOCATION_LABELS), 0.40, None, IlsConfig(), reads_film=False)
    assert [(n["target"], n["location"]) for n in silent.negative_pairs] == [("cardiomegaly", ["heart"])]
    assert silent.dropped == Counter({WITHHELD_SILENT_REPORT: len(LESIONS) - 1})
    literal = compose_pairs("s1", [], [], list(ILS_LOCATION_LABELS), 0.40, None,
                            IlsConfig(silent_report_negatives=True), reads_film=False)
    reading = compose_pairs("s1", [], [], list(ILS_LOCATION_LABELS), 0.40, None, IlsConfig())
    assert literal.negative_pairs == reading.negative_pairs
    assert {n["target"] for n in reading.negative_pairs} == set(LESIONS)
    assert not reading.dropped and not literal.dropped


def test_a_heart_called_prominent_withholds_the_cardiomegaly_negative() -> None:
    """"The cardiac silhouette is prominent" (a non-target finding at the heart) is neither cardiomegaly nor a
    normal heart: no "There is no cardiomegaly." however low the CTR, counted on the card; a negated prominence
    ("no prominence of the heart") does not withhold it."""
    from cxrground.ils.compose import WITHHELD_HEART_DESCRIBED
    from cxrground.reports.structure import structure_text

    prominent = [x for x in structure_text("The cardiac silhouette is prominent.").findings]
    assert [(x.lesion, x.reported_location) for x in prominent] == [(None, ("heart",))]
    out = compose_pairs("s1", prominent, [], list(ILS_LOCATION_LABELS), 0.40, None, IlsConfig())
    assert "cardiomegaly" not in {n["target"] for n in out.negative_pairs}
    assert out.dropped == Counter({WITHHELD_HEART_DESCRIBED: 1})
    assert {n["target"] for n in out.negative_pairs} == set(LESIONS) - {"cardiomegaly"}
    negated = structure_text("No prominence of the heart.").findings
    assert [x.assertion for x in negated] == ["absent"]
    out = compose_pairs("s1", list(negated), [], list(ILS_LOCATION_LABELS), 0.40, None, IlsConfig())
    assert "cardiomegaly" in {n["target"] for n in out.negative_pairs} and not out.dropped


def test_opacity_negatives_take_the_lesion_inference_form_at_the_configured_share():
    """ILS §11.2: a share of the opacity negatives (``IlsConfig.opacity_lesion_inference_share``, 0.494 by default)
    is written as lesion-inference negatives ("Segment the opacity in the ... and predict its type." → "There is no
    opacity in the ..."), with target ``opacity``; 0 and 1 give none and all."""
    ef = f("effusion", rl=("left lung base",))
    free = [lab for lab in ILS_LOCATION_LABELS if lab.startswith("right")]

    def kinds(share: float) -> Counter:
        out: Counter = Counter()
        for seed in range(400):
            config = IlsConfig(seed=seed, opacity_lesion_inference_share=share)
            for n in compose_pairs(f"s{seed}", [ef], [g(ef)], free, 0.3, mask(), config).negative_pairs:
                if n["target"] == "opacity":
                    out[n["type"]] += 1
        return out

    default = kinds(IlsConfig().opacity_lesion_inference_share)
    share = default["lesion_inference"] / sum(default.values())
    assert sum(default.values()) >= 300 and abs(share - 0.494) < 0.07, default
    assert kinds(0.0)["lesion_inference"] == 0
    assert set(kinds(1.0)) == {"lesion_inference"}


def _global_shares(config_kwargs: dict, empty: list[str], studies: int = 1500) -> dict[str, float]:
    """Realised global share of each lung lesion's emitted negatives over ``studies`` studies whose report names an
    opacity in both lungs and leaves ``empty`` free."""
    op = f("opacity", rl=("right lung", "left lung"))
    made: Counter = Counter()
    glob: Counter = Counter()
    for seed in range(studies):
        out = compose_pairs(f"s{seed}", [op], [g(op)], empty, 0.3, mask(), IlsConfig(seed=0, **config_kwargs))
        for n in out.negative_pairs:
            made[n["target"]] += 1
            glob[n["target"]] += n["type"] == "global"
    return {lesion: glob[lesion] / made[lesion] for lesion in made if lesion != "cardiomegaly"}


def test_global_negatives_need_a_region_keeps_the_train_shares():
    """With ``global_negative_needs_region`` a report that leaves no location empty gives no lung negative at all
    (basic and global alike), so each lesion's global share of its emitted negatives is the ILS §11.2 target; by
    default such a report keeps its global negatives and nothing else (share 1)."""
    target = IlsConfig().negative_global_share
    default = _global_shares({}, [], studies=300)
    assert default["effusion"] == 1.0 and default["atelectasis"] == 1.0  # only globals survive a full report
    strict = compose_pairs("s1", [f("opacity", rl=("right lung", "left lung"))],
                           [g(f("opacity", rl=("right lung", "left lung")))], [], 0.3, mask(),
                           IlsConfig(global_negative_needs_region=True))
    assert [n["target"] for n in strict.negative_pairs] in ([], ["cardiomegaly"])
    # a report that leaves one location free: the strict rule keeps the target share
    half = _global_shares({"global_negative_needs_region": True}, ["left apical zone lung"])
    for lesion in ("effusion", "atelectasis"):
        assert abs(half[lesion] - target[lesion]) < 0.05, (lesion, half[lesion])
    # a report without findings is untouched by the switch
    a = compose_pairs("s7", [], [], list(ILS_LOCATION_LABELS), 0.3, mask(), IlsConfig(seed=3))
    b = compose_pairs("s7", [], [], list(ILS_LOCATION_LABELS), 0.3, mask(),
                      IlsConfig(seed=3, global_negative_needs_region=True))
    assert a.negative_pairs == b.negative_pairs


def test_a_box_over_two_zones_grounds_only_the_zone_its_mask_lies_in():
    from cxrground.ils.spatial.base import Box
    from cxrground.ils.verify import boxes_mask, verify_location

    upper, base = np.zeros(SHAPE, bool), np.zeros(SHAPE, bool)
    upper[0:10, 0:10], base[10:20, 0:10] = True, True
    right = upper | base
    locations = {"right upper zone lung": upper, "right lung base": base, "right lung": right,
                 "right mid zone lung": np.zeros(SHAPE, bool)}
    box = Box(2, 4, 8, 16, 1.0)  # x0, y0, x1, y1: spans both zones
    drawn = np.zeros(SHAPE, bool)
    drawn[12:16, 3:7] = True  # the mask left in it lies in the base only
    rl = ("right upper zone lung", "right lung base")
    by_box = verify_location(rl, locations, [box])
    by_mask = verify_location(rl, locations, [box], covered=boxes_mask([box], SHAPE) & drawn)
    assert by_box.grounded == rl and by_box.complete
    assert by_mask.grounded == ("right lung base",) and not by_mask.complete
    whole = verify_location(("right lung",), locations, [box], covered=boxes_mask([box], SHAPE) & drawn)
    assert whole.grounded == ("right lung base",)  # refined into the zones the mask reaches
