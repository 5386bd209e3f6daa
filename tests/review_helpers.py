"""Shared inputs of the ``test_review_*`` files: a review database over the synthetic ILS dataset and benchmark of
:mod:`percept_build_helpers` (memoised per session), a bearer-authenticated client and a browser login."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from cxrground.review.db import ReviewDB
from cxrground.review.importers import bench_items, ils_items, import_items
from percept_build_helpers import synthetic_bench, synthetic_ils

_CACHE: dict[str, object] = {}


@dataclass
class ReviewSetup:
    """A built review database, its tokens by user name and the inputs it was imported from."""

    db_path: Path
    tokens: dict[str, str]
    ils_dir: Path
    images: Path
    bench_dir: Path
    ils_keys: list[str] = field(default_factory=list)

    def copy(self, folder: Path) -> ReviewDB:
        """A private copy of the database in ``folder`` (tests that write decisions use their own copy)."""
        folder.mkdir(parents=True, exist_ok=True)
        target = folder / "review.sqlite"
        src = ReviewDB(self.db_path)
        with sqlite3.connect(src.path) as a, sqlite3.connect(target) as b:
            a.backup(b)
        return ReviewDB(target)


def review_setup(tmp_path_factory) -> ReviewSetup:
    """Users alice, bob, carol (reviewers) and boss (admin); 4 positive + 2 negative ILS pairs of the synthetic
    dataset (2 reviewers each) and every case of the synthetic benchmark (2 reviewers each)."""
    if "setup" not in _CACHE:
        ils_dir, images = synthetic_ils(tmp_path_factory)
        bench_dir, _ = synthetic_bench(tmp_path_factory)
        folder = tmp_path_factory.mktemp("review")
        db = ReviewDB.create(folder / "base.sqlite")
        tokens = {name: db.add_user(name, role)[1]
                  for name, role in (("alice", "reviewer"), ("bob", "reviewer"), ("carol", "reviewer"),
                                     ("boss", "admin"))}
        items = ils_items(ils_dir, images, ("train",))
        chosen = [i for i in items if i["positive"]][:4] + [i for i in items if not i["positive"]][:2]
        import_items(db, chosen, None, 0, 2)
        import_items(db, bench_items(bench_dir), None, 0, 2)
        _CACHE["setup"] = ReviewSetup(db.path, tokens, ils_dir, images, bench_dir, [i["key"] for i in chosen])
    return _CACHE["setup"]  # type: ignore[return-value]


@contextlib.contextmanager
def served_copy(setup: ReviewSetup, folder: Path) -> Iterator[tuple]:
    """(server, private db): a copy of the setup database in ``folder`` served on 127.0.0.1 until the block ends."""
    from cxrground.review.app import create_app
    from cxrground.serve.run import BackgroundServer

    db = setup.copy(folder)
    with BackgroundServer(create_app(db)) as srv:
        yield srv, db


def user_named(db: ReviewDB, name: str):
    """The user ``name`` of ``db``."""
    return next(u for u in db.users() if u.name == name)


def open_assignment(page, url: str, assignment_id: int) -> None:
    """Open one assignment's page in a Playwright ``page`` and wait until the viewer is ready."""
    page.goto(f"{url}/review/{assignment_id}")
    page.wait_for_selector("body[data-ready='true']")


def signed_in(page, srv, setup: ReviewSetup, db: ReviewDB, name: str, size: tuple[int, int] = (1366, 768)):
    """Size the browser ``page``, sign ``name`` in on the served app ``srv`` and return the user from ``db``."""
    page.set_viewport_size({"width": size[0], "height": size[1]})
    browser_login(page, srv.url, name, setup.tokens[name])
    return user_named(db, name)


def paint_stroke(page, h: int, w: int, y: int, x0: int, x1: int) -> None:
    """Drag the brush along image row ``y`` from column ``x0`` to ``x1`` of an ``h`` x ``w`` film in the viewer."""
    box = page.locator("#view").bounding_box()
    to = lambda x, yy: (box["x"] + (x + 0.5) * box["width"] / w, box["y"] + (yy + 0.5) * box["height"] / h)  # noqa: E731
    page.mouse.move(*to(x0, y))
    page.mouse.down()
    page.mouse.move(*to(x1, y), steps=6)
    page.mouse.up()


def client(base_url: str, token: str | None = None) -> httpx.Client:
    """An httpx client for the app at ``base_url`` (with ``Authorization: Bearer token`` when given)."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.Client(base_url=base_url, headers=headers, timeout=30.0, follow_redirects=False)


def login(http: httpx.Client, name: str, token: str) -> str:
    """Sign in through the login form (as a browser would); returns the session's CSRF token."""
    page = http.get("/login")
    csrf = page.text.split("name='csrf' value='", 1)[1].split("'", 1)[0]
    done = http.post("/login", data={"csrf": csrf, "name": name, "token": token})
    assert done.status_code == 303 and done.headers["location"] == "/queue", done.text
    queue = http.get("/queue")
    return queue.text.split("name='csrf-token' content='", 1)[1].split("'", 1)[0]


def browser_login(page, url: str, name: str, token: str) -> None:
    """Sign in through the login form in a Playwright ``page`` (the queue redirects there first)."""
    page.goto(url + "/queue")
    assert page.url.endswith("/login")
    page.fill("#name", name)
    page.fill("#token", token)
    page.click("#login-button")
    page.wait_for_url(url + "/queue")
