"""The web demo in headless Chromium: upload a CXR, type an instruction, see the mask overlaid and the answer."""

from __future__ import annotations

import re

import numpy as np
import pytest

pytest.importorskip("fastapi")

from cxrground.serve.app import STATIC_DIR, create_app
from cxrground.serve.run import BackgroundServer
from cxrground.vocab import ils_templates
from serve_helpers import ThresholdModel, cxr_pixels, expected_output, png_bytes

INSTRUCTION = ils_templates.instruction("global", "effusion")

READ_CANVAS = """() => {
  const c = document.getElementById('overlay-canvas');
  const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
  return {width: c.width, height: c.height, data: Array.from(d)};
}"""


@pytest.fixture(scope="module")
def server():
    with BackgroundServer(create_app(ThresholdModel())) as srv:
        yield srv


def _track_requests(page) -> list[str]:
    urls: list[str] = []
    page.on("request", lambda r: urls.append(r.url))
    return urls


def test_upload_segment_and_overlay(page, server, tmp_path):
    px = cxr_pixels(50, 70)
    image = tmp_path / "cxr.png"
    image.write_bytes(png_bytes(px))
    urls = _track_requests(page)
    page.goto(server.url + "/")
    page.wait_for_selector("body[data-ready='true']")
    assert page.locator("#example-select option").count() > 7
    page.set_input_files("#image-input", str(image))
    page.fill("#instruction-input", INSTRUCTION)
    page.click("#submit-button")
    page.wait_for_selector("body[data-state='done']", timeout=20_000)

    want = expected_output(px, INSTRUCTION)
    assert page.inner_text("#answer") == want.answer
    assert page.inner_text("#structured td[data-key='lesion']") == "effusion"
    assert page.inner_text("#structured td[data-key='present']") == "true"
    assert page.inner_text("#structured td[data-key='locations']") == "right lung"
    assert page.is_hidden("#error")

    canvas = page.evaluate(READ_CANVAS)
    assert (canvas["height"], canvas["width"]) == (50, 70)
    rgba = np.asarray(canvas["data"], dtype=np.int32).reshape(50, 70, 4)
    coloured = (rgba[:, :, 0] != rgba[:, :, 1]) | (rgba[:, :, 1] != rgba[:, :, 2])
    np.testing.assert_array_equal(coloured, want.mask)  # colour exactly where the mask is, grey elsewhere
    np.testing.assert_array_equal(rgba[~want.mask][:, 0], px[~want.mask])
    assert (rgba[want.mask][:, 1] - rgba[want.mask][:, 0] > 100).all()  # cyan tint, clearly visible

    page.screenshot(path=str(tmp_path / "web_demo.png"), full_page=True)
    assert (tmp_path / "web_demo.png").stat().st_size > 1000
    page.uncheck("#show-mask")
    rgba = np.asarray(page.evaluate(READ_CANVAS)["data"], dtype=np.int32).reshape(50, 70, 4)
    np.testing.assert_array_equal(rgba[:, :, 0], px)

    assert page.console_errors == []
    assert all(u.startswith(server.url) or u.startswith("data:") for u in urls), urls


def test_server_error_is_shown_in_the_page(page, server, tmp_path):
    bad = tmp_path / "notes.png"
    bad.write_bytes(b"this is a text file with a .png name")
    page.goto(server.url + "/")
    page.wait_for_selector("body[data-ready='true']")
    page.set_input_files("#image-input", str(bad))
    page.select_option("#example-select", index=1)
    assert page.input_value("#instruction-input") == ils_templates.instruction("global", "cardiomegaly")
    page.click("#submit-button")
    page.wait_for_selector("body[data-state='error']", timeout=20_000)
    message = page.inner_text("#error")
    assert message.startswith("Error 415:") and "unrecognised format" in message
    assert page.is_hidden("#result")


def test_static_files_reference_nothing_external():
    for path in STATIC_DIR.iterdir():
        text = path.read_text(encoding="utf-8")
        assert not re.search(r"(https?:)?//[a-z0-9.-]+\.[a-z]{2,}", text, re.IGNORECASE), path.name
