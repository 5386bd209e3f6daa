"""``review_stats`` (``GET /api/stats``, ``review stats``) counts with SQL aggregates: the same JSON as the figures
computed from a full snapshot of the database, without building the items in Python or decoding a mask."""

from __future__ import annotations

import json
import random
from collections import Counter, defaultdict
from typing import Any

import numpy as np
import pytest

import cxrground.io.masks
import cxrground.review.db
from cxrground.io.masks import decode_rle, encode_rle
from cxrground.percept.cases import TASKS
from cxrground.review.db import REJECT_REASONS, ReviewDB
from cxrground.review.stats import (
    _nan_to_none,
    acceptance_table,
    dice,
    fleiss_of,
    pairwise_cohen,
    ratings_of,
    review_stats,
)

H, W = 24, 30


def _snapshot_stats(db: ReviewDB) -> dict[str, Any]:
    """The figures computed the way they were before SQL: every assignment read with its item and decisions, every
    corrected mask decoded."""
    snap = db.snapshot()
    assignments = snap.assignments
    ratings = ratings_of(assignments)
    by_item: dict[int, list[bool]] = defaultdict(list)
    for a in assignments:
        by_item[a.item.id].append(a.done)
    fk, fk_units = fleiss_of(ratings)
    dice_rows = []
    for a in assignments:
        d = a.decisions.get("pair")
        if a.item.kind != "ils" or d is None or d["decision"] != "correct" or not d["mask"] or not a.item.mask:
            continue
        shape = (a.item.height, a.item.width)
        dice_rows.append((a.item.lesion, dice(decode_rle(d["mask"], shape), decode_rle(a.item.mask, shape))))
    per_lesion: dict[str, list[float]] = defaultdict(list)
    for lesion, value in dice_rows:
        per_lesion[lesion].append(value)
    values = [v for _, v in dice_rows]
    reasons = Counter(r.reason for r in ratings if r.decision == "reject")
    return {
        "items": len(snap.items), "items_complete": sum(all(done) for done in by_item.values()),
        "assignments": len(assignments), "units_assigned": sum(len(a.item.parts) for a in assignments),
        "units_decided": sum(len([p for p in a.item.parts if p in a.decisions]) for a in assignments),
        "ratings": len(ratings),
        "reviewers": [{"reviewer": name, "assigned": sum(a.user_name == name for a in assignments),
                       "done": sum(a.done for a in assignments if a.user_name == name)}
                      for name in sorted({a.user_name for a in assignments})],
        "acceptance_by_lesion": acceptance_table(ratings, "lesion"),
        "acceptance_by_type": acceptance_table(ratings, "item_type"),
        "reject_reasons": dict(sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0]))),
        "cohen": [{**p, "kappa": _nan_to_none(p["kappa"])} for p in pairwise_cohen(ratings)],
        "fleiss": {"kappa": _nan_to_none(fk), "units": fk_units},
        "dice": {"n": len(values), "mean": float(np.mean(values)) if values else None,
                 "median": float(np.median(values)) if values else None,
                 "by_lesion": {k: {"n": len(v), "mean": float(np.mean(v))} for k, v in sorted(per_lesion.items())}},
    }


def _blob(rng: random.Random) -> np.ndarray:
    m = np.zeros((H, W), bool)
    y, x = rng.randrange(H - 6), rng.randrange(W - 6)
    m[y : y + rng.randrange(2, 7), x : x + rng.randrange(2, 7)] = True
    return m


def _mixed_db(path, seed: int) -> ReviewDB:
    """Five reviewers and an admin; ILS pairs (positive with masks, negative), CheXpercept cases of several
    questions (keyed like the ILS pair they come from) and an item in no queue; open, partly and fully decided
    assignments, 2 or 3 reviewers an item, accepts, rejections with reasons and corrections."""
    rng = random.Random(seed)
    db = ReviewDB.create(path)
    for name in ("ann", "bo", "cy", "dee", "eve"):
        db.add_user(name, "reviewer")
    db.add_user("boss", "admin")

    def ils(i: int, lesion: str, positive: bool, parts: bool = True) -> dict[str, Any]:
        payload: dict[str, Any] = {"pair_id": f"p{i}", "instruction": "x" * 200}
        if parts:
            payload["parts"] = ["pair"]
        return {"kind": "ils", "key": f"{lesion}_p{i}", "lesion": lesion, "positive": positive,
                "item_type": f"{rng.choice(['basic', 'global'])} {'positive' if positive else 'negative'}",
                "source": "/ils", "height": H, "width": W, "images": [{"path": "/x.png", "role": "cxr"}],
                "mask": encode_rle(_blob(rng)) if positive else None, "payload": payload}

    def bench(i: int, lesion: str) -> dict[str, Any]:
        return {"kind": "bench", "key": f"{lesion}_p{i}", "lesion": lesion, "positive": True,
                "item_type": rng.choice(["RF", "RR", "LF"]), "source": "/bench", "height": H, "width": W,
                "images": [], "mask": None,
                "payload": {"questions": [], "parts": rng.sample(TASKS, rng.randrange(1, 5))}}

    lesions = ["edema", "effusion", "nodule"]
    two = [ils(i, rng.choice(lesions), i % 3 != 0, parts=i != 4) for i in range(10)]
    two += [bench(i, it["lesion"]) for i, it in enumerate(two[:4])]  # same keys as ILS pairs, other kind
    three = [ils(10 + i, rng.choice(lesions), True) for i in range(3)] + [bench(20 + i, "edema") for i in range(2)]
    db.add_and_assign(two, 2)
    db.add_and_assign(three, 3)
    db.add_items([ils(99, "edema", True)])  # imported, in no queue
    for a in db.assignments():
        state = rng.random()
        if state < 0.2:
            continue  # open
        parts = a.item.parts if state > 0.5 else a.item.parts[: max(1, len(a.item.parts) - 1)]
        for part in parts:
            x = rng.random()
            if a.item.kind == "ils" and a.item.positive and x < 0.35:
                db.record(a.id, part, "correct", mask=encode_rle(_blob(rng) | decode_rle(a.item.mask)))
            elif x < 0.6:
                db.record(a.id, part, "reject", rng.choice(REJECT_REASONS[a.item.kind]))
            else:
                db.record(a.id, part, "accept")
    return db


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_sql_figures_are_the_snapshot_figures(tmp_path, seed) -> None:
    db = _mixed_db(tmp_path / "review.sqlite", seed)
    expected = _snapshot_stats(db)
    got = review_stats(db)
    assert json.dumps(got) == json.dumps(expected)  # the same JSON, float for float
    # the database has what the comparison is about
    assert got["dice"]["n"] and got["cohen"] and got["fleiss"]["units"] and got["reject_reasons"]
    assert len(got["reviewers"]) == 5 and 0 < got["items_complete"] < got["items"] - 1
    assert 0 < got["units_decided"] < got["units_assigned"]
    assert set(TASKS) & set(got["acceptance_by_type"]) and len(got["dice"]["by_lesion"]) >= 2


def test_an_empty_database_and_one_without_decisions(tmp_path) -> None:
    db = ReviewDB.create(tmp_path / "empty.sqlite")
    assert json.dumps(review_stats(db)) == json.dumps(_snapshot_stats(db))
    db.add_user("ann", "reviewer")
    db.add_and_assign([{"kind": "bench", "key": "edema_p1", "lesion": "edema", "positive": True, "item_type": "RR",
                        "source": "/b", "height": H, "width": W, "images": [], "mask": None,
                        "payload": {"parts": ["detection", "location"]}}], 1)
    stats = review_stats(db)
    assert json.dumps(stats) == json.dumps(_snapshot_stats(db))
    assert stats["units_assigned"] == 2 and stats["items_complete"] == 0 and stats["fleiss"]["kappa"] is None


def test_the_statistics_build_no_item_in_python_and_decode_no_mask(tmp_path, monkeypatch) -> None:
    db = _mixed_db(tmp_path / "review.sqlite", 0)
    expected = json.dumps(_snapshot_stats(db))

    def refused(*_: Any, **__: Any) -> None:
        raise AssertionError("the statistics read every item (or decoded a mask) into Python")

    monkeypatch.setattr(cxrground.review.db.ReviewDB, "snapshot", refused)
    monkeypatch.setattr(cxrground.review.db, "_item", refused)
    monkeypatch.setattr(cxrground.io.masks, "decode_rle", refused)
    monkeypatch.setattr("pycocotools.mask.decode", refused)
    assert json.dumps(review_stats(db)) == expected
