"""The simulated-lesion zone reader recipe on tiny films (no pack needed)."""

from __future__ import annotations

import numpy as np
import pytest

from cxrground.errors import ConfigError, InputError
from cxrground.lesions.lesion_sim import LesionSimParams
from cxrground.lesions.zone_classifier import ZoneClassifier
from cxrground.lesions.zone_features import FEATURE_NAMES
from cxrground.lesions.zone_sim_fit import (
    ZoneSimRecipe,
    fit_zone_sim,
    fold_models,
    sim_seed,
    simulated_zone_rows,
    working_film,
    youden_probability,
    zone_probabilities,
)

H, W = 120, 140


def _films(n: int) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    yy, xx = np.mgrid[:H, :W]
    out = []
    for i in range(n):
        rng = np.random.default_rng(i)
        right = ((xx - 38) / (25.0 + i % 3)) ** 2 + ((yy - 62) / 48.0) ** 4 <= 1.0
        left = ((xx - 102) / 26.0) ** 2 + ((yy - 62) / (47.0 + i % 2)) ** 4 <= 1.0
        img = np.full((H, W), 190.0)
        img[right | left] = 60.0 + 4 * (yy[right | left] / H)
        img += rng.normal(0, 2.0, img.shape)
        out.append((np.clip(img, 0, 255).astype(np.uint8), right, left))
    return out


def test_seeds_are_stable_and_distinct() -> None:
    assert sim_seed(0, "a", 1) == sim_seed(0, "a", 1)
    assert len({sim_seed(0, "a", c) for c in range(5)} | {sim_seed(1, "a", 0), sim_seed(0, "b", 0)}) == 7


def test_working_film_keeps_small_films() -> None:
    film = _films(1)[0]
    assert all(a is b for a, b in zip(working_film(*film), film, strict=True))
    big = (np.zeros((1300, 1000), np.uint8), np.zeros((1300, 1000), bool), np.zeros((1300, 1000), bool))
    assert max(working_film(*big)[0].shape) < 1300


def test_simulated_rows_train_a_reader_that_finds_the_lesions() -> None:
    films = _films(10)
    ids = [f"f{i}" for i in range(10)]
    models, folds = fold_models(films, [f"p{i}" for i in range(10)])
    assert sorted(set(folds.tolist())) == list(range(5))
    normal = [i != 3 for i in range(10)]
    only, _ = fold_models(films, [f"p{i}" for i in range(10)], normal)
    for i, m in enumerate(only):  # fitted on the other folds' normal films only
        assert m.meta["films"] == sum(1 for j in range(10) if folds[j] != folds[i] and normal[j])
    params = LesionSimParams(p_negative=0.3, p_all_zones=0.2)
    x, y, src = simulated_zone_rows(films, ids, models, params, copies=4, seed=1)
    assert x.shape == (40, 6, len(FEATURE_NAMES)) and y.shape == (40, 6) and y.dtype == bool
    assert np.array_equal(src, np.repeat(np.arange(10), 4))
    assert 0 < y.mean() < 1
    again = simulated_zone_rows(films, ids, models, params, copies=4, seed=1)
    assert np.array_equal(x, again[0]) and np.array_equal(y, again[1])
    recipe = ZoneSimRecipe(params, copies=4, features=("z_mean", "z_p75", "norm_mean", "zone_lower"), l2=1.0)
    clf = fit_zone_sim(x, y, folds[src], recipe, {"name": "test"})
    assert isinstance(clf, ZoneClassifier) and 0.0 < clf.threshold < 1.0 and clf.meta["name"] == "test"
    cols = [FEATURE_NAMES.index(n) for n in recipe.features]
    prob = clf.probability(x[:, :, cols].reshape(-1, len(cols))).reshape(-1, 6)
    assert prob[y].mean() > prob[~y].mean() + 0.2  # inserted lesions are what the reader flags
    assert recipe.as_dict()["params"]["p_negative"] == 0.3
    read = zone_probabilities(clf, models[0], *films[0])
    assert list(read) == ["A", "B", "C", "D", "E", "F"] and all(0.0 <= v <= 1.0 for v in read.values())


def test_youden_probability_separates() -> None:
    assert youden_probability(np.array([0.8, 0.9]), np.array([0.1, 0.2])) in (0.8, 0.2, 0.9)
    th = youden_probability(np.array([0.8, 0.9]), np.array([0.1, 0.2]))
    assert (np.array([0.8, 0.9]) >= th).all() and not (np.array([0.1, 0.2]) >= th).any()


def test_recipe_checks() -> None:
    with pytest.raises(ConfigError, match="copy"):
        ZoneSimRecipe(copies=0)
    with pytest.raises(ConfigError, match="l2"):
        ZoneSimRecipe(l2=-1.0)
    with pytest.raises(InputError, match="unknown zone feature"):
        ZoneSimRecipe(features=("nope",))


def test_shipped_reader_loads_with_its_recipe_and_nih_normal_films(pack_dir) -> None:
    import json

    from cxrground.datasets.pack import Pack
    from cxrground.lesions.zone_sim_fit import ZONE_SIM_V1, default_zone_sim_path

    reader = ZoneClassifier.load(default_zone_sim_path())
    assert reader.feature_names == FEATURE_NAMES and 0.0 < reader.threshold < 1.0
    assert reader.meta["recipe"] == json.loads(json.dumps(ZONE_SIM_V1.as_dict()))
    assert "NIH" in reader.meta["licence"] and "Brixia" in reader.meta["summary"]
    normal = {r.image_id for r in Pack(pack_dir).nih() if r.labels == ("No Finding",)}
    assert reader.meta["films"] and set(reader.meta["films"]) <= normal


class _ShrinkingSegmenter:
    """Test double: the films' lungs with the base cut off where the copy is bright; loses the left lung on every
    third call."""

    name = "shrinking"

    def __init__(self, right: np.ndarray, left: np.ndarray) -> None:
        self.right, self.left, self.calls = right, left, 0

    def segment(self, image):
        from cxrground.anatomy.segment.base import LungHeartMasks

        self.calls += 1
        dense = image.pixels > 120
        left = np.zeros_like(self.left) if self.calls % 3 == 0 else self.left & ~dense
        return LungHeartMasks(self.right & ~dense, left, None, "none", self.name)


def test_resegmented_rows_keep_the_labels_and_drop_copies_that_lose_a_lung() -> None:
    films = _films(6)
    right, left = films[0][1], films[0][2]
    films = [(px, right, left) for px, _, _ in films]
    ids = [f"f{i}" for i in range(6)]
    models, _ = fold_models(films, [f"p{i}" for i in range(6)])
    params = LesionSimParams(p_negative=0.2, effusion_attenuation=(1.5, 2.0), p_effusion=1.0)
    x, y, src = simulated_zone_rows(films, ids, models, params, copies=3, seed=2)
    seg = _ShrinkingSegmenter(right, left)
    xr, yr, srcr = simulated_zone_rows(films, ids, models, params, copies=3, seed=2, segmenter=seg)
    assert seg.calls == 18 and len(xr) == 18 - 6 and xr.shape[1:] == x.shape[1:]
    kept = np.array([k % 3 != 2 for k in range(18)])  # calls 3, 6, ... lost the left lung
    assert np.array_equal(yr, y[kept]) and np.array_equal(srcr, src[kept])  # labels from the clean lungs
    assert not np.allclose(xr, x[kept])  # features read with the re-segmented lungs
    assert ZoneSimRecipe(resegment=True).as_dict()["resegment"] is True
    assert "resegment" not in ZoneSimRecipe().as_dict()  # round-1 recipes (zone_sim_v1's sidecar) unchanged
    assert "effusion_spill" not in ZoneSimRecipe().as_dict()["params"]
    spilled = ZoneSimRecipe(LesionSimParams(effusion_spill=(0.03, 0.1)), resegment=True).as_dict()
    assert spilled["params"]["effusion_spill"] == (0.03, 0.1)
