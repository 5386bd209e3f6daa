"""Tilted films: the tilt estimate from the lungs, turning films and masks, and the built-in segmenter's option
``deskew`` (off by default; bench/records/film_tilt_preregistration.md)."""

from __future__ import annotations

import numpy as np
import pytest

from cxrground.anatomy.segment.tilt import MIN_TILT, SEARCH, lateral_tilt, thorax_tilt, turn


def _lungs(h: int = 240, w: int = 240) -> tuple[np.ndarray, np.ndarray]:
    """Two lung-like ellipses, mirror images about the film's middle column (right lung on the image left)."""
    yy, xx = np.mgrid[:h, :w]
    right = ((yy - 120) / 80) ** 2 + ((xx - 78) / 34) ** 2 <= 1
    left = ((yy - 120) / 80) ** 2 + ((xx - 161) / 34) ** 2 <= 1
    return right, left


def test_an_upright_pair_has_no_tilt():
    right, left = _lungs()
    assert abs(thorax_tilt(right, left)) < 1


@pytest.mark.parametrize("degrees", [7.0, -7.0, 10.0])
def test_the_estimate_is_the_turn_that_puts_the_film_upright(degrees):
    right, left = _lungs()
    turned = turn(right, degrees, mask=True), turn(left, degrees, mask=True)
    tilt = thorax_tilt(*turned)
    assert tilt is not None and abs(tilt + degrees) <= 1.0  # turning by the estimate undoes the turn


def test_no_estimate_without_two_lungs_or_beyond_the_search():
    right, left = _lungs()
    assert thorax_tilt(np.zeros_like(right), left) is None
    assert lateral_tilt(np.zeros_like(right), left) is None
    far = float(np.abs(SEARCH).max()) + 10
    assert thorax_tilt(turn(right, far, mask=True), turn(left, far, mask=True)) is None


def test_turn_keeps_shape_and_dtype():
    film = np.random.default_rng(0).integers(0, 256, (60, 80)).astype(np.uint8)
    out = turn(film, 5.0)
    assert out.shape == film.shape and out.dtype == np.uint8
    assert np.array_equal(turn(film, 0.0), film)
    mask = turn(_lungs()[0], 5.0, mask=True)
    assert mask.dtype == bool and mask.shape == (240, 240) and mask.any()


def _dice(a: np.ndarray, b: np.ndarray) -> float:
    return float(2 * (a & b).sum() / max(1, a.sum() + b.sum()))


def test_a_turned_pack_film_is_read_upright_with_deskew(pack_dir):
    """covid-19-pneumonia-12 turned 7°: the option estimates the turn, reads the film upright and turns the masks
    back; they match the pack's lungs (turned with the film) better than the reading as stored."""
    from PIL import Image

    from cxrground.anatomy.segment import get_segmenter
    from cxrground.datasets.pack import Pack
    from cxrground.io.image import CXRImage

    rec = next(r for r in Pack(pack_dir).cohen() if r.image_id == "covid-19-pneumonia-12")
    film = rec.read()
    truth = [np.asarray(Image.fromarray(m.astype(np.uint8) * 255).rotate(7.0, Image.Resampling.NEAREST)) > 127
             for m in rec.lungs(film.shape)]
    turned = CXRImage(np.asarray(Image.fromarray(film.pixels).rotate(7.0, Image.Resampling.BILINEAR)),
                      path=str(rec.image_path), view=film.view)
    plain = get_segmenter("unet", threads=1).segment(turned)
    seg = get_segmenter("unet", threads=1, deskew=True)
    masks = seg.segment(turned)
    assert "tilt" not in plain.extra
    assert masks.extra["tilt_kept"] is True and abs(masks.extra["tilt"] + 7.0) <= 2.0
    assert abs(masks.extra["tilt"]) >= MIN_TILT
    assert masks.right_lung.shape == film.shape and masks.heart is not None and masks.heart.shape == film.shape
    assert not (masks.right_lung & masks.left_lung).any()
    upright = np.mean([_dice(masks.right_lung, truth[0]), _dice(masks.left_lung, truth[1])])
    stored = np.mean([_dice(plain.right_lung, truth[0]), _dice(plain.left_lung, truth[1])])
    assert upright > stored + 0.01
    assert 0.3 < masks.extra["heart_estimate"]["ctr"] < 0.7
    assert "read upright" in seg.provenance()["deskew"]
    assert get_segmenter("unet").provenance()["deskew"] == "off"


def test_an_upright_film_is_read_as_stored_with_deskew(pack_dir):
    """A film whose lungs give a tilt under MIN_TILT is read once, as stored."""
    from cxrground.anatomy.segment import get_segmenter
    from cxrground.datasets.pack import Pack

    rec = next(r for r in Pack(pack_dir).cohen() if r.image_id == "covid-19-pneumonia-7-PA")
    film = rec.read()
    plain = get_segmenter("unet", threads=1).segment(film)
    masks = get_segmenter("unet", threads=1, deskew=True).segment(film)
    assert masks.extra["tilt"] is None or abs(masks.extra["tilt"]) < MIN_TILT
    assert "tilt_kept" not in masks.extra
    assert np.array_equal(masks.right_lung, plain.right_lung) and np.array_equal(masks.left_lung, plain.left_lung)


def test_the_option_reaches_the_backend_from_the_command_line_form():
    from cxrground.anatomy.segment import get_segmenter

    assert get_segmenter("unet", deskew="true").deskew is True  # as --backend-opt / --segmenter-opt give it
    assert get_segmenter("unet", deskew="false").deskew is False and get_segmenter("unet").deskew is False


def test_ils_build_records_the_angle_of_a_film_read_upright(tmp_path):
    """`ils build --segmenter-opt deskew=true`: the unit of a film turned 10° records the angle it was read at."""
    import json

    from click.testing import CliRunner
    from PIL import Image

    from cxrground.cli import main
    from cxrground.datasets.synthetic import write_cohort
    from cxrground.datasets.synthetic.config import SynthConfig
    from cxrground.io.image import find_images

    cohort = tmp_path / "cohort"
    write_cohort(cohort, 2, seed=11, config=SynthConfig(width=256), progress=False)
    films = sorted(find_images(cohort / "files"))
    Image.open(films[0]).rotate(10.0, Image.Resampling.BILINEAR).save(films[0])
    out = tmp_path / "ils"
    res = CliRunner().invoke(main, ["ils", "build", "--images", str(cohort / "files"), "--out", str(out),
                                    "--segmenter-opt", "deskew=true", "--quiet"])
    assert res.exit_code == 0, res.output
    units = [json.loads(p.read_text()) for p in sorted((out / "units").glob("*.json"))]
    turned = [u for u in units if films[0].parent.name in u["study_key"]]
    assert len(units) == 2 and len(turned) == 1 and abs(turned[0]["tilt"] + 10.0) <= 3.0
    key = turned[0]["study_key"]
    rows = [json.loads(line) for line in (out / "anatomy.jsonl").read_text().splitlines()]
    assert [r.get("tilt") for r in rows if r["study"] == key] == [turned[0]["tilt"]]
    card = (out / "card.md").read_text()
    assert "## How films were read" in card and "1 film read turned upright" in card and f"`{key}`" in card


def test_the_card_says_nothing_of_films_read_as_stored():
    from cxrground.ils.card import reading_lines

    assert reading_lines({}) == [] and reading_lines({"tilt": []}) == []
    lines = reading_lines({"image_note": ["s1", "s2"], "content_box": ["s3"]})
    assert "- 2 films read as the grey-level negative (stored inverted): `s1`, `s2`." in lines
    assert any(line.startswith("- 1 film read inside the uniform borders") for line in lines)
