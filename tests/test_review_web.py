"""The review app in headless Chromium: log in, review a pair, correct a mask with the brush and the eraser (after
zooming), review a CheXpercept case, see the statistics."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("fastapi")

from cxrground.io.masks import decode_rle
from review_helpers import browser_login, review_setup, served_copy

READ_CANVAS = """() => {
  const c = document.getElementById('view');
  const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
  return {width: c.width, height: c.height, data: Array.from(d)};
}"""
GREY = """() => new Promise((resolve) => {
  const img = new Image();
  img.onload = () => {
    const c = document.createElement('canvas'); c.width = img.width; c.height = img.height;
    const x = c.getContext('2d'); x.drawImage(img, 0, 0);
    resolve(Array.from(x.getImageData(0, 0, c.width, c.height).data).filter((_, i) => i % 4 === 0));
  };
  img.src = '/api/assignments/' + document.getElementById('app').dataset.assignment + '/image/0';
})"""


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    return review_setup(tmp_path_factory)


@pytest.fixture()
def live(setup, tmp_path):
    with served_copy(setup, tmp_path / "db") as served:
        yield served


def _canvas(page) -> np.ndarray:
    c = page.evaluate(READ_CANVAS)
    return np.asarray(c["data"], dtype=np.int32).reshape(c["height"], c["width"], 4)


def _native_to_client(page, x: float, y: float, h: int, w: int) -> tuple[float, float]:
    box = page.locator("#view").bounding_box()
    return box["x"] + (x + 0.5) * box["width"] / w, box["y"] + (y + 0.5) * box["height"] / h


def test_review_a_pair_correct_a_mask_and_see_statistics(page, live, setup, tmp_path) -> None:
    srv, db = live
    urls: list[str] = []
    page.on("request", lambda r: urls.append(r.url))
    page.set_viewport_size({"width": 1280, "height": 900})
    page.goto(srv.url + "/login")
    page.fill("#name", "alice")
    page.fill("#token", "wrong")
    page.click("#login-button")
    assert "wrong token" in page.inner_text("#login-error")
    page.console_errors.clear()  # the refused login's 401 is logged by the browser
    browser_login(page, srv.url, "alice", setup.tokens["alice"])
    alice = next(u for u in db.users() if u.name == "alice")
    queue = db.assignments(alice)
    assert page.inner_text("#progress-text") == f"0 of {len(queue)} done"
    assert page.locator("#queue tbody tr").count() == len(queue)
    page.click("#resume")
    page.wait_for_selector("body[data-ready='true']")
    first = queue[0]
    assert first.item.kind == "ils" and first.item.positive
    assert page.url.endswith(f"/review/{first.id}")
    payload = first.item.payload
    assert page.inner_text("#instruction") == payload["instruction"]
    assert page.get_attribute("#answer", "data-raw") == payload["answer"]
    assert "[SEG]" not in page.inner_text("#answer") and "[mask: the overlay]" in page.inner_text("#answer")
    assert page.inner_text("#sentence") == payload["sentence"] and payload["sentence"]

    h, w = first.item.height, first.item.width
    generated = decode_rle(first.item.mask, (h, w))
    grey = np.asarray(page.evaluate(GREY), dtype=np.int32).reshape(h, w)
    rgba = _canvas(page)
    assert rgba.shape == (h, w, 4)
    coloured = rgba[:, :, 0] != rgba[:, :, 1]
    np.testing.assert_array_equal(coloured, generated)  # overlay exactly on the generated mask
    np.testing.assert_array_equal(rgba[~generated][:, 0], grey[~generated])  # identity window elsewhere
    page.uncheck("#show-mask")
    np.testing.assert_array_equal(_canvas(page)[:, :, 0], grey)
    page.keyboard.press("m")  # shortcut: mask back on
    assert page.is_checked("#show-mask")
    page.fill("#window", "100")  # window/level: narrower window raises contrast
    page.dispatch_event("#window", "input")
    narrow = _canvas(page)[:, :, 0]
    assert not np.array_equal(narrow[~generated], grey[~generated])
    page.click("#reset-view")
    np.testing.assert_array_equal(_canvas(page)[~generated][:, 0], grey[~generated])

    # zoom in with the wheel around the canvas centre, then pan a little with the hand tool
    box = page.locator("#stage").bounding_box()
    page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    before = float(page.get_attribute("#app", "data-scale") or 0)
    page.mouse.wheel(0, -300)
    page.wait_for_function(f"Number(document.getElementById('app').dataset.scale) > {before}")
    page.keyboard.press("h")
    assert page.get_attribute("#app", "data-tool") == "pan"
    page.mouse.move(box["x"] + 200, box["y"] + 200)
    page.mouse.down()
    page.mouse.move(box["x"] + 230, box["y"] + 220, steps=3)
    page.mouse.up()
    assert page.get_attribute("#app", "data-edited") is None  # panning paints nothing

    # brush a stroke away from the generated mask, erase at the mask's centroid
    page.keyboard.press("b")
    page.fill("#brush-size", "3")
    page.dispatch_event("#brush-size", "input")
    ys, xs = np.nonzero(~generated)
    far = np.argmax((ys - np.nonzero(generated)[0].mean()) ** 2 + (xs - np.nonzero(generated)[1].mean()) ** 2)
    ty, tx = int(np.clip(ys[far], 6, h - 7)), int(np.clip(xs[far], 6, w - 16))
    vis = page.locator("#stage").bounding_box()
    cx, cy = _native_to_client(page, tx, ty, h, w)
    if not (vis["x"] < cx < vis["x"] + vis["width"] - 40 and vis["y"] < cy < vis["y"] + vis["height"]):
        page.keyboard.press("0")  # stroke outside the zoomed view: reset and paint at the fitted scale
        cx, cy = _native_to_client(page, tx, ty, h, w)
    page.mouse.move(cx, cy)
    page.mouse.down()
    end_x, _ = _native_to_client(page, tx + 8, ty, h, w)
    page.mouse.move(end_x, cy, steps=8)
    page.mouse.up()
    gy, gx = (round(float(v)) for v in np.argwhere(generated).mean(axis=0))
    if not generated[gy, gx]:
        gy, gx = (int(v) for v in np.argwhere(generated)[len(np.argwhere(generated)) // 2])
    page.keyboard.press("e")
    ex, ey = _native_to_client(page, gx, gy, h, w)
    page.mouse.click(ex, ey)
    assert page.get_attribute("#app", "data-edited") == "true"
    page.keyboard.press("s")  # save the corrected mask; the page moves to the next open assignment
    page.wait_for_url(lambda u: not u.endswith(f"/review/{first.id}"))

    saved = db.assignment(first.id, alice).decisions["pair"]
    assert saved["decision"] == "correct"
    fixed = decode_rle(saved["mask"], (h, w))
    added, removed = fixed & ~generated, generated & ~fixed
    assert added.sum() >= 10 and removed.sum() >= 5
    ay, ax = np.nonzero(added)
    assert abs(ay.mean() - ty) <= 4 and tx - 4 <= ax.mean() <= tx + 12  # the stroke, where it was drawn
    ry, rx = np.nonzero(removed)
    assert abs(ry.mean() - gy) <= 4 and abs(rx.mean() - gx) <= 4  # the eraser click
    assert (fixed == generated)[np.hypot(*np.mgrid[:h, :w] - np.array([[[gy]], [[gx]]])) > 6].sum() \
        >= generated.size - added.sum() - 200

    # the next pair: reject with a reason
    page.wait_for_selector("body[data-ready='true']")
    second = int(page.get_attribute("#app", "data-assignment"))
    assert second == queue[1].id
    page.select_option("#reason", "wrong location")
    page.click("#reject")
    page.wait_for_url(lambda u: not u.endswith(f"/review/{second}"))
    assert db.assignment(second, alice).decisions["pair"] == {**db.assignment(second, alice).decisions["pair"],
                                                             "decision": "reject", "reason": "wrong location"}

    # a CheXpercept case: every question with its images and answer key; accept all
    case = next(a for a in queue if a.item.kind == "bench")
    page.goto(f"{srv.url}/review/{case.id}")
    page.wait_for_selector("body[data-ready='true']")
    sections = page.locator("section.question")
    assert sections.count() == len(case.item.parts)
    assert page.locator("li.key").count() >= len(case.item.parts)
    page.wait_for_function("Array.from(document.images).every(i => i.complete && i.naturalWidth > 0)")
    for k in range(sections.count()):
        sections.nth(k).locator("button.accept").click()
        page.wait_for_selector(f"section.question:nth-of-type({k + 1})[data-state='accept']", timeout=10_000)
    assert page.is_visible("#next")
    assert db.assignment(case.id, alice).done
    page.goto(srv.url + "/queue")
    assert page.inner_text("#progress-text") == f"3 of {len(queue)} done"
    assert page.request.get(srv.url + "/stats").status == 403  # statistics are for admins
    page.click("#logout")
    page.wait_for_url(srv.url + "/login")

    # the admin's statistics page
    browser_login(page, srv.url, "boss", setup.tokens["boss"])
    page.goto(srv.url + "/stats")
    assert "Review statistics" in page.inner_text("h1")
    lesion_rows = page.locator("#by-lesion tbody tr")
    assert lesion_rows.count() >= 1
    dice_all = page.locator("#dice tbody tr").last.inner_text()
    assert dice_all.split("\t")[:2] == ["all", "1"]
    assert 0.0 < float(dice_all.split("\t")[2]) < 1.0
    assert "wrong location" in page.inner_text("#reasons")
    page.screenshot(path=str(tmp_path / "stats.png"), full_page=True)
    assert page.console_errors == [], page.console_errors
    assert all(u.startswith(srv.url) or u.startswith("data:") or u.startswith("blob:") for u in urls), urls
