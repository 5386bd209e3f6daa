"""A reviewer's free-text comment on any decision (accept, correct, reject with any reason): stored with it as plain
text, kept in the history, returned by the API, exported by `review export` (the CSV's `comment` column and the
masks index) and shown by `review history`; too long or not text is refused with 400; a database made before
comments opens with empty ones."""

from __future__ import annotations

import csv
import json
import sqlite3

import numpy as np
import pytest

pytest.importorskip("fastapi")

from click.testing import CliRunner
from fastapi.testclient import TestClient

from cxrground.cli import main
from cxrground.review.app import MAX_COMMENT_CHARS, create_app, rle_runs
from cxrground.review.db import ReviewDB
from review_helpers import review_setup, user_named

HOSTILE = "<script>alert(1)</script><img src=x onerror=alert(2)> & \"quotes\"\nsecond line"


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    return review_setup(tmp_path_factory)


def test_every_decision_carries_a_comment_kept_in_history_api_export_and_cli(setup, tmp_path) -> None:
    db = setup.copy(tmp_path / "db")
    alice, bob = user_named(db, "alice"), user_named(db, "bob")
    pair = next(a for a in db.assignments(alice) if a.item.kind == "ils" and a.item.positive)
    theirs = next(a for a in db.assignments(bob) if a.item.id == pair.item.id)
    case = next(a for a in db.assignments(alice) if a.item.kind == "bench")
    h, w = pair.item.height, pair.item.width
    drawn = np.zeros((h, w), bool)
    drawn[h // 4: h // 2, w // 3: w // 2] = True
    url = f"/api/assignments/{pair.id}/decision"
    with TestClient(create_app(db), headers={"Authorization": f"Bearer {setup.tokens['alice']}"}) as http:
        r = http.post(url, json={"part": "pair", "decision": "reject", "reason": "other",
                                 "comment": "  projection looks rotated  "})
        assert r.status_code == 200 and r.json()["comment"] == "projection looks rotated", r.text
        r = http.post(url, json={"part": "pair", "decision": "correct", "comment": HOSTILE, "expected_version": 1,
                                 "mask": {"size": [h, w], "counts": rle_runs(drawn)}})
        assert r.status_code == 200 and r.json()["decision"] == "correct", r.text
        seen = http.get(f"/api/assignments/{pair.id}").json()["decisions"]["pair"]
        assert seen["comment"] == HOSTILE  # stored and returned as the text typed, nothing escaped or dropped
        for bad in ("x" * (MAX_COMMENT_CHARS + 1), 12, ["a"], "bell\x07"):
            r = http.post(url, json={"part": "pair", "decision": "accept", "comment": bad})
            assert r.status_code == 400 and "comment" in r.json()["error"]["message"], (bad, r.text)
        assert db.assignment(pair.id, alice).decisions["pair"]["version"] == 2  # the refused ones wrote nothing
        first = case.item.parts[0]
        r = http.post(f"/api/assignments/{case.id}/decision",
                      json={"part": first, "decision": "accept", "comment": "x" * MAX_COMMENT_CHARS})
        assert r.status_code == 200, r.text  # the cap itself is allowed
    db.record(theirs.id, "pair", "accept", comment="fine, but misses the retrocardiac part")

    history = db.history(key=pair.item.key)
    assert [(r["reviewer"], r["decision"], r["comment"]) for r in history] == [
        ("alice", "reject", "projection looks rotated"), ("alice", "correct", HOSTILE),
        ("bob", "accept", "fine, but misses the retrocardiac part")]

    runner = CliRunner()
    out, masks = tmp_path / "decisions.csv", tmp_path / "masks"
    done = runner.invoke(main, ["review", "export", "--db", str(db.path), "--out", str(out), "--masks", str(masks)])
    assert done.exit_code == 0, done.output
    rows = {(r["kind"], r["key_id"]): r for r in csv.DictReader(out.open(encoding="utf-8"))}
    row = rows[("ils", pair.item.key)]
    assert row["comment"] == f"alice: {HOSTILE}\nbob: fine, but misses the retrocardiac part", row
    assert rows[("bench", case.item.key)]["comment"] == f"alice [{first}]: " + "x" * MAX_COMMENT_CHARS
    assert all(r["comment"] == "" for k, r in rows.items() if k not in {("ils", pair.item.key),
                                                                        ("bench", case.item.key)})
    [index] = [json.loads(line) for line in (masks / "masks.jsonl").read_text().splitlines()]
    assert index["key_id"] == pair.item.key
    assert index["comment"] == {"alice": HOSTILE, "bob": "fine, but misses the retrocardiac part"}

    shown = runner.invoke(main, ["review", "history", "--db", str(db.path), "--key", pair.item.key])
    assert shown.exit_code == 0, shown.output
    lines = [line for line in shown.output.splitlines() if line.strip()]
    assert len(lines) == 3  # a comment's line break stays inside its line
    assert lines[0].endswith('comment: "projection looks rotated"'), lines[0]
    assert json.dumps(HOSTILE, ensure_ascii=False) in lines[1]
    jsonl = tmp_path / "history.jsonl"
    assert runner.invoke(main, ["review", "history", "--db", str(db.path), "--out", str(jsonl)]).exit_code == 0
    assert HOSTILE in [json.loads(line)["comment"] for line in jsonl.read_text().splitlines()]


def test_a_database_made_before_comments_opens_with_empty_ones(setup, tmp_path) -> None:
    db = setup.copy(tmp_path / "db")
    alice = user_named(db, "alice")
    a = db.assignments(alice)[0]
    db.record(a.id, a.item.parts[0], "reject", "other")
    with sqlite3.connect(db.path) as con:  # the schema before comments
        con.execute("ALTER TABLE decisions DROP COLUMN comment")
        con.execute("ALTER TABLE decision_history DROP COLUMN comment")
    reopened = ReviewDB(db.path)
    assert reopened.assignment(a.id, alice).decisions[a.item.parts[0]]["comment"] == ""
    assert [r["comment"] for r in reopened.history()] == [""]
    reopened.write_decision(a.id, a.item.parts[0], "accept", comment="on second look fine", expected_version=1)
    assert [r["comment"] for r in ReviewDB(db.path).history()] == ["", "on second look fine"]
