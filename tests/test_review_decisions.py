"""Decisions the review app must not take silently: a write over a decision made since the page loaded (another tab
or session) is refused with what is stored now and replaced only on an explicit overwrite; every write is kept in
a history that `review history` reads back (masks included) while `review export` exports the latest; an accept of
an item whose image the app cannot serve is refused. Page routes answer errors as pages, the API as JSON; a page
older than its session reads the new CSRF token from /api/me; a refused sign-in keeps the typed name."""

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
from cxrground.io.masks import decode_rle
from cxrground.review.app import create_app, rle_runs
from cxrground.review.db import ReviewDB
from review_helpers import review_setup, user_named


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    return review_setup(tmp_path_factory)


def _bearer(db: ReviewDB, token: str) -> TestClient:
    return TestClient(create_app(db), headers={"Authorization": f"Bearer {token}"})


def _sign_in(http: TestClient, name: str, token: str) -> str:
    """Sign in through the form (as a browser); returns the CSRF token the pages carry."""
    form = http.get("/login").text.split("name='csrf' value='", 1)[1].split("'", 1)[0]
    r = http.post("/login", data={"csrf": form, "name": name, "token": token}, follow_redirects=False)
    assert r.status_code == 303, r.text
    return http.get("/queue").text.split("name='csrf-token' content='", 1)[1].split("'", 1)[0]


def test_a_write_over_a_decision_made_since_is_refused_and_every_write_is_kept(setup, tmp_path) -> None:
    db = setup.copy(tmp_path / "db")
    alice = user_named(db, "alice")
    pair = next(a for a in db.assignments(alice) if a.item.kind == "ils" and a.item.positive)
    h, w = pair.item.height, pair.item.width
    url = f"/api/assignments/{pair.id}/decision"
    drawn = np.zeros((h, w), bool)
    drawn[h // 4: h // 2, w // 3: w // 2] = True
    correction = {"part": "pair", "decision": "correct", "mask": {"size": [h, w], "counts": rle_runs(drawn)}}
    with _bearer(db, setup.tokens["alice"]) as http:
        assert http.get(f"/api/assignments/{pair.id}").json()["decisions"] == {}  # both tabs load: version 0
        first = http.post(url, json={**correction, "expected_version": 0})  # tab 1 saves a correction
        assert first.status_code == 200 and first.json()["version"] == 1, first.text
        stale = http.post(url, json={"part": "pair", "decision": "accept", "expected_version": 0})  # tab 2
        assert stale.status_code == 409, stale.text
        error = stale.json()["error"]
        assert error["type"] == "conflict" and "decided meanwhile" in error["message"]
        assert error["stored"]["decision"] == "correct" and error["stored"]["version"] == 1
        assert abs(error["stored"]["updated"] - first.json()["updated"]) < 1e-6
        assert db.assignment(pair.id, alice).decisions["pair"]["decision"] == "correct"  # nothing was written
        for bad in ({"expected_version": "1"}, {"expected_version": -1}, {"expected_version": True},
                    {"overwrite": "yes"}):
            r = http.post(url, json={"part": "pair", "decision": "accept", **bad})
            assert r.status_code == 400, (bad, r.text)
        replaced = http.post(url, json={"part": "pair", "decision": "accept", "expected_version": 1,
                                        "overwrite": True})  # the reviewer said: replace it
        assert replaced.status_code == 200 and replaced.json()["version"] == 2
        seen = http.get(f"/api/assignments/{pair.id}").json()["decisions"]["pair"]
        assert seen["decision"] == "accept" and seen["version"] == 2
    stored = db.assignment(pair.id, alice).decisions["pair"]
    assert stored["decision"] == "accept" and stored["mask"] is None and stored["version"] == 2
    history = db.history(key=pair.item.key)
    assert [(r["reviewer"], r["decision"], r["version"], r["replaced_version"], r["overwrite"], r["latest"])
            for r in history] == [("alice", "correct", 1, None, False, False), ("alice", "accept", 2, 1, True, True)]
    np.testing.assert_array_equal(decode_rle(history[0]["mask"], (h, w)), drawn)  # the correction is recoverable
    assert {r["via"] for r in history} == {"token"}

    bob = user_named(db, "bob")
    theirs = next(a for a in db.assignments(bob) if a.item.id == pair.item.id)
    db.record(theirs.id, "pair", "accept")  # both reviewers decided: the export has a consensus row
    runner = CliRunner()
    out = tmp_path / "decisions.csv"
    assert runner.invoke(main, ["review", "export", "--db", str(db.path), "--out", str(out)]).exit_code == 0
    row = next(r for r in csv.DictReader(out.open()) if r["key_id"] == pair.item.key and r["kind"] == "ils")
    assert row["decision"] == "accept" and row["corrected"] == "0", row  # the latest decision
    shown = runner.invoke(main, ["review", "history", "--db", str(db.path), "--key", pair.item.key])
    assert shown.exit_code == 0, shown.output
    lines = [line for line in shown.output.splitlines() if line.strip()]
    assert len(lines) == 3 and "alice" in lines[0] and "correct with a mask" in lines[0]
    assert "replaced v1 decided meanwhile (overwrite)" in lines[1] and "latest" in lines[1]
    jsonl = tmp_path / "history.jsonl"
    wrote = runner.invoke(main, ["review", "history", "--db", str(db.path), "--reviewer", "alice", "--out",
                                 str(jsonl)])
    assert wrote.exit_code == 0 and "wrote 2 decision(s)" in wrote.output and "1 replaced" in wrote.output
    rows = [json.loads(line) for line in jsonl.read_text().splitlines()]
    np.testing.assert_array_equal(decode_rle(rows[0]["mask"], (h, w)), drawn)


def test_an_older_database_gets_versions_and_its_decisions_start_the_history(setup, tmp_path) -> None:
    db = setup.copy(tmp_path / "db")
    alice = user_named(db, "alice")
    a = db.assignments(alice)[0]
    db.record(a.id, a.item.parts[0], "reject", "other")
    with sqlite3.connect(db.path) as con:  # the schema before versions and history
        con.execute("DROP TABLE decision_history")
        con.execute("ALTER TABLE decisions DROP COLUMN version")
    reopened = ReviewDB(db.path)
    stored = reopened.assignment(a.id, alice).decisions[a.item.parts[0]]
    assert stored["decision"] == "reject" and stored["version"] == 1
    [row] = reopened.history()
    assert (row["decision"], row["reason"], row["version"], row["latest"], row["via"]) == \
        ("reject", "other", 1, True, "before history")
    assert reopened.write_decision(a.id, a.item.parts[0], "accept", expected_version=1).version == 2
    ReviewDB(db.path)  # idempotent: the history is not seeded twice
    assert len(ReviewDB(db.path).history()) == 2


def test_an_item_whose_image_cannot_be_served_can_only_be_rejected(setup, tmp_path) -> None:
    db = setup.copy(tmp_path / "db")
    alice = user_named(db, "alice")
    queue = db.assignments(alice)
    missing, corrupt = [a for a in queue if a.item.kind == "ils"][:2]
    case = next(a for a in queue if a.item.kind == "bench")
    (tmp_path / "corrupt.png").write_bytes(b"\x89PNG\r\n\x1a\n truncated")
    with db.connect() as con:
        for a, path in ((missing, tmp_path / "gone.png"), (corrupt, tmp_path / "corrupt.png")):
            con.execute("UPDATE items SET images = ? WHERE id = ?",
                        (json.dumps([{**a.item.images[0], "path": str(path)}]), a.item.id))
        images = [dict(im) for im in case.item.images]
        images[-1]["path"] = str(tmp_path / "gone-stage.png")  # one image of the case is gone
        con.execute("UPDATE items SET images = ? WHERE id = ?", (json.dumps(images), case.item.id))
    with _bearer(db, setup.tokens["alice"]) as http:
        detail = http.get(f"/api/assignments/{missing.id}").json()
        assert detail["unreadable_reason"] == "image unreadable"
        for a, status, kind in ((missing, 404, "image_missing"), (corrupt, 422, "image_unreadable")):
            r = http.post(f"/api/assignments/{a.id}/decision", json={"part": "pair", "decision": "accept"})
            assert r.status_code == status and r.json()["error"]["type"] == kind, r.text
            assert "reject it as 'image unreadable'" in r.json()["error"]["message"]
            assert str(tmp_path) not in r.text
            if a.item.positive:
                h, w = a.item.height, a.item.width
                r = http.post(f"/api/assignments/{a.id}/decision", json={
                    "part": "pair", "decision": "correct", "mask": {"size": [h, w], "counts": [0, h * w]}})
                assert r.status_code == status, r.text
            assert not db.assignment(a.id, alice).decisions
            r = http.post(f"/api/assignments/{a.id}/decision",
                          json={"part": "pair", "decision": "reject", "reason": "image unreadable"})
            assert r.status_code == 200, r.text
        part = case.item.parts[0]
        r = http.post(f"/api/assignments/{case.id}/decision", json={"part": part, "decision": "accept"})
        assert r.status_code == 404 and "image unclear" in r.json()["error"]["message"], r.text
        r = http.post(f"/api/assignments/{case.id}/decision",
                      json={"part": part, "decision": "reject", "reason": "image unclear"})
        assert r.status_code == 200, r.text


def test_pages_answer_errors_as_pages_and_the_api_as_json(setup, tmp_path) -> None:
    db = setup.copy(tmp_path / "db")
    theirs = db.assignments(user_named(db, "bob"))[0]
    with TestClient(create_app(db)) as http:
        r = http.post("/login", data={"csrf": "stale", "name": "alice", "token": "x"})  # a form left open too long
        assert r.status_code == 403 and r.headers["content-type"].startswith("text/html")
        assert "sign-in form had expired" in r.text and "id='login-form'" in r.text and "value='alice'" in r.text
        form = r.text.split("name='csrf' value='", 1)[1].split("'", 1)[0]  # the form shown again works
        r = http.post("/login", data={"csrf": form, "name": "alice", "token": "wrong"})
        assert r.status_code == 401 and "wrong token" in r.text and "value='alice'" in r.text  # the name is kept
        _sign_in(http, "alice", setup.tokens["alice"])
        for path, status, words in (("/stats", 403, "for admins"), ("/review/999999", 404, "no such assignment"),
                                    (f"/review/{theirs.id}", 404, "no such assignment"), ("/review/abc", 404,
                                                                                           "not found")):
            r = http.get(path)
            assert r.status_code == status and r.headers["content-type"].startswith("text/html"), (path, r.text)
            assert words in r.text.lower() and "href='/queue'" in r.text and "role='alert'" in r.text, (path, r.text)
        for path, status in (("/api/stats", 403), ("/api/assignments/999999", 404), ("/api/assignments/abc", 404)):
            r = http.get(path)
            assert r.status_code == status and set(r.json()) == {"error"}, (path, r.text)


def test_a_page_older_than_its_session_reads_the_new_csrf_token(setup, tmp_path) -> None:
    db = setup.copy(tmp_path / "db")
    with TestClient(create_app(db)) as http:
        old = _sign_in(http, "alice", setup.tokens["alice"])
        aid = http.get("/api/queue").json()["assignments"][0]
        body = {"part": aid["parts"][0], "decision": "reject", "reason": "other"}
        url = f"/api/assignments/{aid['id']}/decision"
        new = _sign_in(http, "alice", setup.tokens["alice"])  # signed in again in another tab: a new session
        assert new != old
        r = http.post(url, json=body, headers={"X-CSRF-Token": old})
        assert r.status_code == 403 and r.json()["error"]["type"] == "csrf", r.text
        me = http.get("/api/me").json()
        assert me == {"name": "alice", "role": "reviewer", "csrf": new}
        assert http.post(url, json=body, headers={"X-CSRF-Token": me["csrf"]}).status_code == 200
        http.post("/logout", data={"csrf": new})
        assert http.get("/api/me").status_code == 401
    with _bearer(db, setup.tokens["alice"]) as bearer:
        assert "csrf" not in bearer.get("/api/me").json()  # a token holder has no session, no CSRF token
