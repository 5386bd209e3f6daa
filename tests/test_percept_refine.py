"""CheXpercept §6 refinement (non-SAM fallback) and the §0 scale rule of DeformConfig."""

from __future__ import annotations

import numpy as np
import pytest

from cxrground.percept.config import DeformConfig
from cxrground.percept.refine import (
    REFINEMENT_BACKEND,
    clean_mask,
    components_by_size,
    disc_close,
    disc_dilate,
    disc_erode,
    external_contour,
    lattice_points,
    refine_mask,
    seed_point,
)


def square(shape, y0, x0, side):
    m = np.zeros(shape, dtype=bool)
    m[y0 : y0 + side, x0 : x0 + side] = True
    return m


def test_scaled_constants_follow_the_scale_rule():
    cfg = DeformConfig()
    s1024 = cfg.scaled((1024, 800))
    assert (s1024.min_area, s1024.refine_kernel, s1024.kernel, s1024.grid_step) == (1000, 15, 32, 64)
    s256 = cfg.scaled((200, 256))  # longest side 256 → s = 1/4
    assert s256.min_area == pytest.approx(1000 / 16)
    assert s256.refine_kernel == 4  # 15/4 = 3.75 → 4
    assert s256.kernel == 8 and s256.kernel_radius == 4
    assert s256.grid_step == 16 and s256.opposite_min_dist == 12.5 and s256.point_spacing == 7.5
    assert s256.fake_min_dist == 25 and s256.default_kernel == 1  # 5/4 → 1 (≥ 1)
    assert cfg.scaled((2048, 2048)).refine_kernel == 30
    assert cfg.depth("cardiomegaly") == 1 and cfg.depth("edema") == 2


def test_min_area_threshold_at_1024_and_scaled():
    big = np.zeros((1024, 1024), dtype=bool)
    big |= square(big.shape, 100, 100, 33)  # 1089 px ≥ 1000
    big |= square(big.shape, 500, 500, 31)  # 961 px < 1000
    ref = refine_mask(big)
    assert len(ref.components) == 1 and ref.components[0].mask[110, 110]
    small = np.zeros((256, 256), dtype=bool)
    small |= square(small.shape, 20, 20, 9)  # 81 px ≥ 62.5
    small |= square(small.shape, 100, 100, 7)  # 49 px < 62.5
    ref = refine_mask(small)
    assert len(ref.components) == 1 and ref.components[0].mask[24, 24] and not ref.optimal[103, 103]


def test_components_largest_first_and_optimal_is_their_union():
    m = np.zeros((256, 256), dtype=bool)
    m |= square(m.shape, 10, 10, 20)
    m |= square(m.shape, 100, 100, 40)
    m |= square(m.shape, 200, 30, 30)
    ref = refine_mask(m)
    sizes = [int(c.mask.sum()) for c in ref.components]
    assert [c.id for c in ref.components] == [0, 1, 2]
    assert sizes == sorted(sizes, reverse=True)
    assert ref.components[0].mask[120, 120] and ref.components[2].mask[15, 15]
    assert [c.name for c in ref.components] == ["optimal_component_0", "optimal_component_1", "optimal_component_2"]
    union = np.zeros_like(m)
    for c in ref.components:
        union |= c.mask
    assert np.array_equal(union, ref.optimal)
    assert ref.backend == REFINEMENT_BACKEND
    # equal sizes: raster order of the first pixel
    eq = square(m.shape, 150, 10, 20) | square(m.shape, 10, 150, 20)
    first = components_by_size(eq)[0]
    assert first[15, 155]


def test_holes_filled_notch_closed_spur_opened():
    scale = DeformConfig().scaled((256, 256))
    m = square((256, 256), 50, 50, 60)
    m[70:80, 70:80] = False  # hole
    m[50:65, 95] = False  # 1-px notch from the top edge
    m[100:102, 110:140] = True  # 2-px spur
    out = clean_mask(m, scale)
    assert out[75, 75] and out[60, 95]
    assert not out[101, 135]
    assert out[55:105, 55:105].all()


def test_opening_can_leave_small_pieces_that_are_dropped():
    scale = DeformConfig().scaled((256, 256))
    m = square((256, 256), 50, 50, 40)
    # a small blob tied by a 1-px bridge (one component before cleaning; the bridge opens, the blob < 62.5 px)
    m[70, 90:100] = True
    m |= square(m.shape, 66, 100, 7)
    out = clean_mask(m, scale)
    assert out[60, 60] and not out[69, 103]


def test_disc_morphology_radii():
    m = np.zeros((101, 101), dtype=bool)
    m[50, 50] = True
    d = disc_dilate(m, 10)
    assert d[50, 60] and not d[50, 61] and d[57, 57] and not d[58, 58]
    e = disc_erode(d, 4)
    assert e[50, 56] and not e[50, 57]
    c = disc_close(square((60, 60), 10, 10, 20) | square((60, 60), 10, 31, 20), 4)
    assert c[20, 30]  # 1-px gap closed
    ring = square((30, 30), 5, 5, 20) & ~square((30, 30), 10, 10, 10)
    cont = external_contour(ring)
    assert cont[5, 10] and not cont[10, 12] and not cont[15, 15]


def test_grid_points_seed_and_labels():
    scale = DeformConfig().scaled((256, 256))
    m = square((256, 256), 40, 40, 64)
    grid = lattice_points(m, scale.grid_step)
    assert grid and all(m[y, x] for x, y in grid)
    assert all((x - 8) % 16 == 0 and (y - 8) % 16 == 0 for x, y in grid)
    assert len(grid) == 16
    ref = refine_mask(m)
    comp = ref.components[0]
    cx, cy = comp.points[0]
    assert (cx, cy) == (72, 72) or (cx, cy) == (71, 71) or comp.mask[cy, cx]
    assert set(comp.points[1:]) | {comp.points[0]} >= set(lattice_points(comp.mask, scale.grid_step))
    assert comp.labels == (1,) * len(comp.points)
    # centroid outside (a U shape): the seed is the grid point nearest to the centroid
    u = square((256, 256), 40, 40, 80) & ~square((256, 256), 40, 70, 20)
    u[40:90, 70:90] = False
    g = lattice_points(u, scale.grid_step)
    seed = seed_point(u, g)
    ys, xs = np.nonzero(u)
    c = (np.rint(xs.mean()), np.rint(ys.mean()))
    assert not u[int(c[1]), int(c[0])]
    assert seed in g
    assert min((x - c[0]) ** 2 + (y - c[1]) ** 2 for x, y in g) == (seed[0] - c[0]) ** 2 + (seed[1] - c[1]) ** 2
