"""Zone features from the normative z-map and the logistic zone classifier (tiny arrays)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from cxrground.errors import ConfigError, InputError
from cxrground.lesions.normative import fit_normative, normalise_intensity
from cxrground.lesions.zone_classifier import MIL_POOLS, ZoneClassifier, _mil_loss, fit_logistic, fit_mil_logistic
from cxrground.lesions.zone_features import (
    FEATURE_NAMES,
    feature_columns,
    film_zone_features,
    zone_feature_matrix,
)
from masks_helpers import TOY_H, TOY_W, toy_lungs

H, W = TOY_H, TOY_W
_lungs = toy_lungs


def _film(rng: np.random.Generator, blob: tuple[int, int] | None = None) -> np.ndarray:
    right, left = _lungs()
    img = np.full((H, W), 190.0)
    img[right | left] = 60.0
    if blob is not None:
        yy, xx = np.mgrid[:H, :W]
        img[((yy - blob[0]) ** 2 + (xx - blob[1]) ** 2 <= 12 ** 2) & (right | left)] = 150.0
    img += rng.normal(0, 2.0, img.shape)
    return np.clip(img, 0, 255).astype(np.uint8)


def test_zone_features_locate_an_opacity_in_its_zone_and_side():
    rng = np.random.default_rng(0)
    right, left = _lungs()
    model = fit_normative([(_film(rng), right, left) for _ in range(6)], grid=(6, 3))
    px = _film(rng, blob=(100, 38))  # right lung base = zone C
    feats, z = film_zone_features(model, px, right, left)
    assert feats.shape == (6, len(FEATURE_NAMES))
    assert z.shape == px.shape
    col = {n: j for j, n in enumerate(FEATURE_NAMES)}
    assert int(np.argmax(feats[:, col["z_frac_gt2"]])) == 2
    assert feats[2, col["asym_z_p75"]] > 1.0 > feats[5, col["asym_z_p75"]]  # C vs F, the same zone of the other lung
    assert feats[2, col["norm_mean"]] > feats[5, col["norm_mean"]]
    # film-level columns are the same on every zone row; position is one-hot upper/mid/lower per lung
    assert np.ptp(feats[:, col["film_z_mean"]]) == 0
    assert feats[:, [col["zone_upper"], col["zone_mid"], col["zone_lower"]]].tolist() == [
        [1, 0, 0], [0, 1, 0], [0, 0, 1]] * 2
    assert feats[:3, col["area_frac"]].sum() == pytest.approx(1.0)
    assert 0.0 < feats[0, col["film_lung_grey"]] < 1.0


def test_zone_features_refuse_an_empty_lung_and_mismatched_shapes():
    right, left = _lungs()
    px = np.zeros((H, W), np.uint8)
    z = np.zeros((H, W))
    with pytest.raises(InputError, match="both lungs"):
        zone_feature_matrix(px, z, z, right, np.zeros_like(left))
    with pytest.raises(InputError):
        zone_feature_matrix(px, z[:-1], z, right, left)


def test_feature_columns_by_name():
    assert feature_columns(["z_p75", "zone_lower"]) == [FEATURE_NAMES.index("z_p75"), FEATURE_NAMES.index("zone_lower")]
    with pytest.raises(InputError, match="z_p99"):
        feature_columns(["z_p99"])


def test_fit_logistic_recovers_a_known_direction_and_penalty_shrinks_it():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(400, 2))
    y = (rng.random(400) < 1 / (1 + np.exp(-(3 * x[:, 0] - 0.5)))).astype(float)
    coef, intercept = fit_logistic(x, y, l2=0.0)
    assert coef[0] == pytest.approx(3.0, abs=0.8)
    assert abs(coef[1]) < 0.5
    assert intercept == pytest.approx(-0.5, abs=0.4)
    shrunk, _ = fit_logistic(x, y, l2=100.0)
    assert abs(shrunk[0]) < abs(coef[0])
    with pytest.raises(ValueError, match="0 or 1"):
        fit_logistic(x, y * 2, 1.0)


def test_zone_classifier_flags_round_trip_and_checks_its_file(tmp_path):
    rng = np.random.default_rng(2)
    x = np.column_stack([rng.normal(size=200), np.ones(200)])  # a constant column gets std 1
    y = (x[:, 0] > 0).astype(float)
    clf = ZoneClassifier.fit(x, y, ("a", "b"), l2=1.0, threshold=0.5, meta={"name": "t"})
    assert clf.flags(np.array([[2.0, 1.0], [-2.0, 1.0]])).tolist() == [True, False]
    path = clf.save(tmp_path / "zc.npz")
    again = ZoneClassifier.load(path)
    assert again.feature_names == ("a", "b")
    assert np.allclose(again.probability(x), clf.probability(x))
    assert json.loads(path.with_suffix(".json").read_text())["name"] == "t"
    with pytest.raises(InputError, match="2 columns"):
        again.probability(np.zeros((3, 3)))
    path.write_bytes(path.read_bytes() + b"x")
    with pytest.raises(InputError, match="sha256"):
        ZoneClassifier.load(path)
    with pytest.raises(ConfigError, match="coef"):
        ZoneClassifier(("a",), np.zeros(1), np.ones(1), np.zeros(2), 0.0)
    # normalise_intensity is the feature's intensity scale: aerated lung near 0, mediastinum 1
    right, left = _lungs()
    norm = normalise_intensity(_film(rng), right, left)
    assert abs(float(np.median(norm[right]))) < 0.1


def _mil_films(rng: np.random.Generator, n: int = 240) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Films of 6 zones, feature 0 raised in the abnormal zones (1-3 per positive film), feature 1 noise."""
    zone = np.zeros((n, 6), bool)
    y = np.arange(n) % 2
    for i in np.flatnonzero(y):
        zone[i, rng.choice(6, size=rng.integers(1, 4), replace=False)] = True
    x = rng.normal(size=(n, 6, 2))
    x[:, :, 0] += 2.5 * zone
    return x, y.astype(float), zone


@pytest.mark.parametrize("pool", MIL_POOLS)
def test_mil_loss_gradient_matches_finite_differences(pool):
    rng = np.random.default_rng(3)
    a = np.concatenate([np.ones((7, 6, 1)), rng.normal(size=(7, 6, 3))], axis=2)
    y, w, pen = (rng.random(7) < 0.5).astype(float), np.ones(7), np.array([0.0, 1.0, 1.0, 1.0])
    beta = rng.normal(size=4) * 0.5
    _, grad = _mil_loss(beta, a, y, w, pool, pen)
    num = [(_mil_loss(beta + e, a, y, w, pool, pen)[0] - _mil_loss(beta - e, a, y, w, pool, pen)[0]) / 2e-6
           for e in np.eye(4) * 1e-6]
    assert np.allclose(grad, num, atol=1e-5)


@pytest.mark.parametrize("pool", MIL_POOLS)
def test_mil_classifier_finds_the_abnormal_zones_from_film_labels_only(pool):
    rng = np.random.default_rng(4)
    x, y, _ = _mil_films(rng)
    clf = ZoneClassifier.fit_films(x, y, ("signal", "noise"), l2=1.0, pool=pool)
    assert clf.coef[0] > 1.0 and abs(clf.coef[1]) < 0.3 * clf.coef[0]
    xt, _, zt = _mil_films(np.random.default_rng(5))
    p = clf.probability(xt.reshape(-1, 2)).reshape(-1, 6)
    assert p[zt].mean() > p[~zt].mean() + 0.3  # zone level, though trained on film labels
    assert clf.meta["pool"] == pool and clf.meta["films"] == len(y)


def test_mil_fit_refuses_bad_input():
    x, y = np.zeros((4, 6, 2)), np.array([0.0, 1.0, 0.0, 1.0])
    with pytest.raises(ValueError, match="pool"):
        fit_mil_logistic(x, y, pool="max")
    with pytest.raises(ValueError, match="films, zones, d"):
        fit_mil_logistic(x[0], y)
    with pytest.raises(ValueError, match="0 or 1"):
        fit_mil_logistic(x, y * 2)
    with pytest.raises(ValueError, match="l2"):
        fit_mil_logistic(x, y, l2=-1.0)
    with pytest.raises(ValueError, match="expected"):
        ZoneClassifier.fit_films(x, y, ("a",))
