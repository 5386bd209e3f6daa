"""Uniform film borders: finding them, and the lung U-Net reading inside them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from cxrground.datasets.synthetic import SynthConfig, generate_study
from cxrground.io.borders import ContentBox, content_box
from cxrground.io.image import CXRImage


def _film(h: int = 200, w: int = 160, seed: int = 0) -> np.ndarray:
    """A textured 'exposed field' with no uniform line anywhere."""
    rng = np.random.default_rng(seed)
    return rng.integers(30, 220, size=(h, w)).astype(np.uint8)


def test_a_black_letterbox_band_is_cut_exactly():
    field = _film()
    padded = np.pad(field, ((20, 30), (0, 0)), constant_values=0)
    box = content_box(padded)
    assert box.to_list() == [20, 30, 0, 0]
    assert np.array_equal(box.crop(padded), field)


def test_grey_and_white_bands_with_noise_are_cut():
    rng = np.random.default_rng(1)
    field = _film()
    padded = np.pad(field, ((0, 0), (12, 9)), constant_values=0)
    padded[:, :12] = np.clip(128 + rng.integers(-3, 4, size=(200, 12)), 0, 255)  # grey, noisy band on the left
    padded[:, -9:] = 252  # white band on the right
    assert content_box(padded).to_list() == [0, 0, 12, 9]


def test_text_in_a_band_stops_the_cut_there():
    field = _film()
    padded = np.pad(field, ((40, 0), (0, 0)), constant_values=0)
    padded[10:16, 5:100] = 255  # a label: over 10 % of those rows are bright
    assert content_box(padded).top == 10  # the rows above the label are cut; the label and the band below it stay


def test_thin_bands_are_kept_and_cuts_are_capped():
    field = _film()
    thin = np.pad(field, ((1, 0), (0, 0)), constant_values=0)  # 1 px: under max(2 px, 1 %)
    assert content_box(thin).empty
    wide = np.pad(field, ((0, 0), (100, 0)), constant_values=0)  # 100 of 260 columns: capped at 30 %
    assert content_box(wide).left == int(0.30 * 260)


def test_nothing_is_cut_when_too_little_would_be_left():
    field = _film(60, 160)
    padded = np.pad(field, ((70, 70), (0, 0)), constant_values=0)  # the field is 30 % of the height
    assert content_box(padded).empty


def test_a_uniform_film_and_bad_input():
    assert content_box(np.zeros((50, 50), np.uint8)).empty  # everything "border": nothing would be left
    with pytest.raises(ValueError, match="2-D"):
        content_box(np.zeros((5, 5, 3), np.uint8))


def test_place_crop_and_grid_scaling():
    box = ContentBox((100, 80), top=10, bottom=20, left=4, right=6)
    inside = np.ones((70, 70), np.float32)
    full = box.place(inside)
    assert full.shape == (100, 80) and full.sum() == 70 * 70 and full[:10].sum() == 0
    assert np.array_equal(box.crop(full), inside)
    half = box.on_grid((50, 40))
    assert half.to_list() == [5, 10, 2, 3]


# --- the lung U-Net reads inside the box -----------------------------------------------------------------------

@pytest.fixture(scope="module")
def unet_pair():
    pytest.importorskip("torch")
    from cxrground.anatomy.segment import UNetLungSegmenter

    return UNetLungSegmenter(threads=1, content_box=True), UNetLungSegmenter(threads=1)


def _dice(a: np.ndarray, b: np.ndarray) -> float:
    return 2.0 * float((a & b).sum()) / max(1, int(a.sum() + b.sum()))


def test_a_bordered_phantom_reads_as_the_unbordered_one(unet_pair):
    on, off = unet_pair
    study = generate_study(0, 3, SynthConfig(width=256))
    plain = on.segment(CXRImage(study.image))
    assert "content_box" not in plain.extra  # a phantom has no border: nothing cut, nothing recorded
    h, w = study.image.shape
    py, px = h // 5, w // 5
    bordered = CXRImage(np.pad(study.image, ((py, py), (px, px)), constant_values=0))
    cut = on.segment(bordered)
    assert cut.extra["content_box"] == [py, py, px, px]
    inner = (slice(py, py + h), slice(px, px + w))
    assert _dice(cut.right_lung[inner], plain.right_lung) > 0.97
    assert _dice(cut.left_lung[inner], plain.left_lung) > 0.97
    assert not cut.right_lung[:py].any() and not cut.left_lung[:, :px].any()
    whole = off.segment(bordered)
    assert "content_box" not in whole.extra


def test_the_option_reaches_the_backend_from_the_command_line_form():
    pytest.importorskip("torch")
    from cxrground.anatomy.segment import get_segmenter

    assert get_segmenter("unet", content_box="true").content_box is True  # as --backend-opt gives it
    assert get_segmenter("unet", content_box="false").content_box is False
    assert get_segmenter("unet").content_box is False
    assert get_segmenter("unet", content_box="true").provenance()["content_box"].startswith("uniform borders cut")


@pytest.mark.pack
def test_a_pack_film_in_a_black_frame_keeps_its_left_lung(unet_pair, pack_dir: Path):
    """16708_5_1 sits in a black frame (149 rows above, 206 below, 52 columns right of the field): read whole, the
    U-Net loses much of the left lung (Dice 0.70 against the pack's mask); read inside the field it does not."""
    from cxrground.datasets.pack import Pack

    on, off = unet_pair
    rec = next(r for r in Pack(pack_dir).cohen() if r.image_id == "16708_5_1")
    im = rec.read()
    truth_r, truth_l = rec.lungs(im.shape)
    cut, whole = on.segment(im), off.segment(im)
    assert cut.extra["content_box"] == [149, 206, 0, 52]
    assert _dice(cut.left_lung, truth_l) > 0.85 > _dice(whole.left_lung, truth_l)
    assert _dice(cut.right_lung, truth_r) > 0.9


def test_anatomy_zones_passes_segmenter_options(monkeypatch, tmp_path: Path):
    pytest.importorskip("torch")
    from click.testing import CliRunner

    from cxrground.cli import main

    seen = {}

    def fake_write_zones(images, out, segmenter, *args, **kwargs):
        seen["content_box"] = segmenter.content_box
        return [], []

    monkeypatch.setattr("cxrground.lesions.zones.write_zones", fake_write_zones)
    monkeypatch.setattr("cxrground.lesions.zones.find_images", lambda root: [])
    base = ["anatomy", "zones", "--images", str(tmp_path), "--out", str(tmp_path / "o"), "--zone-model", "normative"]
    assert CliRunner().invoke(main, [*base, "--segmenter-opt", "content_box=true"]).exit_code == 0
    assert seen == {"content_box": True}
    assert CliRunner().invoke(main, base).exit_code == 0
    assert seen == {"content_box": False}
    res = CliRunner().invoke(main, [*base, "--segmenter-opt", "borders=true"])
    assert res.exit_code != 0 and "does not accept option 'borders'" in res.output
