"""Simulated lesions on films with known zone truth (tiny arrays)."""

from __future__ import annotations

import numpy as np
import pytest

from cxrground.anatomy.ils_locations import lung_zone_bands
from cxrground.errors import ConfigError, InputError
from cxrground.lesions.lesion_sim import (
    LesionSimParams,
    add_attenuation,
    simulate_lesions,
    smooth_noise,
    zone_labels_from_field,
)
from masks_helpers import TOY_H, TOY_W, toy_lungs

H, W = TOY_H, TOY_W
_lungs = toy_lungs


def _film(seed: int = 0) -> np.ndarray:
    right, left = _lungs()
    img = np.full((H, W), 190.0)
    img[right | left] = 60.0
    img += np.random.default_rng(seed).normal(0, 2.0, img.shape)
    return np.clip(img, 0, 255).astype(np.uint8)


def test_add_attenuation_is_identity_at_zero_monotone_and_bounded() -> None:
    g = np.array([[0, 60, 128, 200, 255]], dtype=np.uint8)
    assert np.array_equal(add_attenuation(g, np.zeros(g.shape)), g)
    more = add_attenuation(g, np.full(g.shape, 0.5)).astype(int)
    assert (more >= g).all() and (more <= 255).all()
    gain = more - g.astype(int)
    assert gain[0, 1] > gain[0, 3] > 0  # dark lung brightens more than dense tissue
    with pytest.raises(InputError, match="attenuation must be >= 0"):
        add_attenuation(g, np.full(g.shape, -0.1))
    with pytest.raises(InputError, match="shape"):
        add_attenuation(g, np.zeros((2, 5)))


def test_smooth_noise_is_normalised_and_seeded() -> None:
    a = smooth_noise(np.random.default_rng(3), (50, 61), 6.0)
    b = smooth_noise(np.random.default_rng(3), (50, 61), 6.0)
    assert a.shape == (50, 61) and np.array_equal(a, b)
    assert abs(float(a.mean())) < 1e-5 and abs(float(a.std()) - 1.0) < 1e-4
    # smooth: neighbouring pixels are strongly correlated
    assert np.corrcoef(a[:, :-1].ravel(), a[:, 1:].ravel())[0, 1] > 0.8


def test_simulation_is_deterministic_for_a_seed() -> None:
    right, left = _lungs()
    img = _film()
    a, b = simulate_lesions(img, right, left, seed=11), simulate_lesions(img, right, left, seed=11)
    assert np.array_equal(a.pixels, b.pixels) and a.labels == b.labels and a.kinds == b.kinds
    others = [simulate_lesions(img, right, left, seed=s) for s in range(12)]
    assert len({o.pixels.tobytes() for o in others}) > 1


def test_all_zones_lesion_labels_every_zone_and_stays_in_the_lungs() -> None:
    right, left = _lungs()
    img = _film()
    p = LesionSimParams(p_negative=0.0, p_all_zones=1.0, p_effusion=0.0, gamma=(1.0, 1.0),
                        ground_glass_attenuation=(0.3, 0.3), airspace_cover=(0.9, 0.9))
    sim = simulate_lesions(img, right, left, p, seed=2)
    assert sim.labels == (True,) * 6 and all(sim.kinds)
    far = ~_dilate(right | left, 4)
    assert float(sim.attenuation[far].max()) == 0.0
    assert (sim.pixels.astype(int) >= img.astype(int)).all()
    assert sim.pixels[right | left].mean() > img[right | left].mean() + 10


def _dilate(mask: np.ndarray, n: int) -> np.ndarray:
    from scipy import ndimage

    return ndimage.binary_dilation(mask, iterations=n)


def test_negative_film_has_no_label_and_only_gamma() -> None:
    right, left = _lungs()
    img = _film()
    sim = simulate_lesions(img, right, left, LesionSimParams(p_negative=1.0, gamma=(1.0, 1.0)), seed=5)
    assert sim.labels == (False,) * 6 and sim.kinds == ((),) * 6
    assert np.array_equal(sim.pixels, img) and not sim.attenuation.any()
    dark = simulate_lesions(img, right, left, LesionSimParams(p_negative=1.0, gamma=(2.0, 2.0)), seed=5)
    assert dark.labels == (False,) * 6 and dark.pixels.mean() < img.mean()


def test_chosen_zones_carry_the_lesions_and_labels_follow_the_field() -> None:
    right, left = _lungs()
    img = _film()
    p = LesionSimParams(p_negative=0.0, p_all_zones=0.0, edge=0.0, gamma=(1.0, 1.0))
    seen = set()
    for seed in range(25):
        sim = simulate_lesions(img, right, left, p, seed=seed)
        drawn = tuple(bool(k) for k in sim.kinds)
        assert any(drawn) and not all(drawn)
        for zi, (lab, d) in enumerate(zip(sim.labels, drawn, strict=True)):
            if lab:
                assert d or sim.cover[zi] >= p.min_zone_cover
            if not d and "effusion" not in {k for kk in sim.kinds for k in kk}:
                assert sim.cover[zi] < p.min_zone_cover  # no effusion: no spill past a hard zone edge
        seen |= {k for kk in sim.kinds for k in kk}
        labels, cover = zone_labels_from_field(sim.attenuation, right, left, p.label_attenuation, p.min_zone_cover)
        assert labels == sim.labels and cover == sim.cover
    assert seen == {"ground-glass", "airspace", "effusion"}


def test_effusion_sits_at_the_base() -> None:
    right, left = _lungs()
    p = LesionSimParams(p_negative=0.0, p_all_zones=1.0, p_effusion=1.0, gamma=(1.0, 1.0))
    for seed in range(8):
        sim = simulate_lesions(_film(), right, left, p, seed=seed)
        if "effusion" in sim.kinds[2] and sim.kinds[2] == ("effusion",):
            base = lung_zone_bands(right)["lung base"]
            upper = lung_zone_bands(right)["upper zone lung"]
            assert sim.attenuation[base].max() > sim.attenuation[upper].max()
            return
    pytest.fail("no effusion-only lower zone was drawn in 8 seeds")


def test_effusion_spill_reaches_below_the_lung_and_is_off_by_default() -> None:
    right, left = _lungs()
    base = LesionSimParams(p_negative=0.0, p_all_zones=1.0, p_effusion=1.0, gamma=(1.0, 1.0))
    spill = LesionSimParams(p_negative=0.0, p_all_zones=1.0, p_effusion=1.0, gamma=(1.0, 1.0),
                            effusion_spill=(0.1, 0.1))
    below = np.zeros_like(right)
    bottom = int(np.flatnonzero(right.any(axis=1))[-1])
    below[bottom + 1: bottom + 4] = right[bottom - 3: bottom].any(axis=0)  # just under the right lung's base
    above = np.zeros_like(right)
    above[: int(np.flatnonzero(right.any(axis=1))[0]) - 3] = True  # above the apex (past the blend)
    for seed in range(8):
        dry = simulate_lesions(_film(), right, left, base, seed=seed)
        wet = simulate_lesions(_film(), right, left, spill, seed=seed)
        if "effusion" in dry.kinds[2]:
            assert wet.attenuation[below].max() > 3 * max(dry.attenuation[below].max(), 1e-3)
            assert wet.attenuation[above].max() == 0.0  # never above the fluid
            assert wet.labels[2]
            return
    pytest.fail("no right-base effusion was drawn in 8 seeds")


def test_bad_input_and_parameters_are_named() -> None:
    right, left = _lungs()
    with pytest.raises(InputError, match="lung mask is empty"):
        simulate_lesions(_film(), right, np.zeros_like(left))
    with pytest.raises(InputError):
        simulate_lesions(_film()[:-1], right, left)
    with pytest.raises(ConfigError, match="p_negative"):
        LesionSimParams(p_negative=1.5)
    with pytest.raises(ConfigError, match="airspace_cover"):
        LesionSimParams(airspace_cover=(0.8, 0.2))
    with pytest.raises(ConfigError, match="effusion_spill"):
        LesionSimParams(effusion_spill=(0.2, 0.1))
