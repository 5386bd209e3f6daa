"""The review pages in headless Chromium, where a decision could go wrong without the reviewer noticing: Accept on
a revisited correction keeps the reviewer's mask; nothing can be decided before the film is drawn, and a film the
server cannot serve can only be rejected as unreadable; a stale tab asks before it replaces another tab's decision;
a page whose session ended says how to sign in and then saves on the retry; errors look like errors. Also the
layout (what is judged at the top, no page scroll at 1024x640), negative pairs without mask controls, a stored
reason preselected, keys and names on the case page, the outline mode and the brush circle."""

from __future__ import annotations

import json
import sqlite3

import numpy as np
import pytest

pytest.importorskip("fastapi")

from cxrground.io.masks import decode_rle, encode_rle
from review_helpers import (
    browser_login,
    open_assignment,
    paint_stroke,
    review_setup,
    served_copy,
    signed_in,
    user_named,
)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    return review_setup(tmp_path_factory)


@pytest.fixture()
def live(setup, tmp_path):
    with served_copy(setup, tmp_path / "db") as served:
        yield served


def _posts(page) -> list[dict]:
    posts: list[dict] = []
    page.on("request", lambda r: r.method == "POST" and "/decision" in r.url and posts.append(r.post_data_json))
    return posts


def _sign_in_again(page, url: str, name: str, token: str) -> None:
    """Sign in through the login form (a new session, in a browser that may hold one already)."""
    page.goto(url + "/login")
    page.fill("#name", name)
    page.fill("#token", token)
    page.click("#login-button")
    page.wait_for_url(url + "/queue")


def test_accept_on_a_revisited_correction_keeps_the_reviewers_mask(page, live, setup) -> None:
    srv, db = live
    alice = signed_in(page, srv, setup, db, "alice")
    pair = next(a for a in db.assignments(alice) if a.item.kind == "ils" and a.item.positive)
    h, w = pair.item.height, pair.item.width
    mine = decode_rle(pair.item.mask, (h, w)).copy()
    mine[h // 2 - 3: h // 2 + 3, w // 2 - 3: w // 2 + 3] ^= True  # a correction of the generated mask
    db.record(pair.id, "pair", "correct", mask=encode_rle(mine))
    open_assignment(page, srv.url, pair.id)
    assert page.inner_text("#accept") == "Accept your mask (A)"
    assert "your mask is shown" in page.inner_text("#decision")
    page.keyboard.press("a")
    page.wait_for_url(lambda u: not u.endswith(f"/review/{pair.id}"))
    stored = db.assignment(pair.id, alice).decisions["pair"]
    assert stored["decision"] == "correct", stored  # not an accept of the generated mask
    np.testing.assert_array_equal(decode_rle(stored["mask"], (h, w)), mine)
    assert page.console_errors == [], page.console_errors


def test_nothing_is_decided_before_the_film_is_drawn_and_a_missing_film_can_only_be_rejected(
        page, live, setup, tmp_path) -> None:
    srv, db = live
    page.set_viewport_size({"width": 1366, "height": 768})
    posts = _posts(page)
    browser_login(page, srv.url, "alice", setup.tokens["alice"])
    alice = user_named(db, "alice")
    queue = db.assignments(alice)
    slow, gone = [a for a in queue if a.item.kind == "ils" and a.item.positive][:2]
    case = next(a for a in queue if a.item.kind == "bench")
    held: list = []
    page.route(f"**/api/assignments/{slow.id}/image/0", lambda route: held.append(route))
    page.goto(f"{srv.url}/review/{slow.id}")
    page.wait_for_selector("#accept")
    page.wait_for_function("() => document.getElementById('status').textContent.includes('loading')")
    assert page.is_disabled("#accept") and page.is_disabled("#save-mask") and page.is_disabled("#reject")
    page.select_option("#reason", "wrong lesion")
    assert page.is_disabled("#reject")
    for key in ("a", "s", "r"):
        page.keyboard.press(key)
    assert posts == [] and not db.assignment(slow.id, alice).decisions  # nothing posted while loading
    page.wait_for_function(f"() => {len(held)} > 0 || true")
    held[0].continue_()
    page.wait_for_selector("body[data-ready='true']")
    assert not page.is_disabled("#accept") and not page.is_disabled("#reject")
    assert page.get_attribute("#app", "data-film") == "shown"

    with db.connect() as con:  # the film of the second pair and one image of a case are gone from the server
        con.execute("UPDATE items SET images = ? WHERE id = ?",
                    (json.dumps([{**gone.item.images[0], "path": str(tmp_path / "gone.png")}]), gone.item.id))
        images = [dict(im) for im in case.item.images]
        images[0]["path"] = str(tmp_path / "gone-stage.png")
        con.execute("UPDATE items SET images = ? WHERE id = ?", (json.dumps(images), case.item.id))
    open_assignment(page, srv.url, gone.id)
    assert page.get_attribute("#app", "data-film") == "unreadable"
    assert page.get_attribute("body", "data-state") == "error"
    status = page.inner_text("#status")
    assert "missing on the server" in status and "image unreadable" in status, status
    assert page.is_disabled("#accept") and page.is_disabled("#save-mask") and not page.is_disabled("#reject")
    assert page.input_value("#reason") == "image unreadable"
    offered = page.eval_on_selector_all("#reason option:not([disabled])", "os => os.map(o => o.value)")
    assert offered == ["image unreadable"]
    page.keyboard.press("a")
    assert posts == [] and "cannot be accepted" in page.inner_text("#status")
    page.keyboard.press("r")
    page.wait_for_url(lambda u: not u.endswith(f"/review/{gone.id}"))
    assert db.assignment(gone.id, alice).decisions["pair"]["reason"] == "image unreadable"

    page.console_errors.clear()
    open_assignment(page, srv.url, case.id)  # a case with an image gone: no Accept, the rejection as unclear only
    assert page.get_attribute("#app", "data-film") == "unreadable"
    accepts = page.locator("section.question button.accept")
    assert accepts.count() >= 1 and all(accepts.nth(i).is_disabled() for i in range(accepts.count()))
    first = case.item.parts[0]
    assert page.input_value(f"#reason-{first}") == "image unclear"
    page.keyboard.press("a")
    assert len(posts) == 1  # only the rejection above
    page.keyboard.press("r")
    page.wait_for_function(f"() => document.querySelector(\"section[data-part='{first}']\").dataset.state")
    assert db.assignment(case.id, alice).decisions[first]["reason"] == "image unclear"


def test_a_stale_tab_asks_before_it_replaces_a_decision_made_in_another(page, live, setup) -> None:
    srv, db = live
    bob = signed_in(page, srv, setup, db, "bob")
    pair = next(a for a in db.assignments(bob) if a.item.kind == "ils" and a.item.positive)
    h, w = pair.item.height, pair.item.width
    other = page.context.new_page()
    open_assignment(other, srv.url, pair.id)  # the stale tab, opened first
    open_assignment(page, srv.url, pair.id)
    page.keyboard.press("b")
    paint_stroke(page, h, w, h // 2, w // 2 - 6, w // 2 + 6)
    page.keyboard.press("s")
    page.wait_for_url(lambda u: not u.endswith(f"/review/{pair.id}"))
    assert db.assignment(pair.id, bob).decisions["pair"]["decision"] == "correct"

    answers = ["dismiss", "accept"]
    asked: list[str] = []

    def answer(dialog) -> None:
        asked.append(dialog.message)
        getattr(dialog, answers.pop(0))()

    other.on("dialog", answer)
    other.bring_to_front()
    other.keyboard.press("a")
    other.wait_for_function("() => document.body.dataset.state === 'error'")
    assert asked and "decided in another tab or session at" in asked[0] and "as correct" in asked[0], asked
    assert "that decision is kept" in other.inner_text("#status")
    assert db.assignment(pair.id, bob).decisions["pair"]["decision"] == "correct"  # kept
    other.keyboard.press("a")  # asked again; this time: replace it
    other.wait_for_url(lambda u: not u.endswith(f"/review/{pair.id}"))
    assert len(asked) == 2
    assert db.assignment(pair.id, bob).decisions["pair"]["decision"] == "accept"
    assert [(r["decision"], r["overwrite"]) for r in db.history(key=pair.item.key, user="bob")] == \
        [("correct", False), ("accept", True)]
    other.close()


def test_after_the_session_ends_the_page_says_how_to_sign_in_and_the_retry_saves(page, live, setup) -> None:
    srv, db = live
    alice = signed_in(page, srv, setup, db, "alice")
    first, second = [a for a in db.assignments(alice) if a.item.kind == "ils" and a.item.positive][:2]
    h, w = second.item.height, second.item.width
    open_assignment(page, srv.url, first.id)
    other = page.context.new_page()
    _sign_in_again(other, srv.url, "alice", setup.tokens["alice"])  # signed in again elsewhere: a new session
    page.bring_to_front()
    page.keyboard.press("a")  # the page takes the new session's CSRF token and saves
    page.wait_for_url(lambda u: not u.endswith(f"/review/{first.id}"))
    assert db.assignment(first.id, alice).decisions["pair"]["decision"] == "accept"

    open_assignment(page, srv.url, second.id)
    page.keyboard.press("b")
    paint_stroke(page, h, w, h // 2, w // 2 - 6, w // 2 + 6)
    with sqlite3.connect(db.path) as con:  # the session ends (expiry, or a logout elsewhere)
        con.execute("DELETE FROM sessions")
    page.keyboard.press("s")
    page.wait_for_function("() => document.body.dataset.state === 'error'")
    status = page.inner_text("#status")
    assert "signed out" in status and "Sign in in another tab" in status and "press S again" in status, status
    assert page.get_attribute("#sign-in-again", "href") == "/login"
    assert page.get_attribute("#sign-in-again", "target") == "_blank"
    colour = page.eval_on_selector("#status", "e => getComputedStyle(e).color")
    assert colour == "rgb(192, 57, 43)", colour  # an error looks like one
    assert page.eval_on_selector("#status", "e => getComputedStyle(e, '::before').content") == '"⚠ "'
    assert page.get_attribute("#status", "aria-live") == "assertive"
    assert page.get_attribute("#app", "data-edited") == "true"  # the paint is still there
    _sign_in_again(other, srv.url, "alice", setup.tokens["alice"])
    page.bring_to_front()
    page.keyboard.press("s")
    page.wait_for_url(lambda u: not u.endswith(f"/review/{second.id}"))
    assert db.assignment(second.id, alice).decisions["pair"]["decision"] == "correct"
    other.close()


def test_what_is_judged_is_at_the_top_and_the_page_does_not_scroll(page, live, setup) -> None:
    srv, db = live
    alice = signed_in(page, srv, setup, db, "alice", (1024, 640))
    queue = db.assignments(alice)
    pos = next(a for a in queue if a.item.kind == "ils" and a.item.positive)
    neg = next(a for a in queue if a.item.kind == "ils" and not a.item.positive)
    open_assignment(page, srv.url, pos.id)
    for selector in ("#instruction", "#answer", "#sentence", "#accept"):
        box = page.locator(selector).bounding_box()
        assert box["y"] >= 0 and box["y"] + box["height"] <= 640, (selector, box)
    assert page.evaluate("document.documentElement.scrollHeight <= window.innerHeight"), \
        page.evaluate("[document.documentElement.scrollHeight, window.innerHeight]")
    assert page.get_attribute("#view", "role") == "img" and "chest film" in page.get_attribute("#view", "aria-label")
    assert page.is_visible("#show-mask") and page.is_visible("#outline")

    db.record(neg.id, "pair", "reject", "wrong location")
    open_assignment(page, srv.url, neg.id)
    assert not page.is_visible("#show-mask") and not page.is_visible("#opacity") and not page.is_visible("#compare")
    assert page.inner_text("#stage .pane-label") == "film"
    assert page.input_value("#reason") == "wrong location" and not page.is_disabled("#reject")  # as stored
    assert page.evaluate("document.documentElement.scrollHeight <= window.innerHeight")


def test_outline_mode_and_the_brush_circle(page, live, setup) -> None:
    srv, db = live
    alice = signed_in(page, srv, setup, db, "alice")
    pair = next(a for a in db.assignments(alice) if a.item.kind == "ils" and a.item.positive)
    h, w = pair.item.height, pair.item.width
    generated = decode_rle(pair.item.mask, (h, w))
    open_assignment(page, srv.url, pair.id)
    read = ("() => { const c = document.getElementById('view');"
            " return Array.from(c.getContext('2d').getImageData(0, 0, c.width, c.height).data); }")
    cyan = lambda rgba: (rgba[:, :, 2] > rgba[:, :, 0] + 40)  # noqa: E731
    filled = cyan(np.asarray(page.evaluate(read), dtype=np.int32).reshape(h, w, 4))
    np.testing.assert_array_equal(filled, generated)
    page.keyboard.press("o")
    assert page.get_attribute("#app", "data-outline") == "true"
    lined = cyan(np.asarray(page.evaluate(read), dtype=np.int32).reshape(h, w, 4))
    assert lined.sum() < 0.8 * generated.sum() and not (lined & ~generated).any()  # the edge only
    ys, xs = np.nonzero(generated)
    edge = (ys == ys.min())
    assert lined[ys[edge], xs[edge]].all()  # the mask's top row is drawn
    page.keyboard.press("o")
    box = page.locator("#view").bounding_box()
    page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    page.mouse.move(box["x"] + box["width"] / 2 + 3, box["y"] + box["height"] / 2 + 3)
    assert page.is_visible("#brush-cursor")
    radius = float(page.input_value("#brush-size"))
    scale = float(page.get_attribute("#app", "data-scale"))
    size = page.locator("#brush-cursor").bounding_box()
    assert abs(size["width"] - 2 * radius * scale) < 2, (size, radius, scale)
    page.keyboard.press("h")
    assert not page.is_visible("#brush-cursor")  # panning: no brush
    assert page.console_errors == [], page.console_errors


def test_the_case_page_decides_with_keys_and_names_each_questions_controls(page, live, setup) -> None:
    srv, db = live
    alice = signed_in(page, srv, setup, db, "alice")
    case = next(a for a in db.assignments(alice) if a.item.kind == "bench" and len(a.item.parts) >= 2)
    open_assignment(page, srv.url, case.id)
    parts = case.item.parts
    assert page.inner_text("#position").endswith(f"of {len(db.assignments(alice))}")
    assert page.inner_text("#case-progress") == f"0 of {len(parts)} questions decided"
    label = "es => es.map(e => e.getAttribute('aria-label'))"
    names = page.eval_on_selector_all("section.question button.accept", label)
    assert len(set(names)) == len(parts) and all(n.startswith("Accept question ") for n in names)
    reasons = page.eval_on_selector_all("section.question select", label)
    assert len(set(reasons)) == len(parts)
    assert page.get_attribute(f"section[data-part='{parts[0]}']", "aria-current") == "step"
    page.keyboard.press("a")
    page.wait_for_function(f"() => document.querySelector(\"section[data-part='{parts[0]}']\").dataset.state")
    assert db.assignment(case.id, alice).decisions[parts[0]]["decision"] == "accept"
    assert page.get_attribute(f"section[data-part='{parts[1]}']", "aria-current") == "step"
    assert page.inner_text("#case-progress") == f"1 of {len(parts)} questions decided"
    page.keyboard.press("r")  # no reason: nothing recorded, the list is offered
    assert page.evaluate("document.activeElement.id") == f"reason-{parts[1]}"
    page.select_option(f"#reason-{parts[1]}", "ambiguous question")
    page.keyboard.press("r")
    page.wait_for_function(f"() => document.querySelector(\"section[data-part='{parts[1]}']\").dataset.state")
    assert db.assignment(case.id, alice).decisions[parts[1]]["reason"] == "ambiguous question"
    assert page.console_errors == [], page.console_errors
