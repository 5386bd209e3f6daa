"""Rule-based report structurer (the built-in default of ILS §7): findings, assertion and location per sentence.

Per sentence of the chosen section, with the lexicon of :mod:`.lexicon`:

1. **Finding phrases** are found with one regular expression (:data:`~.lexicon.ENTITY_RE`, applied through its
   first-character dispatch :data:`~.lexicon.ENTITY_MATCHER`, which finds the same matches faster); sentences
   without one are skipped at once.
2. **Assertion** (present / absent / uncertain) per phrase. The *scope* of a cue is its clause: the
   sentence cut at scope ends (``;``, "but", "however", "with", "and there", ...). Before the phrase the
   nearest cue of the clause decides (a negation -> absent, a hedge -> uncertain; a *link hedge* such as
   "to suggest" or "concerning for" is transparent inside an earlier negation: "no opacity to suggest
   pneumonia" negates both; a closing cue such as "is not seen" between an earlier cue and the phrase ends
   that cue's scope). After the phrase the nearest post-cue of the clause applies ("... cannot be
   excluded", "... is not seen", "... has resolved") when every phrase in between is coordinated with it
   ("effusion or pneumothorax is not seen"), and not across a comma that opens a new subject ("heart size is
   enlarged, pulmonary vascularity within normal limits": the vascularity is normal, the heart is not). A
   negation before a list ends where a bare comma opens a new item with a size / side word ("no pneumothorax,
   small right effusion"), and so does "and" before such a size word ("no effusion and mild cardiomegaly"; version
   25), unless the list goes on with "or" / "nor" ("no pneumothorax, large effusion, or consolidation"). Cues
   inside the phrase count too ("the heart is *not* enlarged", "heart size *may be* enlarged"). Pseudo-negations
   ("no change in", "not significantly changed") are matched first and ignored. Any negation -> absent; else any
   hedge -> uncertain; else present. Hedged cues that contain a negation word ("cannot exclude", "not excluded")
   are hedges: an uncertain finding never becomes absent.
3. **Alternatives**: phrases joined by "or", "versus", "vs", "/" or "and/or" ("atelectasis versus
   pneumonia", "atelectasis/infiltrate"), and the comma-joined members of a list that ends with such a join
   ("atelectasis, aspiration, or pneumonia"; not after an observation, whose comma may link it to its
   alternatives), are each one finding. The *alternatives policy* (``alternatives=``,
   CLI ``--alternatives``) decides their assertion: ``uncertain`` (default, ILS.md §7.1: a differential is a
   hedge) makes every member of the group uncertain; ``present`` leaves each member the assertion its own cues
   give, so "atelectasis or scarring" is two present findings while "atelectasis versus pneumonia" stays
   uncertain through the hedge "versus". Negated groups ("no effusion or pneumothorax") stay absent under
   both policies.
4. **Attribution** (predicted lesion type): an observation (opacity-class phrase or consolidation, not
   absent) followed in its clause by a link phrase ("is", "consistent with", "may represent", "likely",
   "concerning for", ...; :data:`~.lexicon.LINK_RE`) and a lesion of
   :data:`~.lexicon.ATTRIBUTABLE` (or a group of alternatives, for which a bare comma is a link: "opacity,
   atelectasis versus pneumonia") becomes one finding per attributed lesion whose ``entity`` is the
   observation phrase (paper example: "The lower lung opacity is pneumonia." -> (opacity, pneumonia,
   present)). The assertion is the attributed lesion's, made uncertain when the link or the observation is
   hedged or when there are several alternatives. Attributed non-target findings ("may represent
   scarring") keep their own phrase; if every attributed finding is non-target the observation is kept as
   well; an alternative of the observation's own type ("opacity at the left base, atelectasis versus
   infiltrate") is the observation itself, which is then kept as it is. The gap between observation and
   lesion may hold location phrases and modifiers, at most 15 words, no negation, "but", "with", "there",
   ...; an "and" only when a verb (is / are / may / likely / represents ...) follows it ("haziness and
   vascular indistinctness are consistent with edema").
5. **Locations**: every location phrase (:data:`~.lexicon.LOCATION_RE`) of a clause goes to the nearest
   finding (or attributed/alternative group) of that clause; a group shares its phrases. Labels are the
   phrases' labels in order of first mention without repeats; a finding without phrases gets the default of
   :func:`~.lexicon.default_location` (both lungs for lung findings; ``heart`` for cardiomegaly, always).
   Absent findings get labels by the same rules.
   A location phrase followed by "is clear / normal / unremarkable" describes a normal statement and belongs to
   no finding; a phrase introduced by "adjacent", "associated", "superimposed", ... without a location of its
   own takes the location of the finding before it ("small left effusion with adjacent atelectasis"; also
   "compressive / passive / relaxation atelectasis", which lies next to the effusion that causes it, and a
   "parapneumonic" effusion next to its pneumonia); the phrase's alternatives share that location ("adjacent
   atelectasis or consolidation"). A lung finding without a location of its own joined by "and" to a placed lung
   finding lies where that finding lies ("left basilar atelectasis and effusion"), unless it is edema, diffuse by
   its own words ("pulmonary edema", "interstitial ...") or plural effusions (version 10).
   Extent words ("diffuse", "scattered", "multifocal", "widespread") give both lungs only when the
   finding has no other location phrase (ILS §7.2 "(no side)": "diffuse right lower lobe opacity" is the right
   base); a zoned phrase without a side word right after a sided one (only a space, comma, "/" or "and" between)
   takes that side ("left perihilar upper lobe"; not a plural place such as "lower lobes", not a zone with a
   side of its own such as the lingula); a location phrase reaches a finding across "with" only when nothing in
   the finding's own clause places it ("improved aeration of the lung bases with small left basilar effusion").
6. **History**: a phrase in the scope of "history of" / "h/o" ("history of pneumonia") describes the past and
   gives no finding; so does a whole sentence that tells in the past tense what an earlier examination showed
   and compares nothing with today ("On the prior outside CT, the right upper lobe was consolidated."; round 5).
   A sentence that reports what a CT or MRI showed and names no radiograph ("Axial CT scan shows consolidation in
   the right lower lobe.", "... opacities were observed on high-resolution computed tomography scan") gives
   non-target findings only: they keep negatives away from their places, but they are no lesion of this radiograph
   (no mask, no positive, no label).
   A clause-final "have / has (since) resolved / cleared" negates every phrase of its subject, however long the
   list, when no verb stands between ("consolidation, atelectasis, and blunting at the left base have cleared in
   the interval"; round 5); a phrase that is a clause of its own ("heart size is enlarged") is never reached by a
   post-cue of a later subject. A de-identification blank between an observation and a lesion ("opacity XXXX
   atelectasis") is an attribution whose link word is unknown: no hedge is seen, the lesion keeps the
   observation's assertion and location (round 5).
7. **Version 45.** Misspelled lesion words are respelled before the phrases are found (:func:`~.lexicon.respell`;
   the phrase is reported as written). Pronouns and ellipses ("a small one", "the left is unchanged", a sentence
   opening "Resolved on the right,") are phrases of the lesion named before them (after them for the opening), with
   their own cues and side. An opacity at a mediastinal site with no lung place is a non-target finding outside
   the lungs; a sided place "is clear without / no" places the negated findings of its clause; a lesion negated by
   a negated link after an observation ("is not consistent with") shares the observation's places.
8. **Version 46.** "R > L", "L>R", "R ≥ L", "right > left" are no place (both lungs when nothing else places the
   finding, as "right greater than left"). A heart size "unchanged / stable / similar from prior," before
   "enlarged" is cardiomegaly. A finding governed by the clinician's question ("eval / evaluate / assess for", "r/o",
   "rule out", "to exclude", "question of", "clinical concern for"; as its nearest cue before it, or with only
   hedges between: "evaluate for possible pneumonia") is uncertain and a non-target finding, as the findings of a
   CT sentence: it keeps negatives away from its places and gives no lesion; an observation is not attributed to
   it ("right base opacity, question of pneumonia" keeps the opacity). "Hx" before a finding is "history of".
9. **Version 47.** "No / lack of / without (significant) resolution of" leaves the finding present; a negated fit
   without a verb ("not consistent with", "inconsistent with", "not suggestive of", "not in keeping with") negates;
   "cannot / can't r/o" is the radiologist's hedge "cannot rule out", no clinician's question; "query (of)" hedges
   before a finding, as "?"; "indicating" / "indicates" no longer hedge ("indicative of" still does); "CTR" is the
   cardiothoracic ratio, a stated ratio above one half ("CTR 0.62", "> 0.5", "greater than 50%") or a raised one a
   cardiomegaly; a "Heart: enlarged" template line is cardiomegaly; "airspace dz" is airspace disease; in a sentence
   whose sided places all name one side, a side-less singular base ("basal", "basilar", "lower zone", "lower lobe";
   not "the base", see version 22) takes that side ("left effusion and basal atelectasis"); a fronted negated clause
   ("Although no consolidation is seen, ...") ends its negation at the comma that closes it.
10. **Version 48.** The "cardiothoracic index" / "CTI" reads as the cardiothoracic ratio; "condensation" is
   consolidation; "X favored", "X (is) in the differential", "can / could be seen with X" and "X to be considered"
   hedge X; a bare side word before size words ("Lt small effusion") is the side of the finding after it; "edematous
   lungs" / "lungs are edematous" is edema; "pleural a fusion" is a pleural effusion; "not to be confused with X"
   negates X; foreign-body aspiration is no pneumonia; a cardiothoracic ratio after a cardiomegaly phrase of its
   sentence adds no second finding.
11. **Version 49.** A lesion resolved at one place and, in a following clause joined by "but", "and", ";", "while" or
   "whereas", persisting at another ("Pleural effusion has resolved on the right but persists on the left.",
   "Atelectasis has resolved at the right base; it persists at the left base.") is absent at the first place only and
   present at the second (the persisting clause is a phrase of the lesion, with its own cues); a heart "top-normal in
   size to mildly enlarged" is the uncertain range of version 40.
12. **Version 58.** One lesion named twice in a sentence is one finding: two findings of the same target lesion and
   assertion are merged when their labels are equal ("The heart is enlarged, consistent with cardiomegaly.", "No
   focal opacity or infiltrate.") or, both positive, one has no location phrase of its own ("Right lower lobe
   pneumonia, the pneumonia is unchanged."): the first keeps its phrase, takes both findings' location phrases and
   the placed one's labels (:func:`_one_per_lesion`). Different lesions ("right lower lobe opacity, likely
   pneumonia" attributes the opacity), assertions ("opacity may represent infiltrate"), sides ("left effusion and
   right effusion") or places stay apart, and so do non-target findings.
13. **Report level** (:mod:`.resolve`): a positive lesion finding without a location phrase takes the labels of
   the located positive findings of the sentence before when its sentence points back ("This may represent
   atelectasis."), else of the same lesion; in a merged findings + impression section a lesion +
   location repeated in the impression counts once.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Final

from cxrground.errors import ConfigError
from cxrground.reports.findings import Assertion, Finding, Hedge, StructuredReport
from cxrground.reports.model import SectionChoice
from cxrground.reports.sections import make_section_choice
from cxrground.reports.structure.lexicon import (
    AIR_BRONCHOGRAM_RE,
    ALTERNATIVE_GAP_RE,
    ATELECTASIS,
    ATTRIBUTABLE,
    ATTRIBUTION_BLOCK_RE,
    BARE_SIDE_RE,
    BOTH_WINDOW,
    COMPARATIVE_PLACE_RE,
    CTR_RE,
    CUE_KINDS,
    CUE_MATCHER,
    DIFFUSE_PHRASE_RE,
    EDEMA,
    EFFUSION,
    ELLIPSIS_PLACE_RE,
    ELLIPSIS_RE,
    ENTITY_KINDS,
    ENTITY_MATCHER,
    EXPERIENCER_END_RE,
    EXPERIENCER_RE,
    FRONTED_NEGATION_RE,
    HEART_PERICARDIAL_RE,
    HEART_TECHNIQUE_RE,
    LIKELY_HEDGE_RE,
    LINK_RE,
    LOCATION_KINDS,
    LOCATION_MATCHER,
    LOCATION_RE,
    MASKED_LINK_RE,
    MEDIASTINAL_AFTER_RE,
    MEDIASTINAL_BEFORE_RE,
    NEGATED_LINK_GAP_RE,
    NORMAL_SUBJECT_RE,
    OBSCURED_DIAPHRAGM_RE,
    ON_THE_SIDE_RE,
    OPACITY,
    OTHER_MODALITY_RE,
    PERSISTS_ELSEWHERE_RE,
    PREDOMINANT_PLACE_RE,
    PRIOR_EXAM_NOW_RE,
    PRIOR_EXAM_PAST_RE,
    PRIOR_EXAM_RE,
    PRIOR_NEGATION_RE,
    RADIOGRAPH_RE,
    RESOLVED_SIDE_RE,
    SIDE_ABBREVIATIONS,
    SIDE_BACK_GAP_RE,
    SIDE_CARRY_GAP_RE,
    SIDE_SIZE_RE,
    SIDE_WORD_RE,
    THE_BEFORE_RE,
    UNSIDED_BASE_RE,
    EntityKind,
    default_location,
    is_extent_phrase,
    location_labels,
    respell,
)
from cxrground.reports.structure.resolve import resolve_findings
from cxrground.vocab import HEART
from cxrground.vocab.lesions import HEART_MASK_LESIONS
from cxrground.vocab.locations import lung_bases, lung_label, zone_label

__all__ = ["ALTERNATIVE_POLICIES", "DEFAULT_ALTERNATIVES", "RULES_VERSION", "RuleStructurer", "structure_text"]

#: Version of the rules' output, recorded in :attr:`RuleStructurer.provenance` (so in every build's backends
#: identity: ``ils build`` refuses to resume a build structured by other rules). Bump it with every change that
#: changes what the rules read from a report; ``tests/test_structure_rules.py`` pins the output of a fixed corpus
#: to it and fails when the output moves without a bump. 5: hedge grades; 6: plural "opacifications", reticular
#: patterns and acute respiratory distress syndrome (non-target lung findings); 7: a sentence about what a CT or MRI
#: showed gives non-target findings only; 8: modifiers before an alternative; 9: projection mimics; 10: coordinated
#: lesions share a place; 11: sided zone lists with one noun; 12: report-level rules version 2 (concessive clauses);
#: 13: negations about an earlier film, "the left lung is clear except for", costophrenic blunting, whiteout,
#: report-level rules version 3 (a hedged lesion after a placed finding of its sentence); 14: "almost complete /
#: substantial resolution of" leaves the finding present, a "residual" finding lies where the finding before it lies;
#: 15: "c/w" links, "PNA" is pneumonia; 16: report-level rules version 4 (a sentence opening with "superimposed",
#: "underlying", ... points back); report-level rules version 5 holds the "clear except for" rule of version 13
#: (moved there so the LLM path has it; the same output); 17: a heart size "normal to mildly enlarged" is uncertain;
#: 18: a negation ends at a comma before a new statement also after a place ("no effusion on the left, small effusion
#: on the right"), and a place before such a comma is the phrase's before it; the minor fissure is the right mid
#: zone; 19: "the left costophrenic angle is blunted" is costophrenic blunting; 20: "increased heart size" is
#: cardiomegaly; 21: report-level rules version 6 (a sentence that opens with a bare "Findings" points back); 22:
#: "the base" takes the side of a sided place a few words before it, a sided cardiophrenic angle is that side's base,
#: a place after a preposition belongs to the finding before it; 23: a finding-less, verb-less place after a
#: clause-ending "and the" belongs to the finding before the "and"; 24: "no evidence of worsening X" leaves X
#: present, an extent word keeps both lungs beside a predominant place ("multifocal opacities, most pronounced in the
#: left upper lobe"), "rt" / "lt" before a place, "shadowing"; 25: a negation ends at "and" before a sized finding
#: ("no effusion and mild cardiomegaly"), an obscured sided hemidiaphragm places the findings that explain it, "with
#: air bronchograms" is part of its finding; 26: a finding "with" a placed finding shares its place, "cannot be
#: assessed" is a hedge, "middle zones" name both sides; 27: "likely present" and "considered less likely" are hedges,
#: fluid in a costophrenic angle is an effusion, a side-less zone "on the right" is the right one, plural effusions
#: "larger on the right" lie on both sides; 28: "if any", "is (again) suggested" and a bare hedge word closing a
#: clause ("trace left effusion possible") are hedges; 29: report-level rules version 7 (a hedged diagnosis in the
#: sentence after an observation lies where the observation lies; "small adjacent", "there is associated" point back);
#: 30: a hedge before a list ends at a comma before a new sized item, as a negation does ("possible pneumonia, moderate
#: cardiomegaly"), and ", and" before a size word ends either; 31: the location phrases of a zone "on the right" keep
#: "right" as written (the labels of version 27 stay); 32: "GGO", "atx", "PTX", "air-space changes", "infective
#: changes"; 33: "is excluded", "has disappeared" and "disappearance of" negate; 34: a post-cue does not reach back
#: across a bare comma that ends no list ("right basilar atelectasis, pneumonia not excluded"); 35: "versus" and a
#: hedge before a comma stay in their own part of the sentence, and a comma-joined list does not end in "versus"; 36:
#: a hedge does not reach across ", with"; 37: a zone "of the right lung" is that side's zone, and a lung finding placed
#: only after a predominance word ("particularly at") also lies in both lungs; 38: "infectious" written as a reading
#: ("could be infectious") is pneumonia, "if present" a hedge, and "mass-like" before an airspace word that
#: finding's modifier; 39: a heart called prominent is the non-target finding "cardiac prominence" at the heart (it
#: withholds the cardiomegaly negative); 40: a heart size range from the upper limit of normal ("upper normal to
#: mildly enlarged") is an uncertain cardiomegaly; 41: a negated link verb or adjective negates ("does not suggest",
#: "is not consistent with", "nothing to suggest"); 42: "argues against" negates, "limited for evaluation of" hedges;
#: 43: "has not developed / recurred", "fails to show" and "lack of" negate, and "may be radiographically occult" makes
#: a general caveat, no finding; 44: a size word right after a phrase starts a new item, "absent" / "nil" / "zero" and
#: "X: none" negate, "re-expansion of" and "has re-expanded" negate a collapse, "is difficult to exclude / assess" is
#: a hedge also before a place or reason, "the right clinical setting" names no side, "and definite" ends a hedge,
#: "increased cardiothoracic ratio" is cardiomegaly, a bare "R" / "L" before a lesion or zone is that side (and the
#: sentence splitter ends a sentence at a short unpunctuated list line); 45: a lesion word misspelled within one edit
#: ("effusoin", "pnuemonia") or "effus" is that lesion, a heart size that "has decreased but remains enlarged" is
#: cardiomegaly, a cardiomegaly explained by technique ("may be accentuated by AP technique", "likely due to low lung
#: volumes") or followed by ", difficult to assess" is uncertain, an opacity at a mediastinal site is no lung lesion,
#: "adjacent to / along / above / at the left hemidiaphragm" is the left base, "the right lung is clear without X"
#: places X's absence in that lung and "opacity in X is not consistent with Y" Y's absence in X, "a small one" and
#: "the left (one / side) is unchanged" stand for the lesion before them, "Resolved on the right, ..." is that lesion
#: absent on the right, "of uncertain significance" is a hedge; 46: "R > L" / "L>R" / "right > left" name both lungs
#: as "right greater than left" does, "heart size is unchanged from prior, mildly enlarged" is cardiomegaly, a finding
#: governed by the clinician's question ("eval for", "r/o", "rule out", "to exclude", "question of", "clinical concern
#: for") is a non-target finding, and "Hx" before a finding is history; 47: "no / lack of resolution of" leaves the
#: finding present, "not consistent with" / "inconsistent with" / "not suggestive of" negate without a verb, "cannot
#: r/o" is a hedge, "query" hedges, "indicating" does not, "CTR" above 0.50 and a "Heart: enlarged" template line are
#: cardiomegaly, "airspace dz" is airspace disease, a side-less base takes the one side of its sentence, and a fronted
#: "Although no X is seen," ends its negation at the comma; 48: the "cardiothoracic index" / "CTI" is the ratio,
#: "condensation" is consolidation, "X favored", "X in the differential", "can be seen with X" and "X to be
#: considered" hedge, a bare side word before size words belongs to the finding after it ("Lt small effusion"),
#: "lungs are edematous" is edema, "pleural a fusion" an effusion, "not to be confused with" negates, foreign-body
#: aspiration is no pneumonia, and a ratio after a cardiomegaly phrase of its sentence adds no second finding; 49: a
#: lesion resolved at one place and persisting at another of the same sentence is absent at the first and present at
#: the second, and "the heart is top-normal in size to mildly enlarged" is uncertain (the record's other changes, a
#: normal heart in more words, a normal heart that is no normal examination and an attributed consolidation in the
#: labels, change no finding); 50: "midzone(s)" is the mid zone, and a zone word joined to its noun by a hyphen
#: ("right mid-zone", "upper-lobe") reads as the spaced form; 51: places joined by "and" do not break an observation's
#: link to its lesion ("opacities in the right lower lobe and lingula, consistent with pneumonia"), nor does a sign
#: after "with" ("opacity with volume loss, compatible with atelectasis"), "upper lobe diversion" is a vascular sign
#: whose "upper lobe" places nothing, and a paragraph written as a list ends a sentence at every item line; 52: "more
#: on the right" and its kin compare the lungs and name no side, and a pointing-back sentence does not place edema
#: (report-level rules version 8); 53: an atelectasis "adjacent to" / "associated with" an effusion of a whole lung lies
#: at that lung's base; 54: hyphenated places read as spaced or joined ("peri-hilar", "left-lung"), "right upper
#: perihilar" is the right upper and mid zones, a zone or segment "of the LUL" / "of the left lower lobe" takes the
#: lobe's side, "particularly visible in" and "greater involvement of" are predominance words, every place across
#: "with" reaches a finding with no place of its own (not only the first), another person's illness ("her husband
#: was hospitalized with pneumonia") is no finding, and a pneumonia with no place lies where the section's placed
#: parenchymal findings lie (report-level rules version 10); 57 (``bench/records/rules_v57_preregistration.md``): "the
#: heart silhouette and mediastinal contours are not enlarged" is an absent cardiomegaly (the phrase's subject also
#: takes "heart silhouette", "cardio mediastinal silhouette" and a joined mediastinum), and an uncertain pneumonia of a
#: differential takes its alternatives' places (report-level rules version 11); the labels read a normal heart in
#: more words; 58 (``bench/records/rules_v58_preregistration.md``): one lesion named twice in a sentence with one
#: assertion and agreeing places is one finding ("The heart is enlarged, consistent with cardiomegaly.").
RULES_VERSION: Final[str] = "58"
#: Alternatives policies (step 3 of the module docstring); the first is the default (ILS.md §7.1).
ALTERNATIVE_POLICIES: Final[tuple[str, ...]] = ("uncertain", "present")
DEFAULT_ALTERNATIVES: Final[str] = ALTERNATIVE_POLICIES[0]

_NEG = frozenset({"neg_pre", "neg_post", "neg_both", "neg_subj"})
_UNC = frozenset({"unc_pre", "unc_post", "unc_both", "unc_vs", "link", "question"})
_PRE = frozenset({"neg_pre", "unc_pre", "link", "neg_both", "unc_both", "unc_vs", "question"})
_POST = frozenset({"neg_post", "unc_post", "neg_both", "unc_both", "unc_vs", "neg_subj", "caveat"})
_CLOSING = frozenset({"neg_post", "unc_post"})
_HEDGE_PRE = frozenset({"unc_pre", "unc_both", "unc_vs", "question"})
#: Cues before a phrase that hedge it up to a comma or a new sized item: the plain hedges and the clinician's question
#: (version 46).
_QUESTION_LIKE = frozenset({"unc_pre", "question"})
_COORD_GAP: Final[re.Pattern[str]] = re.compile(r"\s*,?\s*(?:and|or|nor|/|,)\s*(?:[\w-]+\s+){0,2}")
_INSIDE_NEG: Final[re.Pattern[str]] = re.compile(r"\b(?:not|no)\b")
_AND: Final[re.Pattern[str]] = re.compile(r"\band\b")
#: A heart size given as a range from normal ("normal to mildly enlarged"; version 49: "top-normal in size to mildly
#: enlarged"): an uncertain cardiomegaly.
_NORMAL_RANGE: Final[re.Pattern[str]] = re.compile(r"\bnormal(?:\s+in\s+size)?\s+(?:to|or)\b")
#: A verb in or after a phrase before a clause-final "have resolved": the phrase is not part of that verb's subject.
_VERB: Final[re.Pattern[str]] = re.compile(
    r"\b(?:is|are|was|were|has|have|had|appears?|remains?|seems?|shows?|demonstrates?)\b")
_PREPOSITIONS: Final[re.Pattern[str]] = re.compile(r"\b(?:in|at|of|the|within|on|involving|over|along|near)\b")
#: Words that may stand between an observation's comma and its alternatives ("opacities, XXXX subsegmental
#: atelectasis or scarring"): de-identification blanks and descriptive modifiers.
_APPOSITION_FILLER: Final[re.Pattern[str]] = re.compile(
    r"\b(?:xxxx|subsegmental|segmental|mild|minimal|small|patchy|streaky|linear|bandlike|band-like|plate-?like|"
    r"discoid|focal|early|developing|chronic|acute|some|mild-moderate)\b")
_AND_VERB: Final[re.Pattern[str]] = re.compile(
    r"\b(?:is|are|may|might|could|likely|probably|represents?|reflects?|suggests?)\b")
_WORD: Final[re.Pattern[str]] = re.compile(r"[\w-]+")
#: A location phrase's stand-in in an attribution gap, and two of them joined by "and" (version 51).
_PLACE: Final[str] = " \x00 "
_PLACE_LIST: Final[re.Pattern[str]] = re.compile(r"\x00(?:\s*,)?\s*(?:and|&)\s+(?:(?:the|both)\s+)*\x00")
#: Non-target signs that may stand after "with" between an observation and its link (version 51: "opacity with
#: volume loss, compatible with atelectasis"), and the words between the observation and such a sign.
_WITH_SIGNS: Final[frozenset[str]] = frozenset({"volume loss", "vascular congestion"})
_WITH_SIGN_GAP: Final[re.Pattern[str]] = re.compile(
    r"\s*,?\s*with\s+(?:(?:associated|mild|minimal|slight|some|moderate|marked|significant)\s+)*")
_ADJACENT: Final[re.Pattern[str]] = re.compile(
    r"\b(?:adjacent|associated|accompanying|surrounding|subjacent|overlying|superimposed|compressive|passive|"
    r"relaxation|parapneumonic|residual)\s+(?:[\w-]+\s+)?$")
_NORMAL_AFTER: Final[re.Pattern[str]] = re.compile(
    r"\s+(?:is|are|remains?|appears?)\s+(?:otherwise\s+|now\s+|again\s+)?(?:clear|normal|unremarkable|"
    r"well[- ]aerated|well[- ]expanded)\b")
#: A comma and a size / extent / morphology / side word: a new statement after a list ("no pneumothorax, small
#: effusion"), also when the negated phrase has words after it ("no effusion on the left, small effusion on the
#: right").
#: Size and severity words of a finding ("small effusion", "severe edema").
_SIZE_WORDS: Final[str] = r"small|trace|tiny|minimal|mild|moderate|large|severe|massive"
_NEW_ITEM: Final[re.Pattern[str]] = re.compile(
    rf"[^,;]*?,\s*(?:an?\s+)?(?:{_SIZE_WORDS}|persistent|new|"
    r"increasing|increased|decreasing|decreased|stable|unchanged|right|left|bilateral|bibasilar|patchy|hazy|"
    r"streaky|linear|subtle|faint|dense|diffuse|multifocal|scattered|retrocardiac|basilar|perihilar|lingular|"
    r"rll|lll|rml|rul|lul)\b")
#: "and" and a size / severity / change word after a negated phrase: a new statement ("no effusion and mild
#: cardiomegaly"; version 25). A plain "no A and B" negates both.
_AND_NEW_ITEM: Final[re.Pattern[str]] = re.compile(
    rf"[^,;]*?(?:,\s*)?\band\s+(?:only\s+)?(?:an?\s+)?(?:{_SIZE_WORDS}|"
    r"persistent|stable|unchanged|increasing|increased|decreasing|decreased|improving|improved|worsening|worsened|"
    r"residual)\b")
#: A size / severity word right after a finding phrase, with no comma or conjunction: a new item ("no effusion small
#: left basilar atelectasis"; version 44).
_BARE_NEW_ITEM: Final[re.Pattern[str]] = re.compile(rf"\s+(?:{_SIZE_WORDS})\b[^,;]*")
#: A later "or" / "nor" of the clause: the phrase belongs to a list that goes on ("no A, small B, or C").
_LIST_GOES_ON: Final[re.Pattern[str]] = re.compile(r"\b(?:or|nor)\b")


def _joining_gap(joiner: str, modifiers: str) -> re.Pattern[str]:
    """The gap between two finding phrases: ``joiner``, then any of the next phrase's ``modifiers``."""
    return re.compile(rf"\s*(?:{joiner})\s*(?:(?:{modifiers})\s+)*")


#: A bare comma between two phrases: a list member when the list ends with "or" ("atelectasis, aspiration, or
#: pneumonia"); modifiers of the next phrase may follow.
_SERIES_COMMA: Final[re.Pattern[str]] = _joining_gap(
    ",", r"xxxx|an?|early|developing|superimposed|underlying|mild|small|focal|subsegmental|chronic|acute|lobar|"
         r"segmental|bibasilar")
#: Words that may follow a comma without starting a new subject ("effusion, previously seen, is no longer seen").
_CLAUSE_CONTINUES: Final[re.Pattern[str]] = re.compile(
    r"(?:\s*\b(?:is|are|was|were|has|have|had|been|be|now|also|again|still|which|that|then|previously|"
    r"otherwise)\b)*\s*")
_AND_OR: Final[re.Pattern[str]] = re.compile(r"\b(?:and|or|nor)\b|/")
#: A comma (and spaces) right before a position.
_COMMA_BEFORE: Final[re.Pattern[str]] = re.compile(r",\s*$")
_VERSUS: Final[re.Pattern[str]] = re.compile(r"\b(?:versus|vs)\b")
_MAX_LINK_WORDS: Final[int] = 15
_LOCATION_SCOPE_SKIP: Final[str] = "with"
#: "and (the)" right before a place: the clause-ending "and" of a coordinated place (version 23).
_AND_THE: Final[re.Pattern[str]] = re.compile(r"\band\s+(?:the\s+)?$")
#: A preposition (and article) right before a location phrase: the place follows the finding it belongs to
#: ("opacity in the right lower lobe and atelectasis"; version 22).
_PLACE_PREPOSITION: Final[re.Pattern[str]] = re.compile(
    r"\b(?:in|at|of|on|within|involving|over|along|throughout|near|projecting\s+over|overlying)\s+"
    r"(?:the\s+|both\s+)?$")
#: A sided hemidiaphragm: what lies "adjacent" to it lies at that side's lung base.
_SIDED_DIAPHRAGM: Final[re.Pattern[str]] = re.compile(r"\b(right|left)\s+hemidiaphragm\b")
#: Gap that coordinates a finding with the one before it ("left basilar atelectasis and small effusion").
_COORDINATION_GAP: Final[re.Pattern[str]] = _joining_gap(
    r",?\s*(?:and|as\s+well\s+as|&|with)\b",  # "with" since version 26
    r"a|an|the|small|tiny|trace|minimal|mild|moderate|large|layering|adjacent|associated|some|possible|probable|"
    r"likely|early|developing|focal|patchy|subsegmental|persistent|residual|new|stable|unchanged|increasing|"
    r"increased|decreasing|decreased|worsening|improving")
#: The gap between two places of one list ("the right upper lobe and the left base").
_PLACE_LIST_GAP: Final[re.Pattern[str]] = re.compile(r"\s*(?:,\s*and|,|and|or|/)\s*(?:(?:in|at|of)\s+)?(?:the\s+)?")
#: A plural place ("upper lobes", "bases") names both sides and takes no side from the phrase before it.
_PLURAL_PLACE: Final[re.Pattern[str]] = re.compile(r"\b(?:lobes|zones|fields|lungs|bases|apices|hila|regions)\b")
#: The whole-lung labels.
_SIDE_LUNGS: Final[frozenset[str]] = frozenset({"right lung", "left lung"})
#: What an opacity at a mediastinal site is (version 45): a non-target finding outside the lungs.
_MEDIASTINAL_OPACITY: Final[EntityKind] = EntityKind("mediastinal opacity", None, lung=False)


@dataclass
class _Mention:
    start: int
    end: int
    kind: EntityKind
    assertion: Assertion = "present"
    group: int = -1
    absorbed: bool = False
    historical: bool = False
    hedge: Hedge | None = None
    entity_span: tuple[int, int] | None = None
    locations: list[tuple[int, str, tuple[str, ...]]] = field(default_factory=list)
    #: for a pronoun or ellipsis ("a small one", "the left"; version 45): the phrase it stands for, and its side
    antecedent: _Mention | None = None
    side: str | None = None
    #: governed by the clinician's question ("eval for", "r/o"; version 46): a non-target finding
    question: bool = False


@dataclass(frozen=True)
class _Cue:
    start: int
    end: int
    kind: str


def _nwords(text: str) -> int:
    return len(_WORD.findall(text))


def _grade(low: str, hedges: list[_Cue]) -> Hedge:
    """The hedge grade of an uncertain phrase: ``likely`` when every cue that hedged it is a likely-hedge."""
    def likely(c: _Cue) -> bool:
        start = c.start - 5 if low.endswith("most ", 0, c.start) else c.start  # "most suggestive of"
        return c.kind != "unc_vs" and LIKELY_HEDGE_RE.fullmatch(low, start, c.end) is not None

    return "likely" if hedges and all(likely(c) for c in hedges) else "possible"


def _new_subject(low: str, start: int, end: int) -> bool:
    """Whether ``low[start:end]`` (between a phrase and a later cue) holds a comma followed by a new subject."""
    k = low.rfind(",", start, end)
    return k >= 0 and _CLAUSE_CONTINUES.fullmatch(low, k + 1, end) is None


def _ends_no_list(gaps: list[str]) -> bool:
    """Whether a bare comma among the ``gaps`` between coordinated phrases is followed by no conjunction: then the
    phrases after it are no list with those before it ("atelectasis, pneumonia not excluded"; version 34), while
    "atelectasis, effusion, or pneumonia" is one."""
    return any("," in g and not _AND_OR.search(g) and not any(_AND_OR.search(h) for h in gaps[k + 1:])
               for k, g in enumerate(gaps))


def _asked(low: str, before: list[_Cue], hedge: _Cue, m: _Mention, mentions: list[_Mention]) -> bool:
    """Whether the clinician's question governs ``m`` through the ``hedge`` that is its nearest cue: only hedges, no
    comma and no other phrase stand between the question and ``m`` ("evaluate for possible pneumonia", "eval for ?
    pneumonia"; version 46)."""
    for c in reversed([c for c in before if c.end <= hedge.start]):
        if c.kind == "question":
            return "," not in low[c.end:m.start] and not any(c.end <= mm.start and mm.end <= m.start
                                                             for mm in mentions)
        if c.kind not in _HEDGE_PRE and c.kind != "link":
            return False
    return False


def _starts_new_item(low: str, cue: _Cue, i: int, mentions: list[_Mention], hi: int, hedge: bool = False) -> bool:
    """Whether a bare comma and a size / side word between ``cue`` and phrase ``i`` start a new statement.

    "No pneumothorax, small right effusion": the effusion is a new statement, and so is "no effusion small left
    atelectasis" (a size word right after a phrase, version 44); so is "and" before a size word ("no
    effusion and mild cardiomegaly"; for a ``hedge`` only after a comma: "possible pneumonia and small effusion"
    hedges both). Not when the list goes on with "or" / "nor" ("no pneumothorax, large effusion, or
    consolidation") or a conjunction joins the two phrases.
    """
    for j in range(i, 0, -1):
        prev = mentions[j - 1]
        if prev.start < cue.end:
            return False
        gap = _NEW_ITEM.match(low, prev.end, mentions[j].start) or _BARE_NEW_ITEM.fullmatch(low, prev.end,
                                                                                              mentions[j].start)
        if gap is not None and not _AND_OR.search(low, prev.end, mentions[j].start):
            return _LIST_GOES_ON.search(low, mentions[j].end, max(hi, mentions[j].end)) is None
        if _AND_NEW_ITEM.match(low, prev.end, mentions[j].start) is not None and (
                not hedge or "," in low[prev.end:mentions[j].start]):  # "no effusion and mild cardiomegaly"
            return _LIST_GOES_ON.search(low, mentions[j].end, max(hi, mentions[j].end)) is None
    return False


def _join_places(gap: str) -> str:
    """An attribution gap whose location phrases are :data:`_PLACE` stand-ins, with places joined by "and" made
    one and the stand-ins made blanks."""
    while True:
        joined = _PLACE_LIST.sub("\x00", gap)
        if joined == gap:
            return gap.replace("\x00", " ")
        gap = joined


class RuleStructurer:
    """The built-in rule-based :class:`~cxrground.reports.findings.Structurer` (lexicon of :mod:`.lexicon`)."""

    name: str = "rules"

    def __init__(self, source: str = "rules", alternatives: str = DEFAULT_ALTERNATIVES) -> None:
        if alternatives not in ALTERNATIVE_POLICIES:
            raise ConfigError(f"unknown alternatives policy {alternatives!r}; expected one of "
                              f"{', '.join(ALTERNATIVE_POLICIES)}")
        self.source = source
        self.alternatives = alternatives

    @property
    def provenance(self) -> dict[str, str]:
        """Name, rules version and settings, recorded with every output (as :attr:`.LLMStructurer.provenance`)."""
        return {"name": self.name, "version": RULES_VERSION, "alternatives": self.alternatives}

    # -- public API ------------------------------------------------------------------------------------------

    def structure(self, report_id: str, section: SectionChoice) -> StructuredReport:
        """Structured findings of every sentence of ``section``, with the report-level rules of :mod:`.resolve`."""
        findings: list[Finding] = []
        for sentence in section.sentences:
            findings.extend(self.structure_sentence(sentence.index, sentence.text))
        return resolve_findings(StructuredReport(report_id=report_id, section=section, findings=tuple(findings)))

    def structure_sentence(self, index: int, text: str) -> list[Finding]:
        """Findings of one sentence numbered ``index`` (1-based)."""
        low = text.lower()
        if len(low) != len(text):  # a few non-ASCII characters change length when lower-cased
            text = low
        written, back = text, None
        spelled = respell(low)
        if spelled is not None:  # misspelled lesion words ("effusoin", "pnuemonia"; version 45) read as written right
            low, edits = spelled
            text, back = low, edits
        mentions = [
            _Mention(m.start(), m.end(), ENTITY_KINDS[m.lastgroup])  # type: ignore[index]
            for m in ENTITY_MATCHER.matches(low)
        ]
        if not mentions:
            return []
        extra_terms = self._ellipses(low, text, mentions)
        extra_terms += self._persisting(low, mentions)
        fronted = FRONTED_NEGATION_RE.match(low)
        if fronted is not None:  # "Although no X is seen, Y ...": the negation ends at the comma (version 47)
            extra_terms.append(_Cue(fronted.start("comma"), fronted.end("comma"), "term"))
        if self._about_prior_exam(low):
            return []  # "On the prior outside CT, the right upper lobe was consolidated.": history
        # "... opacities were observed on high-resolution computed tomography scan": not a finding of this film
        other_exam = OTHER_MODALITY_RE.search(low) is not None and RADIOGRAPH_RE.search(low) is None
        cues = [_Cue(m.start(), m.end(), CUE_KINDS[m.lastgroup]) for m in CUE_MATCHER.matches(low)]  # type: ignore[index]
        # cues that overlap a phrase without lying inside it are parts of words of the phrase: drop them
        cues = [c for c in cues if not any(c.start < mm.end and mm.start < c.end and not (
            mm.start <= c.start and c.end <= mm.end) for mm in mentions)]
        cues = sorted(cues + extra_terms, key=lambda c: (c.start, c.end))
        terms = [c for c in cues if c.kind == "term"]
        groups = self._groups(low, mentions)
        if self.alternatives == "present":  # "versus" joining two alternatives is no hedge under this policy
            joins = [(mentions[g[k - 1]].end, mentions[g[k]].start) for g in groups for k in range(1, len(g))]
            cues = [c for c in cues if c.kind != "unc_vs" or not any(a <= c.start and c.end <= b for a, b in joins)]
        # the scope ends of a hedge before its phrase: a hedge reaches across "with" ("possible small effusion with
        # adjacent atelectasis"), not across ", with" ("..., likely atelectasis, with small effusions"; version 36)
        hedge_terms = [t for t in terms
                       if low[t.start:t.end] != _LOCATION_SCOPE_SKIP or _COMMA_BEFORE.search(low, 0, t.start)]
        for i, mention in enumerate(mentions):
            mention.assertion = self._assertion(low, mention, i, mentions, cues, terms, hedge_terms)
        self._alternatives(mentions, groups)
        self._attribute(low, mentions, groups, cues, terms)
        self._locate(low, text, mentions, terms)
        self._mediastinal(low, mentions)
        self._adjacent(low, text, mentions)
        self._coordinated(low, mentions)
        self._ellipsis_places(mentions)
        self._one_cardiomegaly(low, mentions)
        self._other_person(low, mentions)
        found = self._findings(index, text, mentions, other_exam)
        if back is not None:  # the phrases and places as written, not as respelled
            found = [replace(f, entity=_written(written, back, mm),
                             location_phrases=_written_places(written, back, mm, f.location_phrases))
                     for f, mm in zip(found, [mm for mm in mentions if not (mm.absorbed or mm.historical)],
                                      strict=True)]
        return _one_per_lesion(found)

    # -- steps -------------------------------------------------------------------------------------------------

    @staticmethod
    def _ellipses(low: str, text: str, mentions: list[_Mention]) -> list[_Cue]:
        """Add the pronouns and ellipses of the sentence to ``mentions`` (version 45): "a small one" and "the left (one
        / side) is unchanged" stand for the nearest lung phrase before them (on that side for "the left"), "Resolved on
        the right, ..." opening a sentence for the first lung phrase after its comma, absent on that side. Returns the
        scope ends they add (the comma of "Resolved on the right,")."""
        added: list[_Mention] = []
        terms: list[_Cue] = []
        if "one" not in low and "the right" not in low and "the left" not in low:
            return terms
        for m in ELLIPSIS_RE.finditer(low):
            group = "one" if m.group("one") else "side"
            if group == "side" and ELLIPSIS_PLACE_RE.search(low, max(0, m.start() - 12), m.start()):
                continue  # "effusion on the right is small": a place
            s, e = m.span(group)
            if any(mm.start < e and s < mm.end for mm in mentions):
                continue
            before = [mm for mm in mentions if mm.end <= m.start() and mm.kind.lung and not mm.kind.mimic
                      and ";" not in low[mm.end:m.start()]]  # the lesion of its own clause, or of the clause before
            if not before:
                continue
            ante = before[-1]
            side = m.group("side")
            if side is not None:
                e = m.end()  # "the left side": the whole ellipsis
            added.append(_Mention(s, e, ante.kind, antecedent=ante, side=side,
                                  locations=[(s, text[s:e], (lung_label(side),))] if side else []))
        opening = RESOLVED_SIDE_RE.match(low)
        if opening is not None:
            after = [mm for mm in mentions if mm.start >= opening.end() and mm.kind.lung and not mm.kind.mimic]
            if after:
                s, e = opening.span("side")
                side = opening.group("side")
                added.append(_Mention(s, e, after[0].kind, antecedent=after[0], side=side,
                                      locations=[(s, text[s:e], (lung_label(side),))]))
                terms.append(_Cue(opening.end(), opening.end() + 1, "term"))  # the comma ends its clause
        if added:
            mentions.extend(added)
            mentions.sort(key=lambda mm: mm.start)
        return terms

    @staticmethod
    def _persisting(low: str, mentions: list[_Mention]) -> list[_Cue]:
        """Add the lesion that a sentence states resolved at one place and persisting at another (version 49):
        "Pleural effusion has resolved on the right but persists on the left." is an absent effusion on the right
        and a present one on the left. The persisting clause ("persists", "it remains", "is still present") is a
        phrase of the lesion named before it, with its own cues and places; its join ("but", "and", ";", "while",
        "whereas") ends the clause of the resolution. Returns the scope ends it adds."""
        terms: list[_Cue] = []
        if not any(word in low for word in ("resolved", "cleared", "gone", "disappeared")):
            return terms
        added: list[_Mention] = []
        for mm in mentions:
            if not mm.kind.lung or mm.kind.mimic or mm.antecedent is not None:
                continue
            m = PERSISTS_ELSEWHERE_RE.match(low, mm.end)
            if m is None or LOCATION_RE.match(low, m.end("here")) is None or LOCATION_RE.match(
                    low, m.end("there")) is None:
                continue  # a place on both sides of the join, or none of this
            s, e = m.span("subject") if m.group("subject") else m.span("verb")
            if any(other.start < m.end() and m.start() < other.end for other in mentions if other is not mm):
                continue  # another phrase between: not this lesion's clauses
            added.append(_Mention(s, e, mm.kind, antecedent=mm, entity_span=(mm.start, mm.end)))
            terms.append(_Cue(m.start("join"), m.end("join"), "term"))
        if added:
            mentions.extend(added)
            mentions.sort(key=lambda x: x.start)
        return terms

    @staticmethod
    def _other_person(low: str, mentions: list[_Mention]) -> None:
        """Mark the phrases that name another person's illness (version 54: "her husband was hospitalized with
        pneumonia"; :data:`~.lexicon.EXPERIENCER_RE`) as no finding of this image, up to the end of that person's part
        of the sentence (:data:`~.lexicon.EXPERIENCER_END_RE`)."""
        for m in EXPERIENCER_RE.finditer(low):
            end = EXPERIENCER_END_RE.search(low, m.end())
            stop = end.start() if end is not None else len(low)
            for mm in mentions:
                if m.end() <= mm.start and mm.end <= stop:
                    mm.historical = True

    @staticmethod
    def _about_prior_exam(low: str) -> bool:
        """Whether the sentence tells, in the past tense, what an earlier examination showed (history, step 6)."""
        m = PRIOR_EXAM_RE.match(low)
        if m is None:
            return False
        rest = low[m.end():]
        return PRIOR_EXAM_PAST_RE.search(rest) is not None and PRIOR_EXAM_NOW_RE.search(rest) is None

    @staticmethod
    def _scope(terms: list[_Cue], start: int, end: int, n: int, skip: str | None = None,
               low: str = "") -> tuple[int, int]:
        lo, hi = 0, n
        for t in terms:
            if skip is not None and low[t.start:t.end] == skip:
                continue
            if t.end <= start:
                lo = max(lo, t.end)
            elif t.start >= end:
                hi = min(hi, t.start)
                break
        return lo, hi

    def _assertion(self, low: str, m: _Mention, i: int, mentions: list[_Mention], cues: list[_Cue],
                   terms: list[_Cue], hedge_terms: list[_Cue]) -> Assertion:
        lo, hi = self._scope(terms, m.start, m.end, len(low))
        neg = unc = False
        hedges: list[_Cue] = []  # the cues that made the phrase uncertain, for its hedge grade
        # inside the phrase (the heart-size construction)
        for c in cues:
            if m.start <= c.start and c.end <= m.end:
                neg |= c.kind in _NEG
                if c.kind in _UNC:
                    unc = True
                    hedges.append(c)
        if m.kind.lesion in HEART_MASK_LESIONS:  # the heart-size construction: "not enlarged", "normal to enlarged"
            neg = neg or _INSIDE_NEG.search(low, m.start, m.end) is not None
            unc = unc or _NORMAL_RANGE.search(low, m.start, m.end) is not None  # a negation still wins below
            # explained by technique: "may be accentuated by AP technique", ", likely due to low lung volumes" (v45)
            unc = unc or HEART_TECHNIQUE_RE.match(low, m.end, hi) is not None
            # a pericardial effusion named as its alternative: "..., which may reflect cardiomegaly or pericardial
            # effusion" (version 56)
            unc = unc or HEART_PERICARDIAL_RE.match(low, m.end, hi) is not None
        # before: the nearest applicable cue of the clause; a hedge's clause ends at ``hedge_terms``, a negation's
        # also at "with" ("no cardiomegaly with bilateral effusions")
        lo_hedge = self._scope(hedge_terms, m.start, m.end, len(low))[0]
        before = [c for c in cues if lo_hedge <= c.start and c.end <= m.start and c.kind != "term"]
        for c in reversed(before):
            if c.start < lo and c.kind not in _HEDGE_PRE:
                break
            if c.kind in _CLOSING:
                break  # "no effusion is seen and ..." closed the earlier cue's scope
            if c.kind == "hist":
                m.historical = True  # "history of pneumonia": not a finding of this image
                break
            if c.kind not in _PRE:
                continue
            if c.kind in BOTH_WINDOW and _nwords(low[c.end:m.start]) > BOTH_WINDOW[c.kind]:
                continue
            if c.kind in ("unc_vs", *_QUESTION_LIKE) and "," in low[c.end:m.start] and (
                    c.kind == "unc_vs" or not any(c.end <= mm.start and mm.end <= m.start for mm in mentions)):
                break  # "atelectasis vs consolidation, small effusion"; "edema, likely cardiogenic, with effusions"
            if c.kind == "link":
                if any(p.kind in ("neg_pre", "neg_both") for p in before if p.end <= c.start):
                    neg = True
                elif _starts_new_item(low, c, i, mentions, hi, hedge=True):
                    break  # "opacity, concerning for pneumonia, and small left effusion": the effusion is stated
                else:
                    unc = True
                    hedges.append(c)
            elif c.kind in _NEG:
                if _starts_new_item(low, c, i, mentions, hi):
                    break  # "no pneumothorax, small right effusion": the negation ended with the first phrase
                neg = True
            else:
                if c.kind in _QUESTION_LIKE and _starts_new_item(low, c, i, mentions, hi, hedge=True):
                    break  # "possible pneumonia, moderate cardiomegaly": the hedge ended with the first phrase
                unc = True
                hedges.append(c)
                m.question = c.kind == "question" or _asked(low, before, c, m, mentions)
            break
        # after: the nearest post-cue of the clause, across coordinated phrases only
        for c in cues:
            if c.start < m.end or c.end > hi or c.kind not in _POST:
                continue
            if c.kind == "neg_subj" and not _VERB.search(low, m.start, c.start):
                neg = True  # part of the subject of "... have resolved" ("consolidation, atelectasis, and X have")
                break
            if c.kind in BOTH_WINDOW and _nwords(low[m.end:c.start]) > BOTH_WINDOW[c.kind]:
                break
            if c.kind == "unc_vs" and "," in low[m.end:c.start]:
                break  # "small left effusion, atelectasis vs consolidation": "vs" joins the two after the comma
            prev_end = m.end
            ok = True
            clause = _VERB.search(low, m.start, m.end) is not None  # "heart size is enlarged": a clause of its own
            gaps: list[str] = []
            for other in mentions[i + 1:]:
                if other.start >= c.start:
                    break
                if clause or not _COORD_GAP.fullmatch(low, prev_end, other.start):
                    ok = False
                    break
                gaps.append(low[prev_end:other.start])
                prev_end = other.end
            if ok and _new_subject(low, prev_end, c.start):
                ok = False  # "heart size is enlarged, pulmonary vascularity within normal limits"
            if ok and _ends_no_list(gaps):
                ok = False  # "right basilar atelectasis, pneumonia not excluded": the hedge is the pneumonia's
            if ok and c.kind == "caveat":
                m.historical = True  # "early infection may be radiographically occult": no finding of this image
            elif ok:
                neg |= c.kind in _NEG
                if c.kind in _UNC:
                    unc = True
                    hedges.append(c)
            break
        if neg:
            m.question = False  # "evaluate for pneumonia, which is not seen": the answer
            return "absent"
        if unc:
            m.hedge = _grade(low, hedges)
            return "uncertain"
        return "present"

    @staticmethod
    def _groups(low: str, mentions: list[_Mention]) -> list[list[int]]:
        """Indices of the phrases joined by or / versus / "/" / and/or, group by group (single phrases alone).

        A bare comma joins too when the list ends with such a join ("atelectasis, aspiration, or pneumonia"),
        unless the phrase before the comma is an observation (then the comma may link it to its alternatives:
        "opacity, atelectasis or pneumonia").
        """
        n = len(mentions)
        joined = [False] * n  # joined[i]: mention i joins the group of mention i - 1
        versus = [False] * n  # versus[i]: that join is "versus" / "vs", which joins two phrases only (version 35)
        for i in range(n - 1, 0, -1):
            a, b = mentions[i - 1].end, mentions[i].start
            alternative = ALTERNATIVE_GAP_RE.fullmatch(low, a, b) is not None
            versus[i] = alternative and _VERSUS.search(low, a, b) is not None
            joined[i] = alternative or (
                i + 1 < n and joined[i + 1] and not versus[i + 1] and not mentions[i - 1].kind.observation
                and _SERIES_COMMA.fullmatch(low, a, b) is not None)
        groups: list[list[int]] = [[0]]
        for i in range(1, n):
            if joined[i]:
                groups[-1].append(i)
            else:
                groups.append([i])
        for g, members in enumerate(groups):
            for i in members:
                mentions[i].group = g
        return groups

    def _alternatives(self, mentions: list[_Mention], groups: list[list[int]]) -> None:
        """Under the ``uncertain`` policy a group of two or more alternatives becomes uncertain unless negated."""
        if self.alternatives != "uncertain":
            return
        for members in groups:
            if len(members) > 1 and not any(mentions[i].assertion == "absent" for i in members):
                for i in members:  # a differential: each member is one of several candidates
                    mentions[i].assertion, mentions[i].hedge = "uncertain", "possible"

    @staticmethod
    def _attributable(kind: EntityKind) -> bool:
        return kind.lesion in ATTRIBUTABLE or (kind.lesion is None and (kind.lung or kind.mimic))

    def _attribute(self, low: str, mentions: list[_Mention], groups: list[list[int]], cues: list[_Cue],
                   terms: list[_Cue]) -> None:
        for members in groups:
            if len(members) != 1:
                continue
            i = members[0]
            obs = mentions[i]
            if not obs.kind.observation or obs.assertion == "absent" or i + 1 >= len(mentions):
                continue
            after = self._after_sign(low, mentions, i)
            target_group = groups[mentions[after].group]
            targets = [mentions[j] for j in target_group]
            # an alternative of the observation's own type restates it ("opacity, atelectasis versus infiltrate")
            same = [t for t in targets if t.kind.lesion == obs.kind.lesion
                    and (obs.kind.lesion is not None or t.kind.name == obs.kind.name)]
            others = [t for t in targets if t not in same]
            if not others or any(not self._attributable(t.kind) for t in others):
                continue
            if obs.question or any(t.question for t in targets):
                # the clinician's question is no reading (version 46): "right base opacity, question of pneumonia"
                # keeps the opacity; what a question's observation is linked to is asked as well
                if obs.question:
                    for t in targets:
                        t.question = t.assertion != "absent"
                continue
            if any(t.assertion == "absent" for t in targets):
                # "opacity in the right lower lobe is not consistent with pneumonia": the pneumonia's absence lies
                # where the opacity lies (version 45)
                if all(t.assertion == "absent" for t in others) and not same and NEGATED_LINK_GAP_RE.fullmatch(
                        _PREPOSITIONS.sub(" ", LOCATION_MATCHER.sub(" ", low[obs.end:targets[0].start]))) is not None:
                    obs.group = targets[0].group
                continue
            gap_start, gap_end = mentions[after - 1].end, targets[0].start
            # a blank where the link word was ("opacity XXXX atelectasis"): a link of unknown strength, no hedge seen
            masked = MASKED_LINK_RE.fullmatch(low, gap_start, gap_end) is not None and "xxxx" in low[gap_start:gap_end]
            if not masked and not self._is_link(low, gap_start, gap_end, len(targets) > 1):
                continue
            gap_hedges = [c for c in cues if gap_start <= c.start and c.end <= gap_end and c.kind in _UNC]
            several = len(targets) > 1 and self.alternatives == "uncertain"
            if obs.assertion == "uncertain" or several or gap_hedges:
                grades = {_grade(low, gap_hedges)} if gap_hedges else set()
                if obs.assertion == "uncertain":
                    grades.add(obs.hedge or "possible")
                if several:
                    grades.add("possible")
                for t in others:
                    if t.assertion == "uncertain":
                        grades.add(t.hedge or "possible")
                grade: Hedge = "likely" if grades == {"likely"} else "possible"
                for t in others:
                    t.assertion = "uncertain"
                    t.hedge = grade
            for t in same:
                t.absorbed = True
            if all(t.kind.mimic for t in others):  # explained by what projects over the lung: no lung lesion
                obs.kind = replace(obs.kind, lesion=None, observation=False)
            if any(t.kind.lesion is not None for t in others):
                obs.absorbed = not same
                for t in others:  # a lesion named by an opacity-class phrase keeps that phrase (not "blunting")
                    if t.kind.lesion is not None and obs.kind.lesion is not None:
                        t.entity_span = (obs.start, obs.end)
            # the observation and its targets share their location phrases (and a sign between them, version 51)
            obs.group = targets[0].group
            if after > i + 1:
                mentions[i + 1].group = targets[0].group

    @staticmethod
    def _after_sign(low: str, mentions: list[_Mention], i: int) -> int:
        """The index of the mention an observation ``mentions[i]`` may be linked to: the next one, or the one after a
        non-target sign that follows it after "with" (:data:`_WITH_SIGNS`, version 51)."""
        sign = mentions[i + 1]
        if (i + 2 < len(mentions) and sign.kind.lesion is None and sign.kind.name in _WITH_SIGNS
                and sign.assertion != "absent" and _WITH_SIGN_GAP.fullmatch(
                    _PREPOSITIONS.sub(" ", LOCATION_MATCHER.sub(" ", low[mentions[i].end:sign.start]))) is not None):
            return i + 2
        return i + 1

    @staticmethod
    def _is_link(low: str, start: int, end: int, alternatives: bool) -> bool:
        # what an earlier film showed is no part of the link ("opacity, not previously seen, is concerning for")
        # places joined by "and" are one place (version 51: "in the right lower lobe and lingula, consistent with")
        places = _join_places(LOCATION_MATCHER.sub(_PLACE, low[start:end]))
        gap = AIR_BRONCHOGRAM_RE.sub(" ", PRIOR_NEGATION_RE.sub(" ", places))
        if _nwords(gap) > _MAX_LINK_WORDS:
            return False
        links = list(LINK_RE.finditer(gap))
        if not links:  # a bare comma (with a location phrase) links to alternatives: "opacity at the base, X vs Y"
            return alternatives and _APPOSITION_FILLER.sub(" ", _PREPOSITIONS.sub(" ", gap)).strip() in (",", "")
        rest = LINK_RE.sub(" ", gap)
        if ATTRIBUTION_BLOCK_RE.search(rest):
            return False
        ands = list(_AND.finditer(gap))
        # "X and Y are consistent with Z": an "and" is allowed only before a verb phrase that links to the target
        return not ands or _AND_VERB.search(gap, ands[-1].end()) is not None

    def _locate(self, low: str, text: str, mentions: list[_Mention], terms: list[_Cue]) -> None:
        pending: list[tuple[int, int, tuple[str, ...]]] = []  # phrases whose finding lies only across "with"
        subjects: list[tuple[int, int, int, tuple[str, ...]]] = []  # "the right lung is clear" before a negation
        prev: tuple[int, str] | None = None  # (end, side) of the previous sided location phrase
        places = list(LOCATION_MATCHER.matches(low))
        one_side = _one_side(low, places)
        for m in places:
            kind = LOCATION_KINDS[m.lastgroup]  # type: ignore[index]
            s, e = m.start(), m.end()
            phrase = m.group()
            labels = location_labels(kind, phrase)
            side = SIDE_WORD_RE.search(phrase)
            if side is not None:  # a side word of a no-op phrase ("left greater than right") is no side to carry
                word = SIDE_ABBREVIATIONS.get(side.group(), side.group())
                prev = (e, word) if word in ("right", "left") and labels else None
            elif (kind == "zoned" and prev is not None
                  and (SIDE_CARRY_GAP_RE.fullmatch(low, prev[0], s) or SIDE_BACK_GAP_RE.fullmatch(low, prev[0], s))
                  and _PLURAL_PLACE.search(phrase) is None and {lab.split()[0] for lab in labels} >= {"right", "left"}):
                labels = location_labels(kind, f"{prev[1]} {phrase}")  # "left perihilar upper lobe": left
                prev = (e, prev[1])
            else:
                prev = None
                if (kind == "zoned" and one_side is not None and UNSIDED_BASE_RE.fullmatch(phrase)
                        and THE_BEFORE_RE.search(low, max(0, s - 8), s) is None):
                    # "small left pleural effusion with associated basal atelectasis": the left base (version 47)
                    labels = location_labels(kind, f"{one_side} {phrase}")
            if not labels:
                continue
            if any(mm.start < e and s < mm.end for mm in mentions):
                continue  # part of a finding phrase
            if _NORMAL_AFTER.match(low, e):
                subject = NORMAL_SUBJECT_RE.match(low, e)
                if subject is not None and side is not None:  # "the right lung is clear without consolidation"
                    subjects.append((s, e, subject.end(), labels))
                continue  # "..., the left lower lobe is clear": the location of a normal statement
            best = self._sized_after(low, mentions, kind, phrase, e)
            if best is None:
                best = self._nearest(mentions, terms, low, s, e)
            if best is None:
                best = self._coordinated_place(mentions, terms, low, s, e)
            if best is None:
                pending.append((s, e, labels))
                continue
            if kind == "diaphragm" and not any(mm.kind.lung for mm in mentions if mm.group == best):
                continue  # next to a hemidiaphragm: a lung base only for a lung finding
            for mm in mentions:
                if mm.group == best:
                    mm.locations.append((s, text[s:e], labels))
        # across "with" a phrase goes only to a finding with no place of its own ("improved aeration of the lung
        # bases with small residual left basilar effusion": the effusion is left basilar); every such phrase of the
        # finding, not only the first ("consolidations with possible inflammatory aetiology in the LUL and in the
        # RLL"; version 54)
        placed = {mm.group for mm in mentions for loc in mm.locations if not is_extent_phrase(loc[1])}
        for s, e, labels in pending:
            best = self._nearest(mentions, terms, low, s, e, skip=_LOCATION_SCOPE_SKIP)
            if best is None or best in placed:
                continue
            for mm in mentions:
                if mm.group == best:
                    mm.locations.append((s, text[s:e], labels))
        # "the right lung is clear without consolidation": the negated findings of the clause with no place of their
        # own lie in that lung, not in both (version 45)
        for s, e, after, labels in subjects:
            hi = self._scope(terms, s, e, len(low))[1]
            for mm in mentions:
                if (after <= mm.start and mm.end <= hi and mm.assertion == "absent" and not mm.locations
                        and mm.kind.lung and mm.kind.lesion not in HEART_MASK_LESIONS):
                    mm.locations.append((s, text[s:e], labels))

    @staticmethod
    def _mediastinal(low: str, mentions: list[_Mention]) -> None:
        """An opacity with no lung place, written right after a mediastinal site ("right paratracheal opacity") or
        followed by one after a preposition ("opacity in the right paratracheal region"), is no lung lesion: a
        non-target finding outside the lungs (version 45)."""
        for mm in mentions:
            if mm.kind.lesion != OPACITY or mm.locations or mm.antecedent is not None:
                continue
            if (MEDIASTINAL_BEFORE_RE.search(low, max(0, mm.start - 60), mm.start) is None
                    and MEDIASTINAL_AFTER_RE.match(low, mm.end) is None):
                continue
            mm.kind = _MEDIASTINAL_OPACITY

    @staticmethod
    def _ellipsis_places(mentions: list[_Mention]) -> None:
        """Places of the pronouns and ellipses (version 45): "the left" after a right-sided zone is that zone on the
        left ("the right basilar atelectasis has improved while the left is unchanged": the left base); "a small one"
        with no place of its own lies where the phrase it stands for lies."""
        for mm in mentions:
            ante = mm.antecedent
            if ante is None or not ante.locations:
                continue
            labels = [lab for _, _, labs in ante.locations for lab in labs]
            if mm.side is None:
                if not mm.locations:
                    mm.locations = list(ante.locations)
                continue
            other = "left" if mm.side == "right" else "right"
            if labels and all(lab.startswith(other + " ") for lab in labels):
                s, phrase, _ = mm.locations[0]
                mirrored = tuple(dict.fromkeys(mm.side + lab[len(other):] for lab in labels))
                mm.locations = [(s, phrase, mirrored)]

    @staticmethod
    def _sized_after(low: str, mentions: list[_Mention], kind: str, phrase: str, e: int) -> int | None:
        """Group of the finding (not the heart's) right after a bare side word and its size words ("Rt basal
        atelectasis, Lt small effusion.": "Lt" is the effusion's, not the atelectasis'; version 48); None otherwise."""
        if kind != "whole" or BARE_SIDE_RE.fullmatch(phrase) is None:
            return None
        size = SIDE_SIZE_RE.match(low, e)
        if size is None:
            return None
        after = next((mm for mm in mentions if mm.start == size.end()), None)
        if after is None or after.kind.lesion in HEART_MASK_LESIONS or after.kind.heart:
            return None
        return after.group

    @staticmethod
    def _one_cardiomegaly(low: str, mentions: list[_Mention]) -> None:
        """A cardiothoracic ratio after a cardiomegaly phrase of its sentence adds no second finding ("Mild cardiomegaly
        (CTR 0.55).", "The heart is enlarged with a CTR of 0.6."; version 48). A ratio before the phrase ("CTR is 0.58,
        indicating mild cardiomegaly.") is a finding of its own here, merged with the phrase's by
        :func:`_one_per_lesion` (version 58)."""
        named = False
        for mm in mentions:
            if mm.kind.lesion not in HEART_MASK_LESIONS or mm.absorbed or mm.historical or mm.antecedent is not None:
                continue
            if CTR_RE.search(low, mm.start, mm.end) is None:
                named = True
            elif named:
                mm.absorbed = True

    def _coordinated_place(self, mentions: list[_Mention], terms: list[_Cue], low: str, s: int,
                           e: int) -> int | None:
        """Group of the finding a finding-less, verb-less place after a clause-ending "and (the)" belongs to: the
        nearest finding of the clause before the "and" ("opacities in the right upper lobe and the left lower
        lobe"); None otherwise."""
        gap = _AND_THE.search(low, max(0, s - 12), s)
        if gap is None:
            return None
        end = next((t.start for t in terms if t.start >= e), len(low))
        if _VERB.search(low, e, end) is not None:
            return None  # "..., and the left costophrenic angle is sharp": a statement of its own
        term = next((t for t in terms if t.start <= gap.start() < t.end), None)  # the clause-ending "and"
        return None if term is None else self._nearest(mentions, terms, low, term.start, term.start)

    def _nearest(self, mentions: list[_Mention], terms: list[_Cue], low: str, s: int, e: int,
                 skip: str | None = None) -> int | None:
        """Group of the finding nearest to the location phrase ``low[s:e]`` within its clause. A finding after the
        phrase is taken only when no finding stands before it if a comma stands between them ("no effusion on the
        left, small effusion on the right": "left" is the first effusion's) or the phrase follows a preposition
        ("opacity in the right lower lobe and atelectasis": the opacity's)."""
        lo, hi = self._scope(terms, s, e, len(low), skip=skip, low=low)
        postposed = _PLACE_PREPOSITION.search(low, max(0, s - 40), s) is not None
        best: tuple[int, int, int, int] | None = None  # (second choice, distance, after-penalty, group)
        for mm in mentions:
            if mm.kind.lesion in HEART_MASK_LESIONS or mm.kind.heart or mm.start < lo or mm.end > hi:
                continue
            if e <= mm.start:
                key = (int(postposed or "," in low[e:mm.start]), mm.start - e, 0, mm.group)
            else:
                key = (0, s - mm.end, 1, mm.group)
            if best is None or key[:3] < best[:3]:
                best = key
        return None if best is None else best[3]

    @staticmethod
    def _adjacent(low: str, text: str, mentions: list[_Mention]) -> None:
        """An unlocated phrase introduced by "adjacent" / "associated" / ... lies where the phrase before it lies;
        after a sided hemidiaphragm and no located phrase, at that side's base ("elevated right hemidiaphragm with
        adjacent atelectasis"). An unlocated lung phrase after the one obscured sided hemidiaphragm of the sentence
        lies at that side's base ("the left hemidiaphragm is obscured, likely due to atelectasis")."""
        obscured = list(OBSCURED_DIAPHRAGM_RE.finditer(low))
        for k, mm in enumerate(mentions):
            if (len(obscured) == 1 and not mm.locations and mm.kind.lung and obscured[0].end() <= mm.start
                    and mm.kind.lesion not in HEART_MASK_LESIONS):
                d = obscured[0]  # "the left hemidiaphragm is obscured, likely due to atelectasis": the left base
                side = d.group("side") or d.group("side2")
                mm.locations = [(d.start(), text[d.start():d.end()], (zone_label(side, "lung base"),))]
                continue
            if mm.locations or not _ADJACENT.search(low, max(0, mm.start - 40), mm.start):
                continue
            previous = [p for p in mentions[:k] if p.locations and p.group != mm.group]
            if previous:
                where = list(previous[-1].locations)
                if previous[-1].kind.lesion == EFFUSION and mm.kind.lesion == ATELECTASIS:
                    where = [(at, phrase, lung_bases(labels)) for at, phrase, labels in where]  # version 53
            else:
                diaphragm = list(_SIDED_DIAPHRAGM.finditer(low, 0, mm.start))
                if not diaphragm:
                    continue
                d = diaphragm[-1]
                where = [(d.start(), text[d.start():d.end()], (zone_label(d.group(1), "lung base"),))]
            for other in mentions[k:]:  # the whole group of alternatives lies there ("adjacent atelectasis or ...")
                if other.group == mm.group and not other.locations:
                    other.locations = list(where)

    @staticmethod
    def _coordinated(low: str, mentions: list[_Mention]) -> None:
        """An unlocated lung finding joined by "and" to a placed lung finding lies where that finding lies ("left
        basilar atelectasis and effusion"), unless it is edema or diffuse by its own words ("pulmonary edema")."""
        for k in range(1, len(mentions)):
            mm, before = mentions[k], mentions[k - 1]
            if (mm.locations or not mm.kind.lung or mm.kind.lesion == EDEMA or before.group == mm.group
                    or not before.kind.lung or before.kind.lesion in HEART_MASK_LESIONS):
                continue
            placed = [loc for loc in before.locations if not is_extent_phrase(loc[1])]
            if not placed or _COORDINATION_GAP.fullmatch(low, before.end, mm.start) is None:
                continue
            if DIFFUSE_PHRASE_RE.match(low, mm.start, mm.end):
                continue
            for other in mentions[k:]:  # its alternatives lie there too
                if other.group == mm.group and not other.locations:
                    other.locations = list(before.locations)

    def _findings(self, index: int, text: str, mentions: list[_Mention], other_exam: bool = False) -> list[Finding]:
        """The sentence's findings; ``other_exam``: the sentence reports what a CT or MRI showed, so every finding is
        a non-target one (it keeps negatives away from its places but is no lesion of this radiograph); so is a
        finding the clinician asks about ("eval for pneumonia"; version 46)."""
        out: list[Finding] = []
        low = text.lower()
        for mm in mentions:
            if mm.absorbed or mm.historical:
                continue
            lesion = mm.kind.lesion
            if lesion in HEART_MASK_LESIONS or mm.kind.heart:
                phrases: tuple[str, ...] = ()
                labels: tuple[str, ...] = (HEART,)
            elif mm.kind.mimic:  # it projects over the lung but is not in it
                phrases, labels = (), ()
            else:
                phrases = tuple(dict.fromkeys(p for _, p, _ in sorted(mm.locations)))  # as written
                locs = _side_on_the(low, sorted(mm.locations))
                # extent words ("diffuse", "scattered") give both lungs only when no place is named with them
                placed = [labs for _, p, labs in locs if not is_extent_phrase(p)]
                worst = _worst_places(low, locs)
                predominant = bool(placed) and all(k in worst for k, (_, p, _) in enumerate(locs)
                                                   if not is_extent_phrase(p))
                if predominant and len(placed) < len(locs):
                    placed = [labs for _, _, labs in locs]  # "multifocal ..., most pronounced in X": both lungs, X
                elif placed and mm.kind.lesion == EFFUSION and low.endswith("effusions", mm.start, mm.end) and all(
                        PREDOMINANT_PLACE_RE.search(low, max(0, s - 60), s)
                        or COMPARATIVE_PLACE_RE.search(low, max(0, s - 30), s) for s, p, _ in locs):
                    placed = [default_location(mm.kind), *placed]  # "effusions are larger on the right": both
                elif predominant and mm.kind.lung:
                    placed = [default_location(mm.kind), *placed]  # "opacities, particularly at X": both lungs, X
                labels = tuple(dict.fromkeys(lab for labs in (placed or [labs for _, _, labs in locs])
                                             for lab in labs)) or default_location(mm.kind)
            start, end = mm.entity_span or (mm.start, mm.end)
            entity = text[start:end]
            out.append(Finding(
                entity=entity,
                sent_idx=index,
                assertion=mm.assertion,
                lesion=None if other_exam or mm.question else lesion,
                location_phrases=phrases,
                reported_location=labels,
                source=self.source,
                hedge=mm.hedge if mm.assertion == "uncertain" else None,
            ))
        return out


def _one_per_lesion(found: list[Finding]) -> list[Finding]:
    """A sentence's findings with each lesion named twice made one finding (version 58): a later finding of the same
    target lesion and assertion as an earlier one is merged into it when their labels are equal ("The heart is
    enlarged, consistent with cardiomegaly.", "No focal opacity or infiltrate.") or, both positive, one of them has no
    location phrase of its own ("Right lower lobe pneumonia, the pneumonia is unchanged.": it lies where the placed
    one lies, as report-level rule 1 would place it). The merged finding keeps the earlier one's place in the
    sentence and its phrase, takes the location phrases of both and the placed one's labels; it is ``likely`` only
    when both are. Non-target findings, and findings that differ in assertion or place ("left effusion and right
    effusion"), stay apart."""
    out: list[Finding] = []
    for f in found:
        into = None
        if f.lesion is not None:
            into = next((k for k, g in enumerate(out) if g.lesion == f.lesion and g.assertion == f.assertion
                         and _same_place(g, f)), None)
        if into is None:
            out.append(f)
            continue
        g = out[into]
        placed = g if g.location_phrases or not f.location_phrases else f
        hedge = None if g.assertion != "uncertain" else ("likely" if g.hedge == f.hedge == "likely" else "possible")
        out[into] = replace(g, location_phrases=tuple(dict.fromkeys((*g.location_phrases, *f.location_phrases))),
                            reported_location=placed.reported_location, hedge=hedge)
    return out


def _same_place(a: Finding, b: Finding) -> bool:
    """Whether two findings of one lesion in one sentence lie at one place (:func:`_one_per_lesion`)."""
    if a.reported_location == b.reported_location:
        return True
    return a.assertion != "absent" and (not a.location_phrases) != (not b.location_phrases)


def _side_on_the(low: str, locs: list[tuple[int, str, tuple[str, ...]]]) -> list[tuple[int, str, tuple[str, ...]]]:
    """A finding's places with a side-less zone named before "on the right / left" narrowed to that side, and that
    side-only place dropped ("basilar opacity on the left": the left base; version 27)."""
    out = list(locs)
    for k, (s, _, labs) in enumerate(locs):
        if len(labs) != 1 or labs[0] not in _SIDE_LUNGS or not ON_THE_SIDE_RE.search(low, max(0, s - 8), s):
            continue
        side = labs[0].split()[0]
        earlier = [j for j in range(k) if {lab.split()[0] for lab in locs[j][2]} == {"right", "left"}
                   and not any(lab in _SIDE_LUNGS for lab in locs[j][2])]
        if not earlier:
            continue
        for j in earlier:
            s0, p0, labs0 = out[j]
            out[j] = (s0, p0, tuple(lab for lab in labs0 if lab.startswith(side)))
        out[k] = (s, locs[k][1], ())
    return [loc for loc in out if loc[2]]


def _one_side(low: str, places: list[re.Match[str]]) -> str | None:
    """The one side that every sided place of the sentence names ("left" in "Left effusion and basal atelectasis.";
    version 47), or None when the sentence names both sides, no side, or a side only as "on the right" (the zone
    before it takes that side by the rule of version 27)."""
    sides: set[str] = set()
    for m in places:
        kind = LOCATION_KINDS[m.lastgroup]  # type: ignore[index]
        labels = location_labels(kind, m.group())
        if not labels or (kind != "abbr" and SIDE_WORD_RE.search(m.group()) is None):
            continue  # no place ("right hemidiaphragm"), or no side word ("basal", "retrocardiac")
        if len(labels) == 1 and labels[0] in _SIDE_LUNGS and ON_THE_SIDE_RE.search(low, max(0, m.start() - 8),
                                                                                      m.start()):
            return None
        sides.update(lab.split()[0] for lab in labels)
    return next(iter(sides)) if len(sides) == 1 else None


def _worst_places(low: str, locs: list[tuple[int, str, tuple[str, ...]]]) -> set[int]:
    """Indexes of a finding's places where its disease is worst: after a predominance word ("particularly at"), or
    listed right after such a place ("predominantly in the right upper lobe and the left base")."""
    worst: set[int] = set()
    for k, (s, _, _) in enumerate(locs):
        listed = k - 1 in worst and _PLACE_LIST_GAP.fullmatch(low, locs[k - 1][0] + len(locs[k - 1][1]), s)
        if listed or PREDOMINANT_PLACE_RE.search(low, max(0, s - 60), s):
            worst.add(k)
    return worst


def _as_written(edits: tuple[tuple[int, int, int], ...], pos: int) -> int:
    """Position ``pos`` of the respelled sentence in the sentence as written (``edits`` as
    :func:`~.lexicon.respell` gives them)."""
    return pos - sum(delta for _, end, delta in edits if end <= pos)


def _written(written: str, edits: tuple[tuple[int, int, int], ...], mm: _Mention) -> str:
    """The phrase of ``mm`` as ``written`` in the sentence, before its misspelled words were respelled (version 45);
    ``edits`` as :func:`~.lexicon.respell` gives them."""
    start, end = mm.entity_span or (mm.start, mm.end)
    return written[_as_written(edits, start):_as_written(edits, end)]


def _written_places(written: str, edits: tuple[tuple[int, int, int], ...], mm: _Mention,
                    phrases: tuple[str, ...]) -> tuple[str, ...]:
    """``phrases`` (a finding's location phrases, read in the respelled sentence) as ``written`` in the sentence
    (version 54: "peri-hilar", not the respelled "perihilar"); a phrase not among ``mm``'s places stays as it is."""
    where = {p: s for s, p, _ in sorted(mm.locations, reverse=True)}  # the first place of each phrase
    return tuple(dict.fromkeys(written[_as_written(edits, where[p]):_as_written(edits, where[p] + len(p))]
                               if p in where else p for p in phrases))


_DEFAULT = RuleStructurer()


def structure_text(text: str, report_id: str = "text") -> StructuredReport:
    """Structure free ``text`` (split into numbered sentences as a ``findings`` section) with the rules.

    Raises ``ValueError`` when the text has no usable words.
    """
    section = make_section_choice("findings", text)
    if section is None:
        raise ValueError("text has no usable sentence")
    return _DEFAULT.structure(report_id, section)
