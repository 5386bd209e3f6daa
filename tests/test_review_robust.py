"""The review app under real use: idle connections, CPU work off the event loop, the token cache and the cheap
token check, odd request values, item keys per kind (with the migration of an older database), imports that never
leave an item in no queue, the importer's path and decode checks, and ``--secure-cookies``."""

from __future__ import annotations

import json
import shutil
import socket
import sqlite3
import threading
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("fastapi")

from click.testing import CliRunner

from cxrground.cli import main
from cxrground.errors import ConfigError, InputError
from cxrground.llm import run_sync
from cxrground.review import app as app_module
from cxrground.review import db as db_module
from cxrground.review.app import create_app, rle_runs, server_config
from cxrground.review.db import ReviewDB
from cxrground.review.importers import bench_items, ils_items, import_items
from cxrground.serve.run import BackgroundServer
from review_helpers import client, login, review_setup


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    return review_setup(tmp_path_factory)


class _Served:
    """The app under the exact uvicorn configuration of ``review serve`` (:func:`server_config`), on 127.0.0.1."""

    def __init__(self, app) -> None:
        import uvicorn

        self.server = uvicorn.Server(server_config(app, "127.0.0.1", 0, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, name="review-loop", daemon=True)

    def __enter__(self) -> str:
        import time

        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            assert self.thread.is_alive() and time.monotonic() < deadline, "server did not start"
            time.sleep(0.02)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(10)


def test_idle_connections_lock_nobody_out(setup, tmp_path) -> None:
    db = setup.copy(tmp_path / "db")
    with _Served(create_app(db)) as url:
        port = int(url.rsplit(":", 1)[1])
        idle = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(48)]
        try:
            with client(url, setup.tokens["alice"]) as alice:
                codes = [alice.get("/api/queue").status_code for _ in range(20)]
            with client(url) as anon:
                codes += [anon.get("/healthz").status_code for _ in range(10)]
        finally:
            for s in idle:
                s.close()
    assert codes == [200] * 30, codes


def _limited_run(limit: int, wait: float, check) -> list[dict]:
    """Run an :class:`_InFlightLimit` (``limit``, ``wait``) around an app that answers 200 once a gate opens;
    ``check(limited, call, gate)`` drives it (``call()`` makes one request); returns the messages sent."""
    import asyncio

    from cxrground.review.app import _InFlightLimit

    sent: list[dict] = []

    async def main_() -> None:
        gate = asyncio.Event()

        async def slow(scope, receive, send):
            await gate.wait()
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b""})

        limited = _InFlightLimit(slow, limit=limit, wait=wait)

        async def send(msg):
            sent.append(msg)

        async def receive():
            return {"type": "http.request", "body": b"", "more_body": False}

        scope = {"type": "http", "method": "GET", "path": "/", "headers": []}
        await check(limited, lambda: limited(scope, receive, send), gate)

    run_sync(main_())  # its own loop even when a test before left one running (the browser fixture)
    return sent


def _statuses(sent: list[dict]) -> list[int]:
    return [m["status"] for m in sent if m["type"] == "http.response.start"]


def test_in_flight_limit_answers_503_with_retry_after() -> None:
    import asyncio

    async def check(limited, call, gate) -> None:
        waiting = [asyncio.create_task(call()) for _ in range(2)]
        await asyncio.sleep(0)
        await call()  # the third: refused at once (no wait)
        assert limited.active == 2
        gate.set()
        await asyncio.gather(*waiting)
        assert limited.active == 0

    sent = _limited_run(2, 0, check)
    assert _statuses(sent) == [503, 200, 200]
    assert (b"retry-after", b"1") in sent[0]["headers"]


def test_a_request_over_the_limit_waits_briefly_for_a_slot() -> None:
    import asyncio

    async def check(limited, call, gate) -> None:
        first = asyncio.create_task(call())
        await asyncio.sleep(0)
        second = asyncio.create_task(call())  # waits for the first's slot
        await asyncio.sleep(0.05)
        assert limited.waiting == 1 and limited.active == 1
        gate.set()
        await asyncio.gather(first, second)
        assert limited.active == 0 and limited.waiting == 0

    assert _statuses(_limited_run(1, 2.0, check)) == [200, 200]


def test_token_checks_and_rle_decoding_run_off_the_event_loop(setup, tmp_path, monkeypatch) -> None:
    db = setup.copy(tmp_path / "db")
    threads: dict[str, set[str]] = {"token": set(), "rle": set(), "login": set()}
    real_token, real_decode, real_login = ReviewDB.user_by_token, app_module.decode_rle, ReviewDB.login

    def spy_token(self, token):
        threads["token"].add(threading.current_thread().name)
        return real_token(self, token)

    def spy_decode(*a, **k):
        threads["rle"].add(threading.current_thread().name)
        return real_decode(*a, **k)

    def spy_login(self, *a):
        threads["login"].add(threading.current_thread().name)
        return real_login(self, *a)

    monkeypatch.setattr(ReviewDB, "user_by_token", spy_token)
    monkeypatch.setattr(ReviewDB, "login", spy_login)
    monkeypatch.setattr(app_module, "decode_rle", spy_decode)
    with _Served(create_app(db)) as url:
        with client(url, setup.tokens["alice"]) as alice:
            pos = next(a for a in alice.get("/api/queue").json()["assignments"]
                       if a["kind"] == "ils" and "positive" in a["item_type"])
            detail = alice.get(f"/api/assignments/{pos['id']}").json()
            h, w = detail["height"], detail["width"]
            drawn = np.zeros((h, w), bool)
            drawn[2:9, 3:12] = True
            r = alice.post(f"/api/assignments/{pos['id']}/decision",
                           json={"part": "pair", "decision": "correct", "mask": {"size": [h, w],
                                                                                 "counts": rle_runs(drawn)}})
            assert r.status_code == 200, r.text
        with client(url) as browser:
            login(browser, "bob", setup.tokens["bob"])
    assert threads["token"] and threads["rle"] and threads["login"]
    for kind, names in threads.items():
        assert "review-loop" not in names, (kind, names)  # never on the event loop's thread


def test_wrong_tokens_are_cheap_and_cached(setup, tmp_path, monkeypatch) -> None:
    db = setup.copy(tmp_path / "db")
    calls: list[str] = []
    real = ReviewDB.user_by_token
    monkeypatch.setattr(ReviewDB, "user_by_token", lambda self, t: calls.append(t) or real(self, t))
    slow: list[int] = []
    real_pbkdf2 = db_module._hash_secret
    monkeypatch.setattr(db_module, "_hash_secret", lambda *a: slow.append(1) or real_pbkdf2(*a))
    with BackgroundServer(create_app(db)) as srv, client(srv.url, "rv1_wrong") as bad, \
            client(srv.url, setup.tokens["alice"]) as alice:
        assert [bad.get("/api/queue").status_code for _ in range(20)] == [401] * 20
        assert [alice.get("/api/me").status_code for _ in range(5)] == [200] * 5
    assert calls.count("rv1_wrong") == 1 and len(calls) == 2  # one check per token, then the cache
    assert slow == []  # users made now are checked with the salted SHA-256, no key stretching


def test_an_old_pbkdf2_user_is_rehashed_after_one_good_check(tmp_path) -> None:
    db = ReviewDB.create(tmp_path / "r.sqlite")
    user, token = db.add_user("olga")
    secret = token.split("_", 1)[1]
    with sqlite3.connect(db.path) as con:  # as a database of the previous version stored it
        salt = con.execute("SELECT salt FROM users").fetchone()[0]
        con.execute("UPDATE users SET token_hash = ?, hash_kind = 'pbkdf2'",
                    (db_module._hash_secret(secret, salt),))
    assert db.user_by_token(token[:-1] + "x") is None
    assert db.user_by_token(token) == user
    with sqlite3.connect(db.path) as con:
        assert con.execute("SELECT hash_kind FROM users").fetchone()[0] == "sha256"
    assert db.user_by_token(token) == user and db.user_by_token(token + "x") is None


def test_odd_request_values_get_4xx_and_the_connection_survives(setup, tmp_path) -> None:
    db = setup.copy(tmp_path / "db")
    with BackgroundServer(create_app(db)) as srv:
        with client(srv.url, "rv" + "9" * 40 + "_x") as c:
            assert c.get("/api/queue").status_code == 401
        with client(srv.url) as c:  # a digit str.isdigit accepts and int() refuses
            r = c.get("/api/queue", headers={"Authorization": "Bearer rv\u00b2_x".encode("latin-1")})
            assert r.status_code == 401
        with client(srv.url, setup.tokens["alice"]) as alice:
            for path in ("/api/assignments/99999999999999999999", "/api/assignments/-99999999999999999999",
                         "/api/assignments/99999999999999999999/image/0", "/api/assignments/0"):
                assert alice.get(path).status_code == 404, path
            r = alice.post("/api/assignments/99999999999999999999/decision", json={"part": "pair"})
            assert r.status_code == 404
            own = alice.get("/api/queue").json()["assignments"][0]["id"]
            deep = b"[" * 200_000 + b"]" * 200_000
            r = alice.post(f"/api/assignments/{own}/decision", content=deep,
                           headers={"Content-Type": "application/json"})
            assert r.status_code == 400 and "nested" in r.json()["error"]["message"]
            assert alice.get("/api/me").status_code == 200  # same keep-alive connection, still served
            r = alice.post(f"/api/assignments/{own}/decision", json={"part": ["pair"], "decision": {"a": 1}})
            assert r.status_code == 400
            assert not db.assignment(own, db.users()[0]).decisions


def test_secure_cookies_from_the_command_line(setup, tmp_path, monkeypatch) -> None:
    db = setup.copy(tmp_path / "db")
    with BackgroundServer(create_app(db, secure_cookies=True)) as srv, client(srv.url) as c:
        assert "secure" in c.get("/login").headers["set-cookie"].lower()
    seen: dict = {}
    monkeypatch.setattr(app_module, "serve", lambda *a, **k: seen.update(k))
    result = CliRunner().invoke(main, ["review", "serve", "--db", str(db.path), "--secure-cookies"])
    assert result.exit_code == 0, result.output
    assert seen["secure_cookies"] is True
    result = CliRunner().invoke(main, ["review", "serve", "--db", str(db.path)])
    assert seen["secure_cookies"] is False


def test_a_benchmark_and_its_ils_dataset_import_side_by_side(setup, tmp_path) -> None:
    db = ReviewDB.create(tmp_path / "r.sqlite")
    for name in ("a", "b"):
        db.add_user(name)
    bench = bench_items(setup.bench_dir)
    keys = {b["key"] for b in bench}
    ils = [i for i in ils_items(setup.ils_dir, setup.images) if i["key"] in keys]
    assert ils, "the synthetic benchmark's cases come from the ILS dataset"
    first = import_items(db, bench, None, 0, 1)
    second = import_items(db, ils, None, 0, 1)
    assert first["added"] == len(bench) and second["added"] == len(ils) and second["already_there"] == 0
    assert {(i.kind, i.key) for i in db.items()} == {("bench", k) for k in keys} | {("ils", i["key"]) for i in ils}
    again = import_items(db, ils, None, 0, 1)
    assert again["added"] == 0 and again["already_there"] == len(ils)


_OLD_ITEMS = """CREATE TABLE items(
  id INTEGER PRIMARY KEY, kind TEXT NOT NULL CHECK(kind IN ('ils', 'bench')), key TEXT NOT NULL UNIQUE,
  lesion TEXT NOT NULL, item_type TEXT NOT NULL, positive INTEGER NOT NULL, source TEXT NOT NULL,
  height INTEGER NOT NULL, width INTEGER NOT NULL, images TEXT NOT NULL, payload TEXT NOT NULL, mask TEXT)"""


def test_an_older_database_keyed_by_key_alone_is_migrated(setup, tmp_path) -> None:
    path = tmp_path / "old.sqlite"
    with sqlite3.connect(path) as con:  # the previous schema: users without hash_kind, items UNIQUE(key)
        con.execute("CREATE TABLE users(id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE, role TEXT NOT NULL "
                    "CHECK(role IN ('reviewer', 'admin')), salt BLOB NOT NULL, token_hash BLOB NOT NULL, "
                    "created REAL NOT NULL)")
        con.execute(_OLD_ITEMS)
    db = ReviewDB(path)
    db.add_user("a")
    bench = bench_items(setup.bench_dir)[:1]
    import_items(db, bench, None, 0, 1)
    decided = db.assignments()[0]
    db.record(decided.id, decided.item.parts[0], "accept")
    with sqlite3.connect(path) as con:  # back to the old key-only uniqueness, keeping the rows
        con.execute("PRAGMA foreign_keys=OFF")
        con.execute("PRAGMA legacy_alter_table=ON")  # leave the other tables' references to `items` as they are
        con.execute("ALTER TABLE items RENAME TO items_new")
        con.execute(_OLD_ITEMS)
        con.execute("INSERT INTO items SELECT id, kind, key, lesion, item_type, positive, source, height, width, "
                    "images, payload, mask FROM items_new")  # the columns of that schema (no view)
        con.execute("DROP TABLE items_new")
    reopened = ReviewDB(path)
    [before] = reopened.assignments()
    assert before.decisions and before.item.key == bench[0]["key"]  # rows, assignments, decisions kept
    ils = [dict(i, key=bench[0]["key"]) for i in ils_items(setup.ils_dir, setup.images)[:1]]
    assert import_items(reopened, ils, None, 0, 1)["added"] == 1
    with sqlite3.connect(path) as con:
        assert con.execute("PRAGMA foreign_key_check").fetchall() == []
    ReviewDB(path)  # idempotent


def test_import_with_too_few_reviewers_changes_nothing_and_a_rerun_assigns_leftovers(setup, tmp_path) -> None:
    db = ReviewDB.create(tmp_path / "r.sqlite")
    db.add_user("a")
    items = ils_items(setup.ils_dir, setup.images, ("train",))[:5]
    with pytest.raises(ConfigError, match="nothing was imported"):
        import_items(db, items, None, 0, 2)
    assert db.items() == []
    db.add_items(items[:3])  # as an older version left them: inserted, in no queue
    db.add_user("b")
    counts = import_items(db, items, None, 0, 2)
    assert counts == {"found": 5, "sampled": 5, "added": 2, "already_there": 3, "picked_up": 3, "assignments": 10}
    assert len(db.assignments()) == 10
    assert import_items(db, items, None, 0, 2)["assignments"] == 0


def _ils_copy(setup, tmp_path):
    ils = tmp_path / "ils"
    shutil.copytree(setup.ils_dir, ils)
    data_file = ils / "mimic_ils_instruction_answer.json"
    return ils, data_file, json.loads(data_file.read_text())


def _first_study(data):
    split = next(s for s in ("train", "val", "test") if data.get(s))
    key = next(iter(data[split]))
    return split, key


@pytest.mark.parametrize("case", ["list", "no_pairs", "image_outside", "mask_outside", "pairs_not_object",
                                  "absolute_image"])
def test_review_import_refuses_malformed_ils_datasets_without_a_traceback(setup, tmp_path, case) -> None:
    ils, data_file, data = _ils_copy(setup, tmp_path)
    split, key = _first_study(data)
    study = data[split][key]
    outside = tmp_path / "outside.png"
    outside.write_bytes((setup.images / study["image_path"]).read_bytes())
    if case == "list":
        data = [data]
    elif case == "no_pairs":
        del study["instruction_answer_pairs"]
    elif case == "pairs_not_object":
        study["instruction_answer_pairs"] = ["x"]
    elif case == "image_outside":
        study["image_path"] = "../" * 12 + str(outside).lstrip("/")
    elif case == "absolute_image":
        study["image_path"] = str(outside)
    elif case == "mask_outside":
        pair = next(p for s in data.values() for st in s.values()
                    for p in st["instruction_answer_pairs"].get("positive_pairs", []))
        shutil.copy(ils / "lesion_mask" / pair["seg_mask_path"], tmp_path / "m.png")  # a real mask, outside the folder
        pair["seg_mask_path"] = "../../m.png"
    data_file.write_text(json.dumps(data))
    with pytest.raises(InputError):
        ils_items(ils, setup.images)
    db_path = tmp_path / "r.sqlite"
    ReviewDB.create(db_path).add_user("a")
    result = CliRunner().invoke(main, ["review", "import", "--db", str(db_path), "--ils", str(ils), "--images",
                                       str(setup.images), "--per-item", "1"])
    assert result.exit_code != 0 and "Traceback" not in result.output, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert str(data_file) in result.output or str(ils) in result.output or str(outside) in result.output
    assert ReviewDB(db_path).items() == []


def test_review_import_leaves_out_a_study_whose_film_cannot_be_read_and_imports_the_rest(setup, tmp_path) -> None:
    ils, _, data = _ils_copy(setup, tmp_path)
    images = tmp_path / "images"
    shutil.copytree(setup.images, images)
    split, key = _first_study(data)
    film = images / data[split][key]["image_path"]
    film.write_bytes(film.read_bytes()[:300])  # truncated
    every = ils_items(ils, setup.images)
    bad = sum(1 for i in every if i["payload"]["study"] == key)
    db_path = tmp_path / "r.sqlite"
    ReviewDB.create(db_path).add_user("a")
    result = CliRunner().invoke(main, ["review", "import", "--db", str(db_path), "--ils", str(ils), "--images",
                                       str(images), "--per-item", "1"])
    assert result.exit_code == 0, result.output
    assert f"{len(every) - bad} items found" in result.output and "1 studies left out" in result.output
    (failure,) = [json.loads(line) for line in Path(f"{db_path}.failures.jsonl").read_text().splitlines()]
    assert failure["path"] == str(film.resolve()) and f"study {key}:" in failure["reason"]
    assert f"; first: {film.resolve()}: study {key}:" in result.output
    assert len(ReviewDB(db_path).items()) == len(every) - bad
    film.unlink()  # a missing film: the same
    left: list = []
    assert len(ils_items(ils, images, failures=left)) == len(every) - bad and "not found" in left[0].reason
    with pytest.raises(InputError, match="not found under the --images folder"):  # no failures list: the error
        ils_items(ils, images)
    with pytest.raises(InputError, match="not found under the --images folder"):  # nothing readable: the error
        ils_items(ils, tmp_path, failures=[])
    clean = CliRunner().invoke(main, ["review", "import", "--db", str(db_path), "--ils", str(ils), "--images",
                                      str(setup.images), "--per-item", "1"])
    assert clean.exit_code == 0 and "left out" not in clean.output and not Path(f"{db_path}.failures.jsonl").exists()


def test_benchmark_images_that_do_not_decode_are_refused(setup, tmp_path) -> None:
    bench = tmp_path / "bench"
    shutil.copytree(setup.bench_dir, bench)
    first = Path(bench_items(setup.bench_dir)[0]["images"][0]["path"])  # a PNG the import reads
    png = bench / first.relative_to(Path(setup.bench_dir).resolve())
    png.write_bytes(png.read_bytes()[:200])  # truncated: the header reads, the pixels do not
    db_path = tmp_path / "r.sqlite"
    ReviewDB.create(db_path).add_user("a")
    result = CliRunner().invoke(main, ["review", "import", "--db", str(db_path), "--bench", str(bench),
                                       "--per-item", "1"])
    assert result.exit_code != 0 and "Traceback" not in result.output, result.output
    assert "does not decode" in result.output or "not found" in result.output, result.output
    assert ReviewDB(db_path).items() == []


def test_the_admin_queue_separates_own_work_from_the_team(setup, tmp_path) -> None:
    db = setup.copy(tmp_path / "db")
    with BackgroundServer(create_app(db)) as srv, client(srv.url) as http:
        login(http, "boss", setup.tokens["boss"])
        page = http.get("/queue").text
    assert "Review queue of boss" in page and "0 of 0 done" in page
    assert "id='all-assignments'" in page and "id='team-progress'" in page
    mine = page.split("id='queue'", 1)[1].split("</table>", 1)[0]
    assert "<tr data-id" not in mine  # the admin's own queue is empty; everyone's rows are in the other table


def test_opening_another_sqlite_file_or_an_empty_file_is_refused_and_changes_nothing(tmp_path) -> None:
    cache = tmp_path / "cache.sqlite"
    with sqlite3.connect(cache) as con:  # a response cache: another SQLite file
        con.execute("CREATE TABLE responses(key TEXT PRIMARY KEY, value TEXT)")
    before = cache.read_bytes()
    empty = tmp_path / "empty.db"
    empty.write_bytes(b"")
    for path in (cache, empty):
        res = CliRunner().invoke(main, ["review", "stats", "--db", str(path)])
        assert res.exit_code != 0 and "not a review database" in res.output and "Traceback" not in res.output
        with pytest.raises(InputError, match="no review tables"):
            ReviewDB(path)
    assert cache.read_bytes() == before and empty.read_bytes() == b""
    with sqlite3.connect(cache) as con:
        assert [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")] == ["responses"]
    assert ReviewDB.create(tmp_path / "new.sqlite").path.is_file()  # add-user still creates a new one


def test_add_user_refuses_another_sqlite_file_and_creates_a_missing_or_empty_one(tmp_path) -> None:
    cache = tmp_path / "cache.sqlite"
    with sqlite3.connect(cache) as con:  # another tool's SQLite file, named by a typo in --db
        con.execute("CREATE TABLE responses(key TEXT PRIMARY KEY, value TEXT)")
    before = cache.read_bytes()
    res = CliRunner().invoke(main, ["review", "add-user", "zed", "--db", str(cache)])
    assert res.exit_code == 1 and "not a review database" in res.output and str(cache) in res.output, res.output
    assert "Traceback" not in res.output and cache.read_bytes() == before
    with sqlite3.connect(cache) as con:
        assert con.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
        assert [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")] == ["responses"]
    empty = tmp_path / "empty.sqlite"
    empty.write_bytes(b"")
    for path in (empty, tmp_path / "new" / "review.sqlite"):
        res = CliRunner().invoke(main, ["review", "add-user", "zed", "--db", str(path)])
        assert res.exit_code == 0 and "created reviewer zed" in res.output, res.output
        assert [u.name for u in ReviewDB(path).users()] == ["zed"]


@pytest.mark.parametrize("extra", [["--split", "test"], ["--images", "."], ["--split", "val", "--images", "."]],
                         ids=["split", "images", "both"])
def test_a_bench_import_refuses_the_ils_only_options(setup, tmp_path, extra) -> None:
    db = setup.copy(tmp_path / "db")
    before = len(db.items())
    res = CliRunner().invoke(main, ["review", "import", "--db", str(db.path), "--bench", str(setup.bench_dir),
                                    *extra])
    named = [o for o in ("--split", "--images") if o in extra]
    assert res.exit_code == 2 and "to --ils only" in res.output and all(o in res.output for o in named), res.output
    assert len(db.items()) == before


def test_import_help_says_what_the_seed_does() -> None:
    res = CliRunner().invoke(main, ["review", "import", "--help"], terminal_width=200)
    seed = " ".join(res.output.split("--seed", 1)[1].split("--per-item", 1)[0].split())
    assert "Seed of --sample" in seed and "does not use it" in seed and "of the reviewer assignment" not in seed
