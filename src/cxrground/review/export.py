"""Export of review decisions: ``decisions.csv`` for ``percept build --review``, corrected masks, and the ILS
card's review section.

* **One snapshot**: an export reads the items, assignments and decisions once, in one read transaction
  (:meth:`~cxrground.review.db.ReviewDB.snapshot`), and writes every output from what it read, so the decisions
  file, the masks folder and the card agree even while reviewers keep deciding.
* ``decisions.csv`` has the header and first three columns that :func:`cxrground.percept.cases.read_review`
  reads (``key_id,decision,reviewer``; one row per item, extra columns are ignored by that reader): ``key_id`` is
  the CheXpercept key ``{lesion}_{pair_id}``, ``decision`` the consensus (:func:`cxrground.review.stats.consensus`;
  for a benchmark case ``reject`` when any question's consensus rejects, ``accept`` when every question's
  accepts) once every reviewer the item is assigned to has decided all of it, and blank until then (an item
  rated by 1 of its K reviewers is undecided), and ``reviewer`` the names of the reviewers who decided, joined by
  ``;``. Extra columns: ``kind, lesion, item_type, pair_id, ratings, accepted, corrected, rejected, reasons,
  corrected_mask, assigned, done, comment`` (``assigned``: reviewers the item is assigned to; ``done``: those of
  them who decided all of it; ``comment``: the reviewers' comments on their decisions now, one per line as
  ``reviewer: text``, for a benchmark case ``reviewer [part]: text``; blank when none).
* **Corrected masks** (``--masks DIR``): for an ILS pair kept by consensus (hence fully rated) and corrected by
  at least one
  reviewer, a pixelwise vote over the masks of the reviewers who kept it (``accept`` votes for the generated
  mask; a pixel is set when at least half the votes set it), written as ``DIR/<key_id>.png`` (0/255, native
  size) and indexed in ``DIR/masks.jsonl`` (COCO RLE, with ``comment``: ``{reviewer: text}`` of the reviewers who
  commented on the pair). ``DIR/candidates.jsonl`` is in the predictions format
  that ``percept build --candidates`` reads: every imported positive pair with its corrected mask when there is
  one, else its generated mask, so the benchmark is built from the corrected masks.
* **ILS card** (``--card ILS_DIR``): ``ILS_DIR/review.json`` (:data:`cxrground.ils.card.REVIEW_FILE`) with the
  reviewed share per split, the acceptance and the agreement, and the "Review status" section of
  ``ILS_DIR/card.md`` rewritten from it (a later ``ils build`` resume keeps it; an export rewrites them).
* **Outputs used before:** an existing ``decisions.csv`` or a non-empty masks folder is refused unless
  ``overwrite``; the masks folder is written in a staging folder and replaces an earlier one as a whole
  (:mod:`cxrground.io.export_dir`: a folder holding files no review export writes is never replaced).
"""

from __future__ import annotations

import csv
import io
import json
from collections import defaultdict
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from cxrground.errors import ConfigError, InputError
from cxrground.ils.card import REVIEW_FILE, with_review_section
from cxrground.ils.schema import SPLITS, check_splits, dataset_location, iter_dataset
from cxrground.io.export_dir import export_folder
from cxrground.io.files import atomic_write_text
from cxrground.io.masks import decode_rle, encode_rle, write_mask_png
from cxrground.io.output_lock import locks_output
from cxrground.percept.cases import key_id
from cxrground.review.db import Assignment, Item, ReviewDB, Snapshot
from cxrground.review.stats import consensus, fleiss_of, pairwise_cohen, ratings_of

__all__ = ["CSV_COLUMNS", "MASK_NAMES", "corrected_mask", "decision_rows", "export_review", "ils_card_summary",
           "write_card", "write_decisions", "write_masks"]

#: What ``--masks DIR`` holds (glob patterns): the masks, their index and the candidates (what ``overwrite`` replaces).
MASK_NAMES = ("*.png", "masks.jsonl", "candidates.jsonl")
CSV_COLUMNS = ("key_id", "decision", "reviewer", "kind", "lesion", "item_type", "pair_id", "ratings", "accepted",
               "corrected", "rejected", "reasons", "corrected_mask", "assigned", "done", "comment")


@dataclass(frozen=True)
class _Review:
    """The review state one export writes from: the items and their assignments grouped by item id."""

    items: list[Item]
    groups: dict[int, list[Assignment]]


def _review_of(source: ReviewDB | Snapshot) -> _Review:
    """``source`` grouped by item (a database is read as one :meth:`~ReviewDB.snapshot`)."""
    snap = source.snapshot() if isinstance(source, ReviewDB) else source
    groups: dict[int, list[Assignment]] = defaultdict(list)
    for a in snap.assignments:
        groups[a.item.id].append(a)
    return _Review(snap.items, groups)


def _item_decision(item: Item, assignments: Sequence[Assignment]) -> str:
    """The item's consensus (module docstring): blank until every assigned reviewer decided all of it."""
    if not assignments or not all(a.done for a in assignments):
        return ""
    per_part = [consensus(a.decisions[p]["decision"] for a in assignments if p in a.decisions) for p in item.parts]
    if "reject" in per_part:
        return "reject"
    return "accept" if per_part and all(d == "accept" for d in per_part) else ""


def _comments(item: Item, assignments: Sequence[Assignment]) -> list[tuple[str, str, str]]:
    """``(reviewer, part, comment)`` of every decision now with a comment, by reviewer then the item's part order."""
    return [(a.user_name, p, a.decisions[p].get("comment", ""))
            for a in sorted(assignments, key=lambda a: a.user_name) for p in item.parts
            if p in a.decisions and a.decisions[p].get("comment")]


def corrected_mask(item: Item, assignments: Sequence[Assignment]) -> np.ndarray | None:
    """The vote over the keepers' masks (module docstring), or None when nobody corrected the pair."""
    shape = (item.height, item.width)
    votes = []
    for a in assignments:
        d = a.decisions.get("pair")
        if d is None or d["decision"] == "reject":
            continue
        if d["decision"] == "correct" and d["mask"]:
            votes.append(("correct", decode_rle(d["mask"], shape)))
        elif item.mask:
            votes.append(("accept", decode_rle(item.mask, shape)))
    if not any(kind == "correct" for kind, _ in votes):
        return None
    stack = np.stack([m for _, m in votes])
    return stack.sum(axis=0) * 2 >= len(votes)


def decision_rows(source: ReviewDB | Snapshot) -> list[dict[str, Any]]:
    """One export row per item (columns :data:`CSV_COLUMNS`), in import order."""
    review = _review_of(source)
    rows = []
    for item in review.items:
        assigned = review.groups.get(item.id, [])
        decided = [(a.user_name, p, a.decisions[p]) for a in assigned for p in item.parts if p in a.decisions]
        decision = _item_decision(item, assigned)
        reasons = sorted({(f"{p}: " if item.kind == "bench" else "") + d["reason"]
                          for _, p, d in decided if d["decision"] == "reject" and d["reason"]})
        has_fix = item.kind == "ils" and decision == "accept" and any(d["decision"] == "correct" for *_, d in decided)
        rows.append({
            "key_id": item.key, "decision": decision, "reviewer": ";".join(sorted({n for n, _, _ in decided})),
            "kind": item.kind, "lesion": item.lesion, "item_type": item.item_type,
            "pair_id": item.payload.get("pair_id", ""), "ratings": len(decided),
            "accepted": sum(d["decision"] == "accept" for *_, d in decided),
            "corrected": sum(d["decision"] == "correct" for *_, d in decided),
            "rejected": sum(d["decision"] == "reject" for *_, d in decided),
            "reasons": "; ".join(reasons), "corrected_mask": f"{item.key}.png" if has_fix else "",
            "assigned": len(assigned), "done": sum(a.done for a in assigned),
            "comment": "\n".join(f"{n} [{p}]: {c}" if item.kind == "bench" else f"{n}: {c}"
                                 for n, p, c in _comments(item, assigned))})
    return rows


def write_decisions(source: ReviewDB | Snapshot, out: str | Path) -> list[dict[str, Any]]:
    """Write ``decisions.csv`` (atomically); returns its rows."""
    rows = decision_rows(source)
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=CSV_COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    atomic_write_text(Path(out), buf.getvalue())
    return rows


def write_masks(source: ReviewDB | Snapshot, folder: str | Path) -> dict[str, int]:
    """Write the corrected masks, ``masks.jsonl`` and ``candidates.jsonl`` into ``folder``; returns counts."""
    folder = Path(folder)
    review = _review_of(source)
    index, candidates = [], []
    for item in review.items:
        if item.kind != "ils" or not item.positive:
            continue
        assigned = review.groups.get(item.id, [])
        fixed = corrected_mask(item, assigned) if _item_decision(item, assigned) == "accept" else None
        if fixed is not None:
            write_mask_png(folder / f"{item.key}.png", fixed)
            rle = encode_rle(fixed)
            index.append({"key_id": item.key, "pair_id": item.payload["pair_id"], "path": f"{item.key}.png",
                          "rle": rle, "comment": {n: c for n, _, c in _comments(item, assigned)}})
        else:
            rle = item.mask
        candidates.append({"pair_id": item.payload["pair_id"], "answer": item.payload["answer"], "mask": rle})
    atomic_write_text(folder / "masks.jsonl", "".join(json.dumps(r, sort_keys=True) + "\n" for r in index))
    atomic_write_text(folder / "candidates.jsonl", "".join(json.dumps(r, sort_keys=True) + "\n" for r in candidates))
    return {"corrected": len(index), "candidates": len(candidates)}


def ils_card_summary(source: ReviewDB | Snapshot, ils_dir: str | Path) -> dict[str, Any]:
    """The ILS card's review figures for the dataset in ``ils_dir`` (the folder or its JSON file; items imported
    from it only). A pair counts as reviewed once every reviewer it is assigned to decided it."""
    ils_dir, dataset_file = dataset_location(Path(ils_dir).resolve())
    totals, keys = _pair_counts(dataset_file)
    review = _review_of(source)
    groups = review.groups
    mine = _items_of_folder(review.items, ils_dir, keys)
    assignments = [a for i in mine for a in groups.get(i.id, [])]
    ratings = ratings_of(assignments)
    decided = {i.id: _item_decision(i, groups.get(i.id, [])) for i in mine}
    splits = {}
    for split in SPLITS:
        total = totals[split]
        in_split = [i for i in mine if i.payload.get("split") == split]
        reviewed = [i for i in in_split if decided[i.id]]
        accepted = sum(decided[i.id] == "accept" for i in reviewed)
        splits[split] = {"pairs": total, "imported": len(in_split), "reviewed": len(reviewed),
                         "reviewed_share": len(reviewed) / total if total else None,
                         "accepted": accepted, "acceptance": accepted / len(reviewed) if reviewed else None}
    fk, fk_units = fleiss_of(ratings)
    cohen = [p for p in pairwise_cohen(ratings) if p["kappa"] == p["kappa"]]
    reviewed_all = [i for i in mine if decided[i.id]]
    return {
        "reviewers": sorted({r.reviewer for r in ratings}), "ratings": len(ratings), "splits": splits,
        "reviewed": len(reviewed_all),
        "accepted": sum(decided[i.id] == "accept" for i in reviewed_all),
        "corrected": sum(1 for i in mine if i.positive and decided[i.id] == "accept"
                         and corrected_mask(i, groups.get(i.id, [])) is not None),
        "fleiss_kappa": None if fk != fk else fk, "fleiss_units": fk_units,
        "mean_cohen_kappa": sum(p["kappa"] for p in cohen) / len(cohen) if cohen else None,
        "consensus_rule": "once every assigned reviewer decided: strict majority of the ratings keeps (accept "
                          "or correct); ties reject",
    }


def _pair_counts(dataset_file: Path) -> tuple[dict[str, int], set[str]]:
    """Pairs per split of an ILS dataset and the review keys of its pairs (the file read as a stream)."""
    check_splits(dataset_file)
    totals = dict.fromkeys(SPLITS, 0)
    keys: set[str] = set()
    for split, _key, study in iter_dataset(dataset_file, ()):
        for group in ("positive_pairs", "negative_pairs"):
            for p in study["instruction_answer_pairs"].get(group, []):
                totals[split] += 1
                keys.add(key_id(p["target"], p["pair_id"]))
    return totals, keys


def _items_of_folder(items: Sequence[Item], ils_dir: Path, keys: set[str]) -> list[Item]:
    """The ILS items imported from ``ils_dir``, or from the one folder it is a copy of (the same pair ``keys``)."""
    mine = [i for i in items if i.kind == "ils" and Path(i.source) == ils_dir]
    if mine:
        return mine
    mine = [i for i in items if i.kind == "ils" and i.key in keys]
    sources = sorted({i.source for i in mine})
    if len(sources) > 1:
        raise InputError("no review item was imported from this ILS folder, and its pairs were imported from "
                         f"several folders ({', '.join(sources)}): pass the folder they were imported from", ils_dir)
    if not mine:
        raise InputError("no review item of the database was imported from this ILS folder or a copy of it "
                         "(no pair of its dataset is in the database)", ils_dir)
    return mine


def write_card(review: ReviewDB | Snapshot, ils_dir: str | Path, source: str) -> dict[str, Any]:
    """Write ``ILS_DIR/review.json`` and rewrite the card's review section (``ils_dir``: the dataset folder or its
    JSON file; ``source``: the decisions file named in it); returns the summary."""
    folder = dataset_location(ils_dir)[0]
    summary = {"source": source, **ils_card_summary(review, ils_dir)}
    atomic_write_text(folder / REVIEW_FILE, json.dumps(summary, indent=2, sort_keys=True) + "\n")
    card = folder / "card.md"
    if card.is_file():
        atomic_write_text(card, with_review_section(card.read_text(encoding="utf-8"), summary))
    return summary


@locks_output("review export", "out")
def export_review(db: ReviewDB, out: str | Path, masks_dir: str | Path | None = None,
                  card_dir: str | Path | None = None, overwrite: bool = False) -> list[str]:
    """Write the decisions CSV (and the corrected masks, and the ILS card's review section); one line per file.
    An existing ``out`` or non-empty ``masks_dir`` is a :class:`ConfigError` naming it unless ``overwrite``
    (module docstring)."""
    out = Path(out)
    snap = db.snapshot()  # every output below is written from this one read
    if card_dir is not None:  # refused before anything is written
        ils_card_summary(snap, card_dir)
    if out.exists() and not overwrite:
        raise ConfigError(f"{out} exists; choose another --out or pass --overwrite to replace it")
    with ExitStack() as staged:
        if masks_dir is not None:
            if Path(masks_dir).resolve() in (out.resolve(), *out.resolve().parents):
                raise ConfigError(f"--out {out} is inside --masks {masks_dir}, which an export replaces as a whole; "
                                  "write it elsewhere")
            counts = write_masks(snap, staged.enter_context(export_folder(masks_dir, overwrite, MASK_NAMES,
                                                                          "review masks")))
        rows = write_decisions(snap, out)  # the staged masks take the place of masks_dir once it is written
    partly = sum(not r["decision"] and r["ratings"] > 0 for r in rows)
    lines = [f"{out}: {len(rows)} items, {sum(r['decision'] == 'accept' for r in rows)} accepted, "
             f"{sum(r['decision'] == 'reject' for r in rows)} rejected, "
             f"{sum(not r['decision'] for r in rows)} undecided"
             + (f" ({partly} of them rated by some of their reviewers only)" if partly else "")]
    if masks_dir is not None:
        lines.append(f"{masks_dir}: {counts['corrected']} corrected masks, candidates.jsonl with "
                     f"{counts['candidates']} pairs" + ("" if counts["candidates"] else
                                                        " (no positive ILS pair was imported: `percept build` "
                                                        "needs no --candidates, it uses the dataset's masks)"))
    if card_dir is not None:
        summary = write_card(snap, card_dir, out.name)
        card = dataset_location(card_dir)[0] / "card.md"
        lines.append(f"{card}: review section updated ({summary['reviewed']} pairs reviewed)")
    return lines
