"""``review export`` while reviewers keep deciding (one snapshot for every output) and with items only some of
their reviewers have rated (undecided until all of them have)."""

from __future__ import annotations

import csv
import json
import shutil

import numpy as np
import pytest
from click.testing import CliRunner

import cxrground.review.db as review_db
from cxrground.cli import main
from cxrground.ils.predictions import load_predictions
from cxrground.io.masks import decode_rle, encode_rle, read_mask_png
from cxrground.percept.cases import read_review
from cxrground.review.db import ReviewDB
from cxrground.review.export import export_review
from cxrground.review.stats import format_stats, review_stats
from review_helpers import review_setup


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    return review_setup(tmp_path_factory)


def _rows(path) -> dict[str, dict[str, str]]:
    return {r["key_id"]: r for r in csv.DictReader(path.open())}


def test_an_export_writes_every_output_from_one_snapshot(setup, tmp_path, monkeypatch) -> None:
    db = setup.copy(tmp_path / "db")
    pairs = [a for a in db.assignments() if a.item.kind == "ils" and a.item.positive]
    target = pairs[0].item
    for a in pairs:
        if a.item.id == target.id:
            db.record(a.id, "pair", "accept")
    h, w = target.height, target.width
    fix = decode_rle(target.mask, (h, w)).copy()
    fix[:10, :10] = ~fix[:10, :10]  # a correction that differs from the generated mask
    writer = next(a for a in pairs if a.item.id == target.id)
    other = ReviewDB(db.path)  # another connection, as a reviewer's request in the server

    real_item, injected = review_db._item, []

    def item_then_decide(row):  # a reviewer decides while the export is reading
        if not injected:
            injected.append(other.record(writer.id, "pair", "correct", mask=encode_rle(fix)))
        return real_item(row)

    monkeypatch.setattr(review_db, "_item", item_then_decide)
    out, masks = tmp_path / "decisions.csv", tmp_path / "masks"
    export_review(db, out, masks)
    monkeypatch.setattr(review_db, "_item", real_item)
    stored = next(a for a in db.assignments() if a.id == writer.id).decisions["pair"]
    assert injected and stored["decision"] == "correct"  # the decision was committed during the export
    generated = decode_rle(target.mask, (h, w))

    def outputs() -> tuple[str, bool, bool]:
        """The pair's corrected_mask cell, whether its PNG exists, whether its candidate is the generated mask."""
        candidate = load_predictions(masks / "candidates.jsonl")[target.payload["pair_id"]]
        return (_rows(out)[target.key]["corrected_mask"], (masks / f"{target.key}.png").is_file(),
                bool(np.array_equal(decode_rle(candidate.rle, (h, w)), generated)))

    assert outputs() == ("", False, True)  # no output has the decision: all show the state before it
    export_review(db, out, masks, overwrite=True)  # the next export has it everywhere
    assert outputs() == (f"{target.key}.png", True, False)
    voted = read_mask_png(masks / f"{target.key}.png", (h, w))
    np.testing.assert_array_equal(voted, fix | generated)  # 1 correct + 1 accept: a 1:1 vote keeps the pixel


def test_an_item_is_undecided_until_every_assigned_reviewer_rated_it(setup, tmp_path) -> None:
    ils = tmp_path / "ils"
    shutil.copytree(setup.ils_dir, ils)
    db_path = tmp_path / "partial.sqlite"
    runner = CliRunner()
    for name in ("r1", "r2"):
        assert runner.invoke(main, ["review", "add-user", name, "--db", str(db_path)]).exit_code == 0
    result = runner.invoke(main, ["review", "import", "--db", str(db_path), "--ils", str(ils), "--images",
                                  str(setup.images), "--split", "test", "--sample", "2", "--per-item", "2"])
    assert result.exit_code == 0, result.output
    db = ReviewDB(db_path)
    first, second = db.items()
    for a in db.assignments():
        if a.item.id == first.id or a.user_name == "r1":  # the first item by both, the second by r1 only
            db.record(a.id, "pair", "accept")
    out = tmp_path / "decisions.csv"
    result = runner.invoke(main, ["review", "export", "--db", str(db_path), "--out", str(out), "--card", str(ils)])
    assert result.exit_code == 0, result.output
    assert "2 items, 1 accepted, 0 rejected, 1 undecided (1 of them rated by some of their reviewers only)" \
        in result.output
    rows = _rows(out)
    assert rows[first.key]["decision"] == "accept" and rows[first.key]["assigned"] == rows[first.key]["done"] == "2"
    partial = rows[second.key]
    assert partial["decision"] == "" and partial["reviewer"] == "r1" and partial["ratings"] == "1"
    assert partial["assigned"] == "2" and partial["done"] == "1"
    review = read_review(out)  # percept build --review keeps only explicit accepts: the partial item is not
    assert review.accepted(first.key) and not review.accepted(second.key) and review.status(second.key) == "blank"
    summary = json.loads((ils / "review.json").read_text())
    assert summary["reviewed"] == 1 and summary["splits"]["test"]["reviewed"] == 1
    stats = review_stats(db)
    assert stats["items_complete"] == 1
    assert format_stats(stats).startswith("2 items (1 decided by all their reviewers), 4 assignments, 3 of 4")
