"""§10.1 rendering: cyan overlay formula, point discs with white rings, exact size, no PNG metadata."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from cxrground.percept.render import draw_points, gray_rgb, mask_overlay, point_geometry, write_png
from cxrground.percept.validate import _png_chunks


def test_overlay_formula_cyan_half() -> None:
    img = np.full((8, 10), 200, np.uint8)
    mask = np.zeros((8, 10), bool)
    mask[2:4, 3:6] = True
    out = mask_overlay(img, mask)
    v = 200 / 255
    # out = img·(1 − 0.5) + cyan·0.5 inside; unchanged outside
    assert tuple(out[2, 3]) == (round(v * 0.5 * 255), round((v * 0.5 + 0.5) * 255), round((v * 0.5 + 0.5) * 255))
    assert tuple(out[0, 0]) == (200, 200, 200)
    assert out.shape == (8, 10, 3) and out.dtype == np.uint8


@pytest.mark.parametrize(("shape", "radius", "ring"), [((1024, 800), 15.0, 2.0), ((512, 512), 7.5, 1.0),
                                                       ((1000, 2048), 30.0, 4.0)])
def test_point_geometry_scale_rule(shape: tuple[int, int], radius: float, ring: float) -> None:
    assert point_geometry(shape) == (radius, ring)


def test_points_filled_disc_with_white_ring_antialiased() -> None:
    rgb = gray_rgb(np.zeros((1024, 1024), np.uint8))
    out = draw_points(rgb, [((100, 200), "red"), ((600, 500), "blue")])
    assert tuple(out[200, 100]) == (255, 0, 0)          # centre: point colour
    assert tuple(out[200 + 10, 100]) == (255, 0, 0)     # inside radius 15
    assert tuple(out[200 + 15, 100]) == (255, 255, 255)  # on the ring (radius 15, width 2)
    assert tuple(out[200 + 20, 100]) == (0, 0, 0)       # outside
    assert tuple(out[500, 600]) == (0, 0, 255)
    # anti-aliasing: some pixels between ring and background have intermediate values
    ring_zone = out[180:222, 80:122, 1]
    assert ((ring_zone > 0) & (ring_zone < 255)).any()
    assert tuple(rgb[200, 100]) == (0, 0, 0)  # input untouched


def test_points_scale_with_image_size() -> None:
    out = draw_points(gray_rgb(np.zeros((256, 256), np.uint8)), [((128, 128), "green")])
    lit = (out.sum(axis=2) > 0)
    rows = np.flatnonzero(lit.any(axis=1))
    # radius 15/4 = 3.75 px plus a 1-px ring: the spot spans ~9-10 rows, not 30
    assert 7 <= len(rows) <= 11


def test_png_exact_size_rgb_without_text_chunks(tmp_path) -> None:
    rgb = gray_rgb(np.arange(35 * 21, dtype=np.uint8).reshape(35, 21))
    p = write_png(tmp_path / "x.png", rgb)
    with Image.open(p) as im:
        assert im.mode == "RGB" and im.size == (21, 35)
        assert np.array_equal(np.asarray(im), rgb)
    chunks = _png_chunks(p)
    assert chunks[0] == b"IHDR" and chunks[-1] == b"IEND"
    assert not {b"tEXt", b"zTXt", b"iTXt", b"tIME"} & set(chunks)
    q = write_png(tmp_path / "y.png", rgb)
    assert p.read_bytes() == q.read_bytes()
    with pytest.raises(ValueError):
        write_png(tmp_path / "z.png", rgb[:, :, 0])
