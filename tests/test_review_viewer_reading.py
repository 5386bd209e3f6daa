"""What a radiologist reads on the review pages, in headless Chromium: a comment box on the pair page and on each
question of a case (letters typed there are no shortcuts; the comment is saved with the decision and shown back as
text, never as HTML), the R/L orientation markers of a frontal film (page elements, not pixels of the film or the
mask), a window/level readout with an auto window from the film's 1st-99th percentiles, and readable names where
internal keys were (the key kept in a tooltip), with a case question shown once above its options."""

from __future__ import annotations

import io

import numpy as np
import pytest

pytest.importorskip("fastapi")

from PIL import Image

from review_helpers import browser_login, client, open_assignment, review_setup, served_copy, signed_in, user_named

COMMENT = "A R S retrocardiac part missed <script>window.__pwned = 1</script><img src=x onerror='window.__pwned=2'>"


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    return review_setup(tmp_path_factory)


@pytest.fixture()
def live(setup, tmp_path):
    with served_copy(setup, tmp_path / "db") as served:
        yield served


def test_a_comment_is_typed_freely_saved_with_the_decision_and_shown_as_text(page, live, setup) -> None:
    srv, db = live
    alice = signed_in(page, srv, setup, db, "alice")
    pair = next(a for a in db.assignments(alice) if a.item.kind == "ils" and a.item.positive)
    open_assignment(page, srv.url, pair.id)
    page.click("#comment")
    page.keyboard.type(COMMENT)  # A, R and S typed here are text: nothing is decided
    page.keyboard.press("Escape")  # leaves the box: the keys decide again
    assert db.assignment(pair.id, alice).decisions == {}
    page.keyboard.press("a")
    page.wait_for_url(lambda u: not u.endswith(f"/review/{pair.id}"))
    stored = db.assignment(pair.id, alice).decisions["pair"]
    assert (stored["decision"], stored["comment"]) == ("accept", COMMENT)
    open_assignment(page, srv.url, pair.id)
    assert page.input_value("#comment") == COMMENT  # shown back to its author
    assert page.evaluate("window.__pwned") is None

    case = next(a for a in db.assignments(alice) if a.item.kind == "bench")
    first, second = case.item.parts[0], case.item.parts[1]
    open_assignment(page, srv.url, case.id)
    assert page.locator("textarea.comment").count() == len(case.item.parts)  # one box per question
    page.click(f"#comment-{first}")
    page.keyboard.type("ARN ambiguous wording")
    page.keyboard.press("Escape")
    assert db.assignment(case.id, alice).decisions == {}
    page.keyboard.press("a")
    page.wait_for_selector(f".question[data-part='{first}'][data-state=accept]")
    decided = db.assignment(case.id, alice).decisions
    assert decided[first]["comment"] == "ARN ambiguous wording" and second not in decided

    page.context.clear_cookies()  # the admin sees the comments as text on the read-only pages
    browser_login(page, srv.url, "boss", setup.tokens["boss"])
    open_assignment(page, srv.url, pair.id)
    shown = page.locator(".comment-text")
    assert shown.inner_text() == "Comment: " + COMMENT
    assert shown.locator("script, img").count() == 0 and page.locator("textarea.comment").count() == 0
    assert page.evaluate("window.__pwned") is None
    open_assignment(page, srv.url, case.id)
    assert page.locator(f".question[data-part='{first}'] .comment-text").inner_text() == \
        "Comment: ARN ambiguous wording"
    assert page.console_errors == [], page.console_errors


@pytest.mark.parametrize("size", [(1366, 768), (1024, 640)], ids=["1366x768", "1024x640"])
def test_orientation_markers_sit_at_the_films_edges_and_are_not_drawn_into_it(page, live, setup, size) -> None:
    srv, db = live
    page.set_viewport_size({"width": size[0], "height": size[1]})
    browser_login(page, srv.url, "alice", setup.tokens["alice"])
    alice = user_named(db, "alice")
    neg = next(a for a in db.assignments(alice) if a.item.kind == "ils" and not a.item.positive)
    open_assignment(page, srv.url, neg.id)
    film = page.locator("#view").bounding_box()
    right = page.locator("#stage .orient[data-side=R]").bounding_box()
    left = page.locator("#stage .orient[data-side=L]").bounding_box()
    assert page.locator("#stage .orient").all_inner_texts() == ["R", "L"]
    # R just inside the film's left edge, L just inside its right edge, both half-way down, small
    assert film["x"] <= right["x"] <= film["x"] + 12 and film["x"] + film["width"] - 12 <= left["x"] + left["width"]
    assert left["x"] + left["width"] <= film["x"] + film["width"]
    for marker in (right, left):
        assert abs(marker["y"] + marker["height"] / 2 - (film["y"] + film["height"] / 2)) < 2
        assert marker["height"] < 24 and marker["width"] < 24
    # the canvas holds the film alone: grey pixels only where the markers are shown
    pixels = page.evaluate("""() => { const c = document.getElementById('view'), r = c.getBoundingClientRect();
      const m = document.querySelector('#stage .orient[data-side=R]').getBoundingClientRect();
      const x = Math.floor((m.left + m.width / 2 - r.left) * c.width / r.width);
      const y = Math.floor((m.top + m.height / 2 - r.top) * c.height / r.height);
      return Array.from(c.getContext('2d').getImageData(Math.max(0, x - 3), Math.max(0, y - 3), 7, 7).data); }""")
    rgba = np.array(pixels).reshape(-1, 4)
    assert (rgba[:, 0] == rgba[:, 1]).all() and (rgba[:, 1] == rgba[:, 2]).all()
    page.keyboard.press("+")  # zoomed in past the film's edges: the markers stay inside the stage
    page.keyboard.press("+")
    stage = page.locator("#stage").bounding_box()
    right = page.locator("#stage .orient[data-side=R]").bounding_box()
    left = page.locator("#stage .orient[data-side=L]").bounding_box()
    assert stage["x"] <= right["x"] < left["x"] and left["x"] + left["width"] <= stage["x"] + stage["width"]
    case = next(a for a in db.assignments(alice) if a.item.kind == "bench")
    open_assignment(page, srv.url, case.id)
    assert page.locator("#stage .orient").count() == 2
    assert page.console_errors == [], page.console_errors


def _served_film(url: str, token: str, assignment_id: int) -> np.ndarray:
    with client(url, token) as http:
        r = http.get(f"/api/assignments/{assignment_id}/image/0")
        assert r.status_code == 200
    image = np.asarray(Image.open(io.BytesIO(r.content)).convert("RGB")).astype(int)
    return np.rint(image.sum(axis=2) / 3).astype(int)


def test_window_values_are_shown_and_auto_takes_the_films_1st_to_99th_percentile(page, live, setup) -> None:
    srv, db = live
    alice = signed_in(page, srv, setup, db, "alice")
    for item in (next(a for a in db.assignments(alice) if a.item.kind == "ils"),
                 next(a for a in db.assignments(alice) if a.item.kind == "bench")):
        open_assignment(page, srv.url, item.id)
        assert page.inner_text("#wl-readout").startswith("W 255 / L 127.5")
        film = _served_film(srv.url, setup.tokens["alice"], item.id)
        lo, hi = (int(np.percentile(film, q, method="inverted_cdf")) for q in (1, 99))
        page.fill("#window", "40")
        page.dispatch_event("#window", "input")
        assert page.inner_text("#wl-readout") == "W 40 / L 127.5 (107.5–147.5)"  # the readout follows the sliders
        page.keyboard.press("w")
        readout = page.inner_text("#wl-readout")
        width, level = max(1, hi - lo), (lo + hi) / 2
        assert page.get_attribute("#app", "data-window") == str(width), readout
        assert float(page.get_attribute("#app", "data-level")) == level, readout
        assert float(page.input_value("#window")) == width and float(page.input_value("#level")) == level
        assert readout.endswith("auto") and f"({lo}–{hi})" in readout, readout
        page.keyboard.press("0")  # reset: the full range again
        assert page.inner_text("#wl-readout") == "W 255 / L 127.5 (0–255)"
        assert page.input_value("#window") == "255"
    assert page.console_errors == [], page.console_errors


def test_pages_show_readable_names_and_a_question_once_above_its_options(page, live, setup) -> None:
    srv, db = live
    alice = signed_in(page, srv, setup, db, "alice")
    pair = next(a for a in db.assignments(alice) if a.item.kind == "ils" and a.item.positive)
    open_assignment(page, srv.url, pair.id)
    kind = pair.item.item_type.split()[0]
    title = page.inner_text("#title")
    assert pair.item.key not in title and "positive pair" in title and pair.item.lesion in title
    assert page.get_attribute("#title", "title") == f"item {pair.item.key}"
    assert page.get_attribute("#item-type", "title") == f"type: {pair.item.item_type}"
    assert page.inner_text("#item-type") == f"{kind.replace('_', '-')} instruction, positive pair"
    section = pair.item.payload["section_name"]
    summary = page.inner_text("#section-name")
    assert summary.startswith("Report section: ") and "(" + section + ")" not in summary
    assert page.get_attribute("#section-name", "title") == f"section_name: {section}"

    case = next(a for a in db.assignments(alice) if a.item.kind == "bench")
    open_assignment(page, srv.url, case.id)
    assert page.get_attribute("#item-type", "title") == f"path: {case.item.payload['path']}"
    for q in case.item.payload["questions"]:
        box = page.locator(f".question[data-part='{q['part']}']")
        shown = box.locator(".question-text").inner_text()
        assert "Options:" not in shown and q["question"].startswith(shown.strip())  # the spec's stem, exact
        assert box.locator("pre").count() == 1  # the full text only in the folded "as the model reads it"
        assert box.locator("details.prompt pre").text_content() == q["question"]
        assert box.locator("ol.options li").all_inner_texts() == q["options"]
    assert page.console_errors == [], page.console_errors
