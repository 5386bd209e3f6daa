"""The review app's API and CLI: authentication, isolation between reviewers, CSRF, traversal attempts, validation,
two reviewers at once, a kill during review, and the export read back by ``percept build --review``."""

from __future__ import annotations

import csv
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("fastapi")

from click.testing import CliRunner

from cxrground.cli import main
from cxrground.ils.layout import DATASET_FILE
from cxrground.ils.predictions import load_predictions
from cxrground.io.masks import decode_rle, encode_rle, read_mask_png
from cxrground.percept.build import build_benchmark
from cxrground.percept.cases import read_review
from cxrground.percept.schema import load_benchmark
from cxrground.review.app import create_app, rle_runs
from cxrground.review.db import ReviewDB
from cxrground.review.export import write_decisions, write_masks
from cxrground.review.stats import review_stats
from cxrground.serve.run import BackgroundServer
from percept_build_helpers import synthetic_bench
from review_helpers import client, login, review_setup, served_copy


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    return review_setup(tmp_path_factory)


@pytest.fixture()
def live(setup, tmp_path):
    """(server, private db) on a fresh copy of the setup database."""
    with served_copy(setup, tmp_path / "db") as served:
        yield served


def _own(http, name: str) -> list[dict]:
    body = http.get("/api/queue").json()
    assert body["user"] == name
    return body["assignments"]


def test_health_is_public_and_everything_else_needs_a_login(live, setup) -> None:
    srv, _ = live
    with client(srv.url) as anon:
        assert anon.get("/healthz").json()["status"] == "ok"
        for path in ("/api/queue", "/api/me", "/api/assignments", "/api/assignments/1", "/api/assignments/1/image/0",
                     "/api/stats"):
            r = anon.get(path)
            assert r.status_code == 401, (path, r.status_code)
            assert r.headers["www-authenticate"] == "Bearer"
        assert anon.post("/api/assignments/1/decision", json={"part": "pair", "decision": "accept"}).status_code == 401
        for page in ("/", "/queue", "/review/1", "/stats", "/static/review.js"):
            r = anon.get(page)
            assert r.status_code == 303 and r.headers["location"] == "/login", page
        assert anon.get("/login").status_code == 200
        assert anon.get("/static/review.css").status_code == 200  # the login page's style only
    token = setup.tokens["alice"]
    for bad in ("", token[:-1] + ("A" if token[-1] != "A" else "B"), token.replace("rv1_", "rv2_"), "rv99_x",
                "not-a-token", setup.tokens["bob"] + "x"):
        with client(srv.url, bad or None) as c:
            assert c.get("/api/queue").status_code == 401, bad
    with client(srv.url) as c:
        assert c.get("/api/queue", headers={"Authorization": f"Basic {token}"}).status_code == 401


def test_add_user_prints_the_token_once_and_stores_only_a_hash(tmp_path) -> None:
    db_path = tmp_path / "r.sqlite"
    result = CliRunner().invoke(main, ["review", "add-user", "dana", "--db", str(db_path), "--role", "admin"])
    assert result.exit_code == 0, result.output
    token = result.output.strip().splitlines()[-1].split()[-1]
    user = ReviewDB(db_path).user_by_token(token)
    assert user is not None and user.name == "dana" and user.is_admin
    assert token.split("_", 1)[1].encode() not in db_path.read_bytes()
    for path in tmp_path.iterdir():
        assert token.split("_", 1)[1].encode() not in path.read_bytes()
    again = CliRunner().invoke(main, ["review", "add-user", "dana", "--db", str(db_path)])
    assert again.exit_code != 0 and "already exists" in again.output


def test_reviewers_see_only_their_own_assignments(live, setup) -> None:
    srv, db = live
    with client(srv.url, setup.tokens["alice"]) as alice, client(srv.url, setup.tokens["bob"]) as bob, \
            client(srv.url, setup.tokens["boss"]) as boss:
        mine, theirs = _own(alice, "alice"), _own(bob, "bob")
        assert mine and theirs
        assert {a["reviewer"] for a in mine} == {"alice"} and {a["reviewer"] for a in theirs} == {"bob"}
        assert [a["position"] for a in mine] == sorted(a["position"] for a in mine)
        others = {a["id"] for a in theirs} - {a["id"] for a in mine}
        every = {a.id for a in db.assignments()}
        for aid in sorted(others)[:5]:
            for path in (f"/api/assignments/{aid}", f"/api/assignments/{aid}/image/0"):
                assert alice.get(path).status_code == 404, path
            r = alice.post(f"/api/assignments/{aid}/decision", json={"part": "pair", "decision": "accept"})
            assert r.status_code == 404
        assert {a["id"] for a in alice.get("/api/assignments").json()["assignments"]} == {a["id"] for a in mine}
        assert alice.get("/api/stats").status_code == 403
        assert {a["id"] for a in boss.get("/api/assignments").json()["assignments"]} == every
        assert boss.get(f"/api/assignments/{mine[0]['id']}").json()["editable"] is False
        r = boss.post(f"/api/assignments/{mine[0]['id']}/decision", json={"part": mine[0]["parts"][0],
                                                                        "decision": "accept"})
        assert r.status_code == 403
        assert boss.get("/api/stats").json()["assignments"] == len(every)
    assert all(not a.decisions for a in db.assignments())


def test_traversal_attempts_never_reach_a_file(live, setup) -> None:
    srv, db = live
    secret = db.path.read_bytes()[:64]
    with client(srv.url, setup.tokens["alice"]) as alice:
        aid = _own(alice, "alice")[0]["id"]
        attempts = [f"/api/assignments/{aid}/image/..%2F..%2F..%2Fetc%2Fpasswd", f"/api/assignments/{aid}/image/-1",
                    f"/api/assignments/{aid}/image/99", f"/api/assignments/{aid}/image/0%2F..%2F1",
                    "/api/assignments/..%2F1", f"/api/assignments/{aid}/image/%2Fetc%2Fpasswd",
                    "/static/..%2Fdb.py", "/static/%2e%2e%2f%2e%2e%2fpyproject.toml", "/static/review.js%00.png",
                    "/static/../review/db.py", f"/api/assignments/{aid}/image/1e3", "/review/..%2Fstats"]
        for path in attempts:
            r = alice.get(path)
            assert r.status_code in (400, 404, 422), (path, r.status_code)
            assert b"root:" not in r.content and secret not in r.content and b"sqlite" not in r.content.lower()
        ok = alice.get(f"/api/assignments/{aid}/image/0")
        assert ok.status_code == 200 and ok.content.startswith(b"\x89PNG")


def test_decisions_are_validated_and_stored(live, setup) -> None:
    srv, db = live
    with client(srv.url, setup.tokens["alice"]) as alice:
        queue = _own(alice, "alice")
        pos = next(a for a in queue if a["kind"] == "ils" and "positive" in a["item_type"])
        neg = next(a for a in queue if a["kind"] == "ils" and "negative" in a["item_type"])
        detail = alice.get(f"/api/assignments/{pos['id']}").json()
        h, w = detail["height"], detail["width"]
        assert detail["payload"]["instruction"].endswith(".") and detail["payload"]["answer"].startswith("[SEG]")
        assert detail["payload"]["sentence"] and detail["reasons"] and detail["editable"]
        assert detail["mask"]["size"] == [h, w] and sum(detail["mask"]["counts"]) == h * w
        url = f"/api/assignments/{pos['id']}/decision"
        bad = [{"part": "pair", "decision": "reject"}, {"part": "pair", "decision": "reject", "reason": "meh"},
               {"part": "nope", "decision": "accept"}, {"part": "pair", "decision": "maybe"},
               {"part": "pair", "decision": "correct"},
               {"part": "pair", "decision": "correct", "mask": {"size": [h + 1, w], "counts": [(h + 1) * w]}},
               {"part": "pair", "decision": "correct", "mask": {"size": [h, w], "counts": [h * w - 1]}}, [1, 2]]
        for body in bad:
            r = alice.post(url, json=body)
            assert r.status_code == 400, (body, r.text)
        assert alice.post(url, content=b"{not json", headers={"Content-Type": "application/json"}).status_code == 400
        r = alice.post(f"/api/assignments/{neg['id']}/decision",
                       json={"part": "pair", "decision": "correct", "mask": {"size": [h, w], "counts": [h * w]}})
        assert r.status_code == 400 and "positive" in r.json()["error"]["message"]
        assert all(not a.decisions for a in db.assignments())

        drawn = np.zeros((h, w), bool)
        drawn[h // 4: h // 2, w // 3: w // 2] = True
        r = alice.post(url, json={"part": "pair", "decision": "correct",
                                  "mask": {"size": [h, w], "counts": rle_runs(drawn)}})
        assert r.status_code == 200 and r.json()["ok"] and r.json()["assignment_done"]
        stored = db.assignment(pos["id"], db.users()[0]).decisions["pair"]
        assert stored["decision"] == "correct" and isinstance(stored["mask"]["counts"], str)  # compressed COCO RLE
        np.testing.assert_array_equal(decode_rle(stored["mask"], (h, w)), drawn)
        assert alice.get(f"/api/assignments/{pos['id']}").json()["mask"]["counts"] == rle_runs(drawn)  # resumes
        r = alice.post(f"/api/assignments/{neg['id']}/decision",
                       json={"part": "pair", "decision": "reject", "reason": "wrong location"})
        assert r.status_code == 200
        after = _own(alice, "alice")
        assert {a["id"] for a in after if a["done"]} == {pos["id"], neg["id"]}
        assert alice.get("/api/queue").json()["next"] == next(a["id"] for a in after if not a["done"])


def _test_client(db: ReviewDB, token: str):
    """A client calling the app in-process (no port)."""
    from fastapi.testclient import TestClient

    return TestClient(create_app(db), headers={"Authorization": f"Bearer {token}"})


def test_an_empty_correction_is_refused_and_an_unchanged_one_is_an_accept(setup, tmp_path) -> None:
    db = setup.copy(tmp_path / "db")
    alice = next(u for u in db.users() if u.name == "alice")
    pos = next(a for a in db.assignments(alice) if a.item.kind == "ils" and a.item.positive)
    h, w = pos.item.height, pos.item.width
    url = f"/api/assignments/{pos.id}/decision"
    with _test_client(db, setup.tokens["alice"]) as http:
        r = http.post(url, json={"part": "pair", "decision": "correct", "mask": {"size": [h, w], "counts": [h * w]}})
        assert r.status_code == 400, r.text
        message = r.json()["error"]["message"]
        assert "empty mask means no lesion" in message and "reject the pair" in message
        assert not db.assignment(pos.id, alice).decisions
        generated = decode_rle(pos.item.mask, (h, w))
        r = http.post(url, json={"part": "pair", "decision": "correct",
                                 "mask": {"size": [h, w], "counts": rle_runs(generated)}})
        assert r.status_code == 200 and r.json()["decision"] == "accept", r.text
        stored = db.assignment(pos.id, alice).decisions["pair"]
        assert stored["decision"] == "accept" and stored["mask"] is None  # the generated mask: no correction
        changed = generated.copy()
        changed[0, 0] = not changed[0, 0]
        r = http.post(url, json={"part": "pair", "decision": "correct",
                                 "mask": {"size": [h, w], "counts": rle_runs(changed)}})
        assert r.status_code == 200 and r.json()["decision"] == "correct"
        assert db.assignment(pos.id, alice).decisions["pair"]["decision"] == "correct"


def test_the_pair_page_finds_previous_and_next_without_loading_the_queue(setup, tmp_path, monkeypatch) -> None:
    db = setup.copy(tmp_path / "db")
    alice = next(u for u in db.users() if u.name == "alice")
    queue = db.assignments(alice)
    for a in queue[1:3] + queue[-1:]:  # some decided, so next_open skips them (and wraps around)
        for part in a.item.parts:
            db.record(a.id, part, "accept")
    queue = db.assignments(alice)
    expected = {}
    for pos, a in enumerate(queue):
        later = [q for q in queue[pos + 1:] + queue[:pos] if not q.done]
        expected[a.id] = (pos, len(queue), queue[pos - 1].id if pos else None, later[0].id if later else None)
    real = ReviewDB.assignments

    def one_assignment_only(self, user=None):
        raise AssertionError("the pair page loaded a whole queue")

    with _test_client(db, setup.tokens["alice"]) as http:
        monkeypatch.setattr(ReviewDB, "assignments", one_assignment_only)
        got = {a.id: http.get(f"/api/assignments/{a.id}").json() for a in queue}
        monkeypatch.setattr(ReviewDB, "assignments", real)
    assert {k: (v["position"], v["total"], v["prev"], v["next_open"]) for k, v in got.items()} == expected
    with _test_client(db, setup.tokens["boss"]) as boss:  # an admin looking at another's assignment: that one alone
        seen = boss.get(f"/api/assignments/{queue[2].id}").json()
    assert (seen["position"], seen["total"], seen["prev"], seen["next_open"]) == (0, 1, None, None)


def test_a_stored_image_gone_missing_is_a_json_error_and_one_log_line_naming_it(setup, tmp_path, caplog) -> None:
    db = setup.copy(tmp_path / "db")
    alice = next(u for u in db.users() if u.name == "alice")
    queue = db.assignments(alice)
    film = next(a for a in queue if a.item.kind == "ils")
    case = next(a for a in queue if a.item.kind == "bench")
    moved = {}
    with db.connect() as con:  # each item's images are private copies the test can remove or spoil
        for a in (film, case):
            images = []
            for k, im in enumerate(a.item.images):
                copy = tmp_path / f"{a.item.kind}_{k}{Path(im['path']).suffix}"
                shutil.copyfile(im["path"], copy)
                images.append({**im, "path": str(copy)})
            con.execute("UPDATE items SET images = ? WHERE id = ?", (json.dumps(images), a.item.id))
            moved[a.id] = [Path(im["path"]) for im in images]
    moved[film.id][0].unlink()
    moved[case.id][0].unlink()
    moved[case.id][-1].write_bytes(b"not a png at all")
    cases = [(film.id, 0, 404, moved[film.id][0]), (case.id, 0, 404, moved[case.id][0])]
    if len(moved[case.id]) > 1:
        cases.append((case.id, len(moved[case.id]) - 1, 422, moved[case.id][-1]))
    with _test_client(db, setup.tokens["alice"]) as http:
        for aid, index, status, path in cases:
            caplog.clear()
            with caplog.at_level("WARNING", logger="cxrground.review.app"):
                r = http.get(f"/api/assignments/{aid}/image/{index}")
            assert r.status_code == status, r.text
            assert r.json()["error"]["message"].startswith("the stored image of this item")
            assert str(tmp_path) not in r.text  # the client learns nothing of the server's files
            lines = [rec.getMessage() for rec in caplog.records if rec.name == "cxrground.review.app"]
            assert len(lines) == 1 and str(path) in lines[0], lines
        shutil.copyfile(next(a for a in queue if a.item.kind == "ils" and a.id != film.id).item.images[0]["path"],
                        tmp_path / "spoiled.png")
        (tmp_path / "spoiled.png").write_bytes(b"\x89PNG\r\n\x1a\n truncated")
        with db.connect() as con:
            con.execute("UPDATE items SET images = ? WHERE id = ?",
                        (json.dumps([{**film.item.images[0], "path": str(tmp_path / "spoiled.png")}]), film.item.id))
        r = http.get(f"/api/assignments/{film.id}/image/0")
        assert r.status_code == 422 and r.json()["error"]["type"] == "image_unreadable", r.text


def test_csrf_on_cookie_posts(live, setup) -> None:
    srv, db = live
    with client(srv.url) as browser:
        login_page = browser.get("/login")
        form_token = login_page.text.split("name='csrf' value='", 1)[1].split("'", 1)[0]
        browser.cookies.clear()
        r = browser.post("/login", data={"csrf": form_token, "name": "alice", "token": setup.tokens["alice"]})
        assert r.status_code == 403  # no login cookie: a cross-site login post is refused
        browser.get("/login")
        r = browser.post("/login", data={"csrf": "forged", "name": "alice", "token": setup.tokens["alice"]})
        assert r.status_code == 403
        browser.get("/login")
        r = browser.post("/login", data={"csrf": browser.cookies.get("crg_review_login"), "name": "bob",
                                         "token": setup.tokens["alice"]})
        assert r.status_code == 401 and "wrong token" in r.text
        csrf = login(browser, "alice", setup.tokens["alice"])
        aid = _own(browser, "alice")[0]["id"]
        part = _own(browser, "alice")[0]["parts"][0]
        body = {"part": part, "decision": "accept"}
        assert browser.post(f"/api/assignments/{aid}/decision", json=body).status_code == 403
        assert browser.post(f"/api/assignments/{aid}/decision", json=body,
                            headers={"X-CSRF-Token": "x" * len(csrf)}).status_code == 403
        assert browser.post("/logout", data={"csrf": "nope"}).status_code == 403
        assert all(not a.decisions for a in db.assignments())
        r = browser.post(f"/api/assignments/{aid}/decision", json=body, headers={"X-CSRF-Token": csrf})
        assert r.status_code == 200
        page = browser.get("/queue")
        assert "content-security-policy" in page.headers and page.headers["x-frame-options"] == "DENY"
        assert browser.post("/logout", data={"csrf": csrf}).status_code == 303
        assert browser.get("/api/queue").status_code == 401


def test_two_reviewers_at_once(live, setup) -> None:
    srv, db = live
    errors: list[str] = []

    def review_all(name: str) -> None:
        with client(srv.url, setup.tokens[name]) as c:
            for a in _own(c, name):
                for part in a["parts"]:
                    r = c.post(f"/api/assignments/{a['id']}/decision", json={"part": part, "decision": "accept"})
                    if r.status_code != 200:
                        errors.append(f"{name} {a['id']} {part}: {r.status_code} {r.text}")

    threads = [threading.Thread(target=review_all, args=(n,)) for n in ("alice", "bob")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors
    users = {u.name: u for u in db.users()}
    for name in ("alice", "bob"):
        assert all(a.done for a in db.assignments(users[name]))
    stats = review_stats(db)
    assert stats["ratings"] == sum(len(a.item.parts) for a in db.assignments() if a.user_name in ("alice", "bob"))
    assert all(row["acceptance"] == 1.0 for row in stats["acceptance_by_lesion"].values())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_killed_server_keeps_every_acknowledged_decision(setup, tmp_path) -> None:
    db = setup.copy(tmp_path / "db")
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[1] / "src"),
                                                        os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-m", "cxrground", "review", "serve", "--db", str(db.path), "--port",
                             str(port)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        with client(url, setup.tokens["carol"]) as c:
            while True:
                try:
                    if c.get("/healthz").status_code == 200:
                        break
                except Exception:
                    pass
                assert proc.poll() is None and time.monotonic() < deadline, "review serve did not start"
                time.sleep(0.2)
            queue = _own(c, "carol")
            acked = []
            for a in queue[:3]:
                r = c.post(f"/api/assignments/{a['id']}/decision",
                           json={"part": a["parts"][0], "decision": "reject",
                                 "reason": c.get(f"/api/assignments/{a['id']}").json()["reasons"][0]})
                assert r.status_code == 200
                acked.append((a["id"], a["parts"][0], r.json()["decision_id"]))
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    reopened = ReviewDB(db.path)
    carol = next(u for u in reopened.users() if u.name == "carol")
    for aid, part, _ in acked:
        assignment = reopened.assignment(aid, carol)
        assert assignment is not None and assignment.decisions[part]["decision"] == "reject"
    assert len(acked) == 3


def test_export_closes_the_loop(setup, tmp_path_factory, tmp_path) -> None:
    db = setup.copy(tmp_path / "db")
    ils = [a for a in db.assignments() if a.item.kind == "ils"]
    positive = next(a for a in ils if a.item.positive)
    h, w = positive.item.height, positive.item.width
    fix = np.zeros((h, w), bool)
    fix[5:25, 10:40] = True
    for a in ils:
        if a.item.key == positive.item.key:
            db.record(a.id, "pair", "correct", mask=encode_rle(fix))
        else:
            db.record(a.id, "pair", "accept")
    bench = [a for a in db.assignments() if a.item.kind == "bench"]
    rejected_key = bench[0].item.key
    for a in bench:
        for part in a.item.parts:
            if a.item.key == rejected_key and part == a.item.parts[-1] and a.user_name == bench[0].user_name:
                db.record(a.id, part, "reject", "ambiguous question")
            else:
                db.record(a.id, part, "accept")
    out = tmp_path / "decisions.csv"
    rows = write_decisions(db, out)
    review = read_review(out)
    assert review.status(rejected_key) == "reject"  # 1 accept + 1 reject on that question: a tie rejects
    assert all(review.accepted(r["key_id"]) for r in rows if r["key_id"] != rejected_key)
    assert len(rows) == len(db.items())
    row = next(r for r in rows if r["key_id"] == positive.item.key)
    assert row["corrected"] == 2 and row["corrected_mask"] == f"{positive.item.key}.png"
    assert row["reviewer"] == ";".join(sorted(a.user_name for a in ils if a.item.key == positive.item.key))

    counts = write_masks(db, tmp_path / "masks")
    assert counts["corrected"] == 1
    np.testing.assert_array_equal(read_mask_png(tmp_path / "masks" / f"{positive.item.key}.png", (h, w)), fix)
    preds = load_predictions(tmp_path / "masks" / "candidates.jsonl")
    assert len(preds) == counts["candidates"] == sum(1 for i in db.items() if i.kind == "ils" and i.positive)

    result = CliRunner().invoke(main, ["review", "stats", "--db", str(db.path), "--html", str(tmp_path / "s.html")])
    assert result.exit_code == 0, result.output
    assert "Fleiss' kappa" in result.output and "mean Dice" in result.output
    assert "<table id='cohen'>" in (tmp_path / "s.html").read_text()
    stats = review_stats(db)
    assert stats["dice"]["n"] == 2 and 0.0 <= stats["dice"]["mean"] < 1.0
    assert stats["fleiss"]["units"] == sum(len(i.parts) for i in db.items())

    _, opts = synthetic_bench(tmp_path_factory)
    built = build_benchmark(replace(opts, review=str(out)), tmp_path / "rebuilt", progress=False)
    cases = load_benchmark(tmp_path / "rebuilt").cases
    assert rejected_key not in cases and built.cases == len(cases) >= 1
    assert "Expert review applied" in (tmp_path / "rebuilt" / "card.md").read_text()
    assert json.loads(json.dumps(stats))  # JSON-ready


def test_export_refuses_used_outputs_unless_overwrite_and_replaces_the_masks_as_a_whole(setup, tmp_path) -> None:
    db = setup.copy(tmp_path / "db")
    ils = [a for a in db.assignments() if a.item.kind == "ils"]
    positive = next(a for a in ils if a.item.positive)
    fix = np.zeros((positive.item.height, positive.item.width), bool)
    fix[5:25, 10:40] = True
    for a in ils:
        if a.item.key == positive.item.key:
            db.record(a.id, "pair", "correct", mask=encode_rle(fix))
    out, masks = tmp_path / "decisions.csv", tmp_path / "corrected"
    png = masks / f"{positive.item.key}.png"

    def export(*extra: str, to: Path = out):
        return CliRunner().invoke(main, ["review", "export", "--db", str(db.path), "--out", str(to), "--masks",
                                         str(masks), *extra])

    first = export()
    assert first.exit_code == 0, first.output
    assert png.is_file() and (masks / "candidates.jsonl").is_file()
    before = out.read_bytes()
    again = export()  # the decisions file is used
    assert again.exit_code != 0 and f"{out} exists" in again.output and "--overwrite" in again.output
    assert "Traceback" not in again.output and out.read_bytes() == before
    fresh = tmp_path / "fresh.csv"
    used = export(to=fresh)  # the masks folder is used
    assert used.exit_code != 0 and f"{masks} is not empty" in used.output and "--overwrite" in used.output
    assert not fresh.exists()
    inside = export(to=masks / "decisions.csv")
    assert inside.exit_code != 0 and "is inside --masks" in inside.output

    for a in ils:  # the corrected pair is rejected now: its mask must not stay behind
        if a.item.key == positive.item.key:
            db.record(a.id, "pair", "reject", "other")
    replaced = export("--overwrite")
    assert replaced.exit_code == 0, replaced.output
    assert not png.exists() and (masks / "masks.jsonl").read_text() == ""
    row = next(r for r in csv.DictReader(out.open()) if r["key_id"] == positive.item.key)
    assert row["decision"] == "reject"
    assert not list(tmp_path.glob(".corrected.*"))  # no staging folder left beside it

    (masks / "notes.txt").write_text("mine")  # a folder holding other files is never replaced
    foreign = export("--overwrite")
    assert foreign.exit_code != 0 and "notes.txt" in foreign.output and (masks / "notes.txt").is_file()


def test_ils_card_shows_the_review(setup, tmp_path) -> None:
    ils = tmp_path / "ils"
    shutil.copytree(setup.ils_dir, ils)
    db_path = tmp_path / "card.sqlite"
    runner = CliRunner()
    tokens = {}
    for name in ("r1", "r2"):
        result = runner.invoke(main, ["review", "add-user", name, "--db", str(db_path)])
        assert result.exit_code == 0, result.output
        tokens[name] = result.output.split()[-1]
    result = runner.invoke(main, ["review", "import", "--db", str(db_path), "--ils", str(ils), "--images",
                                  str(setup.images), "--split", "test", "--sample", "4", "--seed", "1",
                                  "--per-item", "2"])
    assert result.exit_code == 0, result.output
    assert "4 sampled, 4 added (0 already there), 8 assignments" in result.output
    again = runner.invoke(main, ["review", "import", "--db", str(db_path), "--ils", str(ils), "--images",
                                 str(setup.images), "--split", "test", "--sample", "4", "--seed", "1"])
    assert "0 added (4 already there)" in again.output
    db = ReviewDB(db_path)
    for k, a in enumerate(db.assignments()):
        reject = a.user_name == "r2" and k % 2 == 0
        db.record(a.id, "pair", "reject" if reject else "accept", "other" if reject else "")
    out = tmp_path / "decisions.csv"
    result = runner.invoke(main, ["review", "export", "--db", str(db_path), "--out", str(out), "--card", str(ils)])
    assert result.exit_code == 0, result.output
    summary = json.loads((ils / "review.json").read_text())
    rows = list(csv.DictReader(out.open()))
    accepted = sum(r["decision"] == "accept" for r in rows)
    test_pairs = summary["splits"]["test"]["pairs"]
    assert summary["splits"]["test"]["reviewed"] == 4 and summary["splits"]["train"]["reviewed"] == 0
    assert summary["accepted"] == accepted and summary["reviewers"] == ["r1", "r2"] and summary["fleiss_units"] == 4
    card = (ils / "card.md").read_text()
    assert "No split has been reviewed" not in card and "## Review status" in card
    assert f"| test | {test_pairs:,} | 4 | {100 * 4 / test_pairs:.1f} % | {accepted} | {100 * accepted / 4:.1f} % |" \
        in card
    assert "Fleiss' κ" in card and "## Backends and settings" in card

    moved = tmp_path / "moved"  # a copy of the imported folder is the same dataset: its card gets the review
    shutil.copytree(ils, moved)
    (moved / "review.json").unlink()
    result = runner.invoke(main, ["review", "export", "--db", str(db_path), "--out", str(out), "--card", str(moved),
                                  "--overwrite"])
    assert result.exit_code == 0, result.output
    assert json.loads((moved / "review.json").read_text())["reviewed"] == summary["reviewed"]

    other = tmp_path / "other"  # a dataset none of whose pairs was imported is refused before anything is written
    shutil.copytree(ils, other)
    data = json.loads((other / DATASET_FILE).read_text())
    for split in data.values():
        for study in (split or {}).values():
            for group in study["instruction_answer_pairs"].values():
                for pair in group:
                    pair["pair_id"] += "-other"
    (other / DATASET_FILE).write_text(json.dumps(data))
    fresh = tmp_path / "fresh.csv"
    bad = runner.invoke(main, ["review", "export", "--db", str(db_path), "--out", str(fresh), "--card", str(other)])
    assert bad.exit_code != 0 and "no review item" in bad.output and "copy of it" in bad.output
    assert not fresh.exists()


def test_a_flood_of_wrong_tokens_does_not_lock_signed_in_reviewers_out(setup, tmp_path) -> None:
    db = setup.copy(tmp_path / "db")
    with BackgroundServer(create_app(db, max_in_flight=4), limit_concurrency=None) as srv:
        stop = time.monotonic() + 3.0
        codes: list[int] = []

        def guess() -> None:
            with client(srv.url, "rv1_" + "x" * 40) as http:
                while time.monotonic() < stop:
                    codes.append(http.get("/api/queue").status_code)

        flood = [threading.Thread(target=guess) for _ in range(12)]  # 12 waiting wrong tokens, 4 working slots
        for t in flood:
            t.start()
        time.sleep(0.5)
        with client(srv.url, setup.tokens["alice"]) as alice:
            answers = []
            while time.monotonic() < stop - 0.3:
                answers.append(alice.get("/api/queue").status_code)
        for t in flood:
            t.join(10)
    assert answers and set(answers) == {200}, answers
    assert codes and set(codes) <= {401, 503} and codes.count(401) > len(codes) // 2


def test_the_bodies_received_at_once_are_bounded(setup, tmp_path) -> None:
    from cxrground.review.app import MAX_BODY_BYTES, MAX_RECEIVING_BYTES
    from cxrground.testing.servers import read_until_closed

    db = setup.copy(tmp_path / "db")
    with BackgroundServer(create_app(db), limit_concurrency=None) as srv:
        with client(srv.url, setup.tokens["alice"]) as alice:
            aid = alice.get("/api/queue").json()["assignments"][0]["id"]
        head = (f"POST /api/assignments/{aid}/decision HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                f"Authorization: Bearer {setup.tokens['alice']}\r\nContent-Length: {MAX_BODY_BYTES - 10}\r\n\r\n")
        part = b"[" + b" " * (MAX_BODY_BYTES // 2)
        socks, refused = [], b""
        try:
            for _ in range(2 * MAX_RECEIVING_BYTES // len(part) + 2):  # half-sent bodies until the budget is spent
                sock = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
                socks.append(sock)
                sock.sendall(head.encode() + part)
                sock.settimeout(0.5)
                try:
                    refused = sock.recv(4096)
                except TimeoutError:
                    continue
                if refused:
                    refused += read_until_closed(sock, 5.0) or b""
                    break
            assert refused.startswith(b"HTTP/1.1 503"), refused[:200]
            assert b"connection: close" in refused.lower() and b"receiving other large requests" in refused
            with client(srv.url, setup.tokens["bob"]) as bob:
                assert bob.get("/api/queue").status_code == 200
        finally:
            for sock in socks:
                sock.close()
