"""Rule-based structurer: negation, hedges, pseudo-negations, attribution, location lexicon, registry and CLI."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from cxrground.errors import ConfigError
from cxrground.reports import parse_report_text
from cxrground.reports.findings import Finding
from cxrground.reports.structure import (
    STRUCTURERS,
    RuleStructurer,
    get_structurer,
    structure_report,
    structure_reports,
    structure_text,
)
from cxrground.reports.structure.lexicon import CUE_KINDS, LOCATION_KINDS, location_labels
from cxrground.vocab import HEART, ILS_LOCATION_LABELS

RB, LB, RM, LM = "right lung base", "left lung base", "right mid zone lung", "left mid zone lung"
RU, LU, RA, LA = "right upper zone lung", "left upper zone lung", "right apical zone lung", "left apical zone lung"
RL, LL = "right lung", "left lung"


def findings(text: str) -> list[Finding]:
    return list(structure_text(text).findings)


def asserted(text: str) -> list[tuple[str | None, str]]:
    """(lesion, assertion) of every finding; non-target findings show their entity in lower case."""
    return [(f.lesion or f.entity.lower(), f.assertion) for f in findings(text)]


def test_paper_example() -> None:
    rep = structure_text("Heart size is normal. The lower lung opacity is pneumonia.")
    assert rep.findings == (
        Finding(entity="opacity", sent_idx=2, assertion="present", lesion="pneumonia",
                location_phrases=("lower lung",), reported_location=(RB, LB), source="rules"),
    )
    f = rep.findings[0]
    assert (f.presence, f.certainty) == ("positive", "definitive")
    assert rep.section.section_content.startswith("(1) Heart size is normal. (2) ")


# --- negation ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("text", "expected"), [
    ("No pleural effusion.", [("effusion", "absent")]),
    ("There is no focal consolidation.", [("consolidation", "absent")]),
    ("No evidence of pneumonia.", [("pneumonia", "absent")]),
    ("Mild cardiomegaly without pulmonary edema.", [("cardiomegaly", "present"), ("edema", "absent")]),
    ("The lungs are free of any focal infiltrates.", [("opacity", "absent")]),
    ("The lungs are clear of consolidation.", [("consolidation", "absent")]),
    ("Negative for focal pulmonary consolidation.", [("consolidation", "absent")]),
    ("Absence of pleural effusion.", [("effusion", "absent")]),
    ("Neither effusion nor pneumothorax.", [("effusion", "absent"), ("pneumothorax", "absent")]),
    ("There is not an effusion.", [("effusion", "absent")]),
    ("No definite pleural effusion.", [("effusion", "absent")]),
    ("No new consolidation.", [("consolidation", "absent")]),
    ("The effusion is no longer seen.", [("effusion", "absent")]),
    ("Pneumothorax is not identified.", [("pneumothorax", "absent")]),
    ("Pleural effusion and pneumothorax are not seen.", [("effusion", "absent"), ("pneumothorax", "absent")]),
    ("The right upper lobe opacity has cleared.", [("opacity", "absent")]),
    ("The effusion is absent.", [("effusion", "absent")]),
    ("Resolved left pleural effusion.", [("effusion", "absent")]),
    ("The right pleural effusion has resolved.", [("effusion", "absent")]),
    ("Interval resolution of the left lower lobe pneumonia.", [("pneumonia", "absent")]),
    ("The heart is not enlarged.", [("cardiomegaly", "absent")]),
    ("Cleared left lower lobe airspace disease.", [("opacity", "absent")]),
    ("Pulmonary vascular congestion appears within normal limits.", [("pulmonary vascular congestion", "absent")]),
    ("There is no focal air space opacity to suggest a pneumonia.", [("opacity", "absent"), ("pneumonia", "absent")]),
])
def test_negation(text: str, expected: list[tuple[str, str]]) -> None:
    assert asserted(text) == expected


def test_list_under_one_negation() -> None:
    assert asserted("No pleural effusion or pneumothorax.") == [("effusion", "absent"), ("pneumothorax", "absent")]
    assert asserted("No focal consolidation, pleural effusion, or pneumothorax.") == [
        ("consolidation", "absent"), ("effusion", "absent"), ("pneumothorax", "absent")]
    assert asserted("Lungs are clear without focal airspace opacity, pleural effusion, or pneumothorax.") == [
        ("opacity", "absent"), ("effusion", "absent"), ("pneumothorax", "absent")]
    assert asserted("No pneumonia, effusions, edema, pneumothorax, nodules or masses.") == [
        ("pneumonia", "absent"), ("effusion", "absent"), ("edema", "absent"), ("pneumothorax", "absent"),
        ("nodules", "absent"), ("masses", "absent")]


def test_negated_then_affirmed() -> None:
    assert asserted("No effusion, but there is new right lower lobe opacity.") == [
        ("effusion", "absent"), ("opacity", "present")]
    assert asserted("No pneumothorax and the heart is enlarged.") == [("pneumothorax", "absent"),
                                                                       ("cardiomegaly", "present")]
    assert asserted("Possible small right effusion, no pneumothorax.") == [("effusion", "uncertain"),
                                                                            ("pneumothorax", "absent")]
    assert asserted("No cardiomegaly with bilateral small pleural effusions.") == [("cardiomegaly", "absent"),
                                                                                    ("effusion", "present")]
    assert asserted("Pneumothorax is not seen and there is a small left effusion.") == [
        ("pneumothorax", "absent"), ("effusion", "present")]


@pytest.mark.parametrize("text", [
    "The effusion is not significantly changed.",
    "No change in the left pleural effusion.",
    "No significant interval change in the right pleural effusion.",
    "Right pleural effusion, without interval change.",
    "No increase in the small left pleural effusion.",
    "Decreased right pleural effusion.",
    "Improved left pleural effusion.",
    "Resolving left pleural effusion.",
])
def test_pseudo_negation_and_change_words_stay_present(text: str) -> None:
    assert asserted(text) == [("effusion", "present")]


# --- hedges -------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("text", [
    "Possible pneumonia.",
    "Pneumonia is possible.",
    "Possibly pneumonia in the right lower lobe.",
    "Findings may represent pneumonia.",
    "There might be early pneumonia.",
    "Cannot exclude pneumonia.",
    "Pneumonia cannot be excluded.",
    "Pneumonia can not be excluded.",
    "Pneumonia is not excluded.",
    "Cannot rule out pneumonia.",
    "Pneumonia cannot be ruled out.",
    "Likely pneumonia.",
    "Pneumonia is likely.",
    "Findings suggestive of pneumonia.",
    "Findings suggest pneumonia.",
    "Findings concerning for pneumonia.",
    "Findings suspicious for pneumonia.",
    "Questionable pneumonia.",
    "Question of pneumonia.",
    "Probable pneumonia.",
    "Probably pneumonia.",
    "Findings could reflect pneumonia.",
    "Findings could represent pneumonia.",
    "Suspected pneumonia.",
    "Pneumonia is suspected.",
    "Difficult to exclude pneumonia.",
    "Presumed pneumonia.",
    "Differential diagnosis includes pneumonia.",
    "Pneumonia?",
    "Atypical pneumonia is another consideration.",
    "Possibility of pneumonia.",
])
def test_hedges_are_uncertain_never_absent(text: str) -> None:
    assert asserted(text) == [("pneumonia", "uncertain")]


def test_cannot_exclude_is_never_absent_even_in_lists() -> None:
    assert asserted("Cannot exclude pneumonia or small effusion.") == [("pneumonia", "uncertain"),
                                                                       ("effusion", "uncertain")]
    assert asserted("A small left pleural effusion cannot be excluded.") == [("effusion", "uncertain")]
    assert asserted("No pneumothorax. Pneumonia not excluded.") == [("pneumothorax", "absent"),
                                                                    ("pneumonia", "uncertain")]


def test_versus_and_alternatives() -> None:
    assert asserted("Atelectasis versus pneumonia.") == [("atelectasis", "uncertain"), ("pneumonia", "uncertain")]
    assert asserted("Atelectasis vs. pneumonia.") == [("atelectasis", "uncertain"), ("pneumonia", "uncertain")]
    assert asserted("Left base atelectasis/infiltrate.") == [("atelectasis", "uncertain"), ("opacity", "uncertain")]
    assert asserted("Scarring versus small effusion.") == [("scarring", "uncertain"), ("effusion", "uncertain")]


def test_borderline_heart() -> None:
    assert asserted("Borderline cardiomegaly.") == [("cardiomegaly", "uncertain")]
    assert asserted("The heart is borderline enlarged.") == [("cardiomegaly", "uncertain")]
    for normal in ("Heart size is at the upper limits of normal.", "Heart size is top normal.",
                   "Heart size is normal.", "The cardiomediastinal silhouette is within normal limits."):
        assert findings(normal) == []


@pytest.mark.parametrize(("text", "assertion"), [
    ("Cardiomegaly.", "present"),
    ("The heart is mildly enlarged.", "present"),
    ("Heart size is moderately enlarged.", "present"),
    ("The cardiac silhouette is enlarged.", "present"),
    ("Enlarged cardiac silhouette.", "present"),
    ("Enlarged heart.", "present"),
    ("Cardiac enlargement.", "present"),
    ("Heart size mildly to moderately enlarged.", "present"),
    ("The cardiac silhouette is likely mildly enlarged.", "uncertain"),
    ("Heart size may be enlarged.", "uncertain"),
    ("No cardiomegaly.", "absent"),
    ("The cardiac silhouette is not enlarged.", "absent"),
])
def test_cardiomegaly_phrasings(text: str, assertion: str) -> None:
    (f,) = findings(text)
    assert (f.lesion, f.assertion, f.reported_location, f.location_phrases) == ("cardiomegaly", assertion, (HEART,), ())


def test_normal_statements_give_no_finding() -> None:
    text = ("The lungs are clear. Lungs are well expanded and clear. Heart size is normal. "
            "No acute cardiopulmonary process. Mediastinal and hilar contours are unremarkable.")
    assert findings(text) == []


# --- attribution (predicted lesion type) --------------------------------------------------------------------------

@pytest.mark.parametrize(("text", "expected"), [
    ("Right lower lobe opacity concerning for pneumonia.", [("opacity", "pneumonia", "uncertain", (RB,))]),
    ("Bibasilar opacities, likely atelectasis.", [("opacities", "atelectasis", "uncertain", (RB, LB))]),
    ("Left lower lobe opacity is consistent with pneumonia.", [("opacity", "pneumonia", "present", (LB,))]),
    ("Opacity is likely atelectasis.", [("Opacity", "atelectasis", "uncertain", (RL, LL))]),
    ("Linear opacities at the left base are consistent with atelectasis.",
     [("opacities", "atelectasis", "present", (LB,))]),
    ("Patchy consolidation in the right middle lobe is compatible with pneumonia.",
     [("consolidation", "pneumonia", "present", (RM,))]),
    ("Left basilar opacity, likely consolidation.", [("opacity", "consolidation", "uncertain", (LB,))]),
    ("Right basilar opacity, atelectasis versus pneumonia.",
     [("opacity", "atelectasis", "uncertain", (RB,)), ("opacity", "pneumonia", "uncertain", (RB,))]),
    ("Haziness and vascular indistinctness are consistent with pulmonary edema.",
     [("Haziness", "edema", "present", (RL, LL))]),
    ("Blunting of the left costophrenic angle may represent a small pleural effusion.",
     [("pleural effusion", "effusion", "uncertain", (LB,))]),
    # an alternative of the observation's own type is the observation itself
    ("Streaky opacities in the left base, atelectasis versus infiltrate.",
     [("opacities", "opacity", "present", (LB,)), ("opacities", "atelectasis", "uncertain", (LB,))]),
    # not attributed: coordination without a link, "and" without a verb before the link (the place is shared)
    ("Left base opacity and atelectasis.", [("opacity", "opacity", "present", (LB,)),
                                             ("atelectasis", "atelectasis", "present", (LB,))]),
    ("Left basilar opacity and blunting of the costophrenic angle secondary to small effusion.",
     [("opacity", "opacity", "present", (LB,)), ("effusion", "effusion", "present", (RB, LB))]),
])
def test_attribution(text: str, expected: list[tuple[str, str, str, tuple[str, ...]]]) -> None:
    got = [(f.entity, f.lesion, f.assertion, f.reported_location) for f in findings(text)]
    assert got == expected


def test_attribution_to_non_target_keeps_the_observation() -> None:
    got = [(f.entity, f.lesion, f.assertion) for f in findings("Right apical opacity may represent scarring.")]
    assert got == [("opacity", "opacity", "present"), ("scarring", None, "uncertain")]


# --- locations ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("phrase", "labels"), [
    ("bilateral", (RL, LL)), ("in both lungs", (RL, LL)), ("diffuse", (RL, LL)), ("multifocal", (RL, LL)),
    ("in the right lung", (RL,)), ("in the left lung", (LL,)), ("in the left hemithorax", (LL,)),
    ("on the right side", (RL,)), ("right-sided", (RL,)), ("left", (LL,)),
    ("bibasilar", (RB, LB)), ("bibasal", (RB, LB)), ("at both bases", (RB, LB)), ("in the lower lungs", (RB, LB)),
    ("at the lung bases", (RB, LB)), ("basilar", (RB, LB)),
    ("at the right base", (RB,)), ("at the left lung base", (LB,)), ("right basilar", (RB,)), ("left basal", (LB,)),
    ("in the right lower lobe", (RB,)), ("in the left lower lobe", (LB,)), ("RLL", (RB,)), ("LLL", (LB,)),
    ("retrocardiac", (LB,)), ("at the right costophrenic angle", (RB,)), ("left costophrenic", (LB,)),
    ("left lower lung zone", (LB,)),
    ("in the right middle lobe", (RM,)), ("RML", (RM,)), ("middle lobe", (RM,)), ("in the lingula", (LM,)),
    ("lingular", (LM,)), ("right heart border", (RM,)),
    ("in the right mid lung", (RM,)), ("left midlung", (LM,)), ("right perihilar", (RM,)),
    ("left perihilar", (LM,)), ("bilateral perihilar", (RM, LM)), ("perihilar", (RM, LM)),
    ("in the right upper lobe", (RU,)), ("in the left upper lobe", (LU,)), ("RUL", (RU,)), ("LUL", (LU,)),
    ("left upper lung", (LU,)), ("in the upper lobes", (RU, LU)),
    ("at the right apex", (RA,)), ("left apical", (LA,)), ("at the apices", (RA, LA)),
    ("in the right mid and lower lung zones", (RM, RB)), ("in the right upper and middle lobes", (RU, RM)),
    ("in the right and left lower lobes", (RB, LB)), ("in the left and right lower lobes", (LB, RB)),
    ("in the lower lung", (RB, LB)), ("in the right hilum", (RM,)),
])
def test_location_lexicon(phrase: str, labels: tuple[str, ...]) -> None:
    (f,) = findings(f"Opacity {phrase}.")
    assert f.reported_location == labels
    assert all(label in ILS_LOCATION_LABELS for label in f.reported_location)
    assert f.location_phrases


def test_location_order_is_first_mention_and_defaults() -> None:
    (f,) = findings("Opacities in the left lower lobe and right upper lobe.")
    assert f.reported_location == (LB, RU) and f.location_phrases == ("left lower lobe", "right upper lobe")
    (f,) = findings("Bibasilar and right midlung pulmonary opacities.")
    assert f.reported_location == (RB, LB, RM)
    (f,) = findings("Pulmonary edema.")  # lung lesion without location -> both lungs
    assert f.reported_location == (RL, LL) and f.location_phrases == ()
    (f,) = findings("Small right pleural effusion.")  # effusion with side only -> that lung
    assert f.reported_location == (RL,)
    (f,) = findings("Moderate bilateral pleural effusions, left greater than right.")
    assert f.reported_location == (RL, LL)
    (f,) = findings("Fracture of the left clavicle.")  # side words before other anatomy are no location
    assert f.reported_location == () and f.lesion is None


def test_each_finding_gets_its_own_location() -> None:
    got = [(f.lesion, f.reported_location) for f in findings(
        "Left lower lobe consolidation and small right pleural effusion.")]
    assert got == [("consolidation", (LB,)), ("effusion", (RL,))]
    got = [(f.lesion, f.reported_location) for f in findings(
        "Bibasilar airspace opacities are identified with bilateral pleural effusions.")]
    assert got == [("opacity", (RB, LB)), ("effusion", (RL, LL))]
    got = [(f.lesion, f.reported_location) for f in findings(
        "Elevated right hemidiaphragm with minimal right base subsegmental atelectasis.")]
    assert got == [("atelectasis", (RB,))]


def test_location_labels_helper() -> None:
    kinds = set(LOCATION_KINDS.values())
    assert kinds == {"border", "retro", "abbr", "fissure", "noop", "paired", "zoned", "both", "whole", "diaphragm"}
    assert location_labels("fissure", "minor fissure") == (RM,)
    assert location_labels("retro", "behind the heart") == (LB,)
    assert location_labels("retro", "posterior to the right heart") == (RB,)
    assert location_labels("zoned", "bibasilar") == (RB, LB)
    assert location_labels("paired", "right upper and left lower lobes") == (RU, LB)
    assert location_labels("noop", "right hemidiaphragm") == ()
    assert location_labels("diaphragm", "adjacent to the left hemidiaphragm") == (LB,)
    assert set(CUE_KINDS.values()) >= {"pseudo", "neg_pre", "neg_post", "unc_pre", "unc_post", "link", "term"}


# --- reports, registry, CLI --------------------------------------------------------------------------------------

REPORT = """FINAL REPORT
 INDICATION:  Cough. Evaluate for pneumonia.

 FINDINGS:  Heart size is normal. There is a right lower lobe opacity,
 possibly pneumonia.  No pleural effusion or pneumothorax.

 IMPRESSION:  Possible right lower lobe pneumonia.
"""


def test_structure_report_uses_the_chosen_section() -> None:
    rep = parse_report_text(REPORT, "s1")
    out = structure_report(rep, RuleStructurer())
    assert out is not None and out.section.name == "findings" and out.report_id == "s1"
    got = [(f.sent_idx, f.lesion or f.entity, f.assertion, f.reported_location) for f in out.findings]
    assert got == [(2, "pneumonia", "uncertain", (RB,)), (3, "effusion", "absent", (RL, LL)),
                   (3, "pneumothorax", "absent", (RL, LL))]
    assert [f.lesion for f in out.lesion_findings()] == ["pneumonia", "effusion"]
    empty = parse_report_text("INDICATION: cough\n", "s2")
    assert structure_report(empty, RuleStructurer()) is None
    done, failed = structure_reports([rep, empty], get_structurer("rules"), progress=False)
    assert [d.report_id for d in done] == ["s1"]
    assert [(f.path, f.stage, f.reason) for f in failed] == [("s2", "structure", "no usable section")]


def test_registry() -> None:
    assert set(STRUCTURERS) == {"rules", "llm"}
    assert isinstance(get_structurer("rules"), RuleStructurer)
    with pytest.raises(ConfigError):
        get_structurer("spacy")
    with pytest.raises(ConfigError):
        get_structurer("llm", base_url="", model="m")


def test_cli_rules(tmp_path: Path) -> None:
    importlib.import_module("cxrground.cli.structure_cmds")  # registers `reports structure`
    from cxrground.cli import main

    (tmp_path / "s1.txt").write_text(REPORT)
    (tmp_path / "s2.txt").write_text("INDICATION: cough\n")
    result = CliRunner().invoke(main, ["reports", "structure", str(tmp_path)])
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in result.output.splitlines()]
    found = [r for r in rows if "failure" not in r]
    assert [(r["report_id"], r["sent_idx"], r["lesion"], r["assertion"]) for r in found] == [
        ("s1", 2, "pneumonia", "uncertain"), ("s1", 3, "effusion", "absent"), ("s1", 3, None, "absent")]
    assert found[0]["certainty"] == "tentative" and found[0]["reported_location"] == [RB]
    assert found[0]["sentence"].startswith("There is a right lower lobe opacity")
    assert [r["failure"]["reason"] for r in rows if "failure" in r] == ["no usable section"]

    out = tmp_path / "out" / "findings.jsonl"
    result = CliRunner().invoke(main, ["reports", "structure", str(tmp_path / "s1.txt"), str(tmp_path / "s2.txt"),
                                       "--out", str(out)])
    assert result.exit_code == 0
    assert len(out.read_text().splitlines()) == 3
    # the failures file holds flat objects, as every failures.jsonl does (stdout wraps them to tell them apart)
    assert set(failure := json.loads((out.parent / "findings.jsonl.failures.jsonl").read_text())) == {
        "path", "stage", "reason", "error", "report"}
    assert failure["path"] == str(tmp_path / "s2.txt") and failure["report"] == "s2"
    # LLM options are checked before any work
    result = CliRunner().invoke(main, ["reports", "structure", str(tmp_path / "s1.txt"), "--structurer", "llm"])
    assert result.exit_code == 2 and "--base-url" in result.output


#: A fixed corpus for the rules-version guard (never extend it: a new sentence would move the pinned hash).
_VERSION_CORPUS = (
    "No focal consolidation, pleural effusion or pneumothorax.",
    "Small right and moderate left pleural effusions with adjacent atelectasis.",
    "Right lower lobe opacity concerning for pneumonia.",
    "Probable left lower lobe pneumonia.",
    "Atelectasis or scarring at the right base.",
    "The heart is mildly enlarged.",
    "Borderline cardiomegaly.",
    "Mild pulmonary edema cannot be excluded.",
    "History of pneumonia.",
    "Diffuse right lower lobe airspace opacity.",
    "Patchy opacity in the left perihilar upper lobe.",
    "Consolidation, atelectasis, and blunting at the left base have cleared in the interval.",
    "On the prior outside CT, the left lower lobe was consolidated.",
    "There is a bandlike opacity at the left base. This likely represents atelectasis.",
    "Patchy retrocardiac opacity XXXX atelectasis.",
    "Improved aeration of the lung bases with a small residual left basilar effusion.",
    "Bilateral interstitial opacities, which may represent edema or atypical infection.",
    "No pneumothorax, small right pleural effusion.",
    "Left base opacity, atelectasis versus bacterial pneumonia.",
    "Focal opacity in the right mid lung may represent a nipple shadow.",
    "Left lower lobe collapse and consolidation.",
    "Multifocal consolidations in the right upper and left lower lobes.",
    "Left lower lobe opacity, which could be atelectasis but pneumonia is not excluded.",
    "Left lower lobe consolidation is seen, not present on prior.",
    "The left lung is clear except for minimal basilar atelectasis.",
    "Subtle opacity at the right base, cannot exclude pneumonia.",
    "Blunted left costophrenic angle likely reflects pleural thickening.",
    "Near whiteout of the left hemithorax.",
    "Almost complete resolution of the right lower lobe opacity.",
    "Resolving right middle lobe pneumonia, with residual opacity.",
    "RLL opacity c/w pneumonia.",
    "LLL consolidation, ? PNA.",
    "Right basilar atelectasis. Underlying infection is not excluded.",
    "Heart size is normal to mildly enlarged.",
    "No evidence of pleural effusion on the left, small effusion on the right.",
    "Fluid tracking along the minor fissure.",
    "The left costophrenic angle is mildly blunted.",
    "Increased heart size.",
    "Right lower lobe opacity. Findings are concerning for pneumonia.",
    "Opacity in the right lung, most pronounced at the base.",
    "Consolidation in the right upper lobe and effusion on the left.",
    "Opacities in the right upper lobe and the left lower lobe.",
    "No evidence of worsening edema.",
    "Multifocal opacities, most prominent in the left upper lobe.",
    "Lt basal opacity and patchy shadowing in the rt. lower zone.",
    "No effusion and mild cardiomegaly.",
    "The left hemidiaphragm is obscured, likely due to atelectasis.",
    "Consolidation in the right lower lobe with air bronchograms, consistent with pneumonia.",
    "Slightly improved left basilar opacity with persistent small effusion.",
    "Small effusion cannot be assessed as the costophrenic angles are excluded.",
    "Airspace opacities in the middle and lower zones.",
    "Small bilateral pleural effusions are likely present.",
    "Minimal fluid in the right costophrenic angle.",
    "Basal atelectasis on the right, small effusion on the left.",
    "Effusions are larger on the right.",
    "Tiny if any left pleural effusion.",
    "A left effusion is again suggested.",
    "No significant effusion; trace left effusion possible.",
    "Left basilar opacity. Atelectasis is favored over pneumonia.",
    "Opacity at the left base. Small adjacent effusion.",
    "Possible pneumonia, moderate cardiomegaly.",
    "No pneumothorax, and small left effusion.",
    "Patchy GGOs in both lower zones. LLL atx. Small left PTX.",
    "Airspace changes in the right lower zone. Infective changes at the right base.",
    "Pneumonia is excluded. Left pleural effusion has disappeared.",
    "Right basilar atelectasis, pneumonia not excluded.",
    "Small left effusion, atelectasis vs consolidation at the left base.",
    "Pulmonary edema, likely cardiogenic, with bilateral effusions.",
    "Bibasilar opacities, likely atelectasis, with small bilateral effusions.",
    "Opacity at the base of the right lung. Opacities, particularly at the mid zone of the left lung.",
    "Subtle bilateral opacification predominantly in the right upper and both mid zones.",
    "Consolidation in the right lower lobe, likely infectious. Effusion, if present, is small.",
    "Right upper lobe mass-like consolidation.",
    "The cardiac silhouette is prominent. Heart size is normal, prominent pulmonary arteries.",
    "Heart size is upper normal to mildly enlarged. Heart size is upper limits of normal.",
    "The opacity is not consistent with pneumonia. Findings do not suggest edema. Nothing to suggest effusion.",
    "The appearance argues against pneumonia. The study is limited for evaluation of effusion.",
    "Pneumonia has not developed. Lack of pleural effusion. Early infection may be radiographically occult.",
    "Absent pleural effusion. Consolidation: none. No pneumothorax small left effusion. Small R effusion.",
    "Pneumonia is difficult to exclude at the right base. Re-expansion of the collapsed left lower lobe.",
    "Small left pleural effusoin. Cardiomegaly, difficult to assess due to rotation. Right paratracheal opacity.",
    "The right lung is clear without consolidation. The right effusion has resolved while the left is unchanged.",
    "Small R > L pleural effusions. Heart size is unchanged from prior, mildly enlarged. Hx pneumonia.",
    "Eval for infiltrate. R/o PNA. Clinical concern for pneumonia. Lungs are clear; no effusion.",
    "No resolution of the bibasilar atelectasis. Not consistent with pneumonia. Cannot r/o PNA. Query right basal "
    "consolidation. Findings indicating edema.",
    "CTR 0.62. Heart: Enlarged. Left effusion and basal atelectasis. Bilateral airspace dz. Although no consolidation "
    "is seen, pneumonia cannot be excluded.",
    "Cardiothoracic index increased. Condensation in the LLL. Bacterial pneumonia favored. Opacities, atypical "
    "pneumonia in the differential. Patchy opacities, can be seen with pneumonia. Pneumonia to be considered.",
    "Rt basal atelectasis, Lt small effusion. Lungs are edematous. No pleural a fusion. Prominent thymic shadow, "
    "not to be confused with consolidation. Foreign body aspiration. Mild cardiomegaly (CTR 0.55).",
    "Pleural effusion has resolved on the right but persists on the left. Atelectasis has resolved at the right base; "
    "it persists at the left base. The heart is top-normal in size to mildly enlarged.",
    "Patchy consolidation in peripheral right midzone. Bilateral upper-lobe predominant opacities. Atelectasis in the "
    "left mid-zone and lower-zone.",
    "Patchy opacities in the right lower lobe and lingula, consistent with pneumonia. Left upper lobe opacity with "
    "volume loss, compatible with atelectasis. Perihilar haziness with upper lobe diversion, in keeping with oedema.",
    "Perihilar opacities, more on the right, likely reflect edema. Opacity at the right base. Findings are "
    "consistent with pulmonary edema.",
    "Small left pleural effusion with adjacent atelectasis. Bilateral effusions with associated atelectasis.",
    "Mild left peri-hilar opacity. Consolidation in the lower zone of the right-lung and in the apical segment of the "
    "LUL. Small opacity in the right upper perihilar region. Diffuse consolidations, particularly visible in the RUL. "
    "Her husband was hospitalized with pneumonia. COVID-19 pneumonia.",
    "Consolidation in the apex of the right lower lobe and in the apical segment of the LUL.",
    "Mild edema of the soft tissues of the chest wall. No longer seen is the previously noted right basilar "
    "consolidation. Enlarged cardiac silhouette, which may reflect cardiomegaly or pericardial effusion. Loculated "
    "right pleural empyema. Heart: normal size.",
    "The heart shadow and mediastinal contours are not enlarged. Cardio mediastinal silhouettes are unremarkable. "
    "Bilateral interstitial prominence. Patchy retrocardiac opacity. No pneumothorax. The differential could include "
    "interstitial edema, infectious process or interstitial disease.",
    "The heart is enlarged, consistent with cardiomegaly. Right lower lobe pneumonia, the pneumonia is unchanged. Left "
    "effusion and right effusion. No focal opacity or infiltrate. Left lower lobe opacity could be atelectasis, "
    "aspiration, or pneumonia. The heart is enlarged, which may represent cardiomegaly.",
)
#: sha256 of the corpus's finding rows under both alternatives policies, per :data:`RULES_VERSION`.
_PINNED_OUTPUT = {"58": "5bc1a8356de2e5619bd8d3ae39491dbc5ff8bdbfdc9c5057089abb8ffc7afddb"}


def test_rules_version_is_bumped_when_the_output_changes() -> None:
    """``ils build`` resumes only a build made by the same rules (the version is in the backends identity): if
    this fails, the rules now read reports differently, so bump ``RULES_VERSION`` and pin the new hash."""
    import hashlib

    from cxrground.reports import make_section_choice
    from cxrground.reports.structure import ALTERNATIVE_POLICIES, RULES_VERSION

    h = hashlib.sha256()
    for policy in ALTERNATIVE_POLICIES:
        structurer = RuleStructurer(alternatives=policy)
        for i, text in enumerate(_VERSION_CORPUS):
            section = make_section_choice("findings", text)
            assert section is not None
            for row in structurer.structure(f"v{i}", section).finding_rows():
                h.update(json.dumps(row, sort_keys=True).encode() + b"\n")
    assert _PINNED_OUTPUT.get(RULES_VERSION) == h.hexdigest(), (
        f"rule output changed under RULES_VERSION {RULES_VERSION!r}: bump it and pin {h.hexdigest()}")


@pytest.mark.parametrize(("text", "expected"), [
    ("Perihilar and apical, mostly peripheral, opacifications bilaterally.", ("opacity", "present")),
    ("Patchy areas of air space opacifications in both lungs.", ("opacity", "present")),
    ("Diffuse reticular pattern in both lungs.", ("reticular pattern", "present")),
    ("A reticular-nodular pattern in both lungs was observed.", ("reticular-nodular pattern", "present")),
    ("Typical findings of acute respiratory distress syndrome.", ("acute respiratory distress syndrome", "present")),
    ("Evaluate for ARDS.", ("ards", "uncertain")),
])
def test_plural_opacifications_reticular_patterns_and_ards(text: str, expected: tuple[str, str]) -> None:
    """The plural is an opacity; reticular patterns and ARDS are non-target lung findings (no lesion, both lungs)."""
    from cxrground.reports.structure import structure_text

    findings = structure_text(text).findings
    assert findings, text
    first = findings[0]
    assert ((first.lesion or first.entity.lower()), first.assertion) == expected
    assert set(first.reported_location) >= {"right lung", "left lung"}
    if first.lesion is None:
        assert all(f.lesion is None for f in findings)


@pytest.mark.parametrize(("text", "reads"), [
    ("Fever and two days of odynophagia", False),
    ("Intensive care study", False),
    ("Chest pain.", False),
    ("Examination within the limits of the norm.", True),
    ("Fever for ten days with dry cough. Normal examination.", True),
    ("No significant findings. Lungs clear.", True),
    ("No acute cardiopulmonary process.", True),
    ("No evidence of acute disease.", True),
    ("The lungs are well aerated.", True),
    ("No pneumothorax.", True),
    ("Small right pleural effusion.", True),
])
def test_reads_the_film(text: str, reads: bool) -> None:
    """A report reads the film with a finding of any kind or a normal-examination statement, not otherwise."""
    from cxrground.reports.reading import reads_the_film
    from cxrground.reports.structure import structure_text

    assert reads_the_film(structure_text(text)) is reads


def test_cli_names_reports_that_say_nothing_about_the_film(tmp_path: Path) -> None:
    """`reports structure` names, on stderr, the reports that do not read the film."""
    importlib.import_module("cxrground.cli.structure_cmds")
    from cxrground.cli import main

    (tmp_path / "note1.txt").write_text("Fever and two days of odynophagia.\n")
    (tmp_path / "note2.txt").write_text("Fever and cough. Normal appearances.\n")
    (tmp_path / "note3.txt").write_text("Small right pleural effusion.\n")
    out = tmp_path / "findings.jsonl"
    result = CliRunner().invoke(main, ["reports", "structure", str(tmp_path), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "1 of 3 reports name no finding and no normal examination" in result.output
    assert result.output.rstrip().endswith(": note1")


@pytest.mark.parametrize(("text", "found"), [
    ("Small consolidation in right upper lobe and ground-glass opacities in both lower lobes were observed on "
     "high-resolution computed tomography scan.",
     [(None, "consolidation", ("right upper zone lung",)),
      (None, "ground-glass opacities", ("right lung base", "left lung base"))]),
    ("Axial CT scan(B)shows consolidation in the right lower lobe.", [(None, "consolidation", ("right lung base",))]),
    ("CT of the chest showed a right lower lobe pneumonia.", [(None, "pneumonia", ("right lung base",))]),
    # the radiograph is named: its findings stay
    ("AP chest radiograph shows extensive bilateral ground-glass opacities as demonstrated on the recent CT.",
     [("opacity", "ground-glass opacities", ("right lung", "left lung"))]),
    # a comparison with a CT, not a CT's finding
    ("Right lower lobe opacity, better seen on the CT.", [("opacity", "opacity", ("right lung base",))]),
])
def test_findings_read_on_a_ct_are_not_lesions_of_the_radiograph(text: str, found: list) -> None:
    """A sentence that reports what a CT showed, and names no radiograph, gives non-target findings only: they keep
    their places (negatives stay away) but are no lesion of this film."""
    from cxrground.ils.compose import compose_pairs
    from cxrground.ils.config import IlsConfig
    from cxrground.reports.reading import reads_the_film
    from cxrground.reports.structure import structure_text

    report = structure_text(text)
    assert [(f.lesion, f.entity.lower(), f.reported_location) for f in report.findings] == found
    assert reads_the_film(report)
    if found[0][0] is None:  # no positive pair, no mask from such a sentence
        out = compose_pairs("s1", report.findings, [], [], None, None, IlsConfig())
        assert not out.positive_pairs and not out.masks


@pytest.mark.parametrize(("text", "expected"), [
    ("Diffuse bilateral airspace opacities compatible with ARDS or multifocal pneumonia.",
     {("pneumonia", "uncertain", (RL, LL))}),
    ("Diffuse bilateral airspace opacities compatible with edema or multifocal pneumonia.",
     {("edema", "uncertain", (RL, LL)), ("pneumonia", "uncertain", (RL, LL))}),
    ("Left base opacity, atelectasis versus bacterial pneumonia.",
     {("atelectasis", "uncertain", (LB,)), ("pneumonia", "uncertain", (LB,))}),
    ("Perihilar opacities may reflect edema or atypical infection.",
     {("edema", "uncertain", (RM, LM)), ("pneumonia", "uncertain", (RM, LM))}),
    ("Interstitial opacities may represent interstitial edema or viral pneumonia.",
     {("edema", "uncertain", (RL, LL)), ("pneumonia", "uncertain", (RL, LL))}),
    ("Right basilar opacity may be atelectasis or patchy pneumonia.",
     {("atelectasis", "uncertain", (RB,)), ("pneumonia", "uncertain", (RB,))}),
    ("Retrocardiac opacity, atelectasis or moderate effusion.",
     {("atelectasis", "uncertain", (LB,)), ("effusion", "uncertain", (LB,))}),
])
def test_alternatives_whose_second_phrase_has_a_modifier(text: str, expected: set) -> None:
    """A differential stays a differential, at the observation's location, whatever modifies its second phrase."""
    got = {(f.lesion, f.assertion, f.reported_location) for f in findings(text) if f.lesion in
           {lesion for lesion, _, _ in expected}}
    assert got == expected


@pytest.mark.parametrize(("text", "where"), [
    ("Focal opacity in the right mid lung may represent a nipple shadow.", (RM,)),
    ("Opacity at the left base likely reflects overlying soft tissue.", (LB,)),
    ("Right basilar opacity is likely due to overlapping breast tissue.", (RB,)),
])
def test_an_opacity_explained_by_a_projection_mimic_is_no_lung_lesion(text: str, where: tuple[str, ...]) -> None:
    """No lesion, so no mask and no positive pair; the observation still names its place, so no negative goes there."""
    found = findings(text)
    assert all(f.lesion is None for f in found)
    (obs,) = [f for f in found if f.reported_location]
    assert obs.reported_location == where and "opacity" in obs.entity.lower()


def test_a_mimic_among_alternatives_leaves_the_lesion_and_names_no_lung_place() -> None:
    found = findings("Opacity at the left base may represent atelectasis or a nipple shadow.")
    assert [(f.lesion, f.assertion, f.reported_location) for f in found if f.lesion] == [
        ("atelectasis", "uncertain", (LB,))]
    for text in ("Soft tissues are unremarkable.", "Dense breast tissue limits evaluation of the bases."):
        assert all(f.lesion is None and f.reported_location == () for f in findings(text))


@pytest.mark.parametrize(("text", "lesion", "where"), [
    ("Left basilar atelectasis and effusion.", "effusion", (LB,)),
    ("Left lower lobe collapse and consolidation.", "consolidation", (LB,)),
    ("Right lower lobe consolidation and small effusion.", "effusion", (RB,)),
    ("Opacity at the right base likely reflects effusion and atelectasis.", "atelectasis", (RB,)),
    ("Left effusion and pulmonary edema.", "edema", (RL, LL)),
    ("Cardiomegaly and effusion.", "effusion", (RL, LL)),
    ("Left basilar atelectasis and right effusion.", "effusion", (RL,)),
    ("Left basilar atelectasis and effusions.", "effusion", (RL, LL)),
])
def test_a_lesion_coordinated_with_a_placed_one_shares_its_place(text: str, lesion: str, where: tuple) -> None:
    """A place written before two nouns joined by "and" modifies both, unless the second is diffuse or placed."""
    (f,) = [f for f in findings(text) if f.lesion == lesion]
    assert f.reported_location == where


@pytest.mark.parametrize(("text", "where"), [
    ("Multifocal consolidations in the right upper and left lower lobes.", (RU, LB)),
    ("Opacities in the right upper and right lower lobes.", (RU, RB)),
    ("Opacities in the left upper, right mid and left lower lung zones.", (LU, RM, LB)),
    ("Opacities in the right middle and lower lobes.", (RM, RB)),
    ("Consolidation in the right upper lobe and left lower lobe.", (RU, LB)),
])
def test_a_sided_zone_list_with_one_noun_keeps_every_zone(text: str, where: tuple[str, ...]) -> None:
    (f,) = findings(text)
    assert f.reported_location == where


@pytest.mark.parametrize(("text", "where"), [
    ("Patchy opacities at both lung bases may reflect atelectasis, though infection cannot be excluded.", (RB, LB)),
    ("Left lower lobe opacity, which could be atelectasis but pneumonia is not excluded.", (LB,)),
    ("Small right effusion, but no pneumonia.", (RL, LL)),
    # a sentence of hedged diagnoses after an observation: there (report-level rules version 7)
    ("Bibasilar atelectasis. Pneumonia cannot be excluded.", (RB, LB)),
])
def test_a_hedged_lesion_in_a_concessive_clause_lies_where_the_sentence_finding_lies(text: str, where: tuple) -> None:
    (f,) = [f for f in findings(text) if f.lesion == "pneumonia"]
    assert f.reported_location == where


@pytest.mark.parametrize(("text", "lesion", "assertion", "where"), [
    ("Left lower lobe consolidation is seen, not present on prior.", "consolidation", "present", (LB,)),
    ("New right lower lobe opacity, not seen on the prior study.", "opacity", "present", (RB,)),
    ("Right basilar opacity was not present previously.", "opacity", "present", (RB,)),
    ("Left effusion, not visualized on the prior exam, is new.", "effusion", "present", (LL,)),
    ("New left lower lobe consolidation, not seen previously.", "consolidation", "present", (LB,)),
    ("Left lower lobe opacity, not previously seen, is concerning for pneumonia.", "pneumonia", "uncertain", (LB,)),
    # a negation about today's film still negates
    ("No consolidation is seen on the current radiograph.", "consolidation", "absent", (RL, LL)),
    ("The previously seen right lower lobe opacity is no longer visualized.", "opacity", "absent", (RB,)),
    ("Previously described left lower lobe consolidation is not seen on the current study.", "consolidation",
     "absent", (LB,)),
])
def test_a_negation_about_an_earlier_film_does_not_negate_today(text: str, lesion: str, assertion: str,
                                                                 where: tuple[str, ...]) -> None:
    assert [(f.lesion, f.assertion, f.reported_location) for f in findings(text) if f.lesion] == [
        (lesion, assertion, where)]


@pytest.mark.parametrize(("text", "lesion", "where"), [
    ("The left lung is clear except for minimal basilar atelectasis.", "atelectasis", (LB,)),
    ("The right lung is otherwise clear except for a small effusion.", "effusion", (RL,)),
    ("Left lung clear apart from patchy lower lobe opacity.", "opacity", (LB,)),
    ("The lungs are clear except for bibasilar atelectasis.", "atelectasis", (RB, LB)),
    ("Small right effusion. The left lung is clear.", "effusion", (RL,)),
])
def test_a_sided_lung_clear_except_for_gives_its_side(text: str, lesion: str, where: tuple[str, ...]) -> None:
    (f,) = [f for f in findings(text) if f.lesion == lesion]
    assert f.reported_location == where


@pytest.mark.parametrize(("text", "where"), [
    ("Subtle opacity at the right base, cannot exclude pneumonia.", (RB,)),
    ("Right lower lobe opacity; pneumonia is not excluded.", (RB,)),
    ("Small right effusion, cannot exclude pneumonia.", (RL,)),
    # before the placed finding: where the section's placed parenchymal findings lie (report-level rules version
    # 10); in the sentence after, by report-level rules version 7
    ("Possible pneumonia, right lower lobe opacity.", (RB,)),
    ("Bibasilar atelectasis. Pneumonia cannot be excluded.", (RB, LB)),
])
def test_a_hedged_lesion_after_a_placed_finding_of_its_sentence_lies_there(text: str, where: tuple) -> None:
    (f,) = [f for f in findings(text) if f.lesion == "pneumonia"]
    assert (f.assertion, f.reported_location) == ("uncertain", where)


def test_a_hedged_edema_after_a_placed_finding_stays_in_both_lungs() -> None:
    (f,) = [f for f in findings("Right pleural effusion, possible mild edema.") if f.lesion == "edema"]
    assert f.reported_location == (RL, LL)


@pytest.mark.parametrize(("text", "expected"), [
    ("Blunting of the left costophrenic angle.", [(None, "present", (LB,))]),
    ("Right costophrenic angle blunting.", [(None, "present", (RB,))]),
    ("Blunting of both costophrenic angles.", [(None, "present", (RB, LB))]),
    ("Blunted left costophrenic angle likely reflects pleural thickening.",
     [(None, "present", (LB,)), (None, "uncertain", (LB,))]),
    ("Blunting of the right costophrenic angle may reflect a small effusion.", [("effusion", "uncertain", (RB,))]),
])
def test_costophrenic_blunting_is_a_placed_sign_not_an_effusion(text: str, expected: list) -> None:
    assert [(f.lesion, f.assertion, f.reported_location) for f in findings(text)] == expected


@pytest.mark.parametrize(("text", "where"), [
    ("Near whiteout of the left hemithorax.", (LL,)),
    ("White-out of the right lung.", (RL,)),
])
def test_whiteout_is_an_opacity(text: str, where: tuple[str, ...]) -> None:
    assert [(f.lesion, f.reported_location) for f in findings(text)] == [("opacity", where)]


@pytest.mark.parametrize(("text", "assertion"), [
    ("Almost complete resolution of the right lower lobe opacity.", "present"),
    ("Virtually complete resolution of the right lower lobe opacity.", "present"),
    ("Substantial resolution of the right lower lobe opacity.", "present"),
    ("Near-total resolution of the right lower lobe opacity.", "present"),
    ("Interval resolution of the right lower lobe opacity.", "absent"),
    ("Complete resolution of the right lower lobe opacity.", "absent"),
])
def test_only_a_complete_resolution_negates(text: str, assertion: str) -> None:
    (f,) = findings(text)
    assert (f.lesion, f.assertion, f.reported_location) == ("opacity", assertion, (RB,))


@pytest.mark.parametrize(("text", "lesion", "where"), [
    ("Resolving right middle lobe pneumonia, with residual opacity.", "opacity", (RM,)),
    ("Improved left basilar consolidation with residual atelectasis.", "atelectasis", (LB,)),
    ("Left lower lobe consolidation has mostly resolved, with minimal residual atelectasis.", "atelectasis", (LB,)),
    ("Residual right basilar opacity.", "opacity", (RB,)),
])
def test_a_residual_finding_lies_where_the_finding_before_it_lies(text: str, lesion: str, where: tuple) -> None:
    (f,) = [f for f in findings(text) if f.lesion == lesion]
    assert f.reported_location == where


@pytest.mark.parametrize(("text", "expected"), [
    ("RLL opacity c/w pneumonia.", [("pneumonia", "present", (RB,))]),
    ("LLL consolidation, ? PNA.", [("pneumonia", "uncertain", (LB,))]),
    ("No PNA.", [("pneumonia", "absent", (RL, LL))]),
])
def test_report_abbreviations_cw_and_pna(text: str, expected: list) -> None:
    assert [(f.lesion, f.assertion, f.reported_location) for f in findings(text) if f.lesion == "pneumonia"] == expected
    if "c/w" in text:  # the opacity is attributed: one finding
        assert len(findings(text)) == 1


@pytest.mark.parametrize(("text", "where"), [
    ("Moderate left pleural effusion with adjacent compressive atelectasis. Superimposed pneumonia cannot be "
     "excluded.", (LL, LB)),  # the effusion's lung and the atelectasis's base (rules version 53)
    ("Right basilar atelectasis. Underlying infection is not excluded.", (RB,)),
    ("Superimposed infection cannot be excluded.", (RL, LL)),
    ("Mild pulmonary edema. Superimposed infection cannot be excluded.", (RL, LL)),
])
def test_a_sentence_opening_with_superimposed_points_back(text: str, where: tuple[str, ...]) -> None:
    (f,) = [f for f in findings(text) if f.lesion == "pneumonia"]
    assert (f.assertion, f.reported_location) == ("uncertain", where)


def test_adjacent_after_a_sentence_without_a_placed_finding_stays_in_both_lungs() -> None:
    (f,) = findings("Elevated left hemidiaphragm. Adjacent atelectasis is not excluded.")
    assert (f.lesion, f.reported_location) == ("atelectasis", (RL, LL))


@pytest.mark.parametrize(("text", "assertion"), [
    ("Heart size is normal to mildly enlarged.", "uncertain"),
    ("The heart is top normal to mildly enlarged.", "uncertain"),
    ("Heart size is normal or slightly enlarged.", "uncertain"),
    ("The heart is mildly enlarged.", "present"),
])
def test_a_heart_size_range_from_normal_is_uncertain(text: str, assertion: str) -> None:
    (f,) = findings(text)
    assert (f.lesion, f.assertion) == ("cardiomegaly", assertion)
    assert (f.hedge is not None) == (assertion == "uncertain")


@pytest.mark.parametrize(("text", "expected"), [
    ("No evidence of pleural effusion on the left, small effusion on the right.",
     [("effusion", "absent", (LL,)), ("effusion", "present", (RL,))]),
    ("No consolidation on the right, patchy opacity at the left base.",
     [("consolidation", "absent", (RL,)), ("opacity", "present", (LB,))]),
    ("No opacity in the left upper lobe, right lower lobe opacity persists.",
     [("opacity", "absent", (LU,)), ("opacity", "present", (RB,))]),
    ("No pleural effusion or pneumothorax is seen on the right, left effusion is moderate.",
     [("effusion", "absent", (RL,)), ("pneumothorax", "absent", (RL,)), ("effusion", "present", (LL,))]),
    # the list goes on: every member stays negated
    ("No effusion on the left, large consolidation, or pneumothorax.",
     [("effusion", "absent", (LL,)), ("consolidation", "absent", (RL, LL)), ("pneumothorax", "absent", (RL, LL))]),
    ("No consolidation, effusion, or pneumothorax.",
     [("consolidation", "absent", (RL, LL)), ("effusion", "absent", (RL, LL)), ("pneumothorax", "absent", (RL, LL))]),
])
def test_a_negation_ends_before_a_new_statement_after_a_place(text: str, expected: list) -> None:
    assert [(f.lesion or f.entity.lower(), f.assertion, f.reported_location) for f in findings(text)] == expected


@pytest.mark.parametrize(("text", "expected"), [
    ("Opacity at the base of the right lung.", [("opacity", (RB,))]),
    ("Opacity at the lung bases.", [("opacity", (RB, LB))]),
    ("Fluid in the minor fissure.", [("effusion", (RM,))]),
    ("Small amount of fluid tracking along the right minor fissure.", [("effusion", (RM,))]),
    ("Opacity along the minor fissure.", [("opacity", (RM,))]),
    ("Thickening of the minor fissure.", []),
])
def test_places_of_the_minor_fissure(text: str, expected: list) -> None:
    assert [(f.lesion, f.reported_location) for f in findings(text)] == expected


@pytest.mark.parametrize("text", [
    "Retrocardiac density.", "Increased density at the left base.", "Soft tissue density in the right upper lobe.",
])
def test_a_density_is_not_read(text: str) -> None:
    """Rules version 18's check rejected reading a lung "density" as an opacity (an extra opacity on an Open-i
    report)."""
    assert [f.lesion for f in findings(text) if f.lesion] == []


@pytest.mark.parametrize(("text", "expected"), [
    ("The left costophrenic angle is blunted.", [("blunted", "present", (LB,))]),
    ("The costophrenic angles are mildly blunted.", [("blunted", "present", (RB, LB))]),
    ("The right costophrenic angle remains blunted, likely due to a small effusion.",
     [("effusion", "uncertain", (RB,))]),
    ("The costophrenic angles are sharp.", []),
    ("The left costophrenic angle is not blunted.", []),
])
def test_a_costophrenic_angle_that_is_blunted(text: str, expected: list) -> None:
    """The non-target costophrenic blunting (entity as written: "blunted"), whose place keeps negatives away."""
    assert [(f.lesion or f.entity.lower(), f.assertion, f.reported_location) for f in findings(text)] == expected


@pytest.mark.parametrize(("text", "expected"), [
    ("Increased heart size.", [("cardiomegaly", "present")]),
    ("Increased size of the cardiac silhouette.", [("cardiomegaly", "present")]),
    ("Increased cardiac silhouette.", [("cardiomegaly", "present")]),
    ("No increase in heart size.", []),  # a change phrase: says nothing about an enlarged heart
    ("Interval increase in heart size.", []),
    # version 20's check rejected "volume overload" as edema (an edema MeSH does not code on an Open-i report)
    ("Volume overload.", []),
])
def test_increased_heart_size(text: str, expected: list) -> None:
    assert [(f.lesion, f.assertion) for f in findings(text)] == expected


@pytest.mark.parametrize(("text", "where"), [
    ("Right lower lobe opacity. Findings are consistent with pneumonia.", (RB,)),
    ("Patchy opacity at the left base. Findings could represent atelectasis or pneumonia.", (LB,)),
    ("Findings are consistent with pneumonia.", (RL, LL)),  # nothing before it to point back to
    ("Mild cardiomegaly. Findings are concerning for pneumonia.", (RL, LL)),  # no located lung finding before
])
def test_a_sentence_opening_with_a_bare_findings_points_back(text: str, where: tuple[str, ...]) -> None:
    (f,) = [f for f in findings(text) if f.lesion == "pneumonia"]
    assert f.reported_location == where


@pytest.mark.parametrize(("text", "expected"), [
    # a place after a preposition belongs to the finding before it, also when "and" joins the next finding
    ("Opacity in the right lower lobe and atelectasis.", [("opacity", (RB,)), ("atelectasis", (RL, LL))]),
    ("Consolidation in the right upper lobe and effusion on the left.",
     [("consolidation", (RU,)), ("effusion", (LL,))]),
    ("Atelectasis at the left base and consolidation in the right lower lobe.",
     [("atelectasis", (LB,)), ("consolidation", (RB,))]),
    ("In the right lung there is patchy opacity.", [("opacity", (RL,))]),  # nothing before it
    # "the base" after a sided place takes its side, unless "and" stands between
    ("Opacity in the right lung, most pronounced at the base.", [("opacity", (RL, RB))]),
    ("Right pleural effusion with atelectasis at the base.", [("effusion", (RL,)), ("atelectasis", (RB,))]),
    ("Opacity in the right lung and effusion at the base.", [("opacity", (RL,)), ("effusion", (RB, LB))]),
    # the cardiophrenic angle
    ("Opacity at the right cardiophrenic angle.", [("opacity", (RB,))]),
    ("Opacity at the cardiophrenic angle.", [("opacity", (RB, LB))]),
])
def test_places_after_a_preposition_the_base_and_the_cardiophrenic_angle(text: str, expected: list) -> None:
    assert [(f.lesion, f.reported_location) for f in findings(text)] == expected


@pytest.mark.parametrize(("text", "expected"), [
    ("Opacities in the right upper lobe and the left lower lobe.", [("opacity", (RU, LB))]),
    ("Patchy opacity in the right lower lobe and the lingula.", [("opacity", (RB, LM))]),
    ("Right effusion, and the left costophrenic angle is sharp.", [("effusion", (RL,))]),  # a statement of its own
    ("Atelectasis at the left base and the heart is enlarged.", [("atelectasis", (LB,)), ("cardiomegaly", (HEART,))]),
])
def test_a_place_coordinated_by_and_the(text: str, expected: list) -> None:
    assert [(f.lesion, f.reported_location) for f in findings(text)] == expected


@pytest.mark.parametrize("text", [
    # version 24's check rejected a prominent heart as an uncertain cardiomegaly (one Open-i "cardiac silhouette is
    # prominent but probably artifactually large" that MeSH does not code). Since version 39 a prominent heart is a
    # non-target finding at the heart, never a cardiomegaly.
    "The cardiac silhouette is prominent.",
    "Mildly prominent cardiac silhouette.",
])
def test_a_prominent_heart_is_no_cardiomegaly(text: str) -> None:
    assert all(f.lesion is None for f in findings(text))


@pytest.mark.parametrize(("text", "assertion"), [
    ("No evidence of worsening edema.", "present"),
    ("No evidence of increasing effusion.", "present"),
    ("No increasing right effusion.", "present"),
    ("Moderate edema without worsening.", "present"),
    ("No evidence of new effusion.", "absent"),
    ("No evidence of effusion.", "absent"),
    ("No new or increasing effusion.", "absent"),
])
def test_no_evidence_of_worsening_leaves_the_finding_present(text: str, assertion: str) -> None:
    (f,) = [f for f in findings(text) if f.lesion is not None]
    assert f.assertion == assertion


@pytest.mark.parametrize(("text", "where"), [
    ("Multifocal opacities, most prominent in the left upper lobe.", (RL, LL, LU)),
    ("Multifocal pneumonia, predominantly in the right lung.", (RL, LL)),
    ("Diffuse interstitial opacities, most pronounced at the bases.", (RL, LL, RB, LB)),
    ("Scattered opacities, especially at the right base.", (RL, LL, RB)),
    ("Diffuse right lower lobe opacity.", (RB,)),  # a place of its own replaces the extent
    ("Multifocal opacities in the right lung, most pronounced in the right lower lobe.", (RL, RB)),
    ("Patchy opacities, most pronounced at the right base.", (RL, LL, RB)),  # no extent word either (version 37)
])
def test_an_extent_word_keeps_both_lungs_beside_a_predominant_place(text: str, where: tuple[str, ...]) -> None:
    (f,) = [f for f in findings(text) if f.lesion is not None]
    assert f.reported_location == where


@pytest.mark.parametrize(("text", "expected"), [
    ("Lt basal opacity.", [("opacity", (LB,))]),
    ("Rt lower zone consolidation.", [("consolidation", (RB,))]),
    ("Small effusion at the lt. base.", [("effusion", (LB,))]),
    ("Opacity in the rt lung.", [("opacity", (RL,))]),
    ("Post RT changes with opacity in the left lung.", [("opacity", (LL,))]),  # radiotherapy, no side
    ("Patchy shadowing in the right lower zone.", [("opacity", (RB,))]),
    ("Airspace shadowing in both lungs.", [("opacity", (RL, LL))]),
    ("Reticular shadowing at both bases.", [(None, (RB, LB))]),  # the interstitial markings, no lesion
    ("Nipple shadows over both lower zones.", [(None, ())]),  # a bare shadow stays a projection mimic
])
def test_side_abbreviations_and_shadowing(text: str, expected: list) -> None:
    assert [(f.lesion, f.reported_location) for f in findings(text)] == expected


@pytest.mark.parametrize(("text", "expected"), [
    ("No effusion and mild cardiomegaly.", [("effusion", "absent"), ("cardiomegaly", "present")]),
    ("No pneumothorax and stable small left pleural effusion.", [("pneumothorax", "absent"), ("effusion", "present")]),
    ("No consolidation and only mild bibasilar atelectasis.",
     [("consolidation", "absent"), ("atelectasis", "present")]),
    ("No pneumothorax and effusion.", [("pneumothorax", "absent"), ("effusion", "absent")]),  # plain "no A and B"
    ("No new consolidation and no effusion.", [("consolidation", "absent"), ("effusion", "absent")]),
    ("No effusion and small pneumothorax or consolidation.",  # the list goes on with "or"
     [("effusion", "absent"), ("pneumothorax", "absent"), ("consolidation", "absent")]),
])
def test_a_negation_ends_at_and_before_a_sized_finding(text: str, expected: list) -> None:
    assert [(f.lesion or f.entity.lower(), f.assertion) for f in findings(text)] == expected


@pytest.mark.parametrize(("text", "expected"), [
    ("The left hemidiaphragm is obscured, likely due to atelectasis.", [("atelectasis", (LB,))]),
    ("The right hemidiaphragm is not well seen, possibly due to a small effusion.", [("effusion", (RB,))]),
    ("Indistinct left hemidiaphragm may reflect consolidation.", [("consolidation", (LB,))]),
    ("Obscuration of the right hemidiaphragm, likely effusion and atelectasis.",
     [("effusion", (RB,)), ("atelectasis", (RB,))]),
    ("Obscuration of the left hemidiaphragm suggests right lower lobe consolidation.",  # a place of its own
     [("consolidation", (RB,))]),
    ("Elevated left hemidiaphragm with adjacent atelectasis.", [("atelectasis", (LB,))]),
    ("Atelectasis. The left hemidiaphragm is obscured.", [("atelectasis", (RL, LL))]),  # before it, another sentence
])
def test_an_obscured_hemidiaphragm_places_what_explains_it(text: str, expected: list) -> None:
    assert [(f.lesion, f.reported_location) for f in findings(text)] == expected


@pytest.mark.parametrize(("text", "expected"), [
    ("Consolidation in the right lower lobe with air bronchograms, consistent with pneumonia.",
     [("pneumonia", "present", (RB,))]),
    ("Dense opacity with air bronchograms in the left lower lobe, compatible with pneumonia.",
     [("pneumonia", "present", (LB,))]),
    ("Left lower lobe consolidation with air bronchograms.", [("consolidation", "present", (LB,))]),
    ("Mild cardiomegaly with small bilateral effusions.",  # "with" still ends a clause
     [("cardiomegaly", "present", (HEART,)), ("effusion", "present", (RL, LL))]),
])
def test_air_bronchograms_are_part_of_their_finding(text: str, expected: list) -> None:
    assert [(f.lesion, f.assertion, f.reported_location) for f in findings(text)] == expected


@pytest.mark.parametrize(("text", "expected"), [
    ("Slightly improved left basilar opacity with persistent small effusion.",
     [("opacity", (LB,)), ("effusion", (LB,))]),
    ("Left basilar atelectasis and persistent effusion.", [("atelectasis", (LB,)), ("effusion", (LB,))]),
    ("Right lower lobe opacity with bilateral effusions.", [("opacity", (RB,)), ("effusion", (RL, LL))]),
    ("Mild cardiomegaly with small bilateral effusions.", [("cardiomegaly", (HEART,)), ("effusion", (RL, LL))]),
    ("Pulmonary edema with small effusion.", [("edema", (RL, LL)), ("effusion", (RL, LL))]),
    ("Right lower lobe opacity with small effusions.", [("opacity", (RB,)), ("effusion", (RL, LL))]),  # plural
])
def test_a_finding_with_a_placed_finding_shares_its_place(text: str, expected: list) -> None:
    assert [(f.lesion, f.reported_location) for f in findings(text)] == expected


@pytest.mark.parametrize(("text", "assertion"), [
    ("Small effusion cannot be assessed as the costophrenic angles are excluded.", "uncertain"),
    ("Effusion could not be well evaluated.", "uncertain"),
    ("Small effusion cannot be excluded.", "uncertain"),
])
def test_a_finding_that_cannot_be_assessed_is_uncertain(text: str, assertion: str) -> None:
    (f,) = findings(text)
    assert f.assertion == assertion


@pytest.mark.parametrize(("text", "where"), [
    ("Airspace opacities in the middle and lower zones.", (RM, LM, RB, LB)),
    ("Opacity in the middle zone.", (RM, LM)),
    ("Opacity in the middle lobe.", (RM,)),
    ("Opacities in the middle and lower lobes.", (RM, RB)),
])
def test_middle_is_the_right_side_only_with_lobe(text: str, where: tuple[str, ...]) -> None:
    (f,) = findings(text)
    assert f.reported_location == where


@pytest.mark.parametrize(("text", "assertion"), [
    ("Small bilateral pleural effusions are likely present.", "uncertain"),
    ("A small left effusion is probably present.", "uncertain"),
    ("Pneumonia is considered less likely.", "uncertain"),
    ("A small left effusion is likely.", "uncertain"),
    ("Atelectasis is seen at the right base.", "present"),
    ("A small left effusion is present.", "present"),
])
def test_a_hedge_before_present_is_a_hedge(text: str, assertion: str) -> None:
    (f,) = findings(text)
    assert f.assertion == assertion


@pytest.mark.parametrize(("text", "expected"), [
    ("Minimal fluid in the right costophrenic angle.", [("effusion", (RB,))]),
    ("Basilar opacity on the left.", [("opacity", (LB,))]),
    ("Opacity in the lower lobe on the right.", [("opacity", (RB,))]),
    ("Basal atelectasis on the right, small effusion on the left.", [("atelectasis", (RB,)), ("effusion", (LL,))]),
    ("Perihilar opacity on the right.", [("opacity", (RM,))]),
    ("Effusions are larger on the right.", [("effusion", (RL, LL))]),
    ("Effusion is larger on the right.", [("effusion", (RL,))]),  # one effusion
])
def test_fluid_in_an_angle_a_zone_on_one_side_and_plural_effusions(text: str, expected: list) -> None:
    assert [(f.lesion, f.reported_location) for f in findings(text)] == expected


def test_a_zone_on_one_side_keeps_its_phrases_as_written() -> None:
    (f,) = findings("Basal atelectasis on the right.")
    assert f.location_phrases == ("Basal", "right") and f.reported_location == (RB,)


@pytest.mark.parametrize(("text", "expected"), [
    ("Tiny if any left pleural effusion.", [("effusion", "uncertain")]),
    ("Small, if any, right pleural effusion.", [("effusion", "uncertain")]),
    ("A left effusion is again suggested.", [("effusion", "uncertain")]),
    ("The left effusion is again suggested on the lateral view.", [("effusion", "uncertain")]),
    ("No significant effusion; trace left effusion possible.", [("effusion", "absent"), ("effusion", "uncertain")]),
    ("Right effusion, likely small.", [("effusion", "present")]),  # the hedge is about the size
    ("Left pleural effusion, possibly loculated.", [("effusion", "present")]),
])
def test_if_any_is_suggested_and_a_closing_hedge_word(text: str, expected: list) -> None:
    assert [(f.lesion, f.assertion) for f in findings(text)] == expected


@pytest.mark.parametrize(("text", "expected"), [
    ("Left basilar opacity. Atelectasis is favored over pneumonia.",
     [("opacity", (LB,)), ("atelectasis", (LB,)), ("pneumonia", (LB,))]),
    ("Right lower lobe opacity. Pneumonia is possible.", [("opacity", (RB,)), ("pneumonia", (RB,))]),
    ("Bibasilar opacities. The differential includes atelectasis and aspiration.",
     [("opacity", (RB, LB)), ("atelectasis", (RB, LB)), ("pneumonia", (RB, LB))]),
    ("Opacity at the left base. Small adjacent effusion.", [("opacity", (LB,)), ("effusion", (LB,))]),
    ("There is a moderate left pleural effusion. There is associated compressive atelectasis.",
     [("effusion", (LL,)), ("atelectasis", (LB,))]),  # the effusion's base (report-level rules version 9)
    # no observation before, edema, the same lesion placed elsewhere: unchanged
    ("Right effusion. Pneumonia is possible.", [("effusion", (RL,)), ("pneumonia", (RL, LL))]),
    ("Right lower lobe opacity. Possible pulmonary edema.", [("opacity", (RB,)), ("edema", (RL, LL))]),
    ("Right lower lobe pneumonia. Left base opacity. Pneumonia is possible.",
     [("pneumonia", (RB,)), ("opacity", (LB,)), ("pneumonia", (RB,))]),
])
def test_a_hedged_diagnosis_after_an_observation_lies_where_it_lies(text: str, expected: list) -> None:
    assert [(f.lesion, f.reported_location) for f in findings(text)] == expected


@pytest.mark.parametrize(("text", "expected"), [
    ("Possible pneumonia, moderate cardiomegaly.", [("pneumonia", "uncertain"), ("cardiomegaly", "present")]),
    ("Possible right lower lobe pneumonia, small left effusion.",
     [("pneumonia", "uncertain"), ("effusion", "present")]),
    ("Opacity in the lingula, concerning for pneumonia, and small left effusion.",
     [("pneumonia", "uncertain"), ("effusion", "present")]),
    ("Cannot exclude pneumonia, small bilateral effusions.", [("pneumonia", "uncertain"), ("effusion", "present")]),
    ("No pneumothorax, and small left effusion.", [("pneumothorax", "absent"), ("effusion", "present")]),
    # no comma, or the list goes on with "or": the hedge covers every item
    ("Possible pneumonia and small effusion.", [("pneumonia", "uncertain"), ("effusion", "uncertain")]),
    ("Possible mild edema, small effusions, or both.", [("edema", "uncertain"), ("effusion", "uncertain")]),
    ("Possible pneumonia, atelectasis, or aspiration.",  # aspiration: the pneumonia again (one finding)
     [("pneumonia", "uncertain"), ("atelectasis", "uncertain")]),
])
def test_a_hedge_ends_before_a_new_sized_item(text: str, expected: list) -> None:
    assert [(f.lesion or f.entity.lower(), f.assertion) for f in findings(text)] == expected


@pytest.mark.parametrize(("text", "expected"), [
    ("Patchy GGOs in both lower zones.", [("opacity", (RB, LB))]),
    ("GGO in the right lower lobe.", [("opacity", (RB,))]),
    ("LLL atx.", [("atelectasis", (LB,))]),
    ("Small left PTX.", [(None, (LL,))]),
    ("Airspace changes in the right lower zone.", [("opacity", (RB,))]),
    ("Infective changes at the right base.", [("pneumonia", (RB,))]),
    ("Inflammatory changes in the left lower lobe.", []),
    ("Axial CT scan shows GGOs in the right lower lobe.", [(None, (RB,))]),  # another modality: non-target
])
def test_report_abbreviations_and_british_wordings(text: str, expected: list) -> None:
    assert [(f.lesion, f.reported_location) for f in findings(text)] == expected


@pytest.mark.parametrize(("text", "expected"), [
    ("Pneumonia is excluded.", [("pneumonia", "absent")]),
    ("Pneumothorax has been excluded.", [("pneumothorax", "absent")]),
    ("Left pleural effusion has disappeared.", [("effusion", "absent")]),
    ("Disappearance of the right pleural effusion.", [("effusion", "absent")]),
    ("Pneumonia is not excluded.", [("pneumonia", "uncertain")]),
    ("Pneumonia cannot be excluded.", [("pneumonia", "uncertain")]),
    ("The right costophrenic angle is excluded from the field of view.", []),
])
def test_excluded_and_disappeared_negate(text: str, expected: list) -> None:
    assert [(f.lesion or f.entity.lower(), f.assertion) for f in findings(text)] == expected


@pytest.mark.parametrize(("text", "expected"), [
    ("Right basilar atelectasis, pneumonia not excluded.", [("atelectasis", "present"), ("pneumonia", "uncertain")]),
    ("Moderate cardiomegaly, pericardial effusion not excluded.",
     [("cardiomegaly", "present"), ("pericardial effusion", "uncertain")]),
    ("Small left effusion and adjacent atelectasis, infection not excluded.",
     [("effusion", "present"), ("atelectasis", "present"), ("pneumonia", "uncertain")]),
    ("Small bilateral effusions, pneumonia cannot be excluded.", [("effusion", "present"), ("pneumonia", "uncertain")]),
    # a list that ends with a conjunction stays one list
    ("Atelectasis, effusion, or pneumonia cannot be excluded.",
     [("atelectasis", "uncertain"), ("effusion", "uncertain"), ("pneumonia", "uncertain")]),
    ("Effusion or consolidation cannot be excluded.", [("effusion", "uncertain"), ("consolidation", "uncertain")]),
])
def test_a_post_cue_stops_at_a_bare_comma_that_ends_no_list(text: str, expected: list) -> None:
    assert [(f.lesion or f.entity.lower(), f.assertion) for f in findings(text)] == expected


@pytest.mark.parametrize(("text", "expected"), [
    ("Retrocardiac opacity, atelectasis vs consolidation, small left effusion.",
     [("atelectasis", "uncertain", (LB,)), ("consolidation", "uncertain", (LB,)), ("effusion", "present", (LL,))]),
    ("Small left effusion, atelectasis vs consolidation at the left base.",
     [("effusion", "present", (LL,)), ("atelectasis", "uncertain", (LB,)), ("consolidation", "uncertain", (LB,))]),
    ("Pulmonary edema, likely cardiogenic, with bilateral effusions.",
     [("edema", "present", (RL, LL)), ("effusion", "present", (RL, LL))]),
    # unchanged: "vs" without a comma, "if any" between commas, a hedge before a list
    ("Tiny left effusion vs pleural thickening.",
     [("effusion", "uncertain", (LL,)), ("pleural thickening", "uncertain", (LL,))]),
    ("Small, if any, right pleural effusion.", [("effusion", "uncertain", (RL,))]),
    ("Possible pneumonia, atelectasis, or aspiration.",
     [("pneumonia", "uncertain", (RL, LL)), ("atelectasis", "uncertain", (RL, LL))]),
])
def test_versus_and_a_hedge_before_a_comma_stay_in_their_part(text: str, expected: list) -> None:
    assert [(f.lesion or f.entity.lower(), f.assertion, f.reported_location) for f in findings(text)] == expected


@pytest.mark.parametrize(("text", "expected"), [
    ("Bibasilar opacities, likely atelectasis, with small bilateral effusions.",
     [("atelectasis", "uncertain"), ("effusion", "present")]),
    ("Right basilar opacity, likely atelectasis, with small right effusion.",
     [("atelectasis", "uncertain"), ("effusion", "present")]),
    ("Possible small effusion with adjacent atelectasis.", [("effusion", "uncertain"), ("atelectasis", "uncertain")]),
])
def test_a_hedge_does_not_reach_across_comma_with(text: str, expected: list) -> None:
    assert [(f.lesion, f.assertion) for f in findings(text)] == expected


@pytest.mark.parametrize(("text", "expected"), [
    # a zone "of the right lung" is that side's zone
    ("Opacity at the base of the right lung.", (RB,)),
    ("Consolidation in the upper zone of the left lung.", (LU,)),
    ("Atelectasis at the base of the left hemithorax.", (LB,)),
    ("Opacity in the apex of the left lung.", (LA,)),
    ("Opacity at the bases of both lungs.", (RB, LB)),
    # a place after a predominance word does not confine the finding: both lungs first
    ("Patchy opacities are seen particularly at mid zone of right lung.", (RL, LL, RM)),
    ("Opacities predominantly in the lower lungs.", (RL, LL, RB, LB)),
    ("Multifocal opacities, most pronounced in the right upper lobe and the left base.", (RL, LL, RU, LB)),
    ("Bilateral opacification predominantly in the right upper and both mid zones.", (RL, LL, RU, RM, LM)),
    ("Bilateral opacities, most pronounced in the right upper lobe.", (RL, LL, RU)),
    # a place not after a predominance word still confines it
    ("Opacity in the right lung, most pronounced at the base.", (RL, RB)),
    ("Opacity in the right lower lobe.", (RB,)),
    ("Opacities in the right upper and left lower lobes.", (RU, LB)),
    # a suspended hyphen keeps both zones of the list
    ("Consolidation in the mid- and lower zones.", (RM, LM, RB, LB)),
    ("Bilateral pulmonary consolidation in mid-and lower zones.", (RL, LL, RM, LM, RB, LB)),
])
def test_places_read_as_written(text: str, expected: tuple[str, ...]) -> None:
    assert [f.reported_location for f in findings(text) if f.lesion is not None] == [expected]


@pytest.mark.parametrize(("text", "expected"), [
    # "infectious" written as a reading is a (hedged) pneumonia
    ("Patchy opacities in the right lower zone, which could be infectious.", [("pneumonia", "uncertain", (RB,))]),
    ("Opacities in the right lower zone could be infectious in etiology.", [("pneumonia", "uncertain", (RB,))]),
    ("Consolidation in the right lower lobe, likely infectious.", [("pneumonia", "uncertain", (RB,))]),
    ("The opacity in the right lower lobe is more likely infectious than atelectatic.",
     [("pneumonia", "uncertain", (RB,)), ("atelectasis", "uncertain", (RB,))]),
    ("No infectious process.", [("pneumonia", "absent", (RL, LL))]),
    ("Non-infectious inflammatory changes.", []),
    # "if present" hedges
    ("Effusion, if present, is small.", [("effusion", "uncertain", (RL, LL))]),
    ("Small left pleural effusion, if present.", [("effusion", "uncertain", (LL,))]),
    # "mass-like" before an airspace word describes that finding
    ("Right upper lobe mass-like consolidation.", [("consolidation", "present", (RU,))]),
    ("Masslike opacity in the left upper lobe.", [("opacity", "present", (LU,))]),
    ("A 2 cm mass in the right upper lobe.", [("mass", "present", (RU,))]),
])
def test_infectious_if_present_and_mass_like(text: str, expected: list) -> None:
    assert [(f.lesion or f.entity.lower(), f.assertion, f.reported_location) for f in findings(text)] == expected


@pytest.mark.parametrize(("text", "expected"), [
    ("The cardiac silhouette is prominent.", [("cardiac silhouette is prominent", "present", ("heart",))]),
    ("Heart size is mildly prominent.", [("heart size is mildly prominent", "present", ("heart",))]),
    ("Prominent cardiac silhouette.", [("prominent cardiac silhouette", "present", ("heart",))]),
    ("The cardiac silhouette is prominent but probably artifactually large due to diminished lung volumes.",
     [("cardiac silhouette is prominent", "present", ("heart",))]),
    ("Cardiac silhouette is possibly prominent.", [("cardiac silhouette is possibly prominent", "uncertain",
                                                    ("heart",))]),
    ("No prominence of the heart.", [("prominence of the heart", "absent", ("heart",))]),
    ("The heart is not prominent.", []),
    ("Heart size is normal, prominent pulmonary arteries.", []),
    ("Overall heart size within normal limits with prominent right atrial convexity.", []),
    # a place near it belongs to the lung finding
    ("Prominent heart size, left basilar atelectasis.",
     [("prominent heart size", "present", ("heart",)), ("atelectasis", "present", (LB,))]),
])
def test_a_heart_called_prominent_is_a_non_target_finding_at_the_heart(text: str, expected: list) -> None:
    got = [(f.lesion or f.entity.lower(), f.assertion, f.reported_location) for f in findings(text)]
    assert got == expected
    assert all(f.lesion is None for f in findings(text) if f.reported_location == ("heart",))


#: Sentence | the lesions read, in order, with their assertion ("-": none). Versions 40-43: a heart size range from the
#: upper limit of normal is uncertain; a negated link verb or adjective negates the diagnosis and leaves an
#: observation before it; "has not developed", "fails to show", "lack of" negate; an "occult" caveat is no finding.
_ASSERTION_READINGS = """
Heart size is upper normal to mildly enlarged. | cardiomegaly uncertain
Cardiac silhouette is upper normal to mildly enlarged. | cardiomegaly uncertain
The heart is high normal to slightly enlarged in size. | cardiomegaly uncertain
Heart size is top-normal to mildly enlarged. | cardiomegaly uncertain
Heart size is at the upper limits of normal to mildly enlarged. | cardiomegaly uncertain
Heart size is top normal to mildly enlarged. | cardiomegaly uncertain
Heart size is upper limits of normal. | -
The heart is top normal in size; the aorta is enlarged. | -
The findings are not typical for pneumonia. | pneumonia absent
The opacity is not consistent with pneumonia. | opacity present, pneumonia absent
Findings are not compatible with edema. | edema absent
Findings are not characteristic of edema. | edema absent
This does not represent pneumonia. | pneumonia absent
The opacity does not represent consolidation. | opacity present, consolidation absent
The opacity is not felt to represent pneumonia. | opacity present, pneumonia absent
The lungs do not demonstrate consolidation. | consolidation absent
The radiograph does not show pneumonia. | pneumonia absent
Findings do not suggest pneumonia. | pneumonia absent
Findings are not suggestive of pneumonia. | pneumonia absent
There is nothing to suggest edema. | edema absent
The appearance argues against pneumonia. | pneumonia absent
Findings argue against edema. | edema absent
The study is limited for evaluation of effusion. | effusion uncertain
Pneumonia has not developed. | pneumonia absent
The effusion has not recurred. | effusion absent
The film fails to show consolidation. | consolidation absent
Lack of pleural effusion. | effusion absent
No focal airspace consolidation to suggest pneumonia, though early infection may be radiographically occult. \
    | consolidation absent, pneumonia absent
Findings suggest pneumonia. | pneumonia uncertain
Opacity consistent with pneumonia. | pneumonia present
No findings to suggest pneumonia. | pneumonia absent
The left effusion does not show significant change. | effusion present
Evaluation of the lungs demonstrates a right lower lobe consolidation. | consolidation present
Pneumonia has developed. | pneumonia present
The effusion has recurred. | effusion present
"""


def _assertion_rows(table: str) -> list[tuple[str, list[tuple[str, str]]]]:
    rows = []
    for line in table.strip().splitlines():  # a row's trailing backslash continues it (Python joins the lines)
        text, read = (part.strip() for part in line.split("|"))
        rows.append((text, [] if read == "-" else [tuple(item.split()) for item in read.split(", ")]))
    return rows


@pytest.mark.parametrize(("text", "expected"), _assertion_rows(_ASSERTION_READINGS))
def test_assertions_of_heart_size_ranges_negated_links_and_caveats(text: str, expected: list) -> None:
    assert [(f.lesion, f.assertion) for f in findings(text)] == expected


#: Sentence | lesions read, in order, with assertion and places (";"-joined labels; "-": none). Version 44.
_V44_READINGS = """
Absent pleural effusion. | effusion absent right lung;left lung
Effusions absent. | effusion absent right lung;left lung
Pleural effusion: none. | effusion absent right lung;left lung
Consolidation: none. Cardiomegaly: absent. | consolidation absent right lung;left lung, cardiomegaly absent heart
Nil effusion. | effusion absent right lung;left lung
Zero pleural effusion. | effusion absent right lung;left lung
No effusion small left basilar atelectasis. | effusion absent right lung;left lung, atelectasis present left lung base
No pneumothorax small left effusion. | effusion present left lung
No effusion or small pneumothorax. | effusion absent right lung;left lung
No definite effusion. | effusion absent right lung;left lung
Early pneumonia is difficult to exclude at the right base. | pneumonia uncertain right lung base
Pneumonia is hard to exclude in the left lower lobe. | pneumonia uncertain left lung base
Pneumonia is difficult to exclude. | pneumonia uncertain right lung;left lung
It is difficult to exclude pneumonia at the left base. | pneumonia uncertain left lung base
Cardiomegaly is difficult to assess given the AP technique. | cardiomegaly uncertain heart
Effusion is difficult to assess on this portable film. | effusion uncertain right lung;left lung
It is difficult to assess for pneumonia. | pneumonia uncertain right lung;left lung
Re-expansion of the previously collapsed right upper lobe. | atelectasis absent right upper zone lung
The previously collapsed left lower lobe has re-expanded. | atelectasis absent left lung base
Re-expansion of the right lower lobe with residual atelectasis. | atelectasis present right lung base
Opacity compatible with pneumonia in the right clinical setting. | pneumonia uncertain right lung;left lung
Left basilar opacity could represent pneumonia in the right clinical context. | pneumonia uncertain left lung base
Small L effusion. | effusion present left lung
Small R pleural effusion. | effusion present right lung
Small rt effusion. | effusion present right lung
Atelectasis L base. | atelectasis present left lung base
Effusion R side. | effusion present right lung
Trace b/l effusions. | effusion present right lung;left lung
Patient on 2 L nasal cannula. | -
Probable small right effusion and definite left basilar consolidation. \
    | effusion uncertain right lung, consolidation present left lung base
Cardiothoracic ratio is increased. | cardiomegaly present heart
Increased cardiothoracic ratio. | cardiomegaly present heart
Cardiothoracic ratio is not increased. | cardiomegaly absent heart
Cardiothoracic ratio is normal. | -
"""


def _v44_rows(table: str = _V44_READINGS) -> list[tuple[str, list[tuple[str, str, tuple[str, ...]]]]]:
    rows = []
    for line in table.strip().splitlines():
        text, read = (part.strip() for part in line.split("|"))
        items = [] if read == "-" else [item.split(" ", 2) for item in read.split(", ")]
        rows.append((text, [(lesion, assertion, tuple(places.split(";"))) for lesion, assertion, places in items]))
    return rows


@pytest.mark.parametrize(("text", "expected"), _v44_rows())
def test_absent_colon_templates_hedges_with_a_place_re_expansion_and_bare_side_letters(text: str,
                                                                                       expected: list) -> None:
    assert [(f.lesion, f.assertion, f.reported_location) for f in findings(text) if f.lesion] == expected


def test_a_report_written_one_item_per_line_without_periods() -> None:
    """The "No" of the first line does not reach the effusion and atelectasis of the next lines (version 44)."""
    from cxrground.reports import make_section_choice

    text = "No pneumothorax\nSmall left pleural effusion\nMild left basilar atelectasis\nHeart size normal"
    section = make_section_choice("findings", text)
    rows = RuleStructurer().structure("r", section).findings
    assert [(f.lesion, f.assertion, f.reported_location) for f in rows if f.lesion] == [
        ("effusion", "present", (LL,)), ("atelectasis", "present", (LB,))]


#: Sentence | lesions read, in order, with assertion and places (";"-joined labels; "-": none). Version 45.
_V45_READINGS = """
Small left effus. | effusion present left lung
No pleural efusion. | effusion absent right lung;left lung
Small left pleural effusoin. | effusion present left lung
Mild atelectsis at the left base. | atelectasis present left lung base
Right lower lobe pnuemonia. | pneumonia present right lung base
Left lower lobe consolidaton. | consolidation present left lung base
Mild cardiomegally. | cardiomegaly present heart
Small bilateral effusions. | effusion present right lung;left lung
Pneumonic consolidation in the left lower lobe. | consolidation present left lung base
Bibasilar atelectases. | atelectasis present right lung base;left lung base
Consolidations in the right lower lobe. | consolidation present right lung base
Consolidative opacity at the left base. | consolidation present left lung base
The lungs opacify diffusely. | -
Heart size has decreased but remains mildly enlarged. | cardiomegaly present heart
Heart size is difficult to evaluate but likely enlarged. | cardiomegaly uncertain heart
Heart size has decreased and is now normal. | -
Cardiomegaly, difficult to assess due to rotation. | cardiomegaly uncertain heart
Cardiomegaly is difficult to assess given the AP technique. | cardiomegaly uncertain heart
Apparent cardiomegaly may be accentuated by AP technique. | cardiomegaly uncertain heart
Cardiomediastinal silhouette is enlarged, likely due to low lung volumes. | cardiomegaly uncertain heart
Cardiomegaly, likely due to cardiomyopathy. | cardiomegaly present heart
Moderate cardiomegaly. Low lung volumes. | cardiomegaly present heart
Right paratracheal opacity. | -
Opacity in the right paratracheal region may represent a mass or lymphadenopathy. | -
Perihilar opacity. | opacity present right mid zone lung;left mid zone lung
Right hilar opacity. | opacity present right mid zone lung
Left upper lobe opacity abutting the mediastinum. | opacity present left upper zone lung
Small amount of atelectasis adjacent to the left hemidiaphragm. | atelectasis present left lung base
Linear opacity above the right hemidiaphragm. | opacity present right lung base
Elevated left hemidiaphragm. | -
Elevated right hemidiaphragm with adjacent atelectasis. | atelectasis present right lung base
The right lung is clear without consolidation. | consolidation absent right lung
The left lung is clear, no effusion. | effusion absent left lung
The lungs are clear without consolidation. | consolidation absent right lung;left lung
Opacity in the right lower lobe is not consistent with pneumonia. \
    | opacity present right lung base, pneumonia absent right lung base
The opacity is not consistent with pneumonia. \
    | opacity present right lung;left lung, pneumonia absent right lung;left lung
No effusion is evident on this single view, but a small one cannot be excluded. \
    | effusion absent right lung;left lung, effusion uncertain right lung;left lung
No left effusion, but a small one cannot be excluded. | effusion absent left lung, effusion uncertain left lung
The right effusion has resolved while the left is unchanged. | effusion absent right lung, effusion present left lung
Resolved on the right, the pleural effusion persists on the left. \
    | effusion absent right lung, effusion present left lung
Right basilar atelectasis has improved while the left is unchanged. \
    | atelectasis present right lung base, atelectasis present left lung base
Pleural effusion on the right is small. | effusion present right lung
Small right effusion; the left side is unchanged. | effusion present right lung
One view of the chest. | -
Subtle increased opacity at the right base is of uncertain significance. | opacity uncertain right lung base
Subtle opacity at the right base, of uncertain significance. | opacity uncertain right lung base
Opacity of unclear etiology at the left base. | opacity present left lung base
"""


@pytest.mark.parametrize(("text", "expected"), _v44_rows(_V45_READINGS))
def test_misspellings_heart_size_caveats_mediastinal_sites_subject_sides_and_ellipses(text: str,
                                                                                       expected: list) -> None:
    assert [(f.lesion, f.assertion, f.reported_location) for f in findings(text) if f.lesion] == expected


@pytest.mark.parametrize(("text", "entity"), [
    ("Small left effus.", "effus"), ("No pleural efusion.", "pleural efusion"),
    ("Right lower lobe pnuemonia and Mild cardiomegally.", "pnuemonia"),
    ("The right effusion has resolved while the left is unchanged.", "effusion"),
])
def test_a_misspelled_phrase_is_reported_as_written(text: str, entity: str) -> None:
    """The finding phrase is the sentence's own text (report-level rules find it there), not the respelled word."""
    rows = findings(text)
    assert rows[0].entity == entity
    assert all(f.entity in text for f in rows)


def test_respell_keeps_real_words() -> None:
    from cxrground.reports.structure.lexicon import MISSPELLINGS, respell

    for word in ("effusion", "effusions", "pneumonic", "atelectases", "consolidations", "consolidative", "opacify",
                 "infusion", "diffusion", "consolidated", "atelectatic", "pneumoniae"):
        assert word not in MISSPELLINGS
    assert respell("small left effusion") is None
    assert respell("small left effus. pnuemonia") == ("small left effusion. pneumonia", ((11, 19, 3), (21, 30, 0)))


#: Sentence | findings read, in order, with assertion and places (";"-joined labels; "-": none); a non-target finding
#: is its phrase after "~". Version 46.
_V46_READINGS = """
Small R > L pleural effusions. | effusion present right lung;left lung
Small L > R effusions. | effusion present right lung;left lung
Small R>L pleural effusions. | effusion present right lung;left lung
Small L>R effusions. | effusion present right lung;left lung
Small R ≥ L effusions. | effusion present right lung;left lung
Small R>=L effusions. | effusion present right lung;left lung
Small right > left effusions. | effusion present right lung;left lung
Bilateral effusions, L > R. | effusion present right lung;left lung
R>L basilar opacities. | opacity present right lung base;left lung base
Heart size is unchanged from prior, mildly enlarged. | cardiomegaly present heart
Heart size is stable compared to the prior study, moderately enlarged. | cardiomegaly present heart
Eval for infiltrate. | ~infiltrate uncertain right lung;left lung
Hx pneumonia, eval for effusion. | ~effusion uncertain right lung;left lung
Hx pneumonia, eval for effusion. No effusion. \
    | ~effusion uncertain right lung;left lung, effusion absent right lung;left lung
Evaluate for pneumonia. | ~pneumonia uncertain right lung;left lung
Assess for effusion. | ~effusion uncertain right lung;left lung
Rule out pneumonia. | ~pneumonia uncertain right lung;left lung
R/o PNA. | ~pna uncertain right lung;left lung
Clinical concern for pneumonia. Lungs are clear. | ~pneumonia uncertain right lung;left lung
Evaluate for possible pneumonia. | ~pneumonia uncertain right lung;left lung
Evaluate for pneumonia, which is not seen. | pneumonia absent right lung;left lung
Right base opacity, question of pneumonia. | opacity present right lung base, ~pneumonia uncertain right lung;left lung
Hx pneumonia. | -
H/o pneumonia. | -
Opacity concerning for pneumonia. | pneumonia uncertain right lung;left lung
Right base opacity ? pneumonia | opacity uncertain right lung base, pneumonia uncertain right lung base
Bilateral effusions, right greater than left. | effusion present right lung;left lung
Small right effusion. | effusion present right lung
Heart size is unchanged. | -
Heart size is enlarged, unchanged from prior. | cardiomegaly present heart
Lungs are clear; no pneumonia. | pneumonia absent right lung;left lung
History of pneumonia. | -
Consolidation in the anterior/outer right upper lobe. | consolidation present right upper zone lung
It is difficult to evaluate for effusion. | effusion uncertain right lung;left lung
It is not possible to exclude a small left effusion. | effusion uncertain left lung
We are unable to exclude pneumonia. | pneumonia uncertain right lung;left lung
"""


@pytest.mark.parametrize(("text", "expected"), _v44_rows(_V46_READINGS))
def test_r_over_l_unchanged_from_prior_clinical_questions_and_hx(text: str, expected: list) -> None:
    assert [(f.lesion or "~" + f.entity.lower(), f.assertion, f.reported_location) for f in findings(text)] == expected


def test_cli_gives_a_report_read_with_no_finding_its_own_line(tmp_path: Path) -> None:
    """A report read and structured with no finding gets one line (``"findings": 0``), so that the output names every
    report read: a script tells it from a report never read (a failure line)."""
    importlib.import_module("cxrground.cli.structure_cmds")
    from cxrground.cli import main

    (tmp_path / "a.txt").write_text("FINDINGS: Fever and two days of odynophagia.\n")
    (tmp_path / "b.txt").write_text("FINDINGS: Small right pleural effusion.\n")
    result = CliRunner().invoke(main, ["reports", "structure", str(tmp_path)])
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in result.output.splitlines() if line.startswith("{")]
    assert [(r["report_id"], r.get("findings"), r.get("lesion")) for r in rows] == [("a", 0, None),
                                                                                    ("b", None, "effusion")]
    assert rows[0]["section"] == "findings" and rows[0]["provenance"]["name"] == "rules"
    out = tmp_path / "out.jsonl"
    result = CliRunner().invoke(main, ["reports", "structure", str(tmp_path), "--out", str(out)])
    assert f"2 reports (1 with no finding), 1 findings -> {out}" in result.output
    assert [json.loads(line).get("findings") for line in out.read_text().splitlines()] == [0, None]
