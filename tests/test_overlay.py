"""Overlay blend formula (CHEXPERCEPT.md §10.1) and the contact sheet layout."""

from __future__ import annotations

import numpy as np
import pytest

from cxrground.errors import MaskShapeError
from cxrground.io.overlay import blend, contact_sheet, label_panel, overlay_masks


def test_blend_formula_cyan_half():
    img = np.full((2, 2), 100, np.uint8)
    m = np.array([[1, 0], [0, 0]], bool)
    out = blend(img, m, (0.0, 1.0, 1.0), 0.5)
    # masked pixel: 100/255*(1-0.5) + colour*0.5 ; unmasked unchanged
    expected = np.rint(np.array([100 / 255 * 0.5, 100 / 255 * 0.5 + 0.5, 100 / 255 * 0.5 + 0.5]) * 255)
    assert out[0, 0].tolist() == expected.astype(int).tolist()
    assert out[1, 1].tolist() == [100, 100, 100]
    assert out.shape == (2, 2, 3) and out.dtype == np.uint8


def test_blend_checks_shape():
    with pytest.raises(MaskShapeError):
        blend(np.zeros((3, 3), np.uint8), np.zeros((3, 4), bool), (1, 0, 0), 0.5)


def test_overlay_outline_and_sheet():
    img = np.zeros((20, 20), np.uint8)
    m = np.zeros((20, 20), bool)
    m[5:15, 5:15] = True
    out = overlay_masks(img, [m], colours=[(1.0, 0.0, 0.0)], alpha=0.5)
    assert out[5, 5].tolist() == [255, 0, 0] and out[10, 10].tolist() == [128, 0, 0]
    panel = label_panel(out, "title", ["a line"], width=40)
    assert panel.shape[1] == 40 and panel.shape[0] > 40
    sheet = contact_sheet([panel, panel, panel], columns=2, gap=2)
    assert sheet.shape == (2 * (panel.shape[0] + 2) + 2, 2 * (40 + 2) + 2, 3)
