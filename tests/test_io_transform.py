"""Letterbox transform: exact native <-> working-size round trips and the serialised record."""

from __future__ import annotations

import numpy as np
import pytest

from cxrground.errors import MaskShapeError
from cxrground.io.transform import Letterbox

SIZES = [(937, 1123), (512, 448), (1024, 1024), (300, 701), (2544, 3056), (1, 5)]


@pytest.mark.parametrize("src", SIZES)
@pytest.mark.parametrize("canvas", [512, 1024, (384, 512)])
def test_mask_round_trips(src, canvas):
    rng = np.random.default_rng(0)
    box = Letterbox.fit(src, canvas)
    # a mask made on the canvas maps to native pixels and back unchanged when the canvas is the smaller grid
    if box.scale_yx[0] <= 1 and box.scale_yx[1] <= 1:
        cm = np.zeros(box.canvas_hw, bool)
        cm[box.valid_region()] = rng.random(box.resized_hw) > 0.5
        np.testing.assert_array_equal(box.mask_to_canvas(box.mask_to_native(cm)), cm)
    # a native mask maps to the canvas and back unchanged when the canvas is the larger grid
    if box.scale_yx[0] >= 1 and box.scale_yx[1] >= 1:
        nm = rng.random(box.src_hw) > 0.5
        np.testing.assert_array_equal(box.mask_to_native(box.mask_to_canvas(nm)), nm)


def test_fit_geometry_and_padding():
    box = Letterbox.fit((500, 1000), 1024)
    assert box.resized_hw == (512, 1024)
    assert box.offset_yx == (256, 0)
    top = Letterbox.fit((500, 1000), 1024, align="topleft")
    assert top.offset_yx == (0, 0)
    m = np.ones((500, 1000), bool)
    cm = box.mask_to_canvas(m)
    assert cm.sum() == 512 * 1024 and not cm[:256].any() and not cm[256 + 512 :].any()


def test_native_frame_is_exact_for_integer_upscale():
    box = Letterbox.fit((4, 6), (8, 12))
    m = np.zeros((4, 6), bool)
    m[1, 2] = True
    cm = box.mask_to_canvas(m)
    assert cm.sum() == 4 and cm[2:4, 4:6].all()


def test_longest_side_and_stretch():
    sam = Letterbox.longest_side((600, 800), 1024)
    assert sam.resized_hw == (768, 1024) and sam.offset_yx == (0, 0) and sam.canvas_hw == (1024, 1024)
    unpadded = Letterbox.longest_side((600, 800), 1024, pad=False)
    assert unpadded.canvas_hw == (768, 1024)
    st = Letterbox.stretch((600, 800), 512)
    assert st.resized_hw == (512, 512) and st.scale_yx == pytest.approx((512 / 600, 512 / 800))


def test_record_round_trip():
    box = Letterbox.fit((937, 1123), 512)
    assert Letterbox.from_dict(box.to_dict()) == box


def test_points_round_trip():
    box = Letterbox.fit((937, 1123), 512)
    pts = np.array([[0.0, 0.0], [1122.0, 936.0], [400.5, 300.25]])
    np.testing.assert_allclose(box.points_to_native(box.points_to_canvas(pts)), pts, atol=1e-9)
    # the native image's outer corners land on the un-padded canvas corners
    corners = box.points_to_canvas([[-0.5, -0.5], [1122.5, 936.5]])
    oy, ox = box.offset_yx
    np.testing.assert_allclose(corners, [[ox - 0.5, oy - 0.5], [ox + 511.5, oy + box.resized_hw[0] - 0.5]])


def test_image_to_canvas_and_logits_back():
    rng = np.random.default_rng(1)
    img = rng.integers(0, 256, (300, 400), dtype=np.uint8)
    box = Letterbox.fit(img.shape, 256)
    canvas = box.image_to_canvas(img)
    assert canvas.shape == (256, 256) and canvas[: box.offset_yx[0]].max() == 0
    logits = np.where(box.mask_to_canvas(img > 128), 5.0, -5.0).astype(np.float32)
    back = box.logits_to_native(logits)
    assert back.shape == img.shape
    rgb = box.image_to_canvas(np.stack([img] * 3, axis=-1))
    assert rgb.shape == (256, 256, 3)


def test_shape_errors_name_both():
    box = Letterbox.fit((100, 200), 64)
    with pytest.raises(MaskShapeError, match=r"\(200, 100\).*\(100, 200\)"):
        box.mask_to_canvas(np.zeros((200, 100), bool))
    with pytest.raises(MaskShapeError):
        box.mask_to_native(np.zeros((100, 200), bool))
