"""``cxrground review serve`` under idle and hostile clients: bodies that never arrive (408, no slot held), idle and
half-sent connections closed, too many sockets for the open-file limit, clients that never read their responses
(dropped after the send timeout, their slots given back), oversized login forms, odd JSON and ids answered in the
app's error shape, and clients that vanish mid-body without a traceback."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import subprocess
import sys
import time

import pytest

pytest.importorskip("fastapi")

import httpx

from cxrground.review.app import MAX_FORM_BYTES, create_app, server_config
from cxrground.review.db import ReviewDB
from cxrground.testing.servers import (
    closed_by_server,
    read_until_closed,
    response_length,
    server_thread,
    small_window_socket,
    stop_process,
    wait_for_bytes,
    wait_for_log,
)
from review_helpers import client, review_setup


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    return review_setup(tmp_path_factory)


@pytest.fixture()
def small_db(tmp_path) -> tuple[ReviewDB, str]:
    db = ReviewDB.create(tmp_path / "r.sqlite")
    return db, db.add_user("alice")[1]




@contextlib.contextmanager
def served(app, **config):
    """The app under ``review serve``'s uvicorn configuration (:func:`server_config` with ``config``) on
    127.0.0.1; yields (url, records of uvicorn's error log)."""
    import uvicorn

    server = uvicorn.Server(server_config(app, "127.0.0.1", 0, log_level="warning", **config))
    with server_thread(server, "review-loop") as (port, records):
        yield f"http://127.0.0.1:{port}", records


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


DROPPED = "dropped the connection of"


def _big_image_assignment(db: ReviewDB, folder) -> int:
    """An assignment of the database's one reviewer whose image is an 8 MB "PNG" (the signature, then noise): far
    more than the kernel's socket buffers hold."""
    big = folder / "big.png"
    big.write_bytes(b"\x89PNG\r\n\x1a\n" + os.urandom(8 * 1024 * 1024))
    db.add_and_assign([{"kind": "ils", "key": "big", "lesion": "effusion", "item_type": "basic", "positive": False,
                        "source": str(folder), "height": 1, "width": 1, "payload": {}, "mask": None,
                        "images": [{"path": str(big), "role": "png", "label": "big"}]}], 1)
    return db.assignments()[-1].id


def _image_requests(token: str, assignment_id: int, count: int) -> bytes:
    """``count`` pipelined requests for the assignment's big image."""
    one = (f"GET /api/assignments/{assignment_id}/image/0 HTTP/1.1\r\nHost: x\r\n"
           f"Authorization: Bearer {token}\r\n\r\n")
    return (one * count).encode()





def _stalled_post(port: int, path: str = "/login") -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    sock.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-www-form-urlencoded\r\n"
                 "Content-Length: 100\r\n\r\nname=".encode())
    return sock


def test_bodies_that_never_arrive_hold_no_slot_and_get_408(small_db) -> None:
    db, token = small_db
    with served(create_app(db, max_in_flight=2, body_timeout=1.0)) as (url, _):
        stalled = [_stalled_post(_port(url)) for _ in range(6)]
        try:
            time.sleep(0.2)
            with client(url, token) as alice:  # more stalled bodies than slots, and still served
                assert [alice.get("/api/me").status_code for _ in range(3)] == [200] * 3
                assert alice.get("/healthz").status_code == 200
            t0 = time.monotonic()
            for sock in stalled:
                answer = b""
                while chunk := sock.recv(4096):
                    answer += chunk
                assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
                assert b"request_timeout" in answer
            assert time.monotonic() - t0 < 4.0
        finally:
            for sock in stalled:
                sock.close()


def test_idle_and_half_sent_connections_are_closed_after_the_idle_timeout(small_db) -> None:
    db, token = small_db
    with served(create_app(db), idle_timeout=1.0) as (url, _):
        idle = [socket.create_connection(("127.0.0.1", _port(url)), timeout=5) for _ in range(20)]
        half = socket.create_connection(("127.0.0.1", _port(url)), timeout=5)
        half.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")  # the head never ends
        try:
            with client(url, token) as alice:
                assert alice.get("/api/me").status_code == 200
            t0 = time.monotonic()
            assert all(closed_by_server(s) for s in [*idle, half])
            assert 0.5 <= time.monotonic() - t0 < 4.0
        finally:
            for s in [*idle, half]:
                s.close()


def test_a_client_that_never_reads_is_dropped_after_the_send_timeout(small_db, tmp_path) -> None:
    db, token = small_db
    own = _big_image_assignment(db, tmp_path)
    with served(create_app(db), send_timeout=1.0) as (url, records):
        stalled = small_window_socket(_port(url))
        try:
            stalled.sendall(_image_requests(token, own, 1))
            sent = time.time()
            assert wait_for_bytes(stalled, 10), "the image never started"
            with client(url, token) as alice:  # others are served meanwhile
                assert alice.get("/api/me").status_code == 200 and alice.get("/healthz").status_code == 200
            dropped = wait_for_log(records, DROPPED, 10)
            assert dropped is not None, "the non-reading client was never dropped"
            assert dropped.created - sent >= 0.9 and "send timeout 1 s" in dropped.getMessage()
            got = read_until_closed(stalled, 10)
            assert got is not None, "the server did not close the connection"
            assert got.startswith(b"HTTP/1.1 200") and len(got) < response_length(got), len(got)  # cut short
        finally:
            stalled.close()
        with client(url, token) as alice:  # and afterwards
            assert alice.get("/api/me").status_code == 200
            assert len(alice.get(f"/api/assignments/{own}/image/0").content) == 8 * 1024 * 1024 + 8
    assert sum(DROPPED in r.getMessage() for r in records) == 1


def test_a_request_stuck_behind_a_client_that_never_reads_gives_its_slot_back(small_db, tmp_path) -> None:
    db, token = small_db
    own = _big_image_assignment(db, tmp_path)
    with served(create_app(db, max_in_flight=1), send_timeout=2.0) as (url, records):
        stalled = small_window_socket(_port(url))
        try:
            # the second request's handler waits to send while the first answer fills the buffers: it holds the slot
            stalled.sendall(_image_requests(token, own, 2))
            assert wait_for_bytes(stalled, 10), "the image never started"
            statuses = []
            while not [r for r in list(records) if DROPPED in r.getMessage()] and 503 not in statuses:
                statuses.append(httpx.get(url + "/healthz", timeout=5).status_code)
                time.sleep(0.05)
            assert 503 in statuses, "the stuck request held no slot"
            assert wait_for_log(records, DROPPED, 10) is not None, "the non-reading client was never dropped"
            deadline = time.monotonic() + 5
            while httpx.get(url + "/healthz", timeout=5).status_code != 200:
                assert time.monotonic() < deadline, "the slot was not given back"
                time.sleep(0.05)
            got = read_until_closed(stalled, 10)
            assert got is not None and len(got) < response_length(got), "the server did not cut the answer short"
        finally:
            stalled.close()
        with client(url, token) as alice:
            assert alice.get("/api/me").status_code == 200
    assert sum(DROPPED in r.getMessage() for r in records) == 1
    assert not [r for r in records if r.levelno >= logging.ERROR or r.exc_info], [r.getMessage() for r in records]


def test_more_idle_sockets_than_open_files_lock_nobody_out_nor_flood_the_log(tmp_path) -> None:
    resource = pytest.importorskip("resource")
    db = ReviewDB.create(tmp_path / "r.sqlite")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    log = tmp_path / "serve.log"
    env = dict(os.environ, OMP_NUM_THREADS="1")

    def few_files() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (160, 160))

    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "cxrground", "review", "serve", "--db", str(db.path),
                                 "--host", "127.0.0.1", "--port", str(port)], env=env, stdout=out,
                                stderr=subprocess.STDOUT, preexec_fn=few_files)
    url = f"http://127.0.0.1:{port}"
    socks: list[socket.socket] = []
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, log.read_text()[-2000:]
            try:
                if httpx.get(url + "/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "review serve did not start"
            time.sleep(0.1)
        for _ in range(300):  # nearly twice the server's open-file limit
            socks.append(socket.create_connection(("127.0.0.1", port), timeout=5))
        time.sleep(0.5)
        t0 = time.monotonic()
        assert [httpx.get(url + "/healthz", timeout=5).status_code for _ in range(5)] == [200] * 5
        assert time.monotonic() - t0 < 3.0
    finally:
        for s in socks:
            s.close()
        stop_process(proc)
    text = log.read_text(errors="replace")
    assert "Traceback" not in text and len(text.splitlines()) < 50, text[-2000:]


def test_a_login_form_over_the_form_limit_is_413_before_it_is_read(small_db) -> None:
    db, _ = small_db
    with served(create_app(db)) as (url, _), client(url) as anon:
        csrf = anon.get("/login").text.split("name='csrf' value='", 1)[1].split("'", 1)[0]
        big = {"csrf": csrf, "name": "alice", "token": "x" * (MAX_FORM_BYTES + 1)}
        assert anon.post("/login", data=big).status_code == 413
        fine = anon.post("/login", data={"csrf": csrf, "name": "alice", "token": "wrong"})
        assert fine.status_code == 401  # an ordinary form still reaches the token check


def test_odd_json_and_ids_get_the_apps_error_shape(setup, tmp_path) -> None:
    db = setup.copy(tmp_path / "db")
    with served(create_app(db)) as (url, records), client(url, setup.tokens["alice"]) as alice:
        own = alice.get("/api/queue").json()["assignments"][0]["id"]
        r = alice.post(f"/api/assignments/{own}/decision", content=b'{"part": ' + b"9" * 5000 + b"}",
                       headers={"Content-Type": "application/json"})
        assert r.status_code == 400 and r.json()["error"]["type"] == "bad_request", r.text
        for path in ("/api/assignments/abc", "/api/assignments/1e3", "/api/assignments/1/image/x"):
            r = alice.get(path)
            assert r.status_code == 404 and set(r.json()) == {"error"}, (path, r.text)
        r = alice.get("/review/abc")  # a page: the error as a page
        assert r.status_code == 404 and r.headers["content-type"].startswith("text/html")
        assert "not found" in r.text.lower()
        r = alice.post("/api/assignments/abc/decision", json={"part": "pair", "decision": "accept"})
        assert r.status_code == 404 and set(r.json()) == {"error"}
    assert not [rec for rec in records if rec.levelno >= logging.ERROR or rec.exc_info]


def test_a_client_vanishing_mid_body_leaves_no_traceback(setup, tmp_path) -> None:
    db = setup.copy(tmp_path / "db")
    with served(create_app(db)) as (url, records):
        with client(url, setup.tokens["alice"]) as alice:
            own = alice.get("/api/queue").json()["assignments"][0]["id"]
        bearer = f"Authorization: Bearer {setup.tokens['alice']}\r\nContent-Type: application/json"
        for path, headers in (("/login", "Content-Type: application/x-www-form-urlencoded"),
                              (f"/api/assignments/{own}/decision", bearer)):
            with socket.create_connection(("127.0.0.1", _port(url)), timeout=5) as sock:
                sock.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\n{headers}\r\nContent-Length: 1000\r\n\r\n"
                             "name=".encode())
                time.sleep(0.2)
        time.sleep(0.5)
        assert httpx.get(url + "/healthz", timeout=5).status_code == 200
    assert not [rec for rec in records if rec.levelno >= logging.ERROR or rec.exc_info], \
        [rec.getMessage()[:200] for rec in records]
