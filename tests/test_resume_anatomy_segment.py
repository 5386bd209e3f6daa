"""``segment lungs`` into a folder used before: no ``heart.png`` of an earlier film next to a ``masks.json`` that
says there is no heart; files it does not write are left alone."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from cxrground.anatomy.segment.base import LungHeartMasks
from cxrground.anatomy.segment.output import write_segmentation
from cxrground.io.image import CXRImage


def _masks(size: int, heart: bool) -> LungHeartMasks:
    r = np.zeros((size, size), bool)
    lft = np.zeros((size, size), bool)
    r[10:50, 8:28] = True
    lft[10:50, 36:56] = True
    h = None
    if heart:
        h = np.zeros((size, size), bool)
        h[30:50, 24:40] = True
    return LungHeartMasks(r, lft, h, "truth" if heart else "none", "given")


def test_a_reused_folder_keeps_no_earlier_heart(tmp_path: Path) -> None:
    out = tmp_path / "seg"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    first = CXRImage(np.full((64, 64), 120, np.uint8), path="a.png")
    write_segmentation(out, Path("a.png"), first, _masks(64, heart=True), {"backend": "given"})
    assert (out / "heart.png").is_file()
    second = CXRImage(np.full((72, 72), 90, np.uint8), path="b.png")
    write_segmentation(out, Path("b.png"), second, _masks(72, heart=False), {"backend": "given"})
    record = json.loads((out / "masks.json").read_text())
    assert record["heart_source"] == "none"
    assert not (out / "heart.png").exists()
    assert (out / "notes.txt").read_text() == "mine"  # not a file of this command: left alone
    assert sorted(p.name for p in out.iterdir()) == ["left_lung.png", "masks.json", "notes.txt", "overlay.png",
                                                     "right_lung.png"]
