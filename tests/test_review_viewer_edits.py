"""The review pages after a decision, in headless Chromium: "Save comment" stores a changed comment alone (the
decision kept, the page stays), the comment box grows with its text up to a height and then scrolls (letters typed in
it are never shortcuts), and the R/L markers follow the film's view: frontal films get them, a film of unknown view
gets them with a "view unknown" hint, a lateral film none."""

from __future__ import annotations

import sqlite3

import pytest

pytest.importorskip("fastapi")

from review_helpers import open_assignment, review_setup, served_copy, signed_in


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    return review_setup(tmp_path_factory)


@pytest.fixture()
def live(setup, tmp_path):
    with served_copy(setup, tmp_path / "db") as served:
        yield served


def _set_view(db, item_id: int, view: str | None) -> None:
    with sqlite3.connect(db.path) as con:
        con.execute("UPDATE items SET view = ? WHERE id = ?", (view, item_id))


def test_save_comment_changes_only_the_comment_and_the_page_stays(page, live, setup) -> None:
    srv, db = live
    alice = signed_in(page, srv, setup, db, "alice")
    pairs = [a for a in db.assignments(alice) if a.item.kind == "ils"]
    decided, undecided = pairs[0], pairs[1]
    db.record(decided.id, "pair", "reject", "wrong location", comment="first look")
    open_assignment(page, srv.url, undecided.id)
    page.click("#comment")
    page.keyboard.type("no decision yet")
    assert page.locator("#save-comment").is_hidden()  # a comment goes with a decision when there is none

    open_assignment(page, srv.url, decided.id)
    assert page.locator("#save-comment").is_hidden()  # nothing changed yet
    page.click("#comment")
    page.keyboard.press("End")
    page.keyboard.type(" - A R S N P: rib overlap, see lateral")  # shortcut letters typed as text
    assert page.locator("#save-comment").is_visible()
    assert page.url.endswith(f"/review/{decided.id}")
    assert db.assignment(decided.id, alice).decisions["pair"]["version"] == 1  # nothing decided by the letters
    page.click("#save-comment")
    page.wait_for_selector("body[data-state=saved]")
    stored = db.assignment(decided.id, alice).decisions["pair"]
    assert (stored["decision"], stored["reason"], stored["version"]) == ("reject", "wrong location", 2)
    assert stored["comment"] == "first look - A R S N P: rib overlap, see lateral"
    assert "comment saved" in page.inner_text("#status") and page.url.endswith(f"/review/{decided.id}")
    assert page.locator("#save-comment").is_hidden()
    page.fill("#comment", "second edit")
    page.dispatch_event("#comment", "input")
    assert page.locator("#save-comment").is_visible()
    page.click("#save-comment")  # the page knows the version its first edit made: no conflict
    page.wait_for_selector("#save-comment", state="hidden")
    assert "comment saved" in page.inner_text("#status")
    again = db.assignment(decided.id, alice).decisions["pair"]
    assert (again["decision"], again["comment"], again["version"]) == ("reject", "second edit", 3)
    assert [r["comment_only"] for r in db.history(key=decided.item.key, user="alice")] == [False, True, True]

    case = next(a for a in db.assignments(alice) if a.item.kind == "bench")
    part = case.item.parts[0]
    db.record(case.id, part, "accept")
    open_assignment(page, srv.url, case.id)
    other = case.item.parts[1]
    page.fill(f"#comment-{other}", "undecided question")
    page.dispatch_event(f"#comment-{other}", "input")
    assert page.locator(f"#save-comment-{other}").is_hidden()
    page.fill(f"#comment-{part}", "the key is right but the wording is odd")
    page.dispatch_event(f"#comment-{part}", "input")
    page.click(f"#save-comment-{part}")
    page.wait_for_selector("body[data-state=saved]")
    got = db.assignment(case.id, alice).decisions
    assert (got[part]["decision"], got[part]["comment"]) == ("accept", "the key is right but the wording is odd")
    assert other not in got
    assert page.console_errors == [], page.console_errors


def test_the_comment_box_grows_with_its_text_then_scrolls(page, live, setup) -> None:
    srv, db = live
    alice = signed_in(page, srv, setup, db, "alice")
    pair = next(a for a in db.assignments(alice) if a.item.kind == "ils")
    open_assignment(page, srv.url, pair.id)
    box = page.locator("#comment")
    empty = box.bounding_box()["height"]
    page.click("#comment")
    for i in range(4):
        page.keyboard.type(f"line {i} of a longer note")
        page.keyboard.press("Shift+Enter")
    grown = box.bounding_box()["height"]
    assert grown > empty + 30, (empty, grown)
    fits = page.evaluate("(() => { const b = document.getElementById('comment'); "
                         "return b.scrollHeight <= b.clientHeight + 1; })()")
    assert fits  # all of the text shows, no scrollbar
    for i in range(30):
        page.keyboard.type(f"more {i}")
        page.keyboard.press("Enter")
    capped = box.bounding_box()["height"]
    max_px = page.evaluate("parseFloat(getComputedStyle(document.getElementById('comment')).maxHeight)")
    assert abs(capped - max_px) < 2, (capped, max_px)
    assert page.evaluate("(() => { const b = document.getElementById('comment'); "
                         "return b.scrollHeight > b.clientHeight && getComputedStyle(b).overflowY === 'auto'; })()")
    assert page.url.endswith(f"/review/{pair.id}") and db.assignment(pair.id, alice).decisions == {}
    assert page.console_errors == [], page.console_errors


def test_r_and_l_follow_the_films_view(page, live, setup) -> None:
    srv, db = live
    alice = signed_in(page, srv, setup, db, "alice")
    pair = next(a for a in db.assignments(alice) if a.item.kind == "ils")
    case = next(a for a in db.assignments(alice) if a.item.kind == "bench")
    for view in ("PA", "AP SUPINE"):
        _set_view(db, pair.item.id, view)
        open_assignment(page, srv.url, pair.id)
        assert page.locator("#stage .orient").all_inner_texts() == ["R", "L"]
        assert page.locator("#stage .view-hint").count() == 0
        assert "not recorded" not in page.inner_text("#help")
    _set_view(db, pair.item.id, None)
    open_assignment(page, srv.url, pair.id)
    assert page.locator("#stage .orient").all_inner_texts() == ["R", "L"]
    assert page.locator("#stage .view-hint").inner_text() == "view unknown: R/L assume a frontal film"
    assert page.locator("#stage .view-hint").is_visible()
    _set_view(db, pair.item.id, "LATERAL")
    open_assignment(page, srv.url, pair.id)
    assert page.locator(".orient").count() == 0
    assert page.locator("#stage .view-hint").inner_text() == "LATERAL view: no R/L markers"
    assert "No R/L markers" in page.inner_text("#help")
    page.keyboard.press("c")  # the generated mask beside: no markers on that pane either
    assert page.locator(".orient").count() == 0
    _set_view(db, case.item.id, "LL")
    open_assignment(page, srv.url, case.id)
    assert page.locator(".orient").count() == 0 and page.get_attribute("#app", "data-orientation") == "none"
    assert page.console_errors == [], page.console_errors
