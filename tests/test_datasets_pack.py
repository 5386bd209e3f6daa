"""Real data: the shared cxr-pack-v1 read in place (skipped outside CI when the pack is missing)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from cxrground.datasets.pack import SHIPPABLE_LICENCES, Pack, PackMissingError, find_pack
from cxrground.io.image import read_images

pytestmark = pytest.mark.pack


@pytest.fixture(scope="module")
def pack(pack_dir) -> Pack:
    return Pack(pack_dir)


def test_counts_match_the_pack_readme(pack):
    nih, cohen = pack.nih(), pack.cohen()
    assert len(nih) == 621 and sum(len(r.boxes) for r in nih) == 12
    assert len(cohen) == 205 and len(pack.iu_report_paths()) == 300
    assert sum(r.brixia is not None for r in cohen) == 71
    assert sum(bool(r.severity) for r in cohen) == 21
    assert sum(r.ignore_mask_path is not None for r in cohen) == 15


def test_shippable_rows_follow_attribution(pack):
    shippable = pack.cohen(shippable_only=True)
    # ATTRIBUTION.md: 84 CC BY 3.0 + 6 CC BY 4.0 + 7 "authorized for everyone"
    assert len(shippable) == 97
    assert {r.license for r in shippable} == SHIPPABLE_LICENCES
    assert not any("NC" in r.license for r in shippable)


def test_nih_images_read_at_512(pack):
    records = pack.nih()[:20]
    images, failures = read_images([r.image_path for r in records], progress=False)
    assert not failures and all(im.shape == (512, 512) for im in images)
    im = records[0].read()
    assert im.view in ("PA", "AP") and im.pixels.dtype == np.uint8 and im.pixels.std() > 10
    with_box = next(r for r in pack.nih() if r.boxes)
    b = with_box.boxes[0]
    assert 0 <= b.x < 512 and 0 <= b.y < 512 and b.w > 0 and b.h > 0


def test_cohen_lung_masks_load_and_lie_on_the_right_sides(pack):
    records = pack.cohen()
    darker = []
    for rec in records[::10]:
        im = rec.read()
        right, left = rec.lungs(im.shape)
        assert right.shape == im.shape and right.any() and left.any(), rec.image_id
        # patient's right lung appears on the image left
        assert np.argwhere(right)[:, 1].mean() < np.argwhere(left)[:, 1].mean(), rec.image_id
        assert (right & left).sum() < 0.01 * right.sum()
        darker.append(im.pixels[right | left].mean() < im.pixels.mean())
    # aerated lungs are darker than the image on average; a few COVID/ARDS white-outs are not
    assert sum(darker) >= 0.8 * len(darker), darker


def test_brixia_scores_parsed(pack):
    rec = next(r for r in pack.cohen() if r.brixia is not None)
    assert set(rec.brixia.senior) == set("ABCDEF")
    assert all(0 <= v <= 3 for v in rec.brixia.senior.values())


def test_manifest_verifies(pack):
    assert pack.verify() == []


def test_missing_pack_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("CXRGROUND_PACK", str(tmp_path / "nowhere"))
    with pytest.raises(PackMissingError, match="CXRGROUND_PACK"):
        find_pack()


def test_the_pack_beside_the_checkout_is_found_from_any_folder(tmp_path, monkeypatch):
    beside = Path(__file__).resolve().parents[2] / "shared" / "data" / "cxr-pack-v1"
    if not (beside / "cohen").is_dir():
        pytest.skip("no pack beside this checkout")
    monkeypatch.delenv("CXRGROUND_PACK", raising=False)
    monkeypatch.chdir(tmp_path)
    assert find_pack() == beside.resolve()
