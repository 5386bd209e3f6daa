"""Changes a review needs after the first decisions: a comment edited alone (the decision kept; version, CSRF and
conflict rules of a decision; kept in the history), how long a sign-in lasts (`review serve --session-hours`), an
assignment taken out of a reviewer's queue (`review unassign`), and each item's film view (carried from the import,
migrated into older databases) that decides the page's R/L markers."""

from __future__ import annotations

import json
import shutil
import sqlite3
import time

import pytest

pytest.importorskip("fastapi")

from click.testing import CliRunner
from fastapi.testclient import TestClient

from cxrground.cli import main
from cxrground.errors import ConfigError
from cxrground.review.app import create_app
from cxrground.review.db import ReviewDB
from cxrground.review.importers import ils_items, import_items
from percept_build_helpers import synthetic_ils
from review_helpers import login, review_setup, user_named


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    return review_setup(tmp_path_factory)


def _bearer(db: ReviewDB, token: str) -> TestClient:
    return TestClient(create_app(db), headers={"Authorization": f"Bearer {token}"})


def test_a_comment_is_edited_alone_with_the_decisions_version_rules_and_kept_in_history(setup, tmp_path) -> None:
    db = setup.copy(tmp_path / "db")
    alice = user_named(db, "alice")
    pair = next(a for a in db.assignments(alice) if a.item.kind == "ils" and not a.item.positive)
    case = next(a for a in db.assignments(alice) if a.item.kind == "bench")
    url = f"/api/assignments/{pair.id}/comment"
    with _bearer(db, setup.tokens["alice"]) as http:
        undecided = http.post(url, json={"part": "pair", "comment": "too early", "expected_version": 0})
        assert undecided.status_code == 400 and "no decision" in undecided.json()["error"]["message"]
        r = http.post(f"/api/assignments/{pair.id}/decision",
                      json={"part": "pair", "decision": "reject", "reason": "wrong location", "comment": "first"})
        assert r.status_code == 200 and r.json()["version"] == 1, r.text
        r = http.post(url, json={"part": "pair", "comment": "  second thoughts\non the location  ",
                                 "expected_version": 1})
        assert r.status_code == 200, r.text
        assert (r.json()["comment"], r.json()["version"]) == ("second thoughts\non the location", 2)
        stored = http.get(f"/api/assignments/{pair.id}").json()["decisions"]["pair"]
        assert (stored["decision"], stored["reason"], stored["comment"], stored["version"]) == \
            ("reject", "wrong location", "second thoughts\non the location", 2)  # the decision itself unchanged
        stale = http.post(url, json={"part": "pair", "comment": "from an old tab", "expected_version": 1})
        assert stale.status_code == 409 and stale.json()["error"]["type"] == "conflict", stale.text
        assert stale.json()["error"]["stored"]["comment"] == "second thoughts\non the location"
        forced = http.post(url, json={"part": "pair", "comment": "", "expected_version": 1, "overwrite": True})
        assert forced.status_code == 200 and forced.json()["version"] == 3  # empty: the comment removed
        for bad in ({"part": "pair", "comment": "x" * 2001}, {"part": "pair", "comment": 5},
                    {"part": "nope", "comment": "x"}, {"part": "pair"}, ["pair"]):
            r = http.post(url, json=bad)
            assert r.status_code == 400, (bad, r.text)
        # a decision made over the comment edit's version is refused as any stale write
        r = http.post(f"/api/assignments/{pair.id}/decision",
                      json={"part": "pair", "decision": "accept", "expected_version": 2})
        assert r.status_code == 409, r.text
        part = case.item.parts[0]
        http.post(f"/api/assignments/{case.id}/decision", json={"part": part, "decision": "accept"})
        r = http.post(f"/api/assignments/{case.id}/comment", json={"part": part, "comment": "key fine",
                                                                   "expected_version": 1})
        assert r.status_code == 200 and db.assignment(case.id, alice).decisions[part]["comment"] == "key fine"
    bob_own = next(a for a in db.assignments(user_named(db, "bob")))
    with _bearer(db, setup.tokens["alice"]) as http:  # another reviewer's assignment: as if unknown
        assert http.post(f"/api/assignments/{bob_own.id}/comment", json={"part": "pair", "comment": "x"}
                         ).status_code == 404
    with _bearer(db, setup.tokens["boss"]) as http:  # an admin sees it but does not comment on it
        assert http.post(url, json={"part": "pair", "comment": "x"}).status_code == 403
    assert db.assignment(pair.id, alice).decisions["pair"]["version"] == 3  # none of the refused ones wrote

    history = db.history(key=pair.item.key, user="alice")
    assert [(r["decision"], r["comment"], r["version"], r["comment_only"], r["latest"]) for r in history] == [
        ("reject", "first", 1, False, False), ("reject", "second thoughts\non the location", 2, True, False),
        ("reject", "", 3, True, True)]
    assert history[2]["overwrite"] and history[1]["via"] == "token"
    shown = CliRunner().invoke(main, ["review", "history", "--db", str(db.path), "--key", pair.item.key,
                                      "--reviewer", "alice"])
    assert shown.exit_code == 0, shown.output
    lines = shown.output.splitlines()
    assert "comment edited (reject (wrong location) kept)" in lines[1] and \
        'comment: "second thoughts\\non the location"' in lines[1], lines


def test_a_comment_edit_from_the_page_session_needs_its_csrf_token(setup, tmp_path) -> None:
    db = setup.copy(tmp_path / "db")
    alice = user_named(db, "alice")
    pair = next(a for a in db.assignments(alice) if a.item.kind == "ils")
    db.record(pair.id, "pair", "accept", comment="ok")
    with TestClient(create_app(db), follow_redirects=False) as http:
        csrf = login(http, "alice", setup.tokens["alice"])
        body = {"part": "pair", "comment": "ok, small effusion too", "expected_version": 1}
        assert http.post(f"/api/assignments/{pair.id}/comment", json=body).status_code == 403
        r = http.post(f"/api/assignments/{pair.id}/comment", json=body, headers={"X-CSRF-Token": csrf})
        assert r.status_code == 200, r.text
    [*_, last] = db.history(key=pair.item.key, user="alice")
    assert (last["comment"], last["via"], last["comment_only"]) == ("ok, small effusion too", "session", True)


def test_session_hours_set_how_long_a_sign_in_lasts(setup, tmp_path, monkeypatch) -> None:
    db = setup.copy(tmp_path / "db")
    with TestClient(create_app(db, session_hours=0.5), follow_redirects=False) as http:
        before = time.time()
        login(http, "alice", setup.tokens["alice"])
    with sqlite3.connect(db.path) as con:
        [(expires,)] = con.execute("SELECT expires FROM sessions").fetchall()
    assert 1800 - 5 <= expires - before <= 1800 + 5
    with TestClient(create_app(db), follow_redirects=False) as http:  # the default: 12 hours
        before = time.time()
        login(http, "bob", setup.tokens["bob"])
    with sqlite3.connect(db.path) as con:
        expires = max(r[0] for r in con.execute("SELECT expires FROM sessions"))
    assert 12 * 3600 - 5 <= expires - before <= 12 * 3600 + 5
    for bad in (0, -1, 721):
        with pytest.raises(ConfigError, match="session hours"):
            create_app(db, session_hours=bad)

    import cxrground.review.launch as launch

    seen = {}
    monkeypatch.setattr(launch, "launch_app", lambda *a, **k: seen.update(k))
    runner = CliRunner()
    for given, expected in ((["--session-hours", "720"], 720.0), ([], 12.0), (["--session-hours", "1.5"], 1.5)):
        done = runner.invoke(main, ["review", "serve", "--db", str(db.path), *given])
        assert done.exit_code == 0 and seen["session_hours"] == expected, done.output
    for bad in ("0", "720.5", "-3", "ten"):
        done = runner.invoke(main, ["review", "serve", "--db", str(db.path), "--session-hours", bad])
        assert done.exit_code == 2 and "--session-hours" in done.output, done.output


def _unassign(db: ReviewDB, *args: str):
    return CliRunner().invoke(main, ["review", "unassign", "--db", str(db.path), *args])


def test_unassign_removes_undecided_assignments_and_decided_ones_only_when_forced(setup, tmp_path) -> None:
    db = setup.copy(tmp_path / "db")
    bob = user_named(db, "bob")
    queue = db.assignments(bob)
    decided, open_pair = (next(a for a in queue if a.item.kind == "ils" and a.item.positive),
                          next(a for a in queue if a.item.kind == "ils" and not a.item.positive))
    db.record(decided.id, "pair", "reject", "other", comment="not this one")
    db.write_comment(decided.id, "pair", "not this one at all", expected_version=1)

    done = _unassign(db, "--reviewer", "bob", "--key", open_pair.item.key, "--kind", "ils")
    assert done.exit_code == 0, done.output
    assert f"removed bob's assignment of ils {open_pair.item.key}" in done.output and "1 assignment(s)" in done.output
    assert open_pair.id not in {a.id for a in db.assignments(bob)}
    again = _unassign(db, "--reviewer", "bob", "--key", open_pair.item.key)
    assert again.exit_code == 1 and "nothing removed" in again.output, again.output

    refused = _unassign(db, "--reviewer", "bob", "--key", decided.item.key, "--kind", "ils")
    assert refused.exit_code == 1 and "--force" in refused.output and "nothing was removed" in refused.output
    assert decided.id in {a.id for a in db.assignments(bob)}
    forced = _unassign(db, "--reviewer", "bob", "--key", decided.item.key, "--kind", "ils", "--force")
    assert forced.exit_code == 0 and "decision of pair kept in the history" in forced.output, forced.output
    assert decided.id not in {a.id for a in db.assignments(bob)}
    kept = db.history(key=decided.item.key, user="bob")
    assert [(r["decision"], r["comment"], r["assignment"], r["latest"]) for r in kept] == [
        ("reject", "not this one", None, False), ("reject", "not this one at all", None, False)]
    assert all(r["removed"] for r in kept)
    shown = CliRunner().invoke(main, ["review", "history", "--db", str(db.path), "--reviewer", "bob"])
    assert shown.exit_code == 0 and shown.output.count("assignment removed") == 2, shown.output
    out = tmp_path / "decisions.csv"
    exported = CliRunner().invoke(main, ["review", "export", "--db", str(db.path), "--out", str(out)])
    assert exported.exit_code == 0, exported.output
    assert "not this one" not in out.read_text()  # a removed assignment's decision leaves the export
    # the id of a removed assignment is not reused by the history of a later one
    assert db.assign([decided.item.id], 3) >= 1
    assert len(db.history(key=decided.item.key, user="bob")) == 2

    left = db.assignments(bob)
    undecided = [a for a in left if not a.decisions]
    case = next(a for a in left if a.item.kind == "bench")
    db.record(case.id, case.item.parts[0], "accept")  # partly decided: not undecided
    every = _unassign(db, "--reviewer", "bob", "--undecided")
    assert every.exit_code == 0, every.output
    assert {a.id for a in db.assignments(bob)} == {case.id}
    assert f"{len(undecided) - 1} assignment(s) removed" in every.output
    assert [a.id for a in db.assignments(user_named(db, "alice"))]  # another reviewer's queue untouched
    assert _unassign(db, "--reviewer", "bob", "--undecided").exit_code == 1


@pytest.mark.parametrize("args", [[], ["--key", "x", "--undecided"], ["--kind", "ils", "--undecided"]])
def test_unassign_usage_errors_exit_2(setup, tmp_path, args) -> None:
    db = setup.copy(tmp_path / "db")
    done = _unassign(db, "--reviewer", "bob", *args)
    assert done.exit_code == 2, done.output


def test_unassign_names_an_unknown_reviewer(setup, tmp_path) -> None:
    db = setup.copy(tmp_path / "db")
    done = _unassign(db, "--reviewer", "zed", "--undecided")
    assert done.exit_code == 2 and "no user 'zed'" in done.output and "alice" in done.output, done.output


def test_items_carry_their_films_view_and_the_api_says_how_to_mark_r_and_l(tmp_path_factory, tmp_path) -> None:
    source, images = synthetic_ils(tmp_path_factory)
    ils = tmp_path / "ils"
    shutil.copytree(source, ils)
    data = json.loads((ils / "mimic_ils_instruction_answer.json").read_text())
    studies = sorted(data["train"])
    lateral, unknown, named = studies[0], studies[1], studies[2]
    for study, view in ((lateral, "LATERAL"), (unknown, None), (named, "PA")):
        unit = ils / "units" / f"{study}.json"
        unit.write_text(json.dumps({**json.loads(unit.read_text()), "view": view}))
    data["train"][named]["view"] = "ap"  # a view the study record states is taken before the unit's
    (ils / "mimic_ils_instruction_answer.json").write_text(json.dumps(data))
    items = ils_items(ils, images, ("train",))
    views = {i["payload"]["study"]: i["view"] for i in items}
    assert (views[lateral], views[unknown], views[named]) == ("LATERAL", None, "AP")

    db = ReviewDB.create(tmp_path / "r.sqlite")
    _, token = db.add_user("alice")
    chosen = [next(i for i in items if i["payload"]["study"] == s) for s in (lateral, unknown, named)]
    import_items(db, chosen, None, 0, 1)
    by_study = {a.item.payload["study"]: a for a in db.assignments()}
    with _bearer(db, token) as http:
        got = {s: http.get(f"/api/assignments/{by_study[s].id}").json() for s in by_study}
    assert (got[lateral]["view"], got[lateral]["orientation"]) == ("LATERAL", "none")
    assert (got[unknown]["view"], got[unknown]["orientation"]) == (None, "assumed")
    assert (got[named]["view"], got[named]["orientation"]) == ("AP", "frontal")


def test_a_benchmark_case_film_is_marked_as_the_frontal_film_the_benchmark_is_made_of(setup, tmp_path) -> None:
    db = setup.copy(tmp_path / "db")
    case = next(a for a in db.assignments(user_named(db, "alice")) if a.item.kind == "bench")
    with _bearer(db, setup.tokens["alice"]) as http:
        got = http.get(f"/api/assignments/{case.id}").json()
    assert (got["view"], got["orientation"]) == ("FRONTAL", "frontal")


def test_an_older_database_gains_views_and_a_history_that_outlives_assignments(setup, tmp_path) -> None:
    db = setup.copy(tmp_path / "db")
    alice = user_named(db, "alice")
    a = next(x for x in db.assignments(alice) if x.item.kind == "ils")
    db.record(a.id, "pair", "reject", "other", comment="old")
    with sqlite3.connect(db.path) as con:  # the schema before views and before assignments could be removed
        con.execute("ALTER TABLE items DROP COLUMN view")
        con.executescript("""
            CREATE TABLE old_history(
              id INTEGER PRIMARY KEY, assignment_id INTEGER NOT NULL REFERENCES assignments(id), part TEXT NOT NULL,
              user_id INTEGER NOT NULL REFERENCES users(id), decision TEXT NOT NULL, reason TEXT NOT NULL DEFAULT '',
              mask TEXT, at REAL NOT NULL, version INTEGER NOT NULL, replaced_version INTEGER,
              overwrite INTEGER NOT NULL DEFAULT 0, via TEXT NOT NULL DEFAULT '', comment TEXT NOT NULL DEFAULT '');
            INSERT INTO old_history SELECT id, assignment_id, part, user_id, decision, reason, mask, at, version,
              replaced_version, overwrite, via, comment FROM decision_history;
            DROP TABLE decision_history;
            ALTER TABLE old_history RENAME TO decision_history;""")
    reopened = ReviewDB(db.path)
    assert reopened.assignment(a.id, alice).item.view is None
    [row] = reopened.history()
    assert (row["decision"], row["comment"], row["key"], row["latest"], row["comment_only"]) == \
        ("reject", "old", a.item.key, True, False)
    reopened.write_comment(a.id, "pair", "newer", expected_version=1)
    assert len(ReviewDB(db.path).history()) == 2  # idempotent: opened again, nothing rebuilt twice
    # importing the same item again fills in its view, and only where it is unknown
    item = {"kind": "ils", "key": a.item.key, "lesion": a.item.lesion, "item_type": a.item.item_type,
            "positive": a.item.positive, "source": a.item.source, "height": a.item.height, "width": a.item.width,
            "images": a.item.images, "payload": a.item.payload, "mask": a.item.mask, "view": "PA"}
    assert reopened.add_items([item]) == []
    assert reopened.assignment(a.id, alice).item.view == "PA"
    reopened.add_items([{**item, "view": "LATERAL"}])
    assert reopened.assignment(a.id, alice).item.view == "PA"
