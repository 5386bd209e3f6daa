"""The dataset card: counts in the layout of ILS Tables 10-12, mask recall per lesion (Table 8 layout),
QC rejections by reason, mask frame, backends and settings."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from cxrground.errors import InputError
from cxrground.ils.frames import FRAME_TEXT
from cxrground.vocab.lesions import ABBREVIATIONS, LESIONS
from cxrground.vocab.traits import lives_in

__all__ = [
    "ADDENDUM_LISTED",
    "COUNT_COLUMNS",
    "FIT_INPUTS_KEY",
    "READING_NOTES",
    "REPROCESSED_KEY",
    "REVIEW_FILE",
    "DatasetCounts",
    "addendum_lines",
    "count_table",
    "pose_lines",
    "read_review_summary",
    "reading_lines",
    "recall_table",
    "render_card",
    "review_lines",
    "rules_lines",
    "stats_text",
    "view_lines",
    "with_review_section",
]

#: Expert review figures of a dataset (``OUT/review.json``, written by ``cxrground review export --card OUT``);
#: the card's "Review status" section is rendered from it when present.
REVIEW_FILE = "review.json"
#: The provenance field counting the studies a resumed build processed again because their report or image had
#: changed since their unit was built (absent when none was).
REPROCESSED_KEY = "studies_reprocessed_for_changed_inputs"
#: The provenance field counting the studies added, removed and changed since the build fitted its normative model
#: on its own studies (none of them among the films the model read; absent when none).
FIT_INPUTS_KEY = "inputs_since_normative_fit"
_REVIEW_HEADING = "## Review status"

COUNT_COLUMNS = ("#IA", "basic pos", "basic neg", "global pos", "global neg", "LI pos", "LI neg")
_TYPE_COLUMN = {"basic": "basic", "global": "global", "lesion_inference": "LI"}


def count_table(split: Mapping[str, Any]) -> dict[str, dict[str, int]]:
    """Per-lesion (by ``target``) pair counts of one split, plus a ``total`` row."""
    rows: dict[str, Counter] = {lesion: Counter() for lesion in (*LESIONS, "total")}
    for study in split.values():
        _count_study(rows, study)
    return _freeze(rows)


def _count_study(rows: dict[str, Counter], study: Mapping[str, Any]) -> None:
    """Add the pairs of one study to per-lesion counters ``rows``."""
    pairs = study["instruction_answer_pairs"]
    for sign, key in (("pos", "positive_pairs"), ("neg", "negative_pairs")):
        for p in pairs.get(key, []):
            col = f"{_TYPE_COLUMN[p['type']]} {sign}"
            for row in (p["target"], "total"):
                rows[row][col] += 1
                rows[row]["#IA"] += 1


def _freeze(rows: Mapping[str, Counter]) -> dict[str, dict[str, int]]:
    return {name: {c: int(counts[c]) for c in COUNT_COLUMNS} for name, counts in rows.items()}


class DatasetCounts:
    """Studies and pair counts per split, added one study at a time (what the card needs of a dataset, without
    holding the dataset)."""

    def __init__(self) -> None:
        self.studies: dict[str, int] = {s: 0 for s in ("train", "val", "test")}
        self._rows: dict[str, dict[str, Counter]] = {}

    @classmethod
    def of(cls, dataset: Mapping[str, Mapping[str, Any]]) -> DatasetCounts:
        """The counts of a whole dataset dict."""
        counts = cls()
        for split, studies in dataset.items():
            for study in studies.values():
                counts.add(split, study)
        return counts

    def add(self, split: str, study: Mapping[str, Any]) -> None:
        """Count one study of ``split``."""
        self.studies[split] = self.studies.get(split, 0) + 1
        rows = self._rows.setdefault(split, {lesion: Counter() for lesion in (*LESIONS, "total")})
        _count_study(rows, study)

    def table(self, split: str) -> dict[str, dict[str, int]]:
        """:func:`count_table` of ``split``."""
        return _freeze(self._rows.get(split) or {lesion: Counter() for lesion in (*LESIONS, "total")})

    def pairs(self) -> int:
        """Pairs in all splits."""
        return sum(self.table(s)["total"]["#IA"] for s in self._rows)


def recall_table(reported: Iterable[tuple[str, bool]]) -> dict[str, dict[str, float]]:
    """Share of reported positive findings that received a mask, per lesion (ILS Table 8 layout)."""
    total: Counter = Counter()
    hit: Counter = Counter()
    for lesion, got in reported:
        total[lesion] += 1
        hit[lesion] += int(got)
    out = {lesion: {"reported": total[lesion], "masked": hit[lesion],
                    "recall": hit[lesion] / total[lesion] if total[lesion] else float("nan")}
           for lesion in LESIONS}
    lung = [lesion for lesion in LESIONS if lives_in(lesion) != "heart" and total[lesion]]
    out["avg (6 lung/pleural)"] = {
        "reported": sum(total[x] for x in lung), "masked": sum(hit[x] for x in lung),
        "recall": sum(out[x]["recall"] for x in lung) / len(lung) if lung else float("nan"),
    }
    return out


def _cell(text: object) -> str:
    """``text`` as one Markdown table cell: whitespace runs (line breaks included) become one space, ``|`` is
    escaped."""
    return " ".join(str(text).split()).replace("|", r"\|")


def _md_counts(title: str, table: Mapping[str, Mapping[str, int]]) -> list[str]:
    lines = [f"### {title}", "", "| lesion | " + " | ".join(COUNT_COLUMNS) + " |",
             "|---|" + "---|" * len(COUNT_COLUMNS)]
    for name, row in table.items():
        lines.append(f"| {_cell(name)} | " + " | ".join(f"{row[c]:,}" for c in COUNT_COLUMNS) + " |")
    return [*lines, ""]


_SECTION_POLICY_TEXT = {
    "findings": "one section per study, findings, else impression, else the last paragraph (the paper's ILS §6 "
                "choice)",
    "impression": "one section per study, impression, else findings, else the last paragraph",
    "findings+impression": "findings and impression together, impression sentences numbered after the findings "
                           "sentences; a lesion + location reported in both counts once (the findings sentence "
                           "keeps its index)",
}


def _report_line(provenance: Mapping[str, Any]) -> str:
    """The card line naming the report section policy and the structurer's settings."""
    policy = (provenance.get("config") or {}).get("sections", "findings")
    structurer = dict((provenance.get("backends") or {}).get("structurer") or {})
    name = structurer.pop("name", None) or structurer.pop("structurer", "?")
    alternatives = structurer.get("alternatives")
    extra = f", alternatives {alternatives}" if alternatives else ""
    return (f"Report sections: `{policy}`: {_SECTION_POLICY_TEXT.get(policy, policy)}. "
            f"Structurer: `{name}`{extra}.")


def _normal_image_line(provenance: Mapping[str, Any]) -> str | None:
    """The card line naming the normative model a ``normative`` build used and what it was fitted on."""
    synth = (provenance.get("backends") or {}).get("synthesizer") or {}
    if synth.get("name") != "normative":
        return None
    model = synth.get("model") or {}
    source = model.get("source") or (model.get("path") and Path(model["path"]).stem) or "?"
    return f"Normal image: normative model `{source}`: {model.get('training_data') or '?'}."


def _reprocessed_line(n: int) -> str:
    """The card line counting the studies processed again because their inputs changed."""
    return (f"Studies processed again by a resumed build because their inputs (report, image or study record) "
            f"changed after their unit was built: {n:,}. Their pairs follow the current inputs.")


def render_card(
    dataset: Mapping[str, Mapping[str, Any]] | DatasetCounts,
    reported: Iterable[tuple[str, bool]],
    rejections: Mapping[str, int],
    provenance: Mapping[str, Any],
    extra_sections: Iterable[str] = (),
    grounding_reasons: Mapping[str, int] | None = None,
    review: Mapping[str, Any] | None = None,
    dropped_pairs: Mapping[str, int] | None = None,
    placed_negatives: Mapping[str, int] | None = None,
    zone_guide: tuple[str, Mapping[str, int]] | None = None,
) -> str:
    """``card.md`` text (``dataset``: the dataset dict or its :class:`DatasetCounts`; ``review``: a ``review.json``
    summary for the "Review status" section; ``dropped_pairs``: pairs left out by the build's checks, by reason;
    ``placed_negatives``: negatives placed away from the zones an image reader flags, by reason, a section of its
    own when not None, i.e. when the build places negatives by the image; ``zone_guide``: the zone reader guiding
    lung-lesion masks and its findings by outcome, a section of its own when not None)."""
    counts = dataset if isinstance(dataset, DatasetCounts) else DatasetCounts.of(dataset)
    lines = ["# ILS dataset card", "",
             "Generated by cxrground (MIMIC-ILS format, ILS.md §12). "
             f"Seed {provenance.get('seed')}, config {provenance.get('config_hash')}, "
             f"code {provenance.get('code_version')}.", "", _report_line(provenance), ""]
    normal_line = _normal_image_line(provenance)
    if normal_line:
        lines += [normal_line, ""]
    reprocessed = provenance.get(REPROCESSED_KEY)
    if reprocessed:
        lines += [_reprocessed_line(reprocessed), ""]
    since_fit = provenance.get(FIT_INPUTS_KEY)
    if isinstance(since_fit, Mapping) and any(since_fit.values()):
        lines += [f"Studies added, removed and changed since the normative model was fitted on this build's studies: "
                  f"{since_fit.get('added', 0):,}, {since_fit.get('removed', 0):,} and {since_fit.get('changed', 0):,}"
                  " (none of them among the films it read). The build kept that model; a fresh build of these "
                  "inputs may fit another.", ""]
    n_studies = {s: counts.studies.get(s, 0) for s in ("train", "val", "test")}
    lines += ["## Splits", "", "| split | studies | pairs | positives | negatives |", "|---|---|---|---|---|"]
    for split, n in n_studies.items():
        t = counts.table(split)["total"]
        pos = t["basic pos"] + t["global pos"] + t["LI pos"]
        lines.append(f"| {split} | {n:,} | {t['#IA']:,} | {pos:,} | {t['#IA'] - pos:,} |")
    lines += ["", *_split_source(provenance.get("split"))]
    lines += ["## Counts per lesion (layout of ILS Tables 10-12; grouped by `target`)", ""]
    for split, title in (("train", "Train"), ("val", "Val"), ("test", "Test")):
        if counts.studies.get(split):
            lines += _md_counts(title, counts.table(split))
    rec = recall_table(reported)
    lines += ["## Mask recall (layout of ILS Table 8): share of reported positive findings that received a mask",
              "", "| lesion | reported | masked | recall % |", "|---|---|---|---|"]
    for name, row in rec.items():
        short = ABBREVIATIONS.get(name, "")
        label = f"{name} ({short})" if short else name
        pct = "–" if row["recall"] != row["recall"] else f"{100 * row['recall']:.1f}"
        lines.append(f"| {label} | {row['reported']:,} | {row['masked']:,} | {pct} |")
    lines += ["", "Reference (paper, default τ): atel. 13.4, pneu. 28.5, effu. 16.0, opac. 21.6, edem. 58.0, "
              "cons. 31.9, avg 28.3.", ""]
    lines += ["## Studies not in the dataset, by reason", "", *_count_table("reason", "studies", rejections), ""]
    lines += ["## Reported positive findings without a mask, by reason (Algorithm 1 and QC)", "",
              *_count_table("reason", "findings", grounding_reasons), ""]
    lines += ["## Pairs left out by checks, by reason", "", *_count_table("reason", "pairs", dropped_pairs), ""]
    if placed_negatives is not None:
        lines += ["## Negatives placed away from zones the image reader flags, by reason", "",
                  "A lung-lesion negative whose random region named a flagged zone, or whose global form would name "
                  "both lungs, drawn again among the unflagged regions (left out, and counted above, when none is "
                  "left).", "", *_count_table("reason", "negatives", placed_negatives), ""]
    if zone_guide is not None:
        reader, outcomes = zone_guide
        lines += [f"## Lung-lesion masks guided by the zone reader `{reader}`", "",
                  "Reported lung lesions keep a mask only in the zones of their reported location that the reader "
                  "flags (and in the zones a report names beside both lungs when the reader flags only others); "
                  "for airspace lesions (not atelectasis) a flagged zone Algorithm 1 left empty is filled "
                  "where the lesion segmenter's smoothed probability is highest.", "",
                  *_count_table("outcome", "findings", outcomes), ""]
    lines += list(extra_sections)
    lines += ["", "## Masks", "", FRAME_TEXT["native"], ""]
    lines += ["## Backends and settings", "", "```json"]
    lines += [json.dumps({k: provenance[k] for k in sorted(provenance)}, indent=2, sort_keys=True), "```", ""]
    lines += review_lines(review, len(provenance.get("exclude_studies", []) or []))
    return "\n".join(lines)


def rules_lines(zone_guide: str, grounded_location: str, silent_report_negatives: bool,
                prominent_heart_negative: bool) -> list[str]:
    """The card's "Rules" section: where this build's rules depart from ILS.md read literally (none with
    ``--paper-rules``)."""
    departures = []
    if zone_guide != "none":
        departures.append(f"lung-lesion masks guided by the zone reader `{zone_guide}` (`--zone-guide none`: "
                          "Algorithm 1 alone)")
    if grounded_location == "mask":
        departures.append("the grounded location read within the drawn mask, not the whole selected boxes "
                          "(`--grounded-location boxes`)")
    if not silent_report_negatives:
        departures.append("no lung or pleural negatives from a report that says nothing about the film "
                          "(`--silent-report-negatives`)")
    if not prominent_heart_negative:
        departures.append("no cardiomegaly pair for a heart the report calls prominent (`--prominent-heart-negative`)")
    if not departures:
        return ["## Rules", "", "ILS.md's rules read literally (`--paper-rules` or the four options it sets).", ""]
    return ["## Rules", "", "Where this build departs from ILS.md read literally (`--paper-rules` reads it literally "
            "on all of them):", "", *[f"- {d}" for d in departures], ""]


#: Studies listed by name in the card's addendum section (the rest are counted).
ADDENDUM_LISTED = 20


def addendum_lines(addenda: Sequence[tuple[str, Sequence[str]]]) -> list[str]:
    """The card's "Report addenda" section for ``addenda`` ((study, lesions its addendum names), in study order);
    no lines when no study's report has an addendum."""
    if not addenda:
        return []
    naming = [(key, lesions) for key, lesions in addenda if lesions]
    lines = ["## Report addenda", "",
             f"{len(addenda)} studies' reports carry an addendum. ILS §6 reads one section, so no pair comes from an "
             f"addendum, even one that corrects the findings; {len(naming)} of these addenda name one of the seven "
             "lesions (present, uncertain or negated). Review those studies:", ""]
    lines += [f"- `{key}`: {', '.join(lesions)}" for key, lesions in naming[:ADDENDUM_LISTED]]
    if len(naming) > ADDENDUM_LISTED:
        lines.append(f"- and {len(naming) - ADDENDUM_LISTED} more (`addendum_lesions` in their unit records)")
    return [*lines, ""]


#: Studies listed by name in the card's "Studies without pairs" section (the rest are counted).
NO_PAIRS_LISTED = 20


def no_pairs_lines(keys: Sequence[str], total: int) -> list[str]:
    """The card's "Studies without pairs" section: the first ``keys`` of the ``total`` studies that were processed
    and gave no instruction-answer pair (no lines when there are none)."""
    if not total:
        return []
    shown = ", ".join(f"`{k}`" for k in keys[:NO_PAIRS_LISTED])
    more = f" and {total - NO_PAIRS_LISTED:,} more" if total > NO_PAIRS_LISTED else ""
    return ["## Studies without pairs", "",
            f"{total:,} stud{'y was' if total == 1 else 'ies were'} processed and gave no instruction-answer pair "
            f"(no reported finding received a mask, and every negative was withheld or left out; the tables above "
            f"count why): {shown}{more}. Each unit record (`units/<study>.json`) holds what was read.", ""]


#: Films listed by name in the card's pose section (the rest are counted).
POSE_LISTED = 20


def pose_lines(posed: Sequence[tuple[str, Mapping[str, Any], bool]], read: bool, shipped: bool = True) -> list[str]:
    """The card's "Films that may be stored in a wrong pose" section: the studies whose film the pose reader flagged
    (``posed``: study, its unit's ``pose_warning``, whether it is in the dataset), or one line saying the films
    were not read (``read`` False). ``shipped``: the shipped reader read them (its held-out figures are quoted);
    otherwise the reader's own sidecar holds them."""
    heading = "## Films that may be stored in a wrong pose"
    if not read:
        return [heading, "", "Not read (`--no-pose-warning`): a film stored mirrored left-right would pass every "
                "check and give every side a wrong name.", ""]
    measured = ("On held-out films the pose reader finds 98-100 % of mirrored films and flags 3-6 % of upright ones "
                "(mostly portables and films whose disease hides the heart)." if shipped else
                "The films were read with other pose weights than the shipped ones (named in `provenance.json`); "
                "their held-out check is in their sidecar.")
    if not posed:
        return [heading, "", f"The pose reader flagged no film as stored mirrored, turned or flipped. {measured}", ""]
    lines = [heading, "",
             f"Films the pose reader flagged: {len(posed):,} ({sum(1 for *_, kept in posed if kept):,} of their "
             "studies in the dataset). Nothing was rejected: look at them (`cxrground anatomy pose` draws "
             "contact sheets). A film stored mirrored passes every other check and names every side wrongly. "
             f"{measured}", ""]
    lines += ["| study | looks right after | P | in the dataset |", "|---|---|---|---|"]
    lines += [f"| `{key}` | {_cell(w.get('correction'))} | {w.get('p', 0):.2f} | {'yes' if kept else 'no'} |"
              for key, w, kept in posed[:POSE_LISTED]]
    if len(posed) > POSE_LISTED:
        lines += ["", f"{len(posed) - POSE_LISTED:,} more: `pose_warning` in their unit records."]
    return [*lines, ""]


#: Unit keys that say how a film was read, with the words for them (after "N films" on the card, after "film" in
#: the gallery).
READING_NOTES: Final[tuple[tuple[str, str], ...]] = (
    ("image_note", "read as the grey-level negative (stored inverted)"),
    ("tilt", "read turned upright (the segmenter's option `deskew`; the angle is the unit's `tilt`)"),
    ("content_box", "read inside the uniform borders (the segmenter's option `content_box`)"),
)


def reading_lines(read_as: Mapping[str, Sequence[str]]) -> list[str]:
    """The card's "How films were read" section: how many films (and which, up to :data:`POSE_LISTED`) were read
    other than as stored (``read_as``: unit key of :data:`READING_NOTES` → study keys); nothing when none was."""
    if not any(read_as.get(key) for key, _ in READING_NOTES):
        return []
    lines = ["## How films were read", ""]
    for key, words in READING_NOTES:
        studies = list(read_as.get(key) or ())
        if studies:
            shown = ", ".join(f"`{k}`" for k in studies[:POSE_LISTED])
            more = f" and {len(studies) - POSE_LISTED:,} more" if len(studies) > POSE_LISTED else ""
            lines.append(f"- {len(studies):,} film{'s' if len(studies) != 1 else ''} {words}: {shown}{more}.")
    return [*lines, "", "Each is recorded in its unit and in `anatomy.jsonl`.", ""]


def _split_source(split: Mapping[str, Any] | None) -> list[str]:
    """One line saying where the splits came from (none when the provenance does not say)."""
    if not split:
        return []
    if split.get("source") == "file":
        return [f"Splits from `{split['path']}`.", ""]
    shares = ", ".join(f"{name} {r:g}" for name, r in zip(("train", "val", "test"), split.get("ratios", ()),
                                                          strict=False))
    unnamed = split.get("studies_without_subject") or 0
    if not unnamed:
        return [f"Splits by a hash of the subject id ({shares}): all studies of a patient share a split.", ""]
    return [f"Splits by a hash of the subject id ({shares}); {unnamed:,} stud{'y' if unnamed == 1 else 'ies'} named "
            f"no subject (no `subject_id` in the index) and {'was' if unnamed == 1 else 'were each'} split on "
            "its own, so one patient's studies among them may be in different splits.", ""]


def view_lines(views: Mapping[str, int], blind: int, view_table: Mapping[str, Any] | None) -> list[str]:
    """The card's "Image views" section: the view of each study's chosen image (``views``: view -> studies,
    "unknown" when none was known), the view table used, and ``blind``, the studies that offered several images
    of unknown view; no lines when no unit recorded a view."""
    if not views:
        return []
    source = (f"`{view_table['path']}` ({view_table['images']:,} images)" if view_table else
              "none (views come from DICOM headers and the index only)")
    counts = ", ".join(f"{view} {n:,}" for view, n in sorted(views.items(), key=lambda kv: (-kv[1], kv[0])))
    lines = ["## Image views", "",
             "One image per study: PA first, then AP, then an image of unknown view, a lateral or other view last "
             f"(ties: the lexicographically first `dicom_id`). View table: {source}. Views of the chosen images: "
             f"{counts}. A study whose image is recorded as another view than PA or AP is rejected (\"Studies not in "
             "the dataset\"); one whose view is unknown is kept as frontal.", ""]
    if blind:
        lines += [f"**{blind:,} studies offered several images and no view for them**, so their image was the first "
                  "`dicom_id`, which can be a lateral film read as frontal (about half of the MIMIC-CXR studies hold "
                  "a lateral film). Give the view table (`--metadata mimic-cxr-2.0.0-metadata.csv.gz`, or a `view` "
                  "column in the index).", ""]
    return lines


def _count_table(key: str, counted: str, counts: Mapping[str, int] | None) -> list[str]:
    """A two-column Markdown table of ``counts``, largest first (one "(none)" row when empty)."""
    rows = [f"| {_cell(k)} | {n:,} |" for k, n in sorted((counts or {}).items(), key=lambda kv: (-kv[1], kv[0]))]
    return [f"| {key} | {counted} |", "|---|---|", *(rows or ["| (none) | 0 |"])]


def _share(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.1f} %"


def review_lines(review: Mapping[str, Any] | None, excluded: int | None = None) -> list[str]:
    """The "Review status" section: "not reviewed", or the reviewed share per split, acceptance and agreement of
    a ``review.json`` summary."""
    paper = ("The paper reviewed only its test split (four radiation oncologists; any rejection removes an item).")
    tail = f" Exclusion list: {excluded} studies." if excluded is not None else ""
    if not review:
        return [_REVIEW_HEADING, "", f"No split has been reviewed by experts. {paper}{tail}", ""]
    kappa = review.get("fleiss_kappa")
    cohen = review.get("mean_cohen_kappa")
    lines = [_REVIEW_HEADING, "",
             f"Expert review from `{_cell(review.get('source', '?'))}`: {len(review.get('reviewers', []))} reviewers "
             f"({_cell(', '.join(review.get('reviewers', [])))}), {review.get('ratings', 0):,} ratings; consensus: "
             f"{review.get('consensus_rule', '?')}. {paper}{tail}", "",
             "| split | pairs | reviewed | reviewed share | accepted | acceptance |", "|---|---|---|---|---|---|"]
    for split, row in (review.get("splits") or {}).items():
        lines.append(f"| {split} | {row['pairs']:,} | {row['reviewed']:,} | {_share(row['reviewed_share'])} | "
                     f"{row['accepted']:,} | {_share(row['acceptance'])} |")
    lines += ["", f"Agreement: Fleiss' κ {'–' if kappa is None else f'{kappa:.3f}'} over "
                  f"{review.get('fleiss_units', 0):,} pairs with two or more ratings; mean pairwise Cohen's κ "
                  f"{'–' if cohen is None else f'{cohen:.3f}'}. Masks corrected by the reviewers: "
                  f"{review.get('corrected', 0):,}.", ""]
    return lines


def read_review_summary(folder: str | Path) -> dict[str, Any] | None:
    """``folder/review.json`` as a dict, or None when the dataset has not been reviewed."""
    path = Path(folder) / REVIEW_FILE
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InputError(f"review summary is not valid JSON ({exc})", path) from exc


def with_review_section(card: str, review: Mapping[str, Any] | None) -> str:
    """``card`` with its "Review status" section (to the next ``## `` heading or the end) rendered anew."""
    head, found, rest = card.partition(_REVIEW_HEADING)
    if not found:
        return card.rstrip("\n") + "\n\n" + "\n".join(review_lines(review))
    old = (found + rest).splitlines()
    excluded = None
    for line in old:
        if "Exclusion list: " in line:
            digits = line.split("Exclusion list: ", 1)[1].split(" ", 1)[0].replace(",", "")
            excluded = int(digits) if digits.isdigit() else None
    end = next((i for i, line in enumerate(old[1:], start=1) if line.startswith("## ")), len(old))
    tail = "\n".join(old[end:])
    return head + "\n".join(review_lines(review, excluded)) + ("\n" + tail if tail else "")


def stats_text(folder: str | Path, as_json: bool = False) -> str:
    """The counts of a dataset folder: JSON per split (``studies`` beside the lesion rows of the card's table), else
    the card's tables (or one studies-and-pairs line per split). The dataset JSON is read as a stream and checked
    study by study."""
    from cxrground.ils.schema import SPLITS, check_splits, dataset_location, iter_dataset

    folder, json_path = dataset_location(folder)
    check_splits(json_path)
    counts = DatasetCounts()
    for split, _key, study in iter_dataset(json_path):
        counts.add(split, study)
    tables = {split: counts.table(split) for split in SPLITS}
    if as_json:
        return json.dumps({split: {"studies": counts.studies.get(split, 0), **tables[split]} for split in SPLITS},
                          indent=2)
    card = folder / "card.md"
    if card.is_file():
        return card.read_text(encoding="utf-8").split("## Backends and settings")[0].rstrip()
    return "\n".join(f"{split}: {counts.studies.get(split, 0)} studies, {tables[split]['total']['#IA']} pairs"
                     for split in SPLITS)
