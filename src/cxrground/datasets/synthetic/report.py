"""MIMIC-CXR style free-text reports for synthetic studies, with the sentence of every finding.

A report has the MIMIC layout (``FINAL REPORT`` title, ``EXAMINATION``, ``INDICATION`` with ``___``
de-identification blanks, ``TECHNIQUE``, ``COMPARISON``, ``FINDINGS`` and ``IMPRESSION``; some reports
have an impression only). Sentences use radiology phrasing with synonyms; hedged sentences (words in
:data:`HEDGE_WORDS`) mark tentative findings; absent lesions may be negated (words in
:data:`NEGATION_WORDS`). A finding's ``sentence`` is recorded verbatim; in the file it may be wrapped
across lines, so compare after collapsing whitespace (:func:`normalise_whitespace`).
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final

import numpy as np

from cxrground.datasets.synthetic.lesions import LesionSpec, Site
from cxrground.vocab.lesions import LUNG_LESIONS
from cxrground.vocab.traits import lives_in

#: Words or phrases that make a sentence hedged (``certainty: tentative``).
HEDGE_WORDS: Final[tuple[str, ...]] = (
    "possible",
    "possibly",
    "probable",
    "questionable",
    "may represent",
    "may reflect",
    "may be",
    "could represent",
    "cannot be excluded",
    "cannot exclude",
    "likely",
    "suggestive of",
    "concerning for",
)
#: Words that negate a lesion in a sentence.
NEGATION_WORDS: Final[tuple[str, ...]] = ("no", "without", "not", "free of", "negative for")

AIRSPACE: Final[tuple[str, ...]] = ("pneumonia", "consolidation", "opacity")


def normalise_whitespace(text: str) -> str:
    """Collapse runs of whitespace to one space and strip (report files wrap sentences)."""
    return re.sub(r"\s+", " ", text).strip()


def has_hedge(sentence: str) -> bool:
    low = sentence.lower()
    return any(re.search(rf"\b{re.escape(w)}\b", low) for w in HEDGE_WORDS)


def has_negation(sentence: str) -> bool:
    low = sentence.lower()
    return any(re.search(rf"\b{re.escape(w)}\b", low) for w in NEGATION_WORDS)


# --- templates --------------------------------------------------------------------------------------
# Placeholders: {adj} adjectival site phrase, {where} "<prep> <noun>", {sev_} severity word + space,
# {pattern} appearance word, {sides} "left greater than right" etc. Templates are filtered by the
# placeholders the site can fill; a template without a site placeholder is used only for sites
# without a location phrase ("unspecified").

_PATTERN_WORDS: Final[dict[str, tuple[str, ...]]] = {
    "lobar": ("dense", "focal", "confluent"),
    "segmental": ("focal", "segmental"),
    "patchy": ("patchy", "patchy ill-defined"),
    "hazy": ("hazy", "ill-defined", "faint"),
    "plate-like": ("plate-like", "linear", "discoid"),
    "wedge": ("dense", "triangular"),
    "perihilar": ("perihilar",),
    "diffuse": ("diffuse",),
}

DEFINITIVE: Final[dict[str, tuple[str, ...]]] = {
    "pneumonia": (
        "{Adj} pneumonia.",
        "Findings are consistent with {adj} pneumonia.",
        "{Pattern} airspace consolidation {where} is compatible with pneumonia.",
        "{Pattern} opacity {where} is consistent with pneumonia.",
        "There is {pattern} consolidation {where} consistent with pneumonia.",
        "Findings are consistent with pneumonia.",
        "{Pattern} airspace opacities are consistent with multifocal pneumonia.",
    ),
    "consolidation": (
        "{Adj} consolidation.",
        "There is {pattern} consolidation {where}.",
        "Consolidation is present {where}.",
        "{Pattern} {adj} consolidation.",
        "{Pattern} consolidation {where} with air bronchograms.",
        "There is {pattern} airspace consolidation.",
    ),
    "opacity": (
        "{Pattern} opacity {where}.",
        "There is {pattern} opacity {where}.",
        "{Pattern} {adj} opacity.",
        "{Adj} opacification is present.",
        "{Pattern} opacities are seen {where}.",
        "There are {pattern} airspace opacities.",
    ),
    "atelectasis": (
        "{Adj} atelectasis.",
        "{Sev_}{adj} atelectasis.",
        "{Pattern} atelectasis {where}.",
        "Linear opacities {where} are consistent with atelectasis.",
        "There is {sev_}atelectasis {where}.",
        "{Sev_}atelectasis.",
    ),
    "edema": (
        "{Sev_}pulmonary edema.",
        "There is {sev_}pulmonary edema.",
        "Findings are consistent with {sev_}interstitial pulmonary edema.",
        "{Adj} opacities are consistent with {sev_}pulmonary edema.",
        "{Sev_}{adj} edema.",
        "{Adj} haziness and vascular indistinctness are consistent with {sev_}pulmonary edema.",
    ),
    "effusion": (
        "{Sev_}{adj} pleural {effusion}.",
        "There {is_are} {a_}{sev_}{adj} pleural {effusion}.",
        "{Sev_}{adj} {effusion} {is_are} present.",
        "{Sev_}{adj} layering pleural {effusion}.",
        "Blunting of the {noun} is consistent with a small pleural effusion.",
        "{Sev_}pleural effusion {where}.",
    ),
    "cardiomegaly": (
        "The heart is {sev_ly}enlarged.",
        "{Sev_}cardiomegaly.",
        "The cardiac silhouette is {sev_ly}enlarged.",
        "{Sev_ly}enlarged cardiac silhouette.",
        "Heart size is {sev_ly}enlarged.",
    ),
}

TENTATIVE: Final[dict[str, tuple[str, ...]]] = {
    "pneumonia": (
        "{Adj} opacity may represent pneumonia.",
        "Opacity {where} is concerning for pneumonia.",
        "Possible {adj} pneumonia.",
        "Pneumonia {where} cannot be excluded.",
        "{Pattern} opacity {where}, likely pneumonia.",
        "{Pattern} opacity {where} could represent early pneumonia.",
        "Findings may represent pneumonia.",
        "{Pattern} opacities are suggestive of multifocal pneumonia.",
    ),
    "consolidation": (
        "Possible consolidation {where}.",
        "Focal consolidation {where} cannot be excluded.",
        "{Adj} opacity, likely consolidation.",
        "Questionable {adj} consolidation.",
        "There may be subtle consolidation.",
    ),
    "opacity": (
        "Possible {adj} opacity.",
        "Questionable opacity {where}.",
        "There may be a subtle opacity {where}.",
        "Probable {pattern} {adj} opacity.",
        "Possible faint airspace opacity.",
    ),
    "atelectasis": (
        "{Adj} opacity likely reflects atelectasis.",
        "Streaky {adj} opacities, likely atelectasis.",
        "Possible {adj} atelectasis.",
        "{Adj} opacity may represent atelectasis.",
        "Opacity {where} is suggestive of atelectasis.",
        "Possible {sev_}atelectasis.",
    ),
    "edema": (
        "Possible {sev_}pulmonary edema.",
        "{Adj} haziness may represent {sev_}pulmonary edema.",
        "Findings are suggestive of {sev_}interstitial edema.",
        "{Sev_}pulmonary edema cannot be excluded.",
        "Likely {sev_}{adj} edema.",
    ),
    "effusion": (
        "Possible {sev_}{adj} pleural {effusion}.",
        "{Sev_}{adj} pleural {effusion} cannot be excluded.",
        "Likely {sev_}{adj} pleural {effusion}.",
        "Blunting of the {noun} may represent a small pleural effusion.",
        "Possible small pleural effusion {where}.",
    ),
    "cardiomegaly": (
        "The cardiac silhouette is likely {sev_ly}enlarged.",
        "Possible {sev_}cardiomegaly.",
        "Heart size may be {sev_ly}enlarged.",
        "Probable {sev_}cardiomegaly.",
    ),
}

#: Short impression lines (certainty applied by :func:`impression_sentence`).
IMPRESSION_DEFINITIVE: Final[dict[str, tuple[str, ...]]] = {
    "pneumonia": ("{Adj} pneumonia.", "Pneumonia {where}.", "Findings consistent with pneumonia."),
    "consolidation": ("{Adj} consolidation.", "Consolidation {where}."),
    "opacity": ("{Adj} opacity.", "Opacity {where}."),
    "atelectasis": ("{Adj} atelectasis.", "Atelectasis {where}.", "{Sev_}atelectasis."),
    "edema": ("{Sev_}pulmonary edema.", "{Sev_}{adj} edema."),
    "effusion": ("{Sev_}{adj} pleural {effusion}.", "{Sev_}pleural effusion {where}."),
    "cardiomegaly": ("{Sev_}cardiomegaly.", "Cardiomegaly."),
}
IMPRESSION_TENTATIVE: Final[dict[str, tuple[str, ...]]] = {
    "pneumonia": ("Possible {adj} pneumonia.", "Opacity {where}, possibly pneumonia.", "Possible pneumonia."),
    "consolidation": ("Possible {adj} consolidation.", "Possible consolidation {where}."),
    "opacity": ("Possible {adj} opacity.", "Questionable opacity {where}."),
    "atelectasis": ("Possible {adj} atelectasis.", "Likely atelectasis {where}.", "Possible atelectasis."),
    "edema": ("Possible {sev_}pulmonary edema.", "Possible {sev_}{adj} edema."),
    "effusion": ("Possible {sev_}{adj} pleural {effusion}.", "Possible small pleural effusion {where}."),
    "cardiomegaly": ("Possible {sev_}cardiomegaly.", "Probable cardiomegaly."),
}

NEGATIONS: Final[dict[tuple[str, ...], tuple[str, ...]]] = {
    ("effusion",): ("No pleural effusion.", "There is no pleural effusion.", "No pleural effusions are seen."),
    ("consolidation",): (
        "No focal consolidation.",
        "There is no focal consolidation.",
        "No focal consolidation is seen.",
    ),
    ("pneumonia",): ("No evidence of pneumonia.", "There is no radiographic evidence of pneumonia."),
    ("opacity",): ("No focal opacity.", "No focal airspace opacity is seen."),
    ("edema",): ("No pulmonary edema.", "There is no pulmonary edema.", "No evidence of pulmonary edema."),
    ("cardiomegaly",): ("No cardiomegaly.", "The heart is not enlarged."),
    ("atelectasis",): ("No atelectasis.",),
    ("consolidation", "effusion"): (
        "No focal consolidation, pleural effusion, or pneumothorax.",
        "There is no focal consolidation or pleural effusion.",
    ),
    ("edema", "effusion"): ("No pulmonary edema or pleural effusion.", "There is no pleural effusion or edema."),
    ("consolidation", "edema"): ("There is no focal consolidation or pulmonary edema.",),
}

EXTRA_WITH_PNEUMOTHORAX: Final[str] = "No pleural effusion or pneumothorax."

LUNGS_CLEAR: Final[tuple[str, ...]] = (
    "The lungs are clear.",
    "Lungs are well expanded and clear.",
    "The lungs are well aerated.",
)
HEART_NORMAL: Final[tuple[str, ...]] = (
    "Heart size is normal.",
    "The cardiomediastinal silhouette is within normal limits.",
    "Cardiac and mediastinal contours are normal.",
    "The heart size is normal.",
)
HEART_BORDERLINE: Final[tuple[str, ...]] = (
    "Heart size is top normal.",
    "The cardiac silhouette is at the upper limits of normal.",
    "Heart size is at the upper limits of normal.",
)
MEDIASTINUM: Final[tuple[str, ...]] = (
    "Mediastinal and hilar contours are unremarkable.",
    "The mediastinal contours are normal.",
    "The aorta is mildly tortuous.",
)
PNEUMOTHORAX: Final[tuple[str, ...]] = ("No pneumothorax.", "There is no pneumothorax.", "No pneumothorax is seen.")
BONES: Final[tuple[str, ...]] = (
    "Degenerative changes are seen in the thoracic spine.",
    "Mild degenerative changes of the thoracic spine.",
    "No acute osseous abnormality.",
    "The osseous structures are unremarkable.",
    "Visualized osseous structures are intact.",
)
STERNOTOMY: Final[tuple[str, ...]] = (
    "Median sternotomy wires are intact.",
    "The patient is status post median sternotomy.",
    "Sternotomy wires are again seen.",
)
NORMAL_IMPRESSION: Final[tuple[str, ...]] = (
    "No acute cardiopulmonary process.",
    "No acute cardiopulmonary abnormality.",
    "No evidence of acute disease.",
)

INDICATIONS: Final[dict[str, tuple[str, ...]]] = {
    "pneumonia": ("cough and fever, evaluate for pneumonia", "fever // ? pneumonia", "productive cough"),
    "edema": ("shortness of breath and leg swelling", "dyspnea, evaluate for fluid overload", "CHF exacerbation"),
    "effusion": ("dyspnea, evaluate for effusion", "decreased breath sounds at the base"),
    "cardiomegaly": ("chest pain", "dyspnea on exertion"),
    "generic": ("chest pain", "shortness of breath", "cough", "preoperative evaluation", "hypoxia",
                "fall, evaluate for acute process", "weakness"),
}


# --- rendering --------------------------------------------------------------------------------------

def _cap(text: str) -> str:
    return text[:1].upper() + text[1:] if text else text


def _needs(template: str) -> set[str]:
    return {m.lower() for m in re.findall(r"\{(\w+)\}", template)}


@dataclass
class Rendered:
    text: str
    phrase: str | None


def _fill(rng: np.random.Generator, template: str, spec: LesionSpec) -> Rendered:
    site: Site = spec.site
    sev = spec.severity
    values: dict[str, str] = {}
    phrase: str | None = None
    needs = _needs(template)
    if "adj" in needs:
        phrase = str(rng.choice(site.adjs))
        values["adj"] = phrase
    if "where" in needs or "noun" in needs:
        noun = str(rng.choice(site.nouns))
        phrase = noun
        values["where"] = f"{site.prep} {noun}".strip()
        values["noun"] = noun
    words = _PATTERN_WORDS.get(spec.appearance, ("focal",))
    values["pattern"] = str(rng.choice(words))
    values["sev_"] = f"{sev} " if sev else ""
    values["sev_ly"] = {"mild": "mildly ", "moderate": "moderately ", "severe": "markedly "}.get(sev, "")
    plural = spec.lesion == "effusion" and site.key == "eff_bilateral"
    values["effusion"] = "effusions" if plural else "effusion"
    values["is_are"] = "are" if plural else "is"
    values["a_"] = "" if plural else "a "
    if spec.lesion == "effusion" and plural and spec.side_severity:
        r, left = spec.side_severity.get("right", ""), spec.side_severity.get("left", "")
        if r != left and "sev_" in needs and rng.random() < 0.6:
            order = {"small": 0, "moderate": 1, "large": 2}
            bigger = "left" if order.get(left, 0) > order.get(r, 0) else "right"
            smaller = "right" if bigger == "left" else "left"
            values["sev_"] = ""
            template = template.rstrip(".") + f", {bigger} greater than {smaller}."
    out = template
    for key, val in values.items():
        out = out.replace("{" + key + "}", val).replace("{" + _cap(key) + "}", _cap(val))
    out = re.sub(r"\s+", " ", out).strip()
    out = out.replace(" ,", ",")
    return Rendered(_cap(out), phrase)


def _usable(template: str, spec: LesionSpec) -> bool:
    needs = _needs(template)
    site = spec.site
    if "adj" in needs and not site.adjs:
        return False
    if needs & {"where", "noun"} and not site.nouns:
        return False
    has_loc = bool(needs & {"adj", "where", "noun"})
    if site.key not in ("heart",) and (site.adjs or site.nouns) and not has_loc:
        return False  # a located finding must name its location
    if not (site.adjs or site.nouns) and has_loc:
        return False
    low = template.lower()
    if spec.lesion == "effusion":
        cpa = site.key in ("eff_rcpa", "eff_lcpa")
        if ("blunting" in low or "{where}" in low or "{noun}" in low) != cpa:
            return False
        if cpa and spec.severity != "small" and "small" in low:
            return False
    if spec.lesion in ("edema",) and "{adj}" in low and not site.adjs:
        return False
    if "multifocal" in low and (spec.appearance != "patchy" or (not site.plural and site.key != "unspecified")):
        return False
    if "air bronchograms" in low and spec.appearance != "lobar":
        return False
    # effusion templates with a size word need a size
    return not (("{sev_}" in low or "{sev_ly}" in low) and not spec.severity and spec.lesion == "effusion")


def finding_sentence(rng: np.random.Generator, spec: LesionSpec, view: str = "AP") -> Rendered:
    """The FINDINGS sentence of a present finding (hedged when tentative); ``layering`` only on AP views."""
    table = TENTATIVE if spec.certainty == "tentative" else DEFINITIVE
    options = [t for t in table[spec.lesion] if _usable(t, spec) and (view == "AP" or "layering" not in t)]
    if not options:  # pragma: no cover - table guard
        raise RuntimeError(f"no template for {spec.lesion} at {spec.site.key}")
    return _fill(rng, str(rng.choice(options)), spec)


def impression_sentence(rng: np.random.Generator, spec: LesionSpec) -> Rendered:
    """A short IMPRESSION line for a present finding (same certainty)."""
    table = IMPRESSION_TENTATIVE if spec.certainty == "tentative" else IMPRESSION_DEFINITIVE
    options = [t for t in table[spec.lesion] if _usable(t, spec)]
    if not options:
        return finding_sentence(rng, spec)
    return _fill(rng, str(rng.choice(options)), spec)


def negation_sentences(rng: np.random.Generator, lesions: Sequence[str]) -> list[tuple[str, tuple[str, ...]]]:
    """Sentences negating ``lesions`` (some combined), as ``(sentence, lesions_negated)``."""
    todo = list(lesions)
    out: list[tuple[str, tuple[str, ...]]] = []
    for combo in (("consolidation", "effusion"), ("edema", "effusion"), ("consolidation", "edema")):
        if all(c in todo for c in combo) and rng.random() < 0.5:
            out.append((str(rng.choice(NEGATIONS[combo])), combo))
            for c in combo:
                todo.remove(c)
    for lesion in todo:
        out.append((str(rng.choice(NEGATIONS[(lesion,)])), (lesion,)))
    return out


# --- report assembly ----------------------------------------------------------------------------------

@dataclass
class ReportResult:
    """The report text plus, per planned finding, its sentences and the negations written."""

    text: str
    has_findings: bool
    #: index into the spec list -> (primary sentence, section, location phrase, impression sentence or None)
    findings: dict[int, tuple[str, str, str | None, str | None]] = field(default_factory=dict)
    #: negated lesion -> (sentence, section)
    negations: dict[str, tuple[str, str]] = field(default_factory=dict)
    other: list[str] = field(default_factory=list)


def _wrap(paragraph: str, width: int = 74) -> list[str]:
    return textwrap.wrap(
        paragraph, width=width, initial_indent=" ", subsequent_indent=" ",
        break_long_words=False, break_on_hyphens=False,
    ) or [" "]


def _indication(rng: np.random.Generator, specs: Sequence[LesionSpec]) -> str:
    key = "generic"
    reported = [s.lesion for s in specs if s.reported]
    for lesion in ("pneumonia", "edema", "effusion", "cardiomegaly"):
        if lesion in reported and rng.random() < 0.6:
            key = lesion
            break
    reason = str(rng.choice(INDICATIONS[key]))
    who = str(rng.choice(["___ year old woman with", "___ year old man with", "___F with", "___M with",
                          "History: ___ with", "___-year-old female with", "___-year-old male with"]))
    text = f"{who} {reason}"
    return text if text.endswith((".", "?")) or "//" in text or rng.random() < 0.4 else text + "."


def compose_report(
    rng: np.random.Generator,
    specs: Sequence[LesionSpec],
    view: str,
    heart_status: str,
    sternotomy: bool,
    impression_only: bool,
    has_prior: bool,
) -> ReportResult:
    """Write the report. Every reported finding gets a sentence; absent lesions may be negated.

    ``heart_status`` is ``normal`` (CTR <= 0.45), ``borderline`` or ``enlarged``. Negations are only
    written for lesion types with no instance in the image, and never for a lesion that shares the
    airspace family with a present one (``no focal consolidation`` next to a pneumonia).
    """
    present = {s.lesion for s in specs}
    reported = [i for i, s in enumerate(specs) if s.reported]
    result = ReportResult(text="", has_findings=not impression_only)

    # which absent lesions to negate
    candidates: list[str] = []
    probs = {"effusion": 0.7, "consolidation": 0.5, "pneumonia": 0.25, "edema": 0.45, "cardiomegaly": 0.25,
             "opacity": 0.15, "atelectasis": 0.05}
    for lesion in ("consolidation", "pneumonia", "opacity", "atelectasis", "edema", "effusion", "cardiomegaly"):
        if lesion in present:
            continue
        if lesion in AIRSPACE and present & set(AIRSPACE):
            continue
        if lesion == "opacity" and present & set(LUNG_LESIONS):
            continue  # every drawn lung lesion is an opacity
        if lesion == "atelectasis" and present & set(LUNG_LESIONS):
            continue
        if lives_in(lesion) == "heart" and heart_status != "normal":
            continue
        if rng.random() < probs[lesion] * (0.6 if impression_only else 1.0):
            candidates.append(lesion)

    finding_sents: dict[int, str] = {}
    for i in reported:
        rendered = finding_sentence(rng, specs[i], view)
        finding_sents[i] = rendered.text
        result.findings[i] = (rendered.text, "impression" if impression_only else "findings", rendered.phrase, None)

    # "without" combination: definitive cardiomegaly + negated edema/effusion in one sentence
    combined: dict[int, str] = {}
    for i in reported:
        s = specs[i]
        if s.lesion == "cardiomegaly" and s.certainty == "definitive" and rng.random() < 0.35:
            for neg in ("edema", "effusion"):
                if neg in candidates:
                    word = "pulmonary edema" if neg == "edema" else "pleural effusion"
                    text = finding_sents[i].rstrip(".") + f" without {word}."
                    finding_sents[i] = text
                    result.findings[i] = (text, *result.findings[i][1:])
                    result.negations[neg] = (text, "impression" if impression_only else "findings")
                    candidates.remove(neg)
                    combined[i] = neg
                    break
    negs = negation_sentences(rng, candidates)

    # order: devices, lung findings, lung normals/negations, pleura, heart, mediastinum, bones
    lung_idx = [i for i in reported if lives_in(specs[i].lesion) == "lung"]
    rng.shuffle(lung_idx)
    pleural_idx = [i for i in reported if lives_in(specs[i].lesion) == "pleura"]
    heart_idx = [i for i in reported if lives_in(specs[i].lesion) == "heart"]
    sentences: list[str] = []
    if sternotomy:
        t = str(rng.choice(STERNOTOMY))
        sentences.append(t)
        result.other.append(t)
    sentences += [finding_sents[i] for i in lung_idx]
    lung_negs = [n for n in negs if all(lives_in(lesion) == "lung" for lesion in n[1])]
    pleura_negs = [n for n in negs if any(lives_in(lesion) == "pleura" for lesion in n[1])]
    heart_negs = [n for n in negs if any(lives_in(lesion) == "heart" for lesion in n[1])]
    any_lung_lesion = any(lives_in(lesion) in ("lung", "pleura") for lesion in present)
    if not any_lung_lesion and not impression_only and rng.random() < 0.7:
        t = str(rng.choice(LUNGS_CLEAR))
        sentences.append(t)
        result.other.append(t)
    sentences += [n[0] for n in lung_negs]
    sentences += [finding_sents[i] for i in pleural_idx]
    pneumothorax_done = False
    section = "impression" if impression_only else "findings"
    for text, lesions in pleura_negs:
        if text == "No pleural effusion." and rng.random() < 0.4:
            text = EXTRA_WITH_PNEUMOTHORAX
        pneumothorax_done = pneumothorax_done or "pneumothorax" in text
        sentences.append(text)
        for lesion in lesions:
            result.negations[lesion] = (text, section)
    for text, lesions in lung_negs + heart_negs:
        pneumothorax_done = pneumothorax_done or "pneumothorax" in text
        for lesion in lesions:
            result.negations[lesion] = (text, section)
    if not pneumothorax_done and rng.random() < (0.3 if impression_only else 0.75):
        t = str(rng.choice(PNEUMOTHORAX))
        sentences.append(t)
        result.other.append(t)
    sentences += [finding_sents[i] for i in heart_idx]
    if not heart_idx and not impression_only:
        if heart_status == "normal" and not heart_negs and rng.random() < 0.8:
            t = str(rng.choice(HEART_NORMAL))
            sentences.append(t)
            result.other.append(t)
        elif heart_status == "borderline" and rng.random() < 0.8:
            t = str(rng.choice(HEART_BORDERLINE))
            sentences.append(t)
            result.other.append(t)
    sentences += [n[0] for n in heart_negs]
    if not impression_only:
        if rng.random() < 0.5:
            t = str(rng.choice(MEDIASTINUM))
            sentences.append(t)
            result.other.append(t)
        if rng.random() < 0.5:
            t = str(rng.choice(BONES))
            sentences.append(t)
            result.other.append(t)

    # impression
    impression: list[str] = []
    if impression_only:
        impression = sentences
    else:
        order = heart_idx + lung_idx + pleural_idx
        important = sorted(order, key=lambda i: ("pneumonia", "consolidation", "edema", "effusion",
                                                  "opacity", "cardiomegaly", "atelectasis").index(specs[i].lesion))
        chosen = important[: int(rng.integers(1, 4))] if important else []
        for i in chosen:
            rendered = impression_sentence(rng, specs[i])
            impression.append(rendered.text)
            t, sec, phrase, _ = result.findings[i]
            result.findings[i] = (t, sec, phrase, rendered.text)
        if not chosen:
            impression.append(str(rng.choice(NORMAL_IMPRESSION)))
    if impression_only and not reported:
        impression = [str(rng.choice(NORMAL_IMPRESSION)), *impression]

    # layout
    exam = "CHEST (PA AND LAT)" if view == "PA" else "CHEST (PORTABLE AP)"
    technique = "Chest PA and lateral" if view == "PA" else "Portable AP view of the chest"
    if has_prior:
        comparison = str(rng.choice(["___", "Chest radiograph from ___.", "Prior study from ___."]))
    else:
        comparison = str(rng.choice(["None.", "None", "___"]))
    lines = [" " * 33 + "FINAL REPORT", f" EXAMINATION:  {exam}", " ",
             f" INDICATION:  {_indication(rng, specs)}", " ", f" TECHNIQUE:  {technique}", " ",
             f" COMPARISON:  {comparison}", " "]
    joiner = "  " if rng.random() < 0.5 else " "
    if not impression_only:
        lines += [" FINDINGS: ", " "]
        lines += _wrap(joiner.join(sentences))
        lines += [" "]
    lines += [" IMPRESSION: ", " "]
    numbered = len(impression) > 1 and rng.random() < 0.6
    if numbered:
        for k, text in enumerate(impression, start=1):
            lines += _wrap(f"{k}. {text}")
            if rng.random() < 0.5:
                lines += [" "]
    else:
        lines += _wrap(joiner.join(impression))
    while lines and lines[-1] == " ":
        lines.pop()
    result.text = "\n".join(lines) + "\n"
    return result
