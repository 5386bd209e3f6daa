"""The shipped lung U-Net backend and the given-masks backend."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from cxrground.anatomy.segment import GivenMasksSegmenter, LungHeartMasks, postprocess_lungs
from cxrground.anatomy.segment.builtin import default_weights_path
from cxrground.datasets.synthetic import SynthConfig, generate_study
from cxrground.errors import InputError, MaskShapeError
from cxrground.io.image import CXRImage

#: Three CC BY-NC-SA (evaluation-only) images and the per-lung Dice lung_unet_v2 got on them
#: (the sidecar's metrics.nc_eval.per_image: right, left).
NC_IMAGES = {
    "jkms-35-e79-g001-l-a": (0.9588, 0.9654),
    "covid-19-pneumonia-15-PA": (0.9652, 0.9241),
    "kjr-21-e24-g001-l-a": (0.9657, 0.9648),
}
#: The lowest of those (0.924) minus a 0.05 margin.
DICE_FLOOR = 0.87


def _dice(a: np.ndarray, b: np.ndarray) -> float:
    return 2.0 * float((a & b).sum()) / max(1, int(a.sum() + b.sum()))


# --- the shipped U-Net ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def unet():
    pytest.importorskip("torch")
    pytest.importorskip("safetensors")
    from cxrground.anatomy.segment import UNetLungSegmenter

    return UNetLungSegmenter()


def test_shipped_weights_and_sidecar_exist():
    path = default_weights_path()
    assert path.is_file() and path.with_suffix(".json").is_file()
    assert path.stat().st_size < 5 * 1024 * 1024


def test_shipped_weights_load_with_matching_sha(unet):
    prov = unet.provenance()
    assert prov["backend"] == "unet" and len(prov["weights_sha256"]) == 64
    assert prov["heart"]["source"] == "estimate"
    meta = unet.meta
    assert meta["data"]["train_licences"] and all(
        lic in ("CC BY 3.0", "CC BY 4.0", "listed as authorized for everyone") for lic in meta["data"]["train_licences"]
    )
    assert "nc_eval" in meta["metrics"]


@pytest.mark.pack
def test_shipped_unet_segments_real_nc_images(unet, pack_dir: Path):
    from cxrground.datasets.pack import Pack

    recs = {r.image_id: r for r in Pack(pack_dir).cohen() if r.image_id in NC_IMAGES}
    assert len(recs) == len(NC_IMAGES)
    for rec in recs.values():
        assert not rec.shippable  # evaluation-only rows: never trained on
        im = rec.read()
        truth_r, truth_l = rec.lungs(im.shape)
        masks = unet.segment(im)
        assert masks.shape == im.shape
        d_r, d_l = _dice(masks.right_lung, truth_r), _dice(masks.left_lung, truth_l)
        assert d_r >= DICE_FLOOR and d_l >= DICE_FLOOR, (rec.image_id, d_r, d_l)
        assert masks.heart_source == "estimate" and masks.heart is not None
        assert "ctr" in masks.extra["heart_estimate"]


@pytest.mark.pack
def test_heart_right_half_stays_above_the_right_base_when_the_left_lung_runs_low(unet, pack_dir: Path):
    """covid-19-pneumonia-12 (AP portable): the U-Net's left lung runs below the diaphragm, far below the right base;
    the heart's right half still rests on the right hemidiaphragm."""
    from cxrground.anatomy.segment.builtin import _mediastinal_midline
    from cxrground.datasets.pack import Pack

    rec = next(r for r in Pack(pack_dir).cohen() if r.image_id == "covid-19-pneumonia-12")
    masks = unet.segment(rec.read())
    right, left, heart = masks.right_lung, masks.left_lung, masks.heart
    rows = np.flatnonzero((right | left).any(axis=1))
    base_r = np.flatnonzero(right.any(axis=1))[-1]
    assert np.flatnonzero(left.any(axis=1))[-1] > base_r + 0.1 * (rows[-1] - rows[0])  # the low left lung
    ys, xs = np.nonzero(heart)
    assert not ((xs < _mediastinal_midline(right, left)) & (ys > base_r + 0.01 * (rows[-1] - rows[0]))).any()


def test_output_is_native_size_for_non_square_images(unet):
    study = generate_study(0, 1, SynthConfig(width=256, height_ratio_range=(1.3, 1.3)))
    im = CXRImage(study.image)
    assert im.shape[0] != im.shape[1]
    masks = unet.segment(im)
    assert masks.shape == im.shape
    assert masks.right_lung.any() and masks.left_lung.any()
    wide = CXRImage(np.ascontiguousarray(study.image.T))
    assert unet.segment(wide).shape == wide.shape
    assert masks.extra["letterbox"]["src_hw"] == list(im.shape)


# --- post-processing -------------------------------------------------------------------------------

def test_postprocess_keeps_largest_component_fills_holes_and_is_exclusive():
    p_r = np.zeros((40, 40))
    p_l = np.zeros((40, 40))
    p_r[5:30, 3:18] = 0.9
    p_r[12, 10] = 0.1  # hole
    p_r[35:38, 35:38] = 0.9  # speck
    p_l[5:30, 16:36] = 0.8  # overlaps the right lung at columns 16-17
    r, lft = postprocess_lungs(p_r, p_l)
    assert r[12, 10] and not r[36, 36]
    assert not (r & lft).any()
    assert r[10, 16] and not lft[10, 16]  # the higher probability wins


def test_postprocess_hysteresis_grows_only_through_connected_low_pixels():
    rng = np.random.default_rng(3)
    p_r = rng.uniform(0.0, 0.6, (40, 40))
    p_l = rng.uniform(0.0, 0.6, (40, 40))
    for low in (None, 0.5, 0.7):  # no hysteresis: the plain rule
        plain = postprocess_lungs(p_r, p_l)
        assert all(np.array_equal(a, b) for a, b in zip(plain, postprocess_lungs(p_r, p_l, 0.5, low), strict=True))
    p_r = np.zeros((40, 40))
    p_l = np.zeros((40, 40))
    p_r[5:20, 3:15] = 0.9
    p_r[20:30, 3:15] = 0.3  # an unsure base below the sure lung
    p_r[33:38, 3:15] = 0.3  # unsure, not connected
    p_l[5:30, 20:36] = 0.9
    r, _ = postprocess_lungs(p_r, p_l)
    assert not r[25, 8]
    r, lft = postprocess_lungs(p_r, p_l, 0.5, 0.25)
    assert r[25, 8] and r[29, 14] and not r[35, 8]
    assert not (r & lft).any()


# --- given masks -----------------------------------------------------------------------------------

def test_given_masks_with_truth_heart_and_with_estimate():
    study = generate_study(0, 0, SynthConfig(width=256))
    m = study.anatomy_masks
    im = CXRImage(study.image, path="/data/x/study.png")
    truth = GivenMasksSegmenter({"/data/x/study.png": (m["right_lung"], m["left_lung"], m["heart"])}, label="synthetic")
    got = truth.segment(im)
    assert isinstance(got, LungHeartMasks) and got.heart_source == "truth"
    assert np.array_equal(got.heart, m["heart"]) and got.source == "given:synthetic"

    est = GivenMasksSegmenter({"study.png": {"right_lung": m["right_lung"], "left_lung": m["left_lung"]}})
    got = est.segment(im)
    assert got.heart_source == "estimate" and got.heart is not None
    assert _dice(got.heart, m["heart"]) > 0.8

    none = GivenMasksSegmenter.from_arrays(m["right_lung"], m["left_lung"], estimate_heart=False)
    got = none.segment(CXRImage(study.image))
    assert got.heart is None and got.heart_source == "none"
    assert none.provenance()["backend"] == "given"


def test_given_masks_errors():
    study = generate_study(0, 0, SynthConfig(width=256))
    m = study.anatomy_masks
    seg = GivenMasksSegmenter({"a.png": (m["right_lung"], m["left_lung"])})
    with pytest.raises(InputError, match="no masks"):
        seg.segment(CXRImage(study.image, path="b.png"))
    with pytest.raises(InputError, match="path"):
        seg.segment(CXRImage(study.image))
    bad = GivenMasksSegmenter.from_arrays(m["right_lung"][:-1], m["left_lung"][:-1])
    with pytest.raises(MaskShapeError):
        bad.segment(CXRImage(study.image))


def test_unet_with_missing_weights_is_a_config_error(tmp_path: Path):
    pytest.importorskip("torch")
    from cxrground.anatomy.segment import UNetLungSegmenter
    from cxrground.errors import ConfigError

    seg = UNetLungSegmenter(tmp_path / "nope.safetensors")  # lazy: nothing loaded yet
    with pytest.raises(ConfigError, match="not found"):
        seg.segment(CXRImage(np.zeros((64, 64), dtype=np.uint8)))


def test_unet_ctr_calibration_option_reaches_the_heart_outline():
    from cxrground.anatomy.segment import get_segmenter
    from cxrground.anatomy.segment.heart import OUTLINE_CALIBRATION

    study = generate_study(0, 2, SynthConfig(width=256))
    im = CXRImage(study.image, path="/data/x/study.png")
    plain = get_segmenter("unet", threads=1)
    calibrated = get_segmenter("unet", threads=1, ctr_calibration="true")  # as --backend-opt gives it
    assert "outline_calibration" not in plain.provenance()["heart"]
    assert calibrated.provenance()["heart"]["outline_calibration"] == list(OUTLINE_CALIBRATION)
    a, b = plain.segment(im), calibrated.segment(im)
    drawn = a.extra["heart_estimate"]["ctr"]
    assert b.extra["heart_estimate"]["outline_calibration"]["ctr_drawn"] == pytest.approx(drawn, abs=0.01)
    assert b.extra["heart_estimate"]["ctr"] == pytest.approx(OUTLINE_CALIBRATION[0] + OUTLINE_CALIBRATION[1] * drawn,
                                                             abs=0.02)
