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


def _small_pack(root: Path) -> Path:
    """A pack of one NIH and one Cohen film with a manifest (the layout of cxr-pack-v1, without its data)."""
    import hashlib

    files = {
        "README.md": "# cxr-pack-v1\n",
        "nih/labels.csv": "image,labels,view,age,sex,orig_size\na.png,No Finding,PA,61,F,1024x1024\n",
        "nih/boxes_512.csv": "image,label,x,y,w,h\n",
        "nih/images/a.png": "png",
        "cohen/metadata.csv": "image,source_filename,patientid,finding,view,sex,age,license,source_url,doi,notes,"
                              "scale,orig_size\nb.jpg,b.jpg,1,COVID-19,AP,M,54.0,CC BY 4.0,u,d,,1.0,10x10\n",
        "cohen/brixia_scores.csv": "filename," + ",".join(f"{r}-{z}" for r in "SJ" for z in "ABCDEF") + "\n",
        "cohen/severity_scores.csv": "filename,geographic_mean,opacity_mean\n",
        "cohen/images/b.jpg": "jpg",
        "cohen/masks/b_right_lung.png": "r",
        "cohen/masks/b_left_lung.png": "l",
        "iu_reports/1.xml": "<eCitation/>",
    }
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    (root / "MANIFEST.sha256").write_text("".join(f"{hashlib.sha256(t.encode()).hexdigest()}  {n}\n"
                                                  for n, t in files.items()))
    return root


def test_verify_lists_every_problem_of_a_damaged_pack_without_a_traceback(tmp_path):
    """pack info --verify on a pack with a bad table row, a missing mask and an added file: each problem named with
    its file and reason, checksums still checked, exit 1; without --verify the bad row is one clean error, and the
    counts say they come from the tables and name a missing file."""
    from click.testing import CliRunner

    from cxrground.cli import main

    pack = _small_pack(tmp_path / "pack")
    assert Pack(pack).verify() == []
    with (pack / "nih/labels.csv").open("a") as fh:
        fh.write("c.png,No Finding,PA,40,M,1024\nx\n")
    (pack / "cohen/masks/b_left_lung.png").unlink()
    (pack / "extra.txt").write_text("added")
    res = CliRunner().invoke(main, ["pack", "info", "--path", str(pack), "--verify"])
    assert res.exit_code == 1 and "Traceback" not in res.output, res.output
    assert [line.strip() for line in res.output.splitlines()[-6:]] == [
        "verify: 5 problems",
        "nih/labels.csv: checksum differs from MANIFEST.sha256",
        "cohen/masks/b_left_lung.png: missing (listed in MANIFEST.sha256)",
        "extra.txt: not in MANIFEST.sha256 (a file added to the pack)",
        "nih/labels.csv: line 3: orig_size '1024' is not WIDTHxHEIGHT",
        "nih/labels.csv: line 4: no value for labels, view, age, sex, orig_size"]
    res = CliRunner().invoke(main, ["pack", "info", "--path", str(pack)])
    assert res.exit_code == 1 and res.output.startswith(f"Error: {pack / 'nih/labels.csv'}: line 3: orig_size")
    assert "(and 1 more problem); cxrground pack info --verify lists every problem" in res.output
    (pack / "nih/labels.csv").write_text("image,labels,view,age,sex,orig_size\na.png,No Finding,PA,61,F,1024x1024\n")
    res = CliRunner().invoke(main, ["pack", "info", "--path", str(pack)])
    assert res.exit_code == 0 and "counts of the tables' rows" in res.output
    assert "missing: 1 image or mask files the tables name: cohen/masks/b_left_lung.png" in res.output
    res = CliRunner().invoke(main, ["pack", "info", "--path", str(tmp_path / "nowhere")])
    assert res.exit_code == 1 and "not the cxr-pack-v1 folder (it has no README.md and cohen/ folder)" in res.output
