"""CheXpercept case curation (CHEXPERCEPT.md §11, §1.4): positive and negative candidates, expert review,
the RF/RR split, the final balanced sample and the count arithmetic of the card.

Choices where the spec is silent (also printed in the card):

* **Positive candidates**: per study (JSON order) and target, every ``global`` positive pair; a study without
  a global positive for that target gives its first ``basic`` positive instead. Per lesion the global items
  come first, then the basic ones, capped at ``max_candidates`` (3,000 as in the reference).
* **Candidate mask**: the ``--candidates`` prediction of that pair id when a predictions file is given (a pair
  without a predicted mask is dropped with a recorded reason), else the dataset's own ``seg_mask_path``.
* **Negative candidates**: ``global`` negative pairs, per lesion in JSON order; lesions are visited in the
  reference's curation order :data:`~cxrground.vocab.lesions.CURATION_ORDER` (CA, CO, ED, AT, PN, OP, EF) and a
  CXR (``dicom_id``) claimed by one lesion is not used by a later one (the order decides which CXRs each lesion
  gets: a normal CXR carries global negatives of many lesions); with ``exclude_positive_cxrs`` CXRs of any
  positive candidate are skipped. Per lesion the first ``max_negatives`` (reference default 100) are kept, one
  per study (the reference could take two pairs of one CXR for a lesion; one CXR per case here, §1.4).
* **Review CSV** ``key_id,decision,reviewer``: decisions are ``accept`` / ``reject`` (case and surrounding
  blanks ignored); an empty cell means "not reviewed"; anything else is an error naming the row. With a review
  file only accepted items are used (rejected, blank or absent items never are); without one every candidate
  is taken and the card says that no expert review was applied.
* **RF / RR split**: per lesion, the first ``round(n × rf_ratio)`` deformation-successful positives (candidate
  order) are RF, the rest RR (Python's ``round``: half to even); the ratio is set per lesion (§11,
  :meth:`~cxrground.percept.options.BuildOptions.rf_ratio_of`).
* **Final balanced sample**: lesions in ``LESIONS`` order, paths in LF, RF, RR order; each pool is shuffled with
  a generator seeded from ``(seed, lesion, path)`` and cases are taken in shuffled order, skipping any whose CXR
  is already used by an earlier case, until the requested number is reached (fewer when the pool runs out).
  One CXR per case; no CXR is reused across cases.
"""

from __future__ import annotations

import csv
import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final

import numpy as np

from cxrground.errors import InputError
from cxrground.vocab.lesions import CURATION_ORDER, LESIONS, LUNG_LESIONS
from cxrground.vocab.percept_templates import (
    PATH_LESION_FREE,
    PATH_REVISION_FREE,
    PATH_REVISION_REQUIRED,
    candidate_instruction,
)
from cxrground.vocab.traits import traits

__all__ = [
    "DECISIONS",
    "SAMPLE_PATHS",
    "TASKS",
    "Candidate",
    "CountTable",
    "Review",
    "balanced_sample",
    "combined_decision",
    "count_arithmetic",
    "key_id",
    "negative_candidates",
    "positive_candidates",
    "read_review",
    "seeded_rng",
    "split_rf_rr",
]

#: Accepted review decision values (after ``strip().lower()``); an empty cell means "not reviewed".
DECISIONS: Final[tuple[str, str]] = ("accept", "reject")
#: Path order of the final sample and of every table.
SAMPLE_PATHS: Final[tuple[str, str, str]] = (PATH_LESION_FREE, PATH_REVISION_FREE, PATH_REVISION_REQUIRED)
#: Task rows of the §1.4 per-task table, in question order.
TASKS: Final[tuple[str, ...]] = (
    "detection", "contour evaluation", "expansion", "contraction", "revision result",
    "distribution", "location", "severity", "comparison",
)


@dataclass(frozen=True)
class Candidate:
    """One positive or negative candidate case (one CXR × one target lesion)."""

    key_id: str
    lesion: str
    pair_id: str
    study: str
    split: str
    dicom_id: str
    image_path: str
    positive: bool
    pair_type: str
    instruction: str = ""
    """Positives: the §2 candidate instruction sent to the candidate model."""
    seg_mask_path: str | None = None
    """Positives: the dataset's own mask (relative to ``lesion_mask/``)."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return asdict(self)


def key_id(lesion: str, pair_id: str) -> str:
    """The reference case id ``{lesion}_{pair_id}`` (§1.1)."""
    return f"{lesion}_{pair_id}"


def seeded_rng(seed: int, *parts: str) -> np.random.Generator:
    """A NumPy generator seeded from ``seed`` and text parts (stable across runs and platforms)."""
    digest = hashlib.sha256("\x1f".join([str(seed), *parts]).encode("utf-8")).digest()
    return np.random.default_rng(int.from_bytes(digest[:16], "little"))


def _splits(dataset: Mapping[str, Any], splits: Sequence[str]) -> Iterable[tuple[str, str, Mapping[str, Any]]]:
    for split in splits:
        for study_key, study in (dataset.get(split) or {}).items():
            yield split, study_key, study


def positive_candidates(dataset: Mapping[str, Any], splits: Sequence[str] = ("train",),
                        max_candidates: int = 3000) -> dict[str, list[Candidate]]:
    """Per lesion: the §11 positive candidates (global first, then first-basic fallbacks), capped."""
    globals_: dict[str, list[Candidate]] = {lesion: [] for lesion in LESIONS}
    basics: dict[str, list[Candidate]] = {lesion: [] for lesion in LESIONS}
    for split, study_key, study in _splits(dataset, splits):
        pairs = study["instruction_answer_pairs"].get("positive_pairs", [])
        with_global = {p["target"] for p in pairs if p["type"] == "global"}
        first_basic: set[str] = set()
        for p in pairs:
            target = p["target"]
            if p["type"] == "global":
                bucket = globals_
            elif p["type"] == "basic" and target not in with_global and target not in first_basic:
                first_basic.add(target)
                bucket = basics
            else:
                continue
            bucket[target].append(Candidate(
                key_id=key_id(target, p["pair_id"]), lesion=target, pair_id=p["pair_id"], study=study_key,
                split=split, dicom_id=study["dicom_id"], image_path=study["image_path"], positive=True,
                pair_type=p["type"], instruction=candidate_instruction(target, p.get("reported_location") or []),
                seg_mask_path=p.get("seg_mask_path")))
    return {lesion: (globals_[lesion] + basics[lesion])[:max_candidates] for lesion in LESIONS}


def negative_candidates(dataset: Mapping[str, Any], splits: Sequence[str] = ("train",), max_negatives: int = 100,
                        exclude_cxrs: Iterable[str] = (), clear_lungs: bool = False) -> dict[str, list[Candidate]]:
    """Per lesion: the first ``max_negatives`` global negatives in JSON order, a CXR used by one lesion only (lesions
    claim CXRs in :data:`~cxrground.vocab.lesions.CURATION_ORDER`; the result is keyed in ``LESIONS`` order).

    ``clear_lungs``: a lung-opacity lesion (:data:`~cxrground.vocab.lesions.LUNG_LESIONS`) takes only films with no
    positive pair of any lung-opacity lesion, the stand-in for the expert who confirms a lesion-free film (§11): a
    report that names consolidation does not make its film free of pneumonia.
    """
    used = set(exclude_cxrs)
    out: dict[str, list[Candidate]] = {}
    for lesion in CURATION_ORDER:
        chosen: list[Candidate] = []
        for split, study_key, study in _splits(dataset, splits):
            if len(chosen) >= max_negatives:
                break
            if study["dicom_id"] in used:
                continue
            if clear_lungs and lesion in LUNG_LESIONS and _names_lung_lesion(study):
                continue
            for p in study["instruction_answer_pairs"].get("negative_pairs", []):
                if p["type"] == "global" and p["target"] == lesion:
                    chosen.append(Candidate(
                        key_id=key_id(lesion, p["pair_id"]), lesion=lesion, pair_id=p["pair_id"], study=study_key,
                        split=split, dicom_id=study["dicom_id"], image_path=study["image_path"], positive=False,
                        pair_type="global"))
                    used.add(study["dicom_id"])
                    break
        out[lesion] = chosen
    return {lesion: out[lesion] for lesion in LESIONS}


def _names_lung_lesion(study: Mapping[str, Any]) -> bool:
    """True when the study holds a positive pair of a lung-opacity lesion."""
    return any(p.get("target") in LUNG_LESIONS for p in study["instruction_answer_pairs"].get("positive_pairs", []))


@dataclass(frozen=True)
class Review:
    """Expert decisions ``{key_id: (decision, reviewer)}`` read from a review CSV."""

    decisions: Mapping[str, tuple[str, str]]
    source: str | None = None

    def accepted(self, key: str) -> bool:
        """True only for an explicit ``accept``."""
        return self.decisions.get(key, ("", ""))[0] == "accept"

    def status(self, key: str) -> str:
        """``accept``, ``reject`` or ``blank`` (not reviewed)."""
        return self.decisions.get(key, ("", ""))[0] or "blank"


def read_review(path: str | Path) -> Review:
    """Read ``key_id,decision,reviewer`` rows; a decision other than accept/reject/empty is an error naming the row.

    A key may appear twice only with two different values in an optional fourth column ``kind`` (what
    ``review export`` writes: the same ``{lesion}_{pair_id}`` reviewed as an ILS pair and as a benchmark case);
    its decision is then :func:`combined_decision` of the rows and its reviewers the union.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8-sig")
    except FileNotFoundError as exc:
        raise InputError("review file not found", path) from exc
    except UnicodeDecodeError as exc:
        raise InputError(f"review CSV is not UTF-8 ({exc})", path) from exc
    except OSError as exc:
        raise InputError(f"cannot read the review CSV ({exc.strerror or exc})", path) from exc
    rows = list(csv.reader(text.splitlines()))
    if not rows or [c.strip().lower() for c in rows[0][:3]] != ["key_id", "decision", "reviewer"]:
        raise InputError("review CSV must start with the header key_id,decision,reviewer", path)
    has_kind = len(rows[0]) > 3 and rows[0][3].strip().lower() == "kind"
    seen: dict[str, list[tuple[str, str, str]]] = {}
    for lineno, row in enumerate(rows[1:], start=2):
        if not any(c.strip() for c in row):
            continue
        if len(row) < 2 or not row[0].strip():
            raise InputError(f"row {lineno}: expected key_id,decision,reviewer, got {row!r}", path)
        key, decision = row[0].strip(), row[1].strip().lower()
        reviewer = row[2].strip() if len(row) > 2 else ""
        kind = row[3].strip() if has_kind and len(row) > 3 else ""
        if decision and decision not in DECISIONS:
            raise InputError(f"row {lineno} ({key}): decision {row[1]!r} is not 'accept' or 'reject'", path)
        earlier = seen.setdefault(key, [])
        if earlier and (not kind or any(k in ("", kind) for k, _, _ in earlier)):
            raise InputError(f"row {lineno}: key_id {key} is reviewed twice", path)
        earlier.append((kind, decision, reviewer))
    decisions = {key: (got[0][1], got[0][2]) if len(got) == 1 else
                 (combined_decision([d for _, d, _ in got]),
                  ";".join(sorted({n for _, _, r in got for n in r.split(";") if n})))
                 for key, got in seen.items()}
    return Review(decisions, str(path))


def combined_decision(decisions: Sequence[str]) -> str:
    """One key's decision from its reviews as different kinds of item: ``reject`` when any rejects, ``accept``
    when all accept, blank (not fully reviewed) otherwise."""
    if "reject" in decisions:
        return "reject"
    return "accept" if decisions and all(d == "accept" for d in decisions) else ""


def split_rf_rr(successful: Sequence[str], rf_ratio: float) -> tuple[list[str], list[str]]:
    """Split one lesion's deformation-successful positives (in candidate order) into (RF, RR)."""
    if not 0.0 <= rf_ratio <= 1.0:
        raise ValueError(f"rf_ratio must be in [0, 1], got {rf_ratio}")
    n_rf = round(len(successful) * rf_ratio)
    return list(successful[:n_rf]), list(successful[n_rf:])


def balanced_sample(pools: Mapping[tuple[str, str], Sequence[Candidate]], requested: Mapping[str, int],
                    seed: int) -> dict[tuple[str, str], list[Candidate]]:
    """The seeded final sample: per (lesion, path) up to ``requested[path]`` cases, one CXR per case overall."""
    used: set[str] = set()
    out: dict[tuple[str, str], list[Candidate]] = {}
    for lesion in LESIONS:
        for path in SAMPLE_PATHS:
            pool = list(pools.get((lesion, path), ()))
            order = seeded_rng(seed, "sample", lesion, path).permutation(len(pool))
            chosen: list[Candidate] = []
            for i in order:
                if len(chosen) >= requested[path]:
                    break
                cand = pool[int(i)]
                if cand.dicom_id in used:
                    continue
                used.add(cand.dicom_id)
                chosen.append(cand)
            out[(lesion, path)] = sorted(chosen, key=lambda c: c.key_id)
    return out


@dataclass(frozen=True)
class CountTable:
    """The §1.4 arithmetic for per-lesion counts ``(LF, RF, RR)`` (or achieved counts per lesion)."""

    cxrs: int
    items: int
    items_per_lesion: dict[str, int]
    tasks: dict[str, int]


def _items_per_case(lesion: str, path: str) -> dict[str, int]:
    """Questions asked in one case of ``lesion`` on ``path`` (§1.2, §1.3)."""
    tasks = dict.fromkeys(TASKS, 0)
    tasks["detection"] = 1
    if path == PATH_LESION_FREE:
        return tasks
    tasks["contour evaluation"] = 1
    if path == PATH_REVISION_REQUIRED:
        for t in ("expansion", "contraction", "revision result"):
            tasks[t] = 1
    if traits(lesion).percept.attributes:
        for t in ("distribution", "location", "severity", "comparison"):
            tasks[t] = 1
    return tasks


def count_arithmetic(counts: Mapping[str, Mapping[str, int]] | Sequence[int]) -> CountTable:
    """CXRs, items per lesion and per task for per-lesion path counts.

    ``counts`` is either ``(LF, RF, RR)`` for every lesion, or ``{lesion: {path: n}}`` (achieved counts).
    With ``(100, 100, 100)``: 2,100 CXRs and 10,400 items.
    """
    if not isinstance(counts, Mapping):
        lf, rf, rr = (int(v) for v in counts)
        counts = {lesion: {PATH_LESION_FREE: lf, PATH_REVISION_FREE: rf, PATH_REVISION_REQUIRED: rr}
                  for lesion in LESIONS}
    tasks = dict.fromkeys(TASKS, 0)
    per_lesion: dict[str, int] = {}
    cxrs = 0
    for lesion in LESIONS:
        per_lesion[lesion] = 0
        for path in SAMPLE_PATHS:
            n = int(counts.get(lesion, {}).get(path, 0))
            cxrs += n
            for task, k in _items_per_case(lesion, path).items():
                tasks[task] += n * k
                per_lesion[lesion] += n * k
    return CountTable(cxrs=cxrs, items=sum(per_lesion.values()), items_per_lesion=per_lesion, tasks=tasks)
