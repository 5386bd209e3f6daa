"""The review viewer as a radiologist uses it, in headless Chromium at 1920x1080 and at a laptop size: the image
fills the space the window leaves, zooms to full resolution, shows the generated mask beside the corrected one,
the answer without the raw [SEG] token, benchmark cases in the same viewer, and a keyboard flow that never loses
a brush edit or records a reason nobody chose."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("fastapi")

from cxrground.io.masks import decode_rle, encode_rle
from cxrground.review.app import create_app
from cxrground.serve.run import BackgroundServer
from review_helpers import browser_login, open_assignment, paint_stroke, review_setup, served_copy

SIZES = [(1920, 1080), (1366, 768)]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    return review_setup(tmp_path_factory)


@pytest.fixture()
def live(setup, tmp_path):
    with served_copy(setup, tmp_path / "db") as served:
        yield served


def _scale(page) -> float:
    return float(page.get_attribute("#app", "data-scale"))


@pytest.mark.parametrize("size", SIZES, ids=[f"{w}x{h}" for w, h in SIZES])
def test_the_image_fills_the_window_and_zooms_to_full_resolution(page, live, setup, size, tmp_path) -> None:
    srv, db = live
    vw, vh = size
    page.set_viewport_size({"width": vw, "height": vh})
    browser_login(page, srv.url, "alice", setup.tokens["alice"])
    alice = next(u for u in db.users() if u.name == "alice")
    pair = next(a for a in db.assignments(alice) if a.item.kind == "ils" and a.item.positive)
    open_assignment(page, srv.url, pair.id)
    stage = page.locator("#stage").bounding_box()
    image = page.locator("#view").bounding_box()
    assert stage["y"] + stage["height"] >= vh - 20 and stage["height"] >= vh - 110, stage  # the full height left
    assert stage["width"] >= 0.6 * vw, stage
    h, w = pair.item.height, pair.item.width
    fitted = min(stage["width"] / w, stage["height"] / h)
    assert abs(_scale(page) - fitted) < 0.01  # as large as the stage allows, in one dimension exactly
    assert abs(image["height"] - h * fitted) < 2 and abs(image["width"] - w * fitted) < 2
    assert image["height"] >= 0.8 * stage["height"] or image["width"] >= 0.95 * stage["width"]
    page.screenshot(path=str(tmp_path / f"pair_{vw}.png"))
    page.keyboard.press("1")  # one image pixel per screen pixel
    assert abs(_scale(page) - 1.0) < 1e-3
    page.keyboard.press("+")
    assert _scale(page) > 1.2
    page.keyboard.press("0")
    assert abs(_scale(page) - fitted) < 0.01
    assert "[SEG]" not in page.inner_text("#answer")
    assert page.get_attribute("#answer", "data-raw") == pair.item.payload["answer"]
    assert page.console_errors == [], page.console_errors


def test_generated_and_corrected_masks_side_by_side(page, live, setup) -> None:
    srv, db = live
    page.set_viewport_size({"width": 1920, "height": 1080})
    browser_login(page, srv.url, "alice", setup.tokens["alice"])
    alice = next(u for u in db.users() if u.name == "alice")
    pair = next(a for a in db.assignments(alice) if a.item.kind == "ils" and a.item.positive)
    open_assignment(page, srv.url, pair.id)
    assert not page.is_visible("#stage-generated")
    page.keyboard.press("c")
    assert page.is_visible("#stage-generated") and page.is_checked("#compare")
    left, right = page.locator("#view").bounding_box(), page.locator("#view-generated").bounding_box()
    assert abs(left["width"] - right["width"]) < 1 and abs(left["height"] - right["height"]) < 1  # one transform
    h, w = pair.item.height, pair.item.width
    rgba = np.asarray(page.evaluate("""() => {
      const c = document.getElementById('view-generated');
      return Array.from(c.getContext('2d').getImageData(0, 0, c.width, c.height).data);
    }"""), dtype=np.int32).reshape(h, w, 4)
    orange = rgba[:, :, 0] > rgba[:, :, 2]
    np.testing.assert_array_equal(orange, decode_rle(pair.item.mask, (h, w)))
    page.keyboard.press("+")
    left, right = page.locator("#view").bounding_box(), page.locator("#view-generated").bounding_box()
    assert abs(left["width"] - right["width"]) < 1  # zoom moves both panes
    page.keyboard.press("c")
    assert not page.is_visible("#stage-generated")


def test_keyboard_flow_never_loses_an_edit_nor_invents_a_reason(page, live, setup) -> None:
    srv, db = live
    page.set_viewport_size({"width": 1366, "height": 768})
    dialogs: list[str] = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    browser_login(page, srv.url, "alice", setup.tokens["alice"])
    alice = next(u for u in db.users() if u.name == "alice")
    queue = db.assignments(alice)
    pair = next(a for a in queue if a.item.kind == "ils" and a.item.positive)
    open_assignment(page, srv.url, pair.id)

    page.keyboard.press("r")  # no reason chosen: nothing is recorded, the list is offered
    assert "choose a reason" in page.inner_text("#status")
    assert page.evaluate("document.activeElement.id") == "reason"
    assert page.is_disabled("#reject")
    page.keyboard.press("Escape")
    page.evaluate("document.activeElement.blur()")
    assert not db.assignment(pair.id, alice).decisions

    h, w = pair.item.height, pair.item.width
    generated = decode_rle(pair.item.mask, (h, w))
    ys, xs = np.nonzero(~generated)
    far = np.argmax((ys - np.nonzero(generated)[0].mean()) ** 2 + (xs - np.nonzero(generated)[1].mean()) ** 2)
    ty, tx = int(np.clip(ys[far], 6, h - 7)), int(np.clip(xs[far], 6, w - 16))
    page.keyboard.press("b")
    paint_stroke(page, h, w, ty, tx, tx + 8)
    assert page.get_attribute("#app", "data-edited") == "true"
    assert "your mask" in page.inner_text("#accept")
    if page.locator("#next").count():
        page.keyboard.press("n")  # asks first; dismissed: the page and the paint stay
        assert dialogs and "not saved" in dialogs[-1]
        assert page.url.endswith(f"/review/{pair.id}") and page.get_attribute("#app", "data-edited") == "true"
    page.keyboard.press("p") if page.locator("#prev").count() else None
    assert page.url.endswith(f"/review/{pair.id}")
    page.keyboard.press("a")  # after painting, A accepts the painted mask
    page.wait_for_url(lambda u: not u.endswith(f"/review/{pair.id}"))
    saved = db.assignment(pair.id, alice).decisions["pair"]
    assert saved["decision"] == "correct"
    fixed = decode_rle(saved["mask"], (h, w))
    assert (fixed & ~generated).sum() >= 10 and not (generated & ~fixed).any()

    other = next(a for a in queue if a.item.kind == "ils" and a.id != pair.id and not a.decisions)
    open_assignment(page, srv.url, other.id)
    page.select_option("#reason", "image unreadable")
    assert page.evaluate("document.activeElement.id") != "reason"  # the list lets go of the keys once chosen
    page.keyboard.press("r")
    page.wait_for_url(lambda u: not u.endswith(f"/review/{other.id}"))
    assert db.assignment(other.id, alice).decisions["pair"]["reason"] == "image unreadable"
    assert page.console_errors == [], page.console_errors


@pytest.mark.parametrize("size", SIZES, ids=[f"{w}x{h}" for w, h in SIZES])
def test_benchmark_cases_get_the_same_viewer(page, live, setup, size, tmp_path) -> None:
    srv, db = live
    vw, vh = size
    page.set_viewport_size({"width": vw, "height": vh})
    browser_login(page, srv.url, "alice", setup.tokens["alice"])
    alice = next(u for u in db.users() if u.name == "alice")
    case = next(a for a in db.assignments(alice) if a.item.kind == "bench")
    open_assignment(page, srv.url, case.id)
    stage = page.locator("#stage").bounding_box()
    assert stage["height"] >= vh - 160 and stage["width"] >= 0.55 * vw, stage
    image = page.locator("#view").bounding_box()
    assert image["height"] >= 0.8 * stage["height"] or image["width"] >= 0.95 * stage["width"]
    read = "() => Array.from(document.getElementById('view').getContext('2d').getImageData(0, 0, 64, 64).data)"
    before = page.evaluate(read)
    page.fill("#window", "60")
    page.dispatch_event("#window", "input")
    assert page.evaluate(read) != before  # window/level on the case image
    fitted = _scale(page)
    page.keyboard.press("+")
    zoomed = _scale(page)
    assert zoomed > fitted
    thumbs = page.locator("button.thumb")
    # one thumbnail per image a question shows (questions that only go on with the conversation show none)
    shown = sum(len(q["images"]) for q in case.item.payload["questions"])
    assert shown >= 1 and thumbs.count() == shown
    distinct = sorted({int(t) for t in thumbs.evaluate_all("ts => ts.map(t => t.dataset.image)")})
    if len(distinct) > 1:
        page.keyboard.press("]")
        page.wait_for_function(f"document.getElementById('app').dataset.image !== '{distinct[0]}'")
        assert page.input_value("#window") == "60"  # the same window carries over to the next image
    assert "[SEG]" not in page.inner_text(".side")
    page.screenshot(path=str(tmp_path / f"case_{vw}.png"))
    assert page.console_errors == [], page.console_errors


@pytest.fixture()
def served(setup, tmp_path):
    """(url, private db) of the app on a fixed local port."""
    db = setup.copy(tmp_path / "db")
    with BackgroundServer(create_app(db), port=18931) as srv:
        yield srv.url, db


def test_saving_an_unchanged_mask_is_an_accept_and_an_empty_one_is_never_posted(page, served, setup) -> None:
    url, db = served
    page.set_viewport_size({"width": 1366, "height": 768})
    posts: list[dict] = []
    page.on("request", lambda r: r.method == "POST" and "/decision" in r.url and posts.append(r.post_data_json))
    browser_login(page, url, "alice", setup.tokens["alice"])
    alice = next(u for u in db.users() if u.name == "alice")
    first, second = [a for a in db.assignments(alice) if a.item.kind == "ils" and a.item.positive][:2]

    open_assignment(page, url, first.id)
    page.keyboard.press("s")  # S with nothing painted: an accept, no correction
    page.wait_for_url(lambda u: not u.endswith(f"/review/{first.id}"))
    saved = db.assignment(first.id, alice).decisions["pair"]
    assert saved["decision"] == "accept" and saved["mask"] is None
    assert [p["decision"] for p in posts] == ["accept"] and "mask" not in posts[0]  # the page posted an accept

    h, w = second.item.height, second.item.width
    ty, tx = h // 2, w // 2
    tiny = np.zeros((h, w), bool)
    tiny[ty - 1: ty + 2, tx: tx + 4] = True
    db.record(second.id, "pair", "correct", mask=encode_rle(tiny))  # an earlier correction: a few pixels
    before = db.assignment(second.id, alice).decisions["pair"]
    open_assignment(page, url, second.id)
    page.keyboard.press("e")
    paint_stroke(page, h, w, ty, tx - 3, tx + 7)  # erase them all: the mask is empty now
    assert page.get_attribute("#app", "data-edited") == "true"
    for key in ("a", "s"):
        page.keyboard.press(key)
        status = page.inner_text("#status")
        assert "empty mask means no lesion" in status and "reject the pair" in status, status
    assert page.url.endswith(f"/review/{second.id}") and len(posts) == 1  # nothing was posted
    assert db.assignment(second.id, alice).decisions["pair"] == before
    assert page.console_errors == [], page.console_errors
