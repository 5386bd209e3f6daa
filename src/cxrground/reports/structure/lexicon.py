"""Lexicon of the rule-based structurer: finding phrases, assertion cues and location phrases (ILS §7).

Everything here is data plus the compiled regular expressions built from it; :mod:`.rules` applies them.
All patterns run on the lower-cased sentence. Lesion names and location labels come from
:mod:`cxrground.vocab`. This is the ILS §7.1 / §7.2 *proposed default*, extended; the changes are marked.

Finding phrases (ILS §7.1 table, extended)
------------------------------------------

=====================  =========================================================================================
lesion                 surface forms (regular expressions simplified; plurals accepted)
=====================  =========================================================================================
cardiomegaly           cardiomegaly; enlarged heart / cardiac silhouette / cardiac shadow / cardiomediastinal
                       silhouette; cardiac enlargement; increased / elevated cardiothoracic ratio, "cardiothoracic
                       ratio is increased" (version 44); "CTR" and "raised" (version 47), a stated ratio above
                       0.50 ("CTR 0.62", "CTR > 0.5", "cardiothoracic ratio greater than 50%"; 0.50 or less is no
                       finding, as a normal heart size); a template line "Heart: (mildly) enlarged" (version 47);
                       the "cardiothoracic index" / "CTI" of translated reports reads as the ratio (version 48); a
                       ratio after a cardiomegaly phrase of its sentence adds no second finding ("Mild cardiomegaly
                       (CTR 0.55)."; version 48);
                       enlargement of the heart / cardiac silhouette;
                       a change or hedge may stand before "enlarged" ("heart size has decreased but remains mildly
                       enlarged", "heart size is difficult to evaluate but likely enlarged"; version 45), and so
                       may "unchanged / stable / similar (from / compared to / since) (the) prior / previous (study
                       / exam / radiograph)" and a comma ("heart size is unchanged from prior, mildly enlarged";
                       version 46);
                       increased heart size / cardiac silhouette / size of the heart (version 20; not the change
                       phrase "increase in heart size");
                       "<heart | heart size | cardiac silhouette | cardiomediastinal silhouette> <is, mildly,
                       moderately, borderline, may be, likely, not, ...> <enlarged | large | increased>";
                       "<heart | ...> is borderline (in size)" (not "borderline normal").
                       *Decision*: "borderline cardiomegaly" / "borderline enlarged" / "heart size is
                       borderline" = uncertain (``borderline`` is a hedge), and so is a range from normal ("normal
                       to mildly enlarged", version 17; "upper normal / at the upper limits of normal to mildly
                       enlarged", version 40; "top-normal / upper normal in size to mildly enlarged", version
                       49); "top normal", "at the upper limits of
                       normal", "normal heart size" are no finding at all (not negations: ILS §7.1 allows only
                       explicit negation; report labels read a normal heart size as a negated cardiomegaly,
                       :data:`HEART_NORMAL_RE`; version 49: also "the heart and mediastinum are normal", "heart
                       size and pulmonary vascularity appear within normal limits", "normal size and configuration
                       of the cardiac silhouette"; version 57: "cardio mediastinal silhouettes are unremarkable",
                       "the heart silhouette is normal in size and contour", "heart and mediastinum of normal size",
                       a list subject "heart size, cardiomediastinal silhouette, and pulmonary vasculature are
                       within the limits of normal", not before an exception ("unremarkable except for ..."); a
                       joined mediastinum keeps a heart phrase whole, "the heart silhouette and mediastinal
                       contours are not enlarged" is an absent cardiomegaly; such a statement is no normal
                       examination,
                       :data:`NORMAL_STATEMENT_RE`). A heart called "prominent" is no cardiomegaly but the non-target
                       finding "cardiac prominence" at the heart (version 39, :data:`HEART_PROMINENCE_PATTERNS`).
pneumonia              pneumonia, bronchopneumonia, pneumonitis, infection, infectious process, aspiration,
                       aspiration pneumonia, PNA (version 15), "infectious" said of a finding ("could be infectious",
                       "likely infectious", "infectious in etiology"; version 38; not "non-infectious"). *Added*:
                       pneumonitis, aspiration (radiographically an
                       aspiration pneumonitis/pneumonia; hedges still apply: "concerning for aspiration"). *Not*
                       foreign-body / FB aspiration (an airway event: the non-target finding "foreign body
                       aspiration", version 48).
                       *Not* radiation pneumonitis / fibrosis / changes (treatment injury, not infection: the
                       non-target finding "radiation changes").
atelectasis            atelectasis, atelectatic (changes), collapse(d). *Changed*: "volume loss" (ILS §7.1 proposal) is
                       a non-target finding: it is a sign, not atelectasis (MeSH codes it apart). *Not* vertebral
                       collapse ("compression collapse", "collapse of the T12 vertebral body": a non-target
                       finding outside the lungs).
opacity                opacity, opacities, opacification(s), opacified, airspace / air space disease (also "dz",
                       version 47), airspace process, infiltrate(s), infiltration, infiltrative process, haziness,
                       hazy opacity,
                       ground-glass (opacity), whiteout / white-out (version 13), (air-space) shadowing (version
                       24; "reticular shadowing" is the non-target interstitial markings, a bare "shadow" no
                       phrase). *Not* "density" (also used for bones and masses; a lung-only reading,
                       "retrocardiac / increased density", added a false opacity on an Open-i report and failed
                       the check of version 18).
consolidation          consolidation, consolidative (opacity/process), consolidated, condensation(s) (translated
                       reports, version 48: "pulmonary / alveolar condensation"). *Decision*: "air bronchograms"
                       are a sign inside the opacity or consolidation they are seen in, not a finding of their own
                       (no phrase).
edema                  edema / oedema, pulmonary / interstitial / alveolar edema, edematous / oedematous lungs,
                       "lungs are (mildly) edematous" (version 48), fluid overload (*not*
                       "volume overload": reading it added an edema MeSH does not code on an Open-i report, version
                       20's check). *Decision*:
                       "(pulmonary) vascular congestion" is **not** edema (ILS §2: the congestion category was
                       dropped; MeSH codes ``Pulmonary Congestion`` apart from ``Pulmonary Edema``); it is a
                       non-target finding; so are its signs cephalization / vascular redistribution (round 4) and
                       Kerley / septal lines (round 4: septal lines are a sign that edema, lymphangitic spread or
                       fibrosis can give; "Kerley B lines suggesting interstitial edema" still names the edema).
                       "CHF" / "(congestive) heart failure" is a clinical diagnosis, the non-target heart failure.
                       *Not* soft-tissue / subcutaneous / chest-wall / mucosal edema, anasarca (edema outside the
                       lungs: a non-target finding; version 56: also written after the noun, "edema of the soft
                       tissues of the chest wall").
effusion               effusion(s), pleural effusion(s), "pleural a fusion" (speech recognition, version 48),
                       pleural fluid (collection), layering fluid / effusion,
                       hydrothorax, (pleural) empyema (version 56); *added* (round 4): loculated / subpulmonic /
                       fissural fluid, "fluid in / along / tracking along the (right) minor / major fissure"
                       (fissural fluid is pleural fluid; a bare "fluid" is not: "atelectasis versus small amount
                       of fluid"). *Not*
                       "pericardial effusion" (a non-target finding). *Decision* (ILS §7.1 is silent):
                       "blunting of the costophrenic angle" is **no** effusion phrase: blunting is a sign
                       that a small effusion, pleural thickening or scarring can give (MeSH codes it apart, as
                       ``Costophrenic Angle/blunted``); "blunting ... may represent a small effusion" still names
                       the effusion. It is the non-target lung observation "costophrenic blunting" (version 13): no
                       mask and no positive, but its place keeps negatives away; so is "the left costophrenic
                       angle is (mildly) blunted" (version 19).
None (non-target)      lung: pneumothorax, hydropneumothorax, nodule, mass, masslike, granuloma(s), calcified
                       granuloma, granulomatous disease / infection, scar(ring), fibrosis, fibrotic changes,
                       emphysema, bulla(e), bullous disease, bronchiectasis, cyst, cavity/cavitation, interstitial
                       markings,
                       interstitial lung disease, interstitial prominence, reticular markings, reticular /
                       reticular-nodular / reticulonodular pattern, acute respiratory distress syndrome (ARDS: a
                       clinical-radiological syndrome, not mapped to edema), pleural
                       thickening, pleural plaque, (pulmonary) vascular congestion, metastasis/metastases,
                       volume loss, radiation pneumonitis / fibrosis / changes, (broncho)vascular crowding,
                       cephalization, vascular redistribution, upper lobe (blood) diversion (version 51),
                       Kerley / septal lines, septal thickening.
                       other: fracture, (hiatal) hernia, (lymph)adenopathy, pericardial effusion,
                       pneumomediastinum, subcutaneous emphysema, pneumoperitoneum / free air, heart failure,
                       soft-tissue edema, vertebral collapse / compression deformity, foreign-body aspiration
                       (version 48), projection mimics (nipple
                       shadow, overlying / overlapping soft tissue, breast tissue, skin fold, vessels or ribs,
                       summation of shadows, costochondral calcification: no location of their own; an
                       observation explained by them alone becomes a non-target lung finding).
=====================  =========================================================================================

*Misspellings* (version 45): a word within one Damerau edit of effusion, atelectasis, pneumonia, consolidation,
cardiomegaly or their plurals, and "effus", reads as that word (:data:`MISSPELLINGS`, :func:`respell`; not the real
words "pneumonic" and "pneumoniae", as in *Streptococcus pneumoniae*); the finding phrase is reported as written.

Observations (the opacity-class phrases and consolidation) can be *attributed* to another finding
(:data:`ATTRIBUTABLE` lesions and lung non-target findings) by a link phrase (:data:`LINK_RE`), see
:mod:`.rules`.

Assertion cues
--------------

=================  ==============================================================================================
kind               cues
=================  ==============================================================================================
pseudo (ignored)   no (significant / interval / ...) change / increase / decrease / progression / worsening /
                   improvement / difference / increasing / enlarging; no (definite ...) evidence / sign(s) of
                   (interval ...) worsening / increasing / progression / change (version 24; "no evidence of new
                   X" stays a negation); not (significantly) changed / increased / decreased / improved /
                   worse(ned) / different; without (significant / interval) change / worsening / increasing;
                   not only; gram negative; to document / confirm / ensure / assess ... (complete) resolution,
                   until / for resolution (a recommendation to follow a finding: it stays present); incomplete
                   resolution: partially /
                   partly / largely / mostly / nearly / almost / slowly resolved / cleared, has not (completely)
                   resolved / cleared, partial / incomplete / near(-)complete / slow / ongoing resolution / clearing
                   (of) (the finding is still there: present; round 4 also moved "nearly completely resolved"
                   here from the negations); no / lack of / without (significant / interval / appreciable)
                   resolution (of), failure to resolve (version 47: the finding persists)
history            (known / remote / past / prior) history of, hx (of) (version 46: also "hx" alone, "Hx pneumonia"),
                   h/o, sequela(e) of, from / due to / related to / secondary to a prior / previous / old / remote /
                   past / healed ...: the phrase is not a
                   finding of this image and gives no tuple ("history of pneumonia", "scarring, sequela of prior
                   infection"); so is a risk: (high / increased / low ...) risk for / of ("deemed high risk for
                   COVID-19 pneumonia", "at risk of aspiration pneumonia")
negation, before   no, without, free of, clear of, negative for, absence of, neither, nor, not (a/an/any),
                   no longer, (interval) resolution of, interval / complete clearing of; absent, nil, zero,
                   re-expansion of (version 44); fronted at a sentence's or clause's start (version 56): no longer
                   seen / visualized ... is / are, gone / resolved / cleared is / are the; a negated fit without a
                   verb: not consistent / compatible with, not suggestive / typical of, not in keeping with,
                   inconsistent with (version 47; not the double
                   negative "not inconsistent with"); not to be confused with (version 48). ("rule out" is *not* a
                   negation: it is a question; "clearing of" alone may be partial and is not one either)
negation, after    a clause-final "absent", ": none / absent / negative / no" (version 44), has re-expanded;
                   (is / are) not seen / visible / present / identified / evident / appreciated /
                   demonstrated / visualized / noted / detected / apparent / observed; (is) absent; no longer
                   seen / visible / present; ruled out; is gone; (appears) within normal limits
negation, both     (has since completely) resolved, (has) cleared (within 4 words)
uncertain, before  possible, possibly, possibility of, probable, probably, questionable, question, likely,
                   most likely, presumed, presumably, may (be / represent / reflect), might, could (be / represent /
                   reflect), cannot / can not / can't (completely) exclude, cannot rule out / r/o (version 47: the
                   radiologist's hedge, no question), query (of) (version 47; not "clinical query:"), difficult / hard /
                   impossible to (completely) exclude, not excluded, suspected, suspect, suspicion of,
                   suspicious for, concerning for, worrisome for, suggestive of, suggest(s / ing / ion of), to
                   suggest, indicative of, raises concern / the possibility / the question for / of, concern for,
                   borderline, equivocal, indeterminate, perhaps, unlikely, doubtful, differential (diagnosis)
                   includes, consider(ed), (please) correlate (clinically) for / to exclude, clinical
                   correlation for, difficult / hard / impossible to assess / evaluate for, not possible / unable
                   to exclude (version 46), (in) favor (of),
                   favors / favored / favoring, unclear / not clear / uncertain whether / if, whether (or not),
                   can / could be seen with (version 48)
question           (version 46) the clinician's question: eval / evaluate / evaluation / assess / assessment (further)
                   for, r/o, (to) rule out, to exclude, question of, clinical concern / suspicion for / of. The
                   finding it governs (the nearest cue before it, or one that only hedges stand between: "evaluate for
                   possible pneumonia") is uncertain and a *non-target* finding (lesion None, as the findings of a CT
                   sentence): it keeps negatives away from its places, but gives no mask, no pair and no lesion label.
                   Not "concerning for" (the radiologist's hedge); a question answered in its clause ("evaluate for
                   pneumonia, which is not seen") is the answer (absent)
uncertain, after   cannot / can not / can't / could not be excluded / ruled out, (is / are) not (entirely)
                   excluded / ruled out, (is / are / seems) (not) possible / likely / unlikely / probable /
                   suspected / questioned / favored / doubtful ("pneumonia is not favored" is a hedge, as
                   "unlikely"), in the appropriate / proper clinical setting / context (*decision*, round 4: the
                   statement is conditional on clinical facts the image does not show: "compatible with pneumonia
                   in the appropriate clinical setting" is uncertain), (is) difficult to (completely) exclude
                   (version 44: also before a place or reason), is difficult / hard to assess / evaluate (version 45:
                   also ", difficult to assess"), (is) of uncertain / unclear / indeterminate significance (version
                   45; not "of unclear etiology"), for cardiomegaly an explanation by technique ("may be accentuated
                   by AP technique", ", likely due to low lung volumes": :data:`HEART_TECHNIQUE_RE`, version 45),
                   may be present, is / would be / could be (another) consideration / possibility, should /
                   could be considered; (version 48) (is) to be considered, (is) in the differential (diagnosis)
                   (after a word: "In the differential, ..." stays a hedge before), a clause-final "favored /
                   favoured" ("Bacterial pneumonia favored.", a likely-hedge)
uncertain, both    ``?`` (within 3 words); versus / vs (within 6 words: "atelectasis versus small amount of
                   fluid" hedges the atelectasis); more / less likely (probable) than, favored over (a comparison
                   of two candidates hedges both: "atelectasis is more likely than pneumonia")
link hedges        suggest*, concerning / suspicious / worrisome for, indicative of: inside the scope of an
                   earlier negation they are transparent ("no opacity to suggest pneumonia" negates both);
                   "indicating" / "indicates" state the finding, no hedge (version 47)
scope end          ``;``, but, however, although, though, whereas, while, except, aside from, apart from,
                   other than, with (not in "consistent / compatible / in keeping / associated / seen /
                   concerning / suspicious / related / correlate(ion) with", and a hedge before the phrase
                   reaches across "with": "possible small effusion with adjacent atelectasis"), "and" before
                   "there / the / a / an / this / these / it", ", the / there / this / it", a hedged
                   explanation: may / could / likely account for / explain / contribute to (the hedge is about
                   the cause: "a hiatal hernia which may account for the retrocardiac opacity" states the
                   opacity), the comma that closes a fronted negated clause ("Although / though / while no X is
                   seen, ..."; version 47: :data:`FRONTED_NEGATION_RE`), the join of a lesion resolved at one place
                   and persisting at another ("... has resolved on the right and persists on the left"; version 49:
                   :data:`PERSISTS_ELSEWHERE_RE`, the persisting clause a phrase of that lesion)
=================  ==============================================================================================

*Decision*: "lungs are clear" (and "normal heart size") produce no finding: ILS §7.1 allows only explicit
negation to yield ``negative``, and ILS §11.2 treats unmentioned and negated lesions alike. "clear of X"
is an explicit negation of X. "decreased / improved / resolving X" is present; "resolved X" /
"resolution of X" is absent, but "partially / nearly resolved X", "X has not resolved" and "partial / near-complete
resolution of X" are present (only a complete resolution is an explicit negation); "no change in X" is present
(pseudo-negation).

Locations (ILS §7.2 table, extended). ``S`` = right/left; ``R``/``L`` below abbreviate the labels
----------------------------------------------------------------------------------------------------

================================================================  ==========================================
phrase                                                            labels
================================================================  ==========================================
bilateral(ly), both lungs / sides / hemithoraces, diffuse(ly),    ``right lung``, ``left lung``
multifocal, widespread, scattered, throughout the lungs
S (lung / hemithorax / chest / side / pleural space), S-sided, S  ``S lung``
bibasilar, bibasal, (both / the / lung) bases, basilar, basal,    ``right lung base``, ``left lung base``
base, lower lobes / lungs / zones (no side)
S base / basilar / basal / lung base, S lower lobe / lung /       ``S lung base``
zone, RLL / LLL, S costophrenic / cardiophrenic angle / sulcus, retrocardiac
(left when no side)
right middle lobe / middle lobe / RML, S heart border             ``right mid zone lung`` / ``S mid zone lung``
middle zone(s) (no side; version 26)                              ``right mid zone lung``, ``left mid zone lung``
(right) minor / horizontal fissure                                ``right mid zone lung``
lingula, lingular (left)                                          ``left mid zone lung``
behind / posterior to the (S) heart (retrocardiac)                ``left lung base`` (``S lung base``)
S mid lung / midlung / mid zone, S (peri / para / infra)hilar,    ``S mid zone lung``
S hilum, S midzone (version 50)
perihilar / hilar / mid lungs (no side, or bilateral)             ``right mid zone lung``, ``left mid zone lung``
S upper lobe / lung / zone, RUL / LUL, S suprahilar               ``S upper zone lung``
upper lobes / lungs / zones (no side)                             both upper zones
S apex / apical, apices / apical / biapical (no side)             ``S apical zone lung`` / both apical zones
S mid and lower lung zones, S upper and middle lobes, ...         each zone of the list, in order
S upper-lobe, S mid-zone, ... (hyphenated; version 50)           as the spaced form
adjacent to / along / above / at / near the S hemidiaphragm       ``S lung base`` (version 45; lung findings only)
S greater / worse than S, R > L, L>R, R ≥ L, R>=L, right > left   nothing (the side word is not a location:
(version 46), S hemidiaphragm / atrium / clavicle / rib / IJ /    a finding with no other place lies in both
PICC / breast / ...                                               lungs by default)
================================================================  ==========================================

A side-less singular ("base", "lower lobe", "apex", "costophrenic angle") maps to both sides: the side is unknown;
but a side-less singular base ("basal", "basilar", "base", "lower zone", "lower lobe"; not "the base") in a sentence
whose sided places all name one side takes that side (version 47, :data:`UNSIDED_BASE_RE`: "Left effusion and basal
atelectasis." -> ``left lung base``).
An opacity at a mediastinal site (paratracheal, mediastinal, aortopulmonary window, subcarinal, tracheal;
:data:`MEDIASTINAL_BEFORE_RE`, :data:`MEDIASTINAL_AFTER_RE`) with no lung place is no lung lesion (version 45).
A zone followed by "of (the) S lung / hemithorax" is that side's zone ("base of the right lung" -> ``S lung base``;
version 37).
Several sides and zones in one phrase are ordered zone by zone, right before left unless the phrase says "left and
right"; a list whose items each carry a side and share one noun ("right upper and left lower lobes") keeps each
item's side and zone, in order (version 11). Defaults when a finding has no location phrase: lung lesions and lung
non-target findings -> ``right lung``, ``left lung``; effusion -> ``right lung``, ``left lung`` (both pleural
spaces; a side-only effusion maps to ``S lung``); cardiomegaly -> ``heart`` always; other non-target findings -> no
label.

*Changed* (round 5): the extent words diffuse(ly), multifocal, widespread and scattered give both lungs only when
the finding has no other location phrase (ILS §7.2 "(no side)"; :data:`EXTENT_RE`), or when every other one follows
a predominance word (version 24, :data:`PREDOMINANT_PLACE_RE`: "multifocal opacities, most prominent in the left
upper lobe" -> both lungs, then the left upper zone); without an extent word a lung finding whose every place
follows a predominance word lies in both lungs too (version 37: "patchy opacities, most pronounced at the right
base" -> both lungs, then the right base). ``S`` may be written "rt" / "lt" before a zone or lung noun
(version 24; a bare "RT" is radiotherapy, no side). A bare side word ("right", "left", "rt", "lt", "R", "L") right
before size words ("small", "moderate(-sized)", "massive", ...) and a lung finding phrase is that phrase's side, not
the finding's before it (version 48, :data:`SIDE_SIZE_RE`: "Rt basal atelectasis, Lt small effusion."). A side-less
zoned phrase
right after a sided one takes its side ("left perihilar upper lobe"), unless it is plural or has a side of its own
(lingula). Hedge grades (round 5, :data:`LIKELY_HEDGE_RE`): an uncertain finding is graded ``likely`` when every
cue that hedged it is a likely-hedge (probable, probably, (most) likely, presumed / presumably, most suggestive
of, favor(ed)), else ``possible``; each member of a differential is ``possible``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Final

from cxrground.reports.structure.dispatch import Alternation, Branch
from cxrground.vocab import HEART, LESIONS, SIDES
from cxrground.vocab.lesions import HEART_MASK_LESIONS
from cxrground.vocab.locations import lung_label, zone_label

__all__ = [
    "ATTRIBUTABLE",
    "CLEAR_EXCEPT_RE",
    "CUE_MATCHER",
    "CUE_RE",
    "DIFFUSE_PHRASE_RE",
    "ENTITY_KINDS",
    "ENTITY_MATCHER",
    "ENTITY_RE",
    "HEART_NORMAL_RE",
    "HEART_PERICARDIAL_RE",
    "HEART_PROMINENCE",
    "HEART_PROMINENCE_PATTERNS",
    "HEART_PROMINENCE_RE",
    "LINK_RE",
    "LOCATION_MATCHER",
    "LOCATION_RE",
    "NORMAL_STATEMENT_RE",
    "PRIOR_NEGATION_RE",
    "EntityKind",
    "default_location",
    "entity_kind",
    "location_labels",
]

CARDIOMEGALY, PNEUMONIA, ATELECTASIS, OPACITY, CONSOLIDATION, EDEMA, EFFUSION = (
    "cardiomegaly", "pneumonia", "atelectasis", "opacity", "consolidation", "edema", "effusion",
)  # fmt: skip
assert set(LESIONS) == {CARDIOMEGALY, PNEUMONIA, ATELECTASIS, OPACITY, CONSOLIDATION, EDEMA, EFFUSION}

#: Lesions an observation (opacity, consolidation) can be attributed to.
ATTRIBUTABLE: Final[frozenset[str]] = frozenset({PNEUMONIA, ATELECTASIS, EDEMA, CONSOLIDATION, EFFUSION})


@dataclass(frozen=True)
class EntityKind:
    """What a finding phrase means: its lesion (None = non-target), and two flags.

    ``observation``: an opacity-class phrase or consolidation that may be attributed to a specific lesion.
    ``lung``: the finding lies in the lungs or pleura (default location both lungs when none is given).
    ``mimic``: something projecting over the lungs that looks like an opacity (a nipple shadow, overlying soft
    tissue); an observation explained by mimics alone is no lung lesion.
    ``heart``: a non-target finding about the heart (a prominent heart), located at the heart.
    """

    name: str
    lesion: str | None
    observation: bool = False
    lung: bool = True
    mimic: bool = False
    heart: bool = False


# --- finding phrases -----------------------------------------------------------------------------------------
# (group name, kind, patterns). Within a group longer patterns come first; groups whose patterns are prefixes
# of another group's patterns come after it (non-target "pericardial effusion" before effusion, ...).

#: A heart subject of a cardiomegaly phrase (version 57: also "heart silhouette / shadow / contour" and "cardio
#: mediastinal" / "cardiac mediastinal silhouette").
_CARDIO_SUBJECT = (
    r"(?:heart(?:\s+(?:size|silhouette|shadow|contour))?|cardiac\s+(?:silhouette|shadow|size|contour)|"
    r"(?:cardio[- ]?mediastinal|cardiac\s+mediastinal)\s+(?:silhouette|contours?))"
)
#: The mediastinum joined to a heart subject in a cardiomegaly phrase (version 57): "The heart silhouette and
#: mediastinal contours are not enlarged."
_CARDIO_JOINED = r"(?:\s+and\s+(?:the\s+)?(?:mediastinum|mediastinal\s+(?:contours?|silhouettes?)))?"
_CARDIO_FILLER = (
    r"(?:is|are|was|appears?|remains?|seems?|has|been|become|becomes|now|again|still|stably|stable|mildly|"
    r"moderately|markedly|severely|massively|minimally|slightly|somewhat|borderline|top|normal|to|likely|"
    r"probably|possibly|may|might|could|be|not|no|longer|significantly|overall|globally|size|xxxx|mild|moderate|"
    r"severe|and|or|unchanged|persistently|chronically|at|least|,|"
    # a change or a hedge before "enlarged" (version 45): "heart size has decreased but remains mildly enlarged",
    # "heart size is difficult to evaluate but likely enlarged"
    r"decreased|increased|but|yet|difficult|hard|evaluate|assess|"
    # a comparison with the prior film before the comma (version 46): "heart size is unchanged from prior, mildly
    # enlarged"
    r"(?:unchanged|stable|similar)\s+(?:(?:from|compared\s+to|since)\s+)?(?:the\s+)?(?:prior|previous)"
    r"(?:\s+(?:study|exam|radiograph))?|"
    # a range from the upper limit of normal (version 40): "upper normal to mildly enlarged"
    r"upper|high|(?:top|upper|high)-normal|(?:at\s+)?(?:the\s+)?upper\s+limits?\s+of|"
    # such a range with "in size" (version 49): "the heart is top-normal in size to mildly enlarged"
    r"in\s+size(?=\s+(?:to|or)\s))"
)
#: The cardiothoracic ratio (version 47: also "CTR", "C/T ratio"; version 48: the "cardiothoracic index", "CTI", of
#: reports translated from Spanish / Portuguese).
_CTR = r"(?:cardio-?thoracic\s+(?:ratio|index)|ctr|cti|c/t\s+ratio)"
#: Words between the ratio and its value ("CTR is 0.58", "CTR of approximately 0.6", "CTR = 0.55", "CTR: 62%").
_CTR_FILLER = (r"(?:\s*(?:(?:is|was|now|of|measures?|measuring|measured|approximately|approx|about|around|roughly|"
               r"estimated\s+at|calculated\s+at|at)(?![\w-])\.?|=|:))*\s*")
#: A comparative before a value of at least one half ("> 0.5", "greater than 50%"): above one half.
_CTR_MORE = r"(?:>|greater\s+than|more\s+than|over|above|exceeds?|exceeding|in\s+excess\s+of)"
#: A ratio value of at least one half: 0.5 ... 0.99, 50 % ... 99 %.
_CTR_HALF_UP = r"(?:0?\.[5-9]\d*|[5-9]\d(?:\.\d+)?(?=\s*(?:%|percent)))"
#: A ratio value above one half: 0.51 ... 0.99, 51 % ... 99 % (not 0.5, 0.50, 50 %).
_CTR_ABOVE_HALF = r"(?:0?\.(?:5\d*[1-9]|[6-9])\d*|(?:5[1-9]|[6-9]\d|50\.\d*[1-9])(?:\.\d+)?(?=\s*(?:%|percent)))"
_CARDIO_PATTERNS: Final[tuple[str, ...]] = (
    r"cardiomegaly",
    r"(?:cardiac|heart)\s+enlargement",
    r"enlargement\s+of\s+the\s+(?:heart|cardiac\s+silhouette)",
    r"enlarged\s+(?:heart|cardiac\s+(?:silhouette|shadow)|cardiomediastinal\s+silhouette)",
    r"increased\s+(?:heart\s+size|size\s+of\s+the\s+(?:heart|cardiac\s+silhouette)|cardiac\s+silhouette)",
    # the cardiothoracic ratio (version 44): "cardiothoracic ratio is increased", "increased cardiothoracic ratio";
    # "CTR" and "raised" (version 47); "increased cardiothoracic index", "CTI" (version 48)
    r"(?:increased|elevated|enlarged|high|raised)\s+(?:cardiothoracic\s+(?:ratio|index)|ctr|cti)",
    rf"{_CTR}(?:\s*{_CARDIO_FILLER}){{0,8}}\s+(?:increased|elevated|enlarged|high|raised)",
    # a stated ratio above 0.50 (version 47): "CTR 0.62", "CTR > 0.5", "cardiothoracic ratio greater than 50%"
    rf"{_CTR}{_CTR_FILLER}(?:{_CTR_MORE}\s*{_CTR_HALF_UP}|{_CTR_ABOVE_HALF})",
    rf"{_CARDIO_SUBJECT}{_CARDIO_JOINED}(?:\s*{_CARDIO_FILLER}){{0,8}}\s+(?:enlarged|enlargement|large|increased)",
    # a template line "Heart: enlarged", "Heart: Mildly enlarged." (version 47)
    rf"{_CARDIO_SUBJECT}\s*:(?:\s*{_CARDIO_FILLER}){{0,8}}\s*(?:enlarged|enlargement|large|increased)",
    rf"{_CARDIO_SUBJECT}\s+(?:is|are|appears?|remains?|seems?)\s+(?:(?:again|still|now|stably)\s+)?borderline"
    r"(?:\s+in\s+size)?(?!\s+(?:normal|to|in\s+(?:contour|configuration)))",
)

#: "blunted" after a costophrenic angle and its verb ("the left costophrenic angle is (mildly) blunted"): the
#: costophrenic blunting finding (version 19). One fixed-width lookbehind per wording.
_BLUNTED_AFTER: Final[tuple[str, ...]] = tuple(
    rf"(?<={place} {verb} {degree})blunted"
    for place, verb in (("costophrenic angle", "is"), ("costophrenic angle", "remains"),
                        ("costophrenic angle", "appears"), ("costophrenic angles", "are"),
                        ("costophrenic angles", "remain"), ("costophrenic angles", "appear"),
                        ("costophrenic sulcus", "is"), ("costophrenic sulci", "are"), ("cp angle", "is"),
                        ("cp angles", "are"))
    for degree in ("", "mildly ", "slightly ", "minimally ", "again ")
)

#: "edematous" after the lungs and their verb ("lungs are (mildly) edematous", "the lung appears oedematous"): a present
#: edema (version 48). One fixed-width lookbehind per wording; "edematous lungs" is :data:`_ENTITY_GROUPS`' own.
_EDEMATOUS_AFTER: Final[tuple[str, ...]] = tuple(
    rf"(?<={subject} {verb} {degree})o?edematous"
    for subject, verb in (("lungs", "are"), ("lungs", "appear"), ("lungs", "remain"), ("lungs", "look"),
                          ("lung", "is"), ("lung", "appears"), ("lung", "remains"), ("lung", "looks"))
    for degree in ("", "mildly ", "moderately ", "markedly ", "severely ", "diffusely ", "slightly ", "again ",
                   "still ")
)

#: Words between a heart subject and "prominent" ("the cardiac silhouette is mildly prominent"); not "normal", "not"
#: or a comma, so "heart size is normal, prominent pulmonary arteries" is no heart finding.
_PROMINENT_FILLER = (
    r"(?:is|are|was|appears?|remains?|seems?|has|been|become|becomes|now|again|still|stably|mildly|moderately|"
    r"markedly|minimally|slightly|somewhat|borderline|more|likely|probably|possibly|may|might|could|be|overall|"
    r"persistently|xxxx)"
)
#: A heart called prominent (version 39): neither cardiomegaly nor a normal heart ("the cardiac silhouette is
#: prominent but probably artifactually large"); a non-target finding at the heart, which withholds the
#: cardiomegaly negative.
HEART_PROMINENCE_PATTERNS: Final[tuple[str, ...]] = (
    rf"{_CARDIO_SUBJECT}(?:\s+{_PROMINENT_FILLER}){{1,6}}\s+prominent",
    r"prominen(?:t|ce\s+of)\s+(?:the\s+)?(?:heart(?:\s+size)?|cardiac\s+(?:silhouette|size|contour|shadow)|"
    r"cardiomediastinal\s+silhouette)",
)
#: Name of the non-target heart finding of :data:`HEART_PROMINENCE_PATTERNS`.
HEART_PROMINENCE: Final[str] = "cardiac prominence"
#: A finding phrase that names a prominent heart (the LLM path locates such a finding at the heart).
HEART_PROMINENCE_RE: Final[re.Pattern[str]] = re.compile(
    r"\b(?:" + "|".join(HEART_PROMINENCE_PATTERNS) + r"|cardiac\s+prominence)\b", re.IGNORECASE)

#: Words of an airspace finding that "mass-like" may describe.
_AIRSPACE_WORD = r"(?:consolidat|opacit|opacif|infiltrat|air[- ]?space|airspace)"
_ENTITY_GROUPS: Final[tuple[tuple[EntityKind, tuple[str, ...]], ...]] = (
    (EntityKind("cardiomegaly", CARDIOMEGALY, lung=False), _CARDIO_PATTERNS),
    (EntityKind(HEART_PROMINENCE, None, lung=False, heart=True), HEART_PROMINENCE_PATTERNS),
    # non-target findings that share words with target phrases come first
    (EntityKind("pericardial effusion", None, lung=False), (r"pericardial\s+effusions?",)),
    (EntityKind("subcutaneous emphysema", None, lung=False), (r"subcutaneous\s+(?:emphysema|air|gas)",)),
    (EntityKind("hydropneumothorax", None), (r"hydropneumothora(?:x|ces)",)),
    (EntityKind("soft tissue edema", None, lung=False), (
        r"(?:soft[- ]tissues?|subcutaneous|chest\s+wall|body\s+wall|mucosal)\s+o?edema", r"anasarca",
        # post-posed (version 56): "edema of the soft tissues of the chest wall", "edema in the left arm"
        r"o?edema(?=\s+(?:of|in|along|involving|within|over)\s+(?:the\s+)?(?:(?:right|left|bilateral|lateral|"
        r"anterior|posterior|upper|lower|superficial|overlying)\s+)*(?:soft[- ]tissues?|subcutaneous|chest\s+wall|"
        r"body\s+wall|extremit(?:y|ies)|arms?|legs?|neck|face(?!\s+of\b)|flanks?|scalp|breasts?|axilla(?:e|ry)?)\b)",
    )),
    (EntityKind("projection mimic", None, lung=False, mimic=True), (
        r"nipple\s+shadows?",
        r"(?:overlying|overlapping|superimposed|superimposition\s+of)\s+(?:the\s+)?(?:soft[- ]tissues?|"
        r"breast(?:\s+(?:tissue|shadows?))?|skin\s+folds?|vessels|vascular\s+(?:structures|shadows)|"
        r"osseous\s+structures|bones?|ribs?)",
        r"breast\s+(?:tissue|shadows?)", r"skin\s+folds?",
        r"(?:summation|confluence|superimposition)\s+of\s+(?:(?:normal|vascular|bony|osseous)\s+)*"
        r"(?:shadows|structures|vessels)",
        r"costochondral\s+calcifications?",
    )),
    (EntityKind("vertebral collapse", None, lung=False), (
        r"(?:compression|vertebral(?:\s+body)?)\s+(?:collapse|deformit(?:y|ies))",
        r"collapse\s+of\s+(?:the\s+|an?\s+)?(?:[ctl]\d{1,2}\b|(?:[\w-]+\s+){0,2}vertebra)(?:[\w-]*)"
        r"(?:\s+bod(?:y|ies))?",
    )),
    (EntityKind("radiation changes", None), (
        r"(?:post[- ]?)?radiation\s+(?:pneumonitis|fibrosis|changes?|injury|scarring)",
    )),
    (EntityKind("bronchovascular crowding", None), (
        r"(?:bronchovascular|vascular)\s+crowding",
        r"crowding\s+of\s+(?:the\s+)?(?:bronchovascular|vascular|pulmonary|lung)\s+(?:markings|structures|vessels)",
    )),
    (EntityKind("vascular congestion", None), (
        r"(?:pulmonary\s+)?(?:vascular|venous)\s+(?:congestion|engorgement|redistribution)", r"pulmonary\s+congestion",
        r"congestion", r"cephali[sz]ation",
        r"(?:upper\s+lobe\s+)?(?:blood\s+|venous\s+|vascular\s+)?diversion",
    )),
    (EntityKind("septal lines", None), (
        r"kerley\s+(?:[abc]\s+)?lines?", r"(?:interlobular\s+)?septal\s+(?:lines?|thickening)",
    )),
    (EntityKind("interstitial markings", None), (
        r"interstitial\s+(?:lung\s+disease|markings?|prominence|thickening|pattern|disease|changes?)",
        r"reticular(?:\s+interstitial)?\s+markings?", r"reticulonodular\s+(?:markings?|pattern)",
        r"reticular(?:[- ]?nodular)?\s+pattern",
        r"(?:reticular(?:[- ]?nodular)?|reticulonodular|interstitial)\s+shadowing",
    )),
    (EntityKind("acute respiratory distress syndrome", None), (
        r"acute\s+respiratory\s+distress\s+syndrome", r"ards",
    )),
    (EntityKind("heart failure", None, lung=False), (
        r"congestive\s+heart\s+failure", r"heart\s+failure", r"chf",
    )),
    # an airway event, no pneumonia (version 48): "foreign body aspiration", "FB aspiration"
    (EntityKind("foreign body aspiration", None, lung=False), (
        r"(?:foreign[- ]body|fb)\s+aspiration(?!\s+pneumon)",
    )),
    # targets
    (EntityKind("edema", EDEMA), (
        r"(?:pulmonary|interstitial|alveolar|airspace)\s+o?edema", r"fluid\s+overload",
        # "edematous / oedematous lungs", "lungs are edematous" (version 48)
        r"o?edematous(?=\s+lungs?\b)", *_EDEMATOUS_AFTER, r"o?edema",
    )),
    (EntityKind("effusion", EFFUSION), (
        r"pleural\s+(?:effusions?|fluid(?:\s+collections?)?)",
        # empyema (version 56): of the pleura, not a subdural / epidural one or one of the gallbladder
        r"(?<!subdural )(?<!epidural )(?:pleural\s+)?empyemas?(?!\s+of\s+the\s+gallbladder)",
        r"pleural\s+a\s+fusions?",  # speech recognition of "effusion" after "pleural" (version 48)
        r"layering\s+(?:pleural\s+)?(?:effusions?|fluid)", r"(?:loculated|subpulmonic|fissural)\s+fluid",
        r"fluid(?=\s+(?:tracking\s+)?(?:(?:with)?in|along|into)\s+the\s+(?:(?:right|left)\s+)?"
        r"(?:major|minor|horizontal|oblique)\s+fissures?\b)",
        # fluid in a costophrenic angle is pleural fluid (version 27)
        r"fluid(?=\s+(?:(?:with)?in|at|along)\s+(?:the\s+|both\s+)?(?:(?:right|left)\s+)?(?:costophrenic|cp)\s+"
        r"(?:angles?|sulc(?:us|i)|recess(?:es)?)\b)",
        r"effusions?", r"hydrothora(?:x|ces)",
    )),
    (EntityKind("pneumonia", PNEUMONIA), (
        r"aspiration\s+pneumonia", r"bronchopneumonia", r"pneumonias?", r"pneumonitis",
        r"infective\s+(?:process|changes?|consolidation)",  # British (version 32)
        r"infectious\s+(?:process|etiology|infiltrates?)", r"infections?", r"aspiration", r"pna",
        # "infectious" as a reading, not before a noun: "could be infectious (in etiology)", "likely infectious than
        # atelectatic" (version 38); "non-infectious" is none
        r"(?<!non-)(?<!non)infectious(?=\s*(?:[.,;:)]|$)|\s+(?:in\s+(?:etiology|nature|origin)|than|or|and|versus|vs)\b)",
    )),
    (EntityKind("atelectasis", ATELECTASIS), (
        r"atelectatic(?:\s+changes?)?", r"atelectases", r"atelectasis", r"collapsed?", r"atx",
    )),
    (EntityKind("consolidation", CONSOLIDATION, observation=True), (
        r"consolidative\s+(?:opacity|opacities|process|changes?|shadowing)", r"consolidations?", r"consolidative",
        r"consolidated",
        # "condensation" of the lung, as reports translated from Spanish / Portuguese write consolidation (version 48)
        r"condensations?",
    )),
    (EntityKind("opacity", OPACITY, observation=True), (
        r"(?:airspace|air[- ]?space|alveolar|ground[- ]glass)\s+(?:opacity|opacities|opacifications?|disease|dz|"
        r"processe?s?|infiltrates?|shadowing)",  # "dz": disease (version 47)
        r"air[- ]?space\s+changes?", r"ggos?",  # version 32
        r"shadowing",  # British for opacity (version 24); a bare "shadow" is cardiac, nipple, breast, vascular
        r"ground[- ]glass",
        r"hazy\s+opacit(?:y|ies)", r"opacit(?:y|ies)", r"opacifications?", r"opacified",
        r"infiltrates?", r"infiltration", r"infiltrative\s+(?:process|changes?)", r"haziness",
        r"white[- ]?outs?",
    )),
    # a sign that a small effusion, pleural thickening or scarring can give: no lesion, but it may be attributed
    (EntityKind("costophrenic blunting", None, observation=True), (
        r"blunt(?:ing|ed)(?=\s+(?:of\s+)?(?:the\s+|both\s+)?(?:[\w-]+\s+){0,2}(?:costophrenic|cp)\b)",
        r"(?<=costophrenic angle )blunting", r"(?<=costophrenic angles )blunting", r"(?<=cp angle )blunting",
        r"(?<=costophrenic sulcus )blunting", r"(?<=costophrenic sulci )blunting", *_BLUNTED_AFTER,
    )),
    # other non-target findings
    (EntityKind("pneumothorax", None), (r"pneumothora(?:x|ces)", r"ptx")),  # "ptx": version 32
    # "mass-like" before an airspace word is that finding's modifier ("mass-like consolidation"; version 38)
    (EntityKind("nodule", None), (r"nodules?", rf"mass[- ]?like(?!\s+{_AIRSPACE_WORD})", r"masses",
                                      rf"mass(?![- ]?like\s+{_AIRSPACE_WORD})")),
    (EntityKind("granuloma", None), (
        r"calcified\s+granulomas?", r"granulomatous\s+(?:disease|process|changes?|infection)", r"granulomas?",
    )),
    (EntityKind("scarring", None), (r"scarring", r"scars?", r"fibrosis", r"fibrotic\s+changes?", r"cicatrix")),
    (EntityKind("emphysema", None), (r"emphysema(?:tous\s+changes?)?", r"bullae", r"bulla", r"bullous\s+disease",
                                     r"bronchiectasis", r"cysts?", r"cavitary\s+lesions?", r"cavitation", r"cavity")),
    (EntityKind("pleural thickening", None), (r"pleural\s+(?:thickening|plaques?)",)),
    (EntityKind("volume loss", None), (r"volume\s+loss",)),
    (EntityKind("metastasis", None), (r"metastas[ie]s", r"metastatic\s+disease")),
    (EntityKind("fracture", None, lung=False), (r"fractures?",)),
    (EntityKind("hernia", None, lung=False), (r"hiatal\s+hernia", r"hernia")),
    (EntityKind("adenopathy", None, lung=False), (r"lymphadenopathy", r"adenopathy")),
    (EntityKind("pneumomediastinum", None, lung=False), (r"pneumomediastinum",)),
    (EntityKind("pneumoperitoneum", None, lung=False), (r"pneumoperitoneum", r"free\s+(?:intraperitoneal\s+)?air")),
)

#: Group name -> kind, for every group of :data:`ENTITY_RE`.
ENTITY_KINDS: Final[dict[str, EntityKind]] = {}
_group_patterns: list[str] = []
_entity_branches: list[Branch] = []
for _kind, _patterns in _ENTITY_GROUPS:
    _gname = "e" + str(len(ENTITY_KINDS))
    ENTITY_KINDS[_gname] = _kind
    _group_patterns.append(f"(?P<{_gname}>{'|'.join(_patterns)})")
    _entity_branches.append(Branch(_gname, _patterns, r"\b", r"\b"))

#: Every finding phrase; ``m.lastgroup`` names the group (see :func:`entity_kind`).
ENTITY_RE: Final[re.Pattern[str]] = re.compile(r"\b(?:" + "|".join(_group_patterns) + r")\b")
#: The matches of :data:`ENTITY_RE`, found faster (``ENTITY_MATCHER.matches(low)``; see :mod:`.dispatch`).
ENTITY_MATCHER: Final[Alternation] = Alternation(_entity_branches)


#: The cardiomediastinal adjective, also written apart or as "cardiac mediastinal" (version 57), and the paediatric
#: "cardiothymic".
_CARDIOMEDIASTINAL = r"(?:cardio[- ]?mediastinal|cardiac[- ]mediastinal|cardiothymic)"
#: A heart subject of a normal statement ("heart size", "the cardiac silhouette", "cardiac and mediastinal contours";
#: version 57: "heart silhouette", "cardiac contours", "cardio mediastinal silhouettes", "cardiomediastinal size"),
#: optionally followed by "size" ("the heart silhouette size").
_HEART_NORMAL_SUBJECT = (
    r"(?:(?:heart(?:\s+(?:silhouettes?|shadow|contours?))?|cardiac\s+(?:size|silhouettes?|contours?|shadow)|"
    rf"{_CARDIOMEDIASTINAL}\s+(?:silhouettes?|contours?|size|shadow)|"
    r"(?:cardiac|heart)\s+and\s+mediastinal\s+(?:silhouettes?|contours?))(?:\s+size)?)"
)
#: One short noun phrase of a normal structure joined to a heart subject (version 49): "(heart and) mediastinum",
#: "mediastinal contours", "pulmonary vascularity / vasculature", "pulmonary XXXX"; version 57: also a second heart
#: subject, "pulmonary vascular pattern" and the Open-i template's "pulmonary vascular engorgement". No finding word
#: and not the lungs: "Heart size is enlarged and mediastinum normal." names no normal heart.
_HEART_NORMAL_JOINED = (
    rf"(?:the\s+)?(?:{_HEART_NORMAL_SUBJECT}|"
    rf"(?:(?:pulmonary|mediastinal|hilar|{_CARDIOMEDIASTINAL}|cardiopulmonary|vascular)\s+){{0,2}}"
    r"(?:mediastinum|mediastinal|vascularity|vasculature|vessels|xxxx|hila|contours?|silhouettes?|structures|"
    r"pattern|engorgement)(?:\s+size)?)"
)
#: A list of normal structures after a heart subject (version 57): "and X", ", X", ", and X"; up to three.
_HEART_NORMAL_LIST = rf"(?:(?:\s*,\s*(?:and\s+)?|\s+and\s+){_HEART_NORMAL_JOINED}){{0,3}}"
#: The verbs and adverbs between a normal heart's subject and its predicate.
_HEART_NORMAL_VERB = (
    r"(?:(?:is|are|remains?|appears?|again|still|stably|otherwise|grossly|overall|both|(?:stable|unchanged)\s+and)"
    r"\s+)*"
)
#: What says the heart is normal (version 57: "normal in size and contour", "of normal size (and contour)", "within
#: the limits of normal"), in an atomic group: a range or exception after it (:data:`_HEART_NORMAL_GOES_ON`) cannot
#: be stepped around by matching less of it.
_HEART_NORMAL_PREDICATE = (
    r"(?>normal(?:\s+in\s+(?:size|caliber)(?:\s+and\s+(?:contour|configuration|shape|appearance))?)?|"
    r"of\s+normal\s+(?:size|caliber)(?:\s+and\s+(?:contour|configuration|shape|appearance))?|"
    r"within\s+(?:the\s+)?(?:normal\s+limits|limits\s+of\s+normal)|unremarkable)\b"
)
#: What may not follow a normal-heart predicate: a range or alternative ("normal to mildly enlarged", "normal or
#: borderline", "normal/mildly enlarged") or an exception ("unremarkable except for ..."; version 57).
_HEART_NORMAL_GOES_ON = (
    r"(?!\s*/|\s+(?:to|or|versus|vs\.?|and/or)\s|\s*,?\s*(?:except|apart\s+from|other\s+than|aside\s+from|save\s+for)"
    r"\b)"
)
#: The body of :data:`HEART_NORMAL_RE` (also stepped over by :data:`NORMAL_STATEMENT_RE`, version 49).
_HEART_NORMAL = (
    rf"\b{_HEART_NORMAL_SUBJECT}{_HEART_NORMAL_LIST}\s+{_HEART_NORMAL_VERB}{_HEART_NORMAL_PREDICATE}"
    rf"{_HEART_NORMAL_GOES_ON}"
    # "normal heart size", "stable normal cardio mediastinal silhouettes"; not "normal heart size is not seen"
    rf"|\bnormal(?:[- ]sized)?\s+(?>{_HEART_NORMAL_SUBJECT})\b"
    r"(?!\s+(?:is|are|was|were)\s+not\b|\s+(?:cannot|can\s+not|could\s+not|not)\b)"
    # version 49: "normal size (and configuration / contour) of the heart / cardiac silhouette"
    r"|\bnormal\s+size(?:\s+and\s+(?:configuration|contour))?\s+of\s+(?:the\s+)?(?:heart|cardiac\s+silhouette)\b"
    # version 56: "Heart: normal size.", "Heart size: normal."
    r"|\b(?:heart(?:\s+size)?|cardiac\s+size)\s*:\s*(?:normal(?:\s+(?:in\s+)?size)?|within\s+(?:the\s+)?normal\s+"
    r"limits|unremarkable)(?=\s*(?:$|[.;,]))"  # the statement ends its clause: not "normal vs. mildly enlarged"
)
#: A statement that the heart is of normal size ("Heart size is normal.", "Normal heart size.", "The cardiac
#: silhouette is within normal limits.", "The cardiomediastinal silhouette is normal."; version 49: a heart subject
#: joined with "and" to one short noun phrase, "The heart and mediastinum are normal.", "Heart size and pulmonary
#: vascularity appear within normal limits.", "Heart and mediastinum normal.", and "Normal size and configuration of
#: the cardiac silhouette."; version 57: plural and written-apart subjects, "heart silhouette", a list of up to
#: three normal structures after the heart, "of normal size", "within the limits of normal", "grossly", "stable and";
#: not before a range, an alternative or an exception). No finding for ILS (§7.1 allows only explicit negation);
#: report labels read it as a negated cardiomegaly, as CheXpert-style labelers do. "Top normal" / "upper limits of
#: normal" are not normal statements.
HEART_NORMAL_RE: Final[re.Pattern[str]] = re.compile(_HEART_NORMAL)
#: What states that the film was read and found normal (:data:`NORMAL_STATEMENT_RE`).
_NORMAL_STATEMENT = (
    r"\bnormal\s+(?:examination|exam|study|appearances?|radiographs?|chest(?:\s+(?:radiograph|x-?ray|film))?|films?|"
    r"x-?rays?|cxr|findings)\b"
    r"|\bwithin\s+(?:the\s+)?(?:normal\s+)?limits\b"
    r"|\bno\s+(?:evidence\s+of\s+)?(?:(?:significant|acute|active|radiographic|radiological|focal|new)\s+)*"
    r"(?:(?:cardiopulmonary|intrathoracic|thoracic|pulmonary|chest)\s+)?(?:findings?|abnormalit(?:y|ies)|"
    r"process(?:es)?|disease)\b"
    r"|\b(?:lungs?|lung\s+fields?)\s+(?:(?:are|is|remain|appear|appears)\s+)?(?:(?:well[- ]expanded|(?:normally|well|"
    r"fully)\s+(?:inflated|expanded|aerated))\s+and\s+)?clear\b"
    r"|\blungs?\s+(?:(?:are|is|remain|appear|appears)\s+)?normally\s+(?:inflated|expanded|aerated)\b"
    r"|\bclear\s+lungs?\b|\bunremarkable\b|\bwell[- ](?:aerated|expanded)\b"
)
#: A statement that the film was read and found normal, in a text with no finding phrase ("Normal examination.",
#: "Examination within the limits of the norm.", "No acute cardiopulmonary process.", "Lungs clear."): with it, a
#: report that names no finding still reads the film (:func:`cxrground.reports.reading.reads_the_film`). A normal heart
#: (:data:`HEART_NORMAL_RE`) is no such statement (version 49): "The heart size is within normal limits." names
#: nothing about the lungs, as "Heart size normal." does not; the pattern steps over each normal-heart statement whole
#: (an atomic group, so a search stays linear) and looks for a normal statement outside them.
NORMAL_STATEMENT_RE: Final[re.Pattern[str]] = re.compile(
    rf"^(?:(?>{_HEART_NORMAL})|(?!{_HEART_NORMAL})[\s\S])*?(?:{_NORMAL_STATEMENT})")


def entity_kind(group: str) -> EntityKind:
    """Kind of the :data:`ENTITY_RE` group ``group``."""
    return ENTITY_KINDS[group]


# --- assertion cues ------------------------------------------------------------------------------------------
# Kinds: pseudo, neg_pre, neg_post, neg_both, unc_pre, unc_post, unc_both, link (linking hedge, acts as
# unc_pre unless inside a negation scope), question (the clinician's question, version 46: an unc_pre whose finding
# is non-target), term (end of scope). Order matters where cues start at the same
# place: hedges that contain a negation word, and pseudo-negations, come before the plain negations.

_NEG_SEEN = (
    r"(?:seen|visible|visualized|present|identified|evident|appreciated|demonstrated|noted|detected|apparent|"
    r"observed|shown|suggested)"
)
#: A negation about an earlier examination ("not present on prior", "not seen previously", "not previously
#: seen"): it says what the earlier film showed, not this one (version 13).
_PRIOR_NEGATION = (
    rf"(?:(?:is|are|was|were|has|have|had)\s+)?not\s+(?:been\s+)?(?:(?:previously|well|clearly|definitely)\s+)?"
    rf"{_NEG_SEEN}\s+(?:(?:on|in|at)\s+(?:the\s+|an?\s+)?(?:prior|previous|earlier|preceding|comparison|older|"
    rf"old|last)\b|previously\b|before\b|earlier\b)"
    rf"|(?:(?:is|are|was|were|has|have|had)\s+)?not\s+(?:been\s+)?previously\s+{_NEG_SEEN}"
)
#: :data:`_PRIOR_NEGATION` on its own, with its commas (removed from an attribution gap).
PRIOR_NEGATION_RE: Final[re.Pattern[str]] = re.compile(rf",?\s*\b(?:{_PRIOR_NEGATION})(?![\w-])\s*,?")
#: What follows "with" in a sign of the finding before it ("consolidation with air bronchograms"; version 25): that
#: "with" ends no clause, and the phrase is left out of an attribution gap (:data:`AIR_BRONCHOGRAM_RE`).
_AIR_BRONCHOGRAM_TAIL = (
    r"\s+(?:(?:an?|associated|multiple|extensive|prominent|visible|some|few)\s+)?air[- ]bronchograms?\b"
)
#: "with (...) air bronchograms" and the commas around it, removed from an attribution gap (version 25).
AIR_BRONCHOGRAM_RE: Final[re.Pattern[str]] = re.compile(rf",?\s*\bwith{_AIR_BRONCHOGRAM_TAIL}\s*")
#: What may follow a post-hedge such as "is difficult to exclude": the clause's end, or a place or reason (version
#: 44: "... at the right base", "... given the technique"); never the finding it would hedge ("difficult to exclude
#: pneumonia" is a hedge before it).
_HEDGE_TAIL = (
    r"(?=\s*(?:$|[.,;:)]|\b(?:and|but|at|in|on|within|along|involving|given|due|because|as|owing|with|without|"
    r"this|here|clinically|radiographically|secondary|on)\b))"
)
_CUES: Final[tuple[tuple[str, str], ...]] = (
    ("pseudo", _PRIOR_NEGATION),
    ("pseudo", r"no\s+(?:(?:significant|interval|substantial|appreciable|definite|significant\s+interval|"
               r"acute|real|major|marked|further)\s+)*(?:change|changes|increase|decrease|progression|"
               r"worsening|improvement|difference|increasing|enlarging)"),
    # "no evidence of worsening edema": the edema is there, it is not worse (version 24); "no evidence of new X"
    # stays a negation
    ("pseudo", r"no\s+(?:(?:radiographic|definite|convincing|definitive|clear|significant|further)\s+)?"
               r"(?:evidence|signs?)\s+of\s+(?:(?:significant|interval|further|substantial)\s+)*"
               r"(?:worsening|increasing|enlarging|progression|progressing|increase|change)"),
    ("pseudo", r"not\s+(?:(?:significantly|substantially|appreciably|markedly|much)\s+)?(?:changed|increased|"
               r"decreased|improved|worsened|worse|different|progressed)"),
    ("pseudo", r"without\s+(?:(?:significant|interval|substantial|appreciable)\s+)*(?:change|increase|decrease|"
               r"progression|worsening|increasing)"),
    ("pseudo", r"not\s+only|gram[- ]negative"),
    # incomplete resolution leaves the finding present: "partially resolved", "has not resolved", "near complete
    # resolution of"
    ("pseudo", r"(?:(?:has|have|had)\s+)?(?:not\s+(?:yet\s+)?(?:(?:completely|entirely|fully|totally)\s+)?|"
               r"(?:partially|partly|incompletely|largely|mostly|nearly|almost|substantially|slowly|gradually)\s+"
               r"(?:(?:completely|entirely)\s+)?)(?:resolved|cleared)|(?:partial|incomplete|near(?:ly)?[- ]?complete|"
               r"near(?:ly)?[- ]total|(?:almost|virtually)\s+complete|substantial|significant|considerable|marked|"
               r"some|slow|gradual|ongoing|continued|continuing)\s+(?:interval\s+)?(?:resolution|clearing)"
               r"(?:\s+of)?|"
               # no resolution leaves the finding present (version 47): "no resolution of the bibasilar atelectasis",
               # "lack of resolution of", "no significant resolution of", "failure to resolve"
               r"(?:no|lack\s+of|without)\s+(?:(?:significant|interval|appreciable|substantial|definite|further|"
               r"radiographic|significant\s+interval)\s+)*resolution(?:\s+of)?|fail(?:ure|s|ed)?\s+to\s+resolve"),
    # "hx" alone (version 46): "Hx pneumonia."
    ("hist", r"(?:(?:a|known|remote|past|prior|previous|clinical)\s+)?(?:history\s+of|hx(?:\s+of)?)|h/o|"
             r"sequelae?\s+of|"
             r"(?:from|due\s+to|related\s+to|secondary\s+to)\s+(?:an?\s+)?(?:prior|previous|old|remote|past|healed)|"
             # a risk is no finding: "deemed high risk for COVID-19 pneumonia", "at risk of aspiration"
             r"(?:(?:high|higher|increased|elevated|low|moderate|significant)[- ]+)?risk(?:\s+factors?)?\s+(?:for|of)"),
    # a hedged explanation of a finding asserts the finding: "a hernia which may account for the opacity"
    ("term", r"\b(?:may|might|could|likely|probably|possibly)\s+(?:account(?:s)?\s+for|explain(?:s)?|"
             r"be\s+responsible\s+for|contribute(?:s)?\s+to)\b"),
    ("pseudo", r"(?:to\s+(?:document|confirm|ensure|assess|evaluate|demonstrate|show|verify|follow|monitor)|until|"
               r"for|await(?:ing)?)\s+(?:the\s+|its\s+)?(?:complete\s+|full\s+|radiographic\s+|eventual\s+)*"
               r"(?:resolution|clearing)"),
    # "... is of uncertain significance" (version 45; "of unclear etiology" states the finding, only its cause is open)
    ("unc_post", r"(?:(?:is|are|was|were|remains?|appears?)\s+)?of\s+(?:uncertain|unclear|indeterminate|questionable|"
                 r"doubtful|undetermined|unknown)\s+(?:clinical\s+)?significance"),
    ("unc_post", r",\s*(?:(?:which\s+is|likely|possibly|probably)\s+)?of\s+(?:uncertain|unclear|indeterminate|"
                 r"questionable|doubtful|undetermined|unknown)\s+(?:clinical\s+)?significance"),
    # a comma-attached "difficult to assess" after a finding (version 45): "Cardiomegaly, difficult to assess due to
    # rotation."
    ("unc_post", r",\s*(?:(?:somewhat|more|very|particularly|though|but)\s+)?(?:difficult|hard|challenging)\s+to\s+"
                 rf"(?:fully\s+|accurately\s+|reliably\s+)?(?:assess|evaluate){_HEDGE_TAIL}"),
    # a finding the reader could not assess is uncertain, as "assessment for X is limited" (version 26)
    ("unc_post", r"(?:cannot|can\s*not|can't|could\s+not)\s+be\s+(?:(?:well|adequately|reliably|fully|properly)\s+)?"
                 r"(?:assessed|evaluated)"),
    ("unc_post", r"(?:cannot|can\s*not|can't|could\s+not|may\s+not)\s+be\s+(?:entirely\s+|completely\s+)?"
                 r"(?:excluded|ruled\s+out)"),
    ("unc_post", r"(?:(?:is|are)\s+)?not\s+(?:entirely\s+|completely\s+|definitely\s+)?(?:excluded|ruled\s+out)"),
    # also before a place or reason: "pneumonia is difficult to exclude at the right base" (version 44)
    ("unc_post", r"(?:(?:is|are|was|would\s+be|may\s+be|remains?)\s+)?(?:difficult|impossible|hard)\s+to\s+"
                 rf"(?:entirely\s+|completely\s+|definitely\s+)?(?:exclude|rule\s+out){_HEDGE_TAIL}"),
    # "cardiomegaly is difficult to assess given the AP technique" (version 44; "difficult to assess for X" is a
    # hedge before X)
    ("unc_post", r"(?:is|are|was|were|remains?)\s+(?:(?:somewhat|more|very|particularly)\s+)?(?:difficult|hard|"
                 rf"challenging)\s+to\s+(?:fully\s+|accurately\s+|reliably\s+)?(?:assess|evaluate){_HEDGE_TAIL}"),
    # "cannot r/o" is the radiologist's "cannot rule out", no clinician's question (version 47)
    ("unc_pre", r"(?:cannot|can\s*not|can't|could\s+not)\s+(?:entirely\s+|completely\s+|definitely\s+)?"
                r"(?:exclude|rule\s+out|r/o)"),
    ("unc_pre", r"(?:difficult|impossible|hard)\s+to\s+(?:entirely\s+|completely\s+|definitely\s+)?"
                r"(?:exclude|rule\s+out)"),
    ("unc_pre", r"(?:please\s+)?(?:correlate|correlation)\s+(?:clinically\s+)?(?:for|to\s+(?:exclude|rule\s+out))|"
                r"clinical(?:ly)?\s+correlat\w*\s+(?:for|to\s+(?:exclude|rule\s+out))|"
                # the radiologist's hedges that hold a question's words (version 46): "it is difficult to assess for
                # pneumonia", "it is not possible to exclude a small effusion"
                r"(?:difficult|hard|challenging|impossible)\s+to\s+(?:assess|evaluate)\s+(?:further\s+)?for|"
                r"(?:not\s+possible|unable)\s+to\s+(?:entirely\s+|completely\s+|definitely\s+)?(?:exclude|rule\s+out)|"
                # "the study is limited for evaluation of effusion" (version 42)
                r"limited\s+(?:for|in)\s+(?:the\s+)?(?:evaluation|assessment)\s+(?:of|for)"),
    # the clinician's question (version 46): "Eval for infiltrate.", "R/o PNA.", "Clinical concern for pneumonia.";
    # the finding it governs is no reading of the film (see rules). Not "concerning for", the radiologist's hedge.
    ("question", r"(?:eval|evaluate|evaluation|assess|assessment)\s+(?:further\s+)?for|r/o|(?:to\s+)?rule\s+out|"
                 r"to\s+exclude|question\s+of|clinical\s+(?:concern|suspicion)\s+(?:for|of)"),
    # fronted (version 56), at the start of a sentence or clause: "No longer seen is the previously noted right
    # basilar consolidation.", "Gone is the left lower lobe opacity."
    ("neg_pre", rf"(?<!\w\s)(?<!,\s)no\s+longer\s+(?:(?:well|clearly)\s+)?{_NEG_SEEN}"
                r"(?=\s+(?:is|are|was|were)\b)|"
                r"(?<!\w\s)(?<!,\s)(?:gone|resolved|cleared)"
                r"(?=\s+(?:is|are|was|were)\s+(?:the|a|an|any|previously|prior)\b)"),
    ("neg_post", rf"(?:(?:is|are|was|were)\s+)?no\s+longer\s+(?:(?:well|clearly)\s+)?{_NEG_SEEN}"),
    ("neg_post", rf"(?:(?:is|are|was|were|has|have)\s+)?not\s+(?:been\s+)?(?:(?:well|clearly|definitely|"
                 rf"convincingly|clearly)\s+)?{_NEG_SEEN}"),
    ("neg_post", r"(?:(?:is|are|has|have)\s+)?(?:been\s+)?(?:since\s+)?(?:completely\s+)?"
                 r"(?:gone|ruled\s+out|disappeared)|(?:is|are)\s+absent|"
                 # "pneumonia is excluded" (not "excluded from" the image; version 33)
                 r"(?:is|are|has\s+been|have\s+been)\s+(?:now\s+)?excluded(?!\s+from)|(?:(?:appears?|is|are|remains?)\s+)?within\s+(?:the\s+)?"
                 r"(?:normal\s+limits|limits\s+of\s+normal)"),
    # round 5: a clause-final "have / has (since) resolved / cleared" negates its whole subject, however long the
    # list ("consolidation, atelectasis, and blunting at the left base have cleared in the interval"); see rules
    ("neg_subj", r"(?:has|have)\s+(?:now\s+|since\s+|also\s+)*(?:(?:completely|entirely|fully)\s+)?"
                 r"(?:resolved|cleared)(?=\s*(?:$|[.;,)]|\b(?:in\s+the\s+interval|since|on|compared|from|"
                 r"and)\b))"),
    ("neg_both", r"(?:(?:has|have)\s+)?(?:been\s+)?(?:since\s+)?(?:completely\s+)?"
                 r"(?:resolved|cleared)"),
    # "Effusions absent."; "Pleural effusion: none." (version 44)
    ("neg_post", r"absent(?=\s*(?:$|[.,;:)]))"),
    ("neg_post", r":\s*(?:none|absent|negative|no|not\s+(?:seen|present|identified))(?=\s*(?:$|[.,;)]))"),
    # "the previously collapsed left lower lobe has re-expanded" (version 44)
    ("neg_post", r"(?:has|have)\s+(?:now\s+|since\s+)?(?:(?:completely|fully)\s+)?re-?expanded"),
    ("neg_pre", r"(?:interval\s+)?(?:resolution|disappearance)\s+of|(?:(?:interval|complete|total)\s+)+clearing\s+of|"
                r"no\s+longer|"
                r"negative\s+for|free\s+of|clear\s+of|absence\s+of|"
                r"without|neither|nor|no|not\s+(?:a|an|any)|"
                # version 44: "absent pleural effusion", "nil effusion", "re-expansion of the collapsed lobe"
                r"absent|zero|nil|(?:interval\s+|complete\s+)?re-?expansion\s+of"),
    # a negated link verb or adjective (version 41): "does not suggest", "is not consistent with", "nothing to suggest"
    ("neg_pre", r"(?:do|does|did)\s+not\s+(?:suggest|represent|show|demonstrate|reveal|indicate|reflect)|"
                r"(?:is|are|was|were)\s+not\s+(?:typical|characteristic|suggestive|consistent|compatible|diagnostic|"
                r"indicative)\s+(?:of|for|with)|"
                # without a verb (version 47): "Not consistent with pneumonia.", "inconsistent with", "not in keeping
                # with"; not the double negative "not inconsistent with"
                r"not\s+(?:typical|suggestive|consistent|compatible)\s+(?:of|with)|not\s+in\s+keeping\s+with|"
                r"(?<!not )inconsistent\s+with|"
                r"not\s+(?:felt|thought|believed|considered)\s+to\s+(?:represent|reflect|be)|"
                r"nothing\s+to\s+suggest|"
                r"not\s+to\s+be\s+confused\s+with|"  # version 48
                r"argu(?:es?|ed|ing)\s+against|"  # version 42
                r"fail(?:s|ed)?\s+to\s+(?:show|demonstrate|reveal)|lack\s+of"),  # version 43
    # "pneumonia has not developed", "the effusion has not recurred" (version 43)
    ("neg_post", r"(?:has|have|had)\s+not\s+(?:yet\s+)?(?:developed|recurred|reaccumulated|re-accumulated|"
                 r"reappeared|returned)"),
    # a general caveat, not a finding of this image: "early infection may be radiographically occult" (version 43)
    ("caveat", r"(?:may|can|could|might)\s+be\s+(?:radiographically\s+|clinically\s+)?occult"),
    # "indicating" / "indicates" state, they do not hedge (version 47); "indicative of" hedges
    ("link", r"(?:to\s+)?suggest(?:s|ed|ing|ive\s+of|ion\s+of)?|concerning\s+for|suspicious\s+for|worrisome\s+for|"
             r"indicative\s+of|(?:raises?|raising|raised)\s+(?:the\s+)?(?:concern|possibility|question|"
             r"suspicion)\s+(?:for|of)|concern\s+for"),
    ("unc_post", r"in\s+(?:the|an?)\s+(?:appropriate|proper|right|correct|suggestive)\s+clinical\s+"
                 r"(?:setting|context|scenario|situation)"),
    # "is (considered) less likely", "are likely present" (version 27)
    ("unc_post", r"(?:(?:is|are|seems?|appears?)\s+(?:(?:also|more|most|less|not|considered|felt\s+to\s+be|"
                 r"thought\s+to\s+be|believed\s+to\s+be)\s+){0,2}"
                 r"(?:possible|possibly|likely|unlikely|probable|probably|suspected|questioned|favou?red|questionable|"
                 r"doubtful)(?:\s+(?:present|seen|noted|identified|visible|evident))?|"
                 r"(?:may|might|could)\s+be\s+present|(?:is|are|would\s+be|could\s+be|may\s+be|might\s+be|remains?)\s+"
                 r"(?:also\s+)?(?:an?\s+|another\s+)?(?:(?:diagnostic\s+)?consideration|possibility|concern)|"
                 r"(?:should|could|would|may|might)\s+(?:also\s+)?be\s+considered|"
                 # "atypical pneumonia to be considered" (version 48)
                 r"(?:(?:is|are)\s+)?(?:also\s+)?to\s+be\s+considered)"
                 r"(?=\s*(?:$|[.,;:)]|\b(?:and|but|given|in|at|on|with|though|although|if|as|clinically)\b))"),
    # "a left effusion is again suggested"; a bare hedge word closing a clause: "trace left effusion possible"
    # (version 28)
    ("unc_post", r"(?:is|are)\s+(?:(?:again|also|now|still)\s+)?suggested"
                 r"(?=\s*(?:$|[.,;:)]|\b(?:and|but|on|in|at|by|with)\b))"),
    # "Bacterial pneumonia favored." (version 48)
    ("unc_post", r"(?:possible|probable|likely|suspected|questioned|favou?red)(?=\s*(?:$|[.,;]))"),
    # "atypical pneumonia in the differential (diagnosis)" (version 48); after a word, so that a sentence opening "In
    # the differential, ..." keeps the hedge before its finding
    ("unc_post", r"(?<=[\w)] )(?:(?:is|are|remains?)\s+)?(?:also\s+)?in\s+the\s+differential(?:\s+diagnosis)?"
                 r"(?=\s*(?:$|[.,;)]))"),
    ("unc_vs", r"(?:more|less)\s+(?:likely|probable)\s+than|favou?red\s+over"),
    ("unc_pre", r"(?:not\s+clear|unclear|uncertain|unsure)\s+(?:whether|if)|whether(?:\s+or\s+not)?"),
    # "opacities, can be seen with COVID-19 pneumonia" (version 48)
    ("unc_pre", r"(?:can|could)\s+(?:also\s+)?be\s+seen\s+with"),
    # British "query" before a finding, as "?" (version 47): "Query right basal consolidation.", "query of"; not the
    # request "clinical query:"
    ("unc_pre", r"(?<!clinical )query(?:\s+of)?(?!\s*:)"),
    ("unc_pre", r"(?:most\s+|more\s+)?(?:likely|probable|probably|possible|possibly)|possibility\s+of|questionable|"
                r"question|presumed|presumably|may(?:\s+(?:be|represent|reflect))?|might|"
                r"could(?:\s+(?:be|represent|reflect))?|suspected|suspect|suspicion\s+(?:of|for)|borderline|equivocal|"
                r"indeterminate|"
                r"differential(?:\s+diagnosis)?(?:\s+(?:includes?|considerations?))?|"
                r"consider(?:ed)?|worrisome|concerning|perhaps|unlikely|doubtful|"
                r"(?:in\s+)?favou?r(?:s|ed|ing)?(?:\s+of)?"),
    ("unc_vs", r"versus|vs\.?"),
    ("unc_both", r"\?"),
    ("unc_both", r"\bif\s+any\b"),  # "tiny if any left effusion", "small, if any, right effusion" (version 28)
    ("unc_both", r"\bif\s+present\b"),  # "effusion, if present, is small" (version 38)
    ("term", r"\bbut\b|\bhowever\b|\balthough\b|\bthough\b|\bwhereas\b|\bwhile\b|\bexcept\b|\baside\s+from\b|"
             r"\bapart\s+from\b|\bother\s+than\b|(?<!consistent )(?<!compatible )(?<!keeping )(?<!or )(?<!associated )"
             r"(?<!seen )(?<!concerning )(?<!suspicious )(?<!correlate )(?<!correlation )(?<!related )\bwith\b"
             rf"(?!{_AIR_BRONCHOGRAM_TAIL})|"
             r"\band\s+(?=(?:there|the|a|an|this|these|it)\b)|"
             # "probable right effusion and definite left consolidation" (version 44)
             r"\band\s+(?=(?:a\s+)?definite(?:ly)?\b)"),
    ("term", r";|,\s+(?=(?:the|there|this|it)\b)"),
)
_word_cues: list[str] = []
_other_cues: list[str] = []
_cue_branches: list[Branch] = []
#: Group name -> cue kind, for :data:`CUE_RE`.
CUE_KINDS: Final[dict[str, str]] = {}
for _i, (_ckind, _pat) in enumerate(_CUES):
    _gname = f"c{_i}"
    CUE_KINDS[_gname] = _ckind
    if _ckind == "unc_both" or _pat.startswith((";", ":", ",")):  # punctuation cues
        _other_cues.append(f"(?P<{_gname}>{_pat})")
        _cue_branches.append(Branch(_gname, (_pat,)))
    elif _ckind == "term":  # scope-end words carry their own boundaries
        _word_cues.append(f"(?P<{_gname}>{_pat})")
        _cue_branches.append(Branch(_gname, (_pat,), r"\b"))
    else:
        _word_cues.append(f"(?P<{_gname}>{_pat})(?![\\w-])")
        _cue_branches.append(Branch(_gname, (_pat,), r"\b", r"(?![\w-])"))
#: Every assertion cue; ``CUE_KINDS[m.lastgroup]`` is its kind. Word cues (scope-end words last) share one
#: leading word boundary, so that positions inside words fail at once; then the punctuation cues.
CUE_RE: Final[re.Pattern[str]] = re.compile(r"\b(?:" + "|".join(_word_cues) + ")|" + "|".join(_other_cues))
#: The matches of :data:`CUE_RE`, found faster: word cues first (each after the shared ``\b``), then punctuation.
CUE_MATCHER: Final[Alternation] = Alternation(
    [b for b in _cue_branches if b.prefix] + [b for b in _cue_branches if not b.prefix])

#: Window (in words between cue and finding phrase) of the cues that apply both before and after a phrase.
BOTH_WINDOW: Final[dict[str, int]] = {"neg_both": 4, "unc_both": 3, "unc_vs": 6}

#: Link phrases that attribute an observation to a lesion ("opacity ... is consistent with pneumonia").
LINK_RE: Final[re.Pattern[str]] = re.compile(
    r"\b(?:is|are|represents?|representing|reflects?|reflecting|consistent\s+with|c/w|compatible\s+with|"
    r"in\s+keeping\s+with|concerning\s+for|suspicious\s+for|worrisome\s+for|suggest(?:s|ing|ive\s+of)?|"
    r"likely|probably|possibly|may|might|could|due\s+to|secondary\s+to|related\s+to|favou?ring|favou?rs?|"
    r"indicat(?:es|ing|ive\s+of)|diagnostic\s+of|characteristic\s+of|typical\s+of|question\s+of|"
    r"most\s+likely|presumably|presumed|probable|possible|suggestion\s+of|concern\s+for|"
    r"(?:raises?|raising|raised)\s+(?:the\s+)?(?:concern|possibility|question|suspicion)\s+(?:for|of))\b"
)
#: Words that stop an attribution (after link phrases are removed from the gap).
ATTRIBUTION_BLOCK_RE: Final[re.Pattern[str]] = re.compile(
    r";|\b(?:but|however|although|no|not|without|there|while|whereas|with|new|also)\b"
)
#: Hedge cues of the ``likely`` grade (round 5): the reader thinks the finding more probable than not ("probable
#: pneumonia", "opacity, likely atelectasis", "most suggestive of pneumonia", "presumed", "favored"). Every other
#: hedge ("may", "possible", "cannot exclude", "suspicious for", "suggestive of", a differential, "?") is of the
#: ``possible`` grade. The grade never changes the ILS assertion (uncertain, tentative: ILS §7.1 lists "likely"
#: as a hedge); report labels may count likely-hedged findings as present (``reports label --uncertain likely``).
LIKELY_HEDGE_RE: Final[re.Pattern[str]] = re.compile(
    r"(?:(?:most|more)\s+)?(?:likely|probable|probably)|presum(?:ed|ably|ptive)|most\s+suggestive\s+of|"
    r"(?:in\s+)?favou?r(?:s|ed|ing)?(?:\s+of)?|(?:is|are|seems?|appears?)\s+(?:(?:most|more)\s+)?(?:likely|probable)"
)
#: A de-identification blank standing where the link word was ("opacity XXXX atelectasis", "opacities, XXXX
#: atelectatic changes"): an attribution whose link word is unknown; no hedge is seen, so the lesion keeps the
#: observation's assertion (round 5; before, the lesion was a second finding without the observation's location).
MASKED_LINK_RE: Final[re.Pattern[str]] = re.compile(r"\s*,?\s*(?:xxxx\s*)+")
#: A sentence about an earlier examination ("On the prior outside CT, the right upper lobe was consolidated."):
#: its findings are history when it is told in the past tense (:data:`PRIOR_EXAM_PAST_RE`) and compares nothing
#: with today (:data:`PRIOR_EXAM_NOW_RE`; "on the prior study the effusion was larger" still reports the effusion).
PRIOR_EXAM_RE: Final[re.Pattern[str]] = re.compile(
    r"\s*(?:on|in|at|per)\s+(?:the\s+|a\s+|an\s+)?(?:(?:previous|prior|outside|old|earlier|remote|preceding)\s+)+"
    r"(?:[\w-]+\s+){0,3}?(?:study|studies|exam(?:ination)?s?|scans?|ct|cts|films?|radiographs?|x-?rays?|images?|"
    r"cxrs?|mri)\b"
)
_OTHER_MODALITY = r"(?:ct|cts|computed\s+tomography|hrct|mri|magnetic\s+resonance(?:\s+imaging)?)"
_MODALITY_WORDS = (r"(?:the|a|an|axial|coronal|sagittal|chest|thoracic|non-?contrast|contrast-enhanced|high-resolution|"
                   r"low-dose|recent|subsequent|same-day|follow-up)")
#: A sentence that reports what a CT or MRI showed ("Axial CT scan(B) shows GGOs ...", "... opacities were observed on
#: high-resolution computed tomography scan"): its findings are not lesions of the radiograph (non-target findings),
#: unless the sentence also names the radiograph (:data:`RADIOGRAPH_RE`: "the radiograph shows ... as demonstrated on
#: the recent CT").
OTHER_MODALITY_RE: Final[re.Pattern[str]] = re.compile(
    rf"^\s*(?:{_MODALITY_WORDS}\s+)*{_OTHER_MODALITY}(?:\s+(?:scans?|images?|examination|study))?\s*(?:\(\w\))?\s*"
    r"(?:of\s+the\s+chest\s+)?(?:shows?|showed|shown|demonstrat\w+|reveal\w*|depict\w*|found)\b"
    rf"|\b(?:was|were|is|are)\s+(?:\w+\s+)?(?:observed|seen|noted|shown|demonstrated|identified|detected|visible|"
    rf"depicted|found)\s+(?:on|in|at|by)\s+(?:{_MODALITY_WORDS}\s+)*{_OTHER_MODALITY}\b"
)
#: Another person than the patient, named as such (version 54): a possessive ("her", "his", "their", "the
#: patient's") or, for the unambiguous words, "a" / "an" before a word for a relative or an acquaintance. A lesion
#: after it in its sentence is that person's illness ("Only sick contact was her husband who was hospitalized with
#: pneumonia."), no finding. Not "child", "son" or "daughter" (a child is often the patient), and not a bare
#: "relative", "sister", "partner" or "parents" ("relative to the prior study", "a sister nodule", "parents report
#: fever": the patient's findings follow).
_PERSON_KIN = (r"husband|wife|spouse|mother|father|brothers?|siblings?|grand(?:mother|father|parents?)|"
               r"family\s+members?|friends?|neighbou?rs?|room-?mates?|co-?workers?|colleagues?")
EXPERIENCER_RE: Final[re.Pattern[str]] = re.compile(
    rf"\b(?:(?:her|his|their|(?:the\s+)?patient'?s)\s+(?:(?:late|older|younger|elder|elderly)\s+)?"
    rf"(?:{_PERSON_KIN}|relatives?|sisters?|partners?|parents)|(?:an?)\s+(?:{_PERSON_KIN}))\b"
    r"(?!\s+(?:nodule|lesion|mass|focus|opacit))"
)
#: Where another person's part of a sentence ends (:data:`EXPERIENCER_RE`): a semicolon, a contrast, ", and", a
#: clause that turns back to the patient ("she", "he", "patient", "now") or to the film ("the radiograph shows").
EXPERIENCER_END_RE: Final[re.Pattern[str]] = re.compile(
    r";|,\s*and\b|\b(?:but|whereas|while|however|she|he|patient|now|radiograph\w*|x-?rays?|cxrs?|films?|imaging|"
    r"shows?|showed|demonstrat\w*|reveal\w*)\b"
)
#: A radiograph named in a sentence (:data:`OTHER_MODALITY_RE`).
RADIOGRAPH_RE: Final[re.Pattern[str]] = re.compile(
    r"\b(?:radiograph\w*|x-?rays?|cxrs?|chest\s+films?|plain\s+films?|frontal|portable)\b"
)
PRIOR_EXAM_PAST_RE: Final[re.Pattern[str]] = re.compile(r"\b(?:was|were|had|showed|demonstrated|revealed)\b")
PRIOR_EXAM_NOW_RE: Final[re.Pattern[str]] = re.compile(
    r"\b(?:larger|smaller|more|less|greater|bigger|better|worse|improv\w*|increas\w*|decreas\w*|again|still|"
    r"persist\w*|unchanged|stable|similar|same|now|today|current\w*|remains?|since|compared|resolv\w*|new)\b"
)
#: A sided lung named clear with an exception ("The left lung is otherwise clear except for minimal basilar
#: atelectasis."): the lung findings after it lie in that lung (version 13). Group 1: the side.
CLEAR_EXCEPT_RE: Final[re.Pattern[str]] = re.compile(
    r"\b(right|left)\s+(?:lung|hemithorax)\s+(?:(?:is|remains|appears)\s+)?(?:(?:otherwise|now|again|essentially|"
    r"grossly)\s+)*(?:clear|unremarkable|well[- ]aerated)\s*,?\s*(?:otherwise\s+)?(?:except\s+(?:for\s+)?|"
    r"apart\s+from|aside\s+from|other\s+than|save\s+for|but\s+for|with\s+the\s+exception\s+of)"
)
#: Phrases of a finding that is diffuse by nature or by word ("pulmonary edema", "bilateral opacities", plural
#: "effusions"): it takes no place from another finding of its sentence.
DIFFUSE_PHRASE_RE: Final[re.Pattern[str]] = re.compile(
    r"(?:pulmonary|interstitial|alveolar|vascular|diffuse|bilateral|multifocal|widespread|scattered)\b|"
    r".*\beffusions\b")
#: A sentence that opens by pointing back ("This may represent atelectasis.", "The appearance suggests scarring or
#: atelectasis.", "Findings are concerning for pneumonia.": a bare "Findings", version 21): its unlocated lesions
#: lie where the located findings of the sentence before lie (see :mod:`.resolve`).
ANAPHOR_RE: Final[re.Pattern[str]] = re.compile(
    r"\s*(?:(?:this|these|that|those|it|they|findings?|the\s+(?:appearance|findings?|latter|abnormality|abnormalities))\b"
    r"(?:\s+(?:findings?|appearance|abnormalit(?:y|ies)|opacit(?:y|ies)|densit(?:y|ies)|changes?))?"
    # version 16: "Superimposed pneumonia cannot be excluded." refers to the finding of the sentence before
    r"|(?:there\s+(?:is|are)\s+(?:also\s+)?)?(?:an?\s+)?(?:(?:small|trace|tiny|minimal|mild|moderate|large)\s+)?"
    # "small adjacent effusion", "there is associated atelectasis": version 29
    r"(?:superimposed|underlying|associated|adjacent|concurrent|coexist(?:ing|ent)|accompanying)\b)",
    re.IGNORECASE,
)
#: Gap between two finding phrases that makes them alternatives ("atelectasis versus pneumonia").
ALTERNATIVE_GAP_RE: Final[re.Pattern[str]] = re.compile(
    r"\s*,?\s*(?:or|versus|vs\.?|/|and\s*/\s*or)\s*(?:(?:xxxx|an?|early|developing|superimposed|underlying|"
    r"mild|small|focal|subsegmental|less\s+likely|more\s+likely|possibly|possible|chronic|acute|"
    r"lobar|segmental|bibasilar|multifocal|multilobar|diffuse|patchy|bilateral|basal|perihilar|retrocardiac|"
    r"interstitial|alveolar|pulmonary|asymmetric|atypical|viral|bacterial|infectious|moderate|large|severe|trace|"
    r"layering|loculated|worsening|new|residual|persistent|recurrent)\s+)*"
)

# --- locations -----------------------------------------------------------------------------------------------

#: Side words of a place; "rt" / "lt" (version 24) only before a zone word or a lung noun, never alone ("post RT");
#: a bare "R" / "L" (version 44) only before a zone, a side noun or a lesion phrase, and not in "b/l".
_SIDE = r"(?:right\s+and\s+left|left\s+and\s+right|right|left|rt\.?|lt\.?|bilateral|both)"
_SIDED = _SIDE + r"(?:[- ]?sided)?"
_DESC = r"(?:(?:lateral|medial|posterior|anterior|inferior|superior|peripheral|dependent|central|far|extreme)\s+)*"
#: A zone noun after its zone word, spaced or hyphenated ("upper lobe", "upper-lobe"; version 50).
_NOUN = r"(?:\s+|-)(?:lungs?\s+)?(?:lobes?|zones?|fields?|lungs?|hemithora(?:x|ces)|regions?|segments?)"
_NEED = r"(?:upper|lower|mid|middle)"
#: One item of a sided zone list with a shared noun ("right upper and left lower lobes", "right upper and both mid
#: zones").
_PAIR = rf"(?:right|left|both)\s+{_NEED}"
_NEEDLIST = rf"{_NEED}(?:\s*(?:,|-\s*(?:and|or|to)|and|to|/|-|or)\s*{_NEED})*{_NOUN}"  # "mid- and lower zones"
_FREE = (
    r"(?:bibasilar(?:ly)?|bibasal(?:ly)?|biapical|apices|apex|apical(?:ly)?|basilar|basal(?:ly)?|bases|base|"
    r"perihilar|parahilar|infrahilar|suprahilar|hilar|hilum|hila|lingula(?:r)?|retrocardiac|midlung|mid-lung|"
    r"midzones?|costophrenic(?:\s+(?:angles?|sulci|sulcus|recess(?:es)?))?|cp\s+angles?|"
    r"cardiophrenic(?:\s+(?:angles?|regions?|sulci|sulcus))?)"
)
#: "... of the right lung" after a zone: the zone's side (version 37: "base of the right lung" is the right base).
#: Version 54: also "... of the left upper lobe" / "of the LUL" after a side-less zone or segment ("apical segment of
#: the LUL" is the left apex).
_OF_SIDE = (r"(?:\s+of\s+(?:the\s+)?(?:(?:right|left|both|rt\.?|lt\.?)(?:\s+|-)(?:lungs?|hemithora(?:x|ces)|"
            r"(?:upper|lower|middle)\s+lobes?)|rul|lul|rll|lll|rml))")
#: "upper" / "lower" before a hilar word: part of the place (version 54: "right upper perihilar region").
_UPPER_HILAR = r"(?:(?:upper|lower)(?:\s+(?:and|or|to)\s+(?:upper|lower))?\s+(?=(?:peri|para|infra)?hil))"
_FREELIST = rf"{_FREE}(?:\s*(?:,|and|/|or)\s*{_FREE})*(?:{_NOUN})?"
_NOOP_ANATOMY = (
    r"(?:hemidiaphragms?|diaphragm|atri(?:um|al)|ventric\w*|clavic\w*|ribs?|\d+(?:st|nd|rd|th)\s+ribs?|"
    r"shoulders?|humer\w*|scapul\w*|internal\s+jugular|ij|jugular|subclavian|picc|arm|axill\w*|breast|"
    r"chest\s+wall|upper\s+quadrant|neck|kidney|main\s*stem|bronch\w*|paratracheal|trache\w*|mediastin\w*|"
    r"cardiac|heart|aort\w*|pectoral\w*|fem\w*|hip|knee|nipple|thyroid)"
)
#: What follows a bare side letter that names a side (version 44): a lesion phrase, perhaps after size words.
_BARE_SIDE_BEFORE = (
    r"\s+(?:(?:small|trace|tiny|minimal|mild|moderate[- ]sized|moderate|large|massive|pleural|basilar|basal|apical|"
    r"sided|lower|upper)\s+)*"
    r"(?:effusions?|pneumothorax|ptx|atelectasis|opacity|opacities|consolidation|infiltrates?|pneumonia)\b"
)
_LOCATIONS: Final[tuple[tuple[str, str], ...]] = (
    ("border", r"(?:right|left)\s+heart\s+border"),
    ("retro", r"(?:behind|posterior\s+to)\s+the\s+(?:(?:right|left)\s+)?heart"),
    ("abbr", r"rll|lll|rml|rul|lul"),
    ("fissure", r"(?:right\s+)?(?:minor|horizontal)\s+fissure"),
    ("noop", r"(?:right|left)\s+(?:(?:slightly|much|somewhat)\s+)?(?:greater|worse|larger|more|less|bigger|"
             r"smaller)\s+than\s+(?:the\s+)?(?:right|left)"),
    # ", more on the right", "... more on the right than the left" (version 52): a comparison of the lungs, no side
    # ("effusion is larger / worse on the right" may compare with a prior film: not one)
    ("noop", r",\s*(?:more|worse|greater|denser|more\s+(?:prominent|pronounced|marked|extensive))\s+on\s+the\s+"
             r"(?:right|left)(?:\s+than\s+(?:on\s+)?the\s+(?:right|left))?"),
    ("noop", r"(?:more|worse|greater|larger|denser|more\s+(?:prominent|pronounced|marked|extensive))\s+on\s+the\s+"
             r"(?:right|left)\s+than\s+(?:on\s+)?the\s+(?:right|left)"),
    # "R > L", "L>R", "R ≥ L", "right > left" (version 46): both lungs, as "right greater than left"
    ("noop", r"(?:right|left|r|l)\s*(?:>=?|≥)\s*(?:right|left|r|l)"),
    # a lung finding next to a sided hemidiaphragm lies at that side's base (version 45)
    ("diaphragm", r"(?:(?:immediately|just)\s+)?(?:adjacent\s+to|along|above|at|near|abutting|bordering|overlying)\s+"
                  r"the\s+(?:right|left)\s+hemidiaphragm"),
    ("noop", rf"(?:right|left)(?:[- ]?sided)?\s+{_NOOP_ANATOMY}"),
    # "in the right clinical setting" names no side (version 44)
    ("noop", r"right\s+(?:clinical|setting|context|scenario|circumstances)"),
    # a bare "R" / "L" before a zone ("L base"; version 44)
    ("zoned", rf"(?<!/)[rl]\s+{_DESC}(?:{_NEEDLIST}|{_FREELIST})"),
    ("paired", rf"{_PAIR}(?:\s*(?:,\s*and|,|/|and)\s*{_PAIR})+{_NOUN}"),
    # "right upper perihilar": the upper and mid zones (version 54)
    ("zoned", rf"(?:{_SIDED}\s+)?{_DESC}(?:lungs?\s+)?(?:{_NEEDLIST}|{_UPPER_HILAR}?{_FREELIST}){_OF_SIDE}?"),
    ("both", r"both\s+lungs|both\s+hemithoraces|both\s+sides|bilateral(?:ly)?|diffuse(?:ly)?|multifocal|"
             r"widespread|scattered|throughout\s+(?:both|the)\s+lungs"),
    ("whole", rf"{_SIDED}\s+(?:lung|hemithorax|chest|side|pleural\s+space|pleura|lung\s+field)s?|"
              rf"(?:right|left)[- ]sided|right|left|"
              # "R" / "L" / "rt" / "lt" before a side noun or right before a lesion ("small L effusion"; version 44)
              rf"(?<!/)[rl]\s+(?:side|lung|hemithorax)|(?<!/)(?:[rl]|rt\.?|lt\.?)(?={_BARE_SIDE_BEFORE})"),
)
#: Extent words of the "both" kind: both lungs only when nothing more specific is said (ILS §7.2 "diffuse,
#: multifocal (no side)"); with a sided or zoned phrase ("diffuse right lower lobe opacity") they add no label.
EXTENT_RE: Final[re.Pattern[str]] = re.compile(r"diffuse(?:ly)?|multifocal|widespread|scattered")
#: Side words of a location phrase; a zoned phrase without one may take the side of the phrase right before it.
SIDE_WORD_RE: Final[re.Pattern[str]] = re.compile(
    r"\b(?:right|left|rt|lt|bilateral(?:ly)?|both)\b|^[rl]\b|^bi|\bbi(?=\w)")
#: Side abbreviations and the side they name.
SIDE_ABBREVIATIONS: Final[dict[str, str]] = {"rt": "right", "lt": "left"}
#: The gap that lets a zoned phrase take the side of the phrase before it ("left perihilar upper lobe").
SIDE_CARRY_GAP_RE: Final[re.Pattern[str]] = re.compile(r"\s*(?:(?:,|/|and)\s*)?")
#: A side-less singular base (version 47: "basal", "basilar", "base", "lower zone", "lower lobe"; not "bibasal",
#: "bases", "both", "bilateral"): in a sentence whose sided places all name one side it takes that side ("Small left
#: pleural effusion with associated basal atelectasis.": the left base). Not "the base", whose side the rule of version
#: 22 decides ("Opacity in the right lung and effusion at the base.": both bases).
UNSIDED_BASE_RE: Final[re.Pattern[str]] = re.compile(
    r"(?:lung\s+)?(?:base|basal(?:ly)?|basilar(?:ly)?|lower\s+(?:zone|lobe))")
#: A bare side word (version 48: :data:`SIDE_SIZE_RE`).
BARE_SIDE_RE: Final[re.Pattern[str]] = re.compile(r"right|left|rt\.?|lt\.?|r|l")
#: Size or severity words right after a bare side word ("Rt basal atelectasis, Lt small effusion."; version 48): the
#: side belongs to the finding phrase that follows them, not to the finding before it.
SIDE_SIZE_RE: Final[re.Pattern[str]] = re.compile(
    r"\s+(?:(?:small|moderate[- ]sized|moderate|large|trace|tiny|mild|minimal|massive)\s+)+")
#: A cardiothoracic ratio phrase (version 48: a second cardiomegaly phrase of a sentence that already names one).
CTR_RE: Final[re.Pattern[str]] = re.compile(rf"\b{_CTR}(?![\w-])")
#: "the" right before a place (:data:`UNSIDED_BASE_RE`).
THE_BEFORE_RE: Final[re.Pattern[str]] = re.compile(r"\bthe\s+$")
#: A fronted subordinate clause that negates ("Although no focal consolidation is seen, early pneumonia cannot be
#: excluded."; version 47): the negation ends at the comma that closes it (group ``comma``). The clause must have a
#: verb after the negated phrase, so that a list's comma ("Although no edema, effusion or ...") is no clause end.
FRONTED_NEGATION_RE: Final[re.Pattern[str]] = re.compile(
    r"\s*(?:although|though|while)\s+(?:no|without)\s+[^,;]*?\b(?:is|are|was|were|seen|identified|evident|present|"
    r"visible|noted|demonstrated|appreciated|detected)\b[^,;]*(?P<comma>,)")
#: The gap that lets "the base" / "the apex" take the side of a sided place a few words before it ("opacity in the
#: right lung, most pronounced at the base"; version 22): no and / or / but / semicolon / side word in between.
SIDE_BACK_GAP_RE: Final[re.Pattern[str]] = re.compile(
    r",?\s*(?:(?!(?:and|or|but|right|left|bilateral|both)\b)[\w-]+\s+){0,4}"
    r"(?:at|in|of|toward|towards|near|involving|within)\s+the\s+")


#: A sided hemidiaphragm that is obscured (version 25): a lung finding after it with no place of its own explains
#: it and lies at that side's base ("the left hemidiaphragm is obscured, likely due to atelectasis"). Group ``side``.
OBSCURED_DIAPHRAGM_RE: Final[re.Pattern[str]] = re.compile(
    r"\b(?:obscur\w*|obliterat\w*|silhouett\w*|effac\w*|indistinct|(?:loss|non-?visuali[sz]ation)\s+of)\s+(?:of\s+)?"
    r"(?:the\s+)?(?P<side>right|left)\s+hemidiaphragm\b"
    r"|\b(?P<side2>right|left)\s+hemidiaphragm\s+(?:(?:is|are|remains?|appears?)\s+)?(?:(?:now|again|still|partially|"
    r"partly|completely|largely|mostly)\s+)?(?:obscured|obliterated|silhouetted|effaced|indistinct|not\s+(?:well\s+)?"
    r"(?:seen|visuali[sz]ed|delineated|identified)|poorly\s+(?:seen|visuali[sz]ed|defined))\b"
)
#: Words right before a place that make it where an extent word's disease is worst ("multifocal opacities, most
#: pronounced in the left upper lobe"; version 24): the place adds to both lungs instead of replacing them.
#: Version 54: also "particularly / especially visible (seen, evident, ...) in" and "greater / more involvement of".
PREDOMINANT_PLACE_RE: Final[re.Pattern[str]] = re.compile(
    r"\b(?:(?:(?:most|more)\s+(?:pronounced|prominent|marked|severe|conspicuous|evident|notable|extensive|dense|"
    r"confluent|apparent)|predominantly|predominant|mainly|mostly|primarily|chiefly|greatest|worst|worse|especially|"
    r"particularly|notably)\s+(?:(?:visible|seen|evident|noted|marked|prominent|pronounced|apparent)\s+)?"
    r"(?:(?:in|at|on|within|involving|over|along|throughout|toward|towards)\s+)?"
    r"|(?:greater|more|most|predominant)\s+involvement\s+(?:of|in|at)\s+)"
    r"(?:the\s+|both\s+)?$"
)
#: A comparative right before a side ("effusions are larger on the right"; version 27): for a plural effusion, the
#: side where it is larger, not the only one.
COMPARATIVE_PLACE_RE: Final[re.Pattern[str]] = re.compile(
    r"\b(?:larger|greater|bigger|more|worse)\s+(?:on|in|at)\s+(?:the\s+)?$"
)
#: "on the" right before a side-only place: the side of a side-less zone named before it for the same finding
#: ("basilar opacity on the left"; version 27).
ON_THE_SIDE_RE: Final[re.Pattern[str]] = re.compile(r"\bon\s+the\s+$")


def is_extent_phrase(phrase: str) -> bool:
    """Whether a location phrase is only an extent word ("diffuse", "scattered", ...), not a place."""
    return EXTENT_RE.fullmatch(phrase.strip().lower()) is not None


_loc_parts: list[str] = []
_loc_branches: list[Branch] = []
#: Group name -> location kind, for :data:`LOCATION_RE`.
LOCATION_KINDS: Final[dict[str, str]] = {}
for _i, (_lkind, _pat) in enumerate(_LOCATIONS):
    _gname = f"l{_i}"
    LOCATION_KINDS[_gname] = _lkind
    _loc_parts.append(f"(?P<{_gname}>{_pat})")
    _loc_branches.append(Branch(_gname, (_pat,), r"\b", r"\b"))
#: Every location phrase; ``LOCATION_KINDS[m.lastgroup]`` is its kind.
LOCATION_RE: Final[re.Pattern[str]] = re.compile(r"\b(?:" + "|".join(_loc_parts) + r")\b")
#: The matches of :data:`LOCATION_RE`, found faster (see :mod:`.dispatch`).
LOCATION_MATCHER: Final[Alternation] = Alternation(_loc_branches)

_ZONE_WORD_RE = re.compile(
    r"upper|suprahilar|lower|midlung|mid-lung|middle|mid|apex|apices|biapical|apical\w*|bibasilar\w*|bibasal\w*|"
    r"basilar|basal\w*|bases|base|perihilar|parahilar|infrahilar|hilar|hilum|hila|lingula\w*|retrocardiac|"
    r"costophrenic|cardiophrenic|cp"
)
_ZONE_OF: Final[dict[str, str]] = {
    "upper": "upper zone lung", "suprahilar": "upper zone lung",
    "apex": "apical zone lung", "apices": "apical zone lung", "biapical": "apical zone lung",
    "apical": "apical zone lung",
    "mid": "mid zone lung", "middle": "mid zone lung", "midlung": "mid zone lung", "mid-lung": "mid zone lung",
    "perihilar": "mid zone lung", "parahilar": "mid zone lung", "infrahilar": "mid zone lung",
    "hilar": "mid zone lung", "hilum": "mid zone lung", "hila": "mid zone lung", "lingula": "mid zone lung",
    "lower": "lung base", "bibasilar": "lung base", "bibasal": "lung base", "basilar": "lung base",
    "basal": "lung base", "bases": "lung base", "base": "lung base", "retrocardiac": "lung base",
    "costophrenic": "lung base", "cardiophrenic": "lung base", "cp": "lung base",
}  # fmt: skip
_ABBR: Final[dict[str, tuple[str, str]]] = {
    "rll": ("right", "lung base"), "lll": ("left", "lung base"), "rml": ("right", "mid zone lung"),
    "rul": ("right", "upper zone lung"), "lul": ("left", "upper zone lung"),
}  # fmt: skip
_BOTH: Final[tuple[str, str]] = (lung_label(SIDES[0]), lung_label(SIDES[1]))


def _zone_key(word: str) -> str:
    for stem in ("apical", "bibasilar", "bibasal", "basal", "lingula"):
        if word.startswith(stem):
            return stem
    return word


def _sides(text: str, default: tuple[str, ...]) -> tuple[str, ...]:
    if "left and right" in text:
        return ("left", "right")
    if "right and left" in text or "bilateral" in text or text.startswith(("both", "bi")) or " of both " in text:
        return SIDES
    if re.search(r"\bright\b|^right|\brt\b|^r\b", text):
        return ("right",)
    if re.search(r"\bleft\b|^left|\blt\b|^l\b", text):
        return ("left",)
    return default


@lru_cache(maxsize=8192)
def location_labels(kind: str, text: str) -> tuple[str, ...]:
    """ILS labels of a location phrase ``text`` (lower case) matched as ``kind`` (a :data:`LOCATION_KINDS` value)."""
    if kind == "noop":
        return ()
    if kind == "both":
        return _BOTH
    if kind == "abbr":
        side, zone = _ABBR[text]
        return (zone_label(side, zone),)
    if kind == "diaphragm":  # next to a sided hemidiaphragm: that side's base (version 45)
        return (zone_label("right" if re.search(r"\bright\b", text) else "left", "lung base"),)
    if kind == "fissure":  # the minor (horizontal) fissure: right lung, between upper and middle lobes
        return (zone_label("right", "mid zone lung"),)
    if kind == "border":
        return (zone_label("right" if text.startswith("right") else "left", "mid zone lung"),)
    if kind == "retro":  # behind the heart = retrocardiac: the left base unless the right heart is named
        return (zone_label("right" if re.search(r"\bright\b", text) else "left", "lung base"),)
    if kind == "whole":
        return tuple(lung_label(s) for s in _sides(text, SIDES))
    if kind == "paired":  # each item names its own side: "right upper and left lower lobes"
        pairs = re.findall(r"\b(right|left|both)\s+(upper|lower|middle|mid)\b", text)
        return tuple(dict.fromkeys(zone_label(side, _ZONE_OF[zone]) for item, zone in pairs
                                   for side in (SIDES if item == "both" else (item,))))
    # zoned: zones in order of mention, sides from the side words or the zone's default side
    words = [_zone_key(w) for w in _ZONE_WORD_RE.findall(text)]
    zones = list(dict.fromkeys(_ZONE_OF[w] for w in words if w in _ZONE_OF))
    if "lingula" in words or "retrocardiac" in words:
        default: tuple[str, ...] = ("left",)
    elif "middle" in words and "mid" not in words and "lobe" in text:  # the right middle lobe; "middle zones": both
        default = ("right",)
    else:
        default = SIDES
    sides = _sides(text, default)
    lobe = _OF_LOBE_RE.search(text)
    if lobe is not None:  # "apical segment of the LUL": the lobe's side and zone (version 54)
        side, zone = _ABBR[lobe.group(1)]
        sides, zones = (side,), list(dict.fromkeys([*zones, zone]))
    if _LOWER_LOBE_RE.search(text) and "lung base" in zones:  # the apex of a lower lobe is the lobe (version 55)
        zones = [z for z in zones if z != "apical zone lung"]
    if any(w.startswith("bi") for w in words):
        sides = SIDES
    return tuple(zone_label(s, z) for z in zones for s in sides)


#: A lobe abbreviation after "of (the)" in a zoned phrase (version 54).
_OF_LOBE_RE: Final[re.Pattern[str]] = re.compile(r"\bof\s+(?:the\s+)?(rul|lul|rll|lll|rml)\b")
#: A lower lobe named in a zoned phrase after an apex word ("apex of the right lower lobe", "apical segment of the
#: RLL"): the apex (superior segment) of that lobe, not the lung apex (version 55).
_LOWER_LOBE_RE: Final[re.Pattern[str]] = re.compile(
    r"\b(?:apex|apices|apical)(?:\s+(?:and\s+[a-z]+\s+)?segments?)?\s+of\s+(?:the\s+)?"
    r"(?:(?:right|left|both)\s+)?(?:lower\s+lobes?|rll|lll)\b")


def default_location(kind: EntityKind) -> tuple[str, ...]:
    """Labels of a finding without a location phrase (see the module docstring)."""
    if kind.lesion in HEART_MASK_LESIONS or kind.heart:
        return (HEART,)
    if kind.lung:
        return _BOTH
    return ()


# --- version 45 ----------------------------------------------------------------------------------------------

#: What may follow a cardiomegaly phrase to explain it by technique (version 45): "(may be) accentuated /
#: exaggerated / magnified by" or "(likely / partly) due to / related to / secondary to" the AP / portable / supine
#: technique or projection, low lung volumes, a poor inspiration, rotation or magnification ("Apparent cardiomegaly
#: may be accentuated by AP technique.", "Cardiomediastinal silhouette is enlarged, likely due to low lung volumes."):
#: the enlargement may be an artifact, so the cardiomegaly is uncertain. Matched right after the phrase.
HEART_TECHNIQUE_RE: Final[re.Pattern[str]] = re.compile(
    r"\s*,?\s*(?:(?:which|this|that|but|although|though|it|and)\s+)*"
    r"(?:(?:is|are|may|might|could|can|be|likely|probably|possibly|partly|partially|in\s+part|at\s+least\s+"
    r"(?:in\s+)?part(?:ly)?|presumably|perhaps|largely|mostly|somewhat|also|again|at\s+least|overall)\s+)*"
    r"(?:(?:accentuated|exaggerated|magnified|overestimated|overstated|emphasi[sz]ed|explained)\s+"
    r"(?:(?:in\s+part|partly|partially|somewhat)\s+)?by|due\s+to|related\s+to|secondary\s+to|attributable\s+to|"
    r"accounted\s+for\s+by|because\s+of|caused\s+by|a\s+result\s+of|from)"
    r"\s+(?:[\w'-]+\s+){0,4}?(?:technique|projection|ap|portable|supine|semi-?upright|(?:lung\s+)?volumes|"
    r"inspiration|inspiratory\s+effort|hypoinflation|rotation|rotated|magnification|positioning|position)\b"
)
#: What may follow a cardiomegaly phrase to name a pericardial effusion as its alternative or explanation (version
#: 56): "Enlarged cardiac silhouette, which may reflect cardiomegaly or pericardial effusion.", ", cardiomegaly versus
#: pericardial effusion", "could reflect pericardial effusion", "or pericardial effusion": the heart itself may not be
#: enlarged, so the cardiomegaly is uncertain. A link word (a verb such as "reflect", or "or" / "versus") is needed:
#: not "with / without / and no pericardial effusion", nor ", pericardial effusion not excluded". Matched right after
#: the phrase.
HEART_PERICARDIAL_RE: Final[re.Pattern[str]] = re.compile(
    r"\s*,?\s*(?:(?:which|this|that|and|but|it)\s+)*"
    r"(?:(?:is|are|may|might|could|can|be|likely|possibly|probably|perhaps)\s+)*"
    r"(?:(?:reflects?|reflecting|represents?|representing|indicates?|due\s+to|related\s+to|secondary\s+to|from|"
    r"suggests?|suggesting|suggestive\s+of|concerning\s+for)\s+"
    r"(?:(?:either|underlying|cardiomegaly|cardiac\s+enlargement|chamber\s+enlargement)\s+)?"
    r"(?:(?:or|versus|vs\.?|and/or)\s+)?"
    r"|(?:(?:either|cardiomegaly|cardiac\s+enlargement|chamber\s+enlargement)\s+)?(?:or|versus|vs\.?|and/or)\s+)"
    r"(?:(?:an?|small|moderate|large|possible|underlying)\s+)*pericardial\s+(?:effusions?|fluid)\b"
)
#: A mediastinal site (version 45): paratracheal, mediastinal, aortopulmonary window, subcarinal, tracheal. Not the
#: hila ("perihilar" and "hilar" are lung places).
_MEDIASTINAL_SITE = (
    r"(?:(?:right|left)(?:[- ]?sided)?\s+)?(?:(?:upper|superior|anterior|posterior|middle|mid|lower|inferior)\s+)?"
    r"(?:paratracheal|mediastin(?:um|al)|aorto-?pulmonary(?:\s+window)?|ap\s+window|subcarinal|trachea|tracheal|"
    r"paraesophageal|prevascular)(?:\s+(?:window|region|area|stripe|space|soft\s+tissues?))?"
)
#: A mediastinal site written right before an opacity phrase ("right paratracheal opacity", "mediastinal soft tissue
#: opacity"; at most two other words between): the opacity is no lung lesion (version 45).
MEDIASTINAL_BEFORE_RE: Final[re.Pattern[str]] = re.compile(
    rf"\b{_MEDIASTINAL_SITE}\s+(?:(?!(?:and|or|with|no|without|nor|but)\b)[\w-]+\s+){{0,2}}$")
#: A mediastinal site after an opacity phrase and a preposition ("opacity in the right paratracheal region").
MEDIASTINAL_AFTER_RE: Final[re.Pattern[str]] = re.compile(
    r"\s+(?:(?:is|are|seen|noted|projecting|projects|located)\s+)?(?:in|at|within|along|over|overlying|of|involving|"
    rf"projecting\s+over)\s+(?:the\s+)?{_MEDIASTINAL_SITE}\b")
#: The gap between an observation and a lesion it is said not to be (version 45: a negated link; location phrases
#: removed first): "Opacity in the right lower lobe is not consistent with pneumonia." places the pneumonia's absence
#: where the opacity lies.
NEGATED_LINK_GAP_RE: Final[re.Pattern[str]] = re.compile(
    r"\s*,?\s*(?:(?:which|that)\s+)?(?:(?:is|are|was|were)\s+not\s+(?:typical|characteristic|suggestive|consistent|"
    r"compatible|diagnostic|indicative)\s+(?:of|for|with)|(?:do|does|did)\s+not\s+(?:suggest|represent|indicate|"
    r"reflect)|(?:is|are)\s+not\s+(?:felt|thought|believed|considered)\s+to\s+(?:represent|reflect|be)|"
    r"argu(?:es?|ed|ing)\s+against)\s*(?:(?:an?|the|focal|acute|active|underlying|superimposed|infectious|early)\s+)*"
)
#: "the right / left lung is clear" as the subject of a negated finding ("The right lung is clear without
#: consolidation."; version 45): what follows the normal statement and the negation lies in that lung. Matched right
#: after the location phrase.
NORMAL_SUBJECT_RE: Final[re.Pattern[str]] = re.compile(
    r"\s+(?:is|are|remains?|appears?)\s+(?:otherwise\s+|now\s+|again\s+)?(?:clear|unremarkable|well[- ]aerated|"
    r"well[- ]expanded)\s*,?\s*(?:and\s+)?(?=(?:without|with\s+no|no|free\s+of|negative\s+for)\b)"
)
#: Words of state or change after "the left / right" that make it an ellipsis of the lesion named before ("The right
#: effusion has resolved while the left is unchanged."; version 45).
_ELLIPSIS_STATE = (
    r"(?=\s+(?:(?:is|are|has|have|had|was|appears?|remains?|seems?|been)\s+)*(?:(?:now|again|still|essentially|"
    r"largely|slightly|relatively|also|mildly|somewhat|minimally|stably|completely|since|only)\s+)*"
    r"(?:persists?|persisting|persistent|unchanged|stable|remains?|present|increased|decreased|improved|worsened|"
    r"larger|smaller|resolved|cleared|similar|increasing|decreasing|small|moderate|large|tiny|trace|minimal)\b)"
)
#: A pronoun or ellipsis that stands for the lesion named before it in the sentence (version 45): "a small one"
#: (group ``one``), "the left (one / side)" before a word of state or change (group ``side``).
ELLIPSIS_RE: Final[re.Pattern[str]] = re.compile(
    r"\b(?:an?|the)\s+(?:(?:small|smaller|tiny|trace|minimal|mild|moderate|large|larger|new|additional|subtle|"
    r"residual|further)\s+)+(?P<one>one)\b(?![\w-])"
    r"(?!\s+(?:of|view|views|side|image|images|film|projection|time|point|day|days|week|month|year)\b)"
    rf"|\bthe\s+(?P<side>right|left)(?:[- ]sided)?(?:\s+(?:one|side))?{_ELLIPSIS_STATE}"
)
#: A preposition right before an :data:`ELLIPSIS_RE` match: "the right" is a place there, no ellipsis ("effusion on
#: the right is small").
ELLIPSIS_PLACE_RE: Final[re.Pattern[str]] = re.compile(
    r"\b(?:on|in|at|to|of|from|over|than|along|within|toward|towards|involving)\s+$")
#: A sentence that opens "Resolved on the right," (version 45): an absent finding on that side of the lesion the
#: sentence goes on to name ("Resolved on the right, the pleural effusion persists on the left."). Group ``side``.
RESOLVED_SIDE_RE: Final[re.Pattern[str]] = re.compile(
    r"\s*(?:(?:now|since|completely|interval|interval(?:ly)?)\s+)*(?:resolved|cleared)\s+(?:on|at|in)\s+the\s+"
    r"(?P<side>right|left)(?:\s+side)?\s*(?=,)"
)

#: Right after a lesion phrase: the lesion resolved at one place and, in a following clause of the sentence, persisting
#: at another (version 49): "Pleural effusion has resolved on the right but persists on the left.", "Atelectasis has
#: resolved at the right base; it persists at the left base." Groups: ``here`` (the preposition before the first
#: place), ``join`` ("but", "and", ";", "while", "whereas"), ``subject`` (a pronoun, or none), ``verb`` (persists /
#: remains / is unchanged / is still present / is stable), ``there`` (the preposition before the second place). A
#: partial resolution ("has partially resolved") is none: the lesion is still there.
PERSISTS_ELSEWHERE_RE: Final[re.Pattern[str]] = re.compile(
    r"\s+(?:(?:has|have|is|are)\s+)?(?:(?:now|since|completely|entirely|fully|also)\s+)*"
    r"(?:resolved|cleared|gone|disappeared)\s+(?P<here>(?:on|in|at|within|from|over)\s+(?:the\s+)?)[^,;.]*?"
    r"(?P<join>\s*,?\s*(?:;|\bbut\b|\band\b|\bwhile\b|\bwhereas\b))\s*"
    r"(?:(?P<subject>it|this|that|they|these)\s+)?"
    r"(?P<verb>(?:(?:is|are|has|have|remains?)\s+)?(?:(?:still|again|now|essentially|likely|probably|possibly)\s+)*"
    r"(?:persists?|persisting|persistent|remains?|unchanged|present|stable)\b)"
    r"(?P<there>\s+(?:(?:on|in|at|within|over|involving)\s+)(?:the\s+)?)"
)


#: Lesion head words of at least 8 letters whose misspellings within one edit are read as the word (version 45).
_SPELLED_HEADS: Final[tuple[str, ...]] = (
    "effusion", "effusions", "atelectasis", "atelectases", "pneumonia", "pneumonias", "consolidation",
    "consolidations", "cardiomegaly",
)
#: Real words within one edit of a head word: never respelled.
_REAL_NEIGHBOURS: Final[frozenset[str]] = frozenset({"pneumonic", "pneumonial", "pneumoniae"})
_LETTERS = "abcdefghijklmnopqrstuvwxyz"


def _one_edit(word: str) -> set[str]:
    """Every string one Damerau edit from ``word`` (an insertion, deletion, substitution or adjacent swap)."""
    splits = [(word[:i], word[i:]) for i in range(len(word) + 1)]
    out = {a + b[1:] for a, b in splits if b}
    out |= {a + b[1] + b[0] + b[2:] for a, b in splits if len(b) > 1}
    out |= {a + c + b[1:] for a, b in splits if b for c in _LETTERS}
    out |= {a + c + b for a, b in splits for c in _LETTERS}
    return out


def _misspellings() -> dict[str, str]:
    table: dict[str, str] = {}
    for head in _SPELLED_HEADS:
        for variant in sorted(_one_edit(head)):
            table.setdefault(variant, head)
    for word in (*_SPELLED_HEADS, *_REAL_NEIGHBOURS):
        table.pop(word, None)
    table["effus"] = "effusion"  # the abbreviation
    return table


#: Misspelled or abbreviated lesion words and the word they stand for (version 45); hyphenated places and the word
#: they are written as without the hyphen (version 54: "peri-hilar", "left-lung").
MISSPELLINGS: Final[dict[str, str]] = {
    **_misspellings(),
    **{f"{a}-{b}": f"{a}{b}" for a, b in (("peri", "hilar"), ("para", "hilar"), ("infra", "hilar"),
                                          ("supra", "hilar"), ("retro", "cardiac"), ("bi", "basilar"),
                                          ("bi", "basal"), ("bi", "apical"), ("costo", "phrenic"))},
    **{f"{side}-{noun}": f"{side} {noun}" for side in ("right", "left")
       for noun in ("lung", "lungs", "hemithorax")},
}
_TOKEN_RE = re.compile(r"(?<![\w-])(?:[a-z]{5,15}|[a-z]{2,5}-[a-z]{4,10})(?![\w-])")


def respell(low: str) -> tuple[str, tuple[tuple[int, int, int], ...]] | None:
    """``low`` (a lower-cased sentence) with its misspelled lesion words (:data:`MISSPELLINGS`) written right, and the
    replacements as (start in the new text, end in the new text, change in length); None when nothing is misspelled.
    """
    parts: list[str] = []
    edits: list[tuple[int, int, int]] = []
    last = shift = 0
    for m in _TOKEN_RE.finditer(low):
        right = MISSPELLINGS.get(m.group())
        if right is None:
            continue
        parts.append(low[last:m.start()])
        start = m.start() + shift
        parts.append(right)
        shift += len(right) - (m.end() - m.start())
        edits.append((start, start + len(right), len(right) - (m.end() - m.start())))
        last = m.end()
    if not edits:
        return None
    parts.append(low[last:])
    return "".join(parts), tuple(edits)
