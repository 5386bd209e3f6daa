"""The builtin deformer's geodesic step distance equals its definition by repeated dilation."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import ndimage

from cxrground.percept.deform.builtin import geodesic_steps

EIGHT = np.ones((3, 3), dtype=bool)
CROSS = ndimage.generate_binary_structure(2, 1)


def dilation_steps(seed: np.ndarray, allowed: np.ndarray, limit: int) -> np.ndarray:
    """The definition: step k dilates everything reached (8-neighbours on odd k, 4 on even) within allowed."""
    dist = np.full(seed.shape, np.inf)
    reached = seed.copy()
    dist[reached] = 0
    for k in range(1, limit + 1):
        grown = ndimage.binary_dilation(reached, structure=EIGHT if k % 2 else CROSS) & allowed & ~reached
        if not grown.any():
            break
        dist[grown] = k
        reached |= grown
    return dist


@pytest.mark.parametrize("case", range(120))
def test_geodesic_steps_match_repeated_dilation(case: int) -> None:
    rng = np.random.default_rng(case)
    h, w = (int(v) for v in rng.integers(1, 48, 2))
    allowed = rng.random((h, w)) < rng.uniform(0.35, 0.95)
    if case % 3:
        allowed = ndimage.binary_opening(allowed)
    if case % 2:
        seed = np.zeros((h, w), dtype=bool)
        seed[rng.integers(0, h), rng.integers(0, w)] = True
    else:
        seed = rng.random((h, w)) < 0.03
    limit = int(rng.integers(0, 70))
    assert np.array_equal(geodesic_steps(seed, allowed, limit), dilation_steps(seed, allowed, limit))


def test_geodesic_steps_diagonal_gap_needs_an_eight_step() -> None:
    # A one-pixel diagonal passage: only odd (8-neighbour) steps cross it.
    allowed = np.array([[1, 0, 0], [0, 1, 1], [0, 1, 1]], dtype=bool)
    seed = np.zeros((3, 3), dtype=bool)
    seed[0, 0] = True
    dist = geodesic_steps(seed, allowed, 10)
    assert dist[1, 1] == 1 and dist[0, 1] == np.inf
    assert np.array_equal(dist, dilation_steps(seed, allowed, 10))


def test_geodesic_steps_stop_at_the_limit() -> None:
    allowed = np.ones((1, 30), dtype=bool)
    seed = np.zeros((1, 30), dtype=bool)
    seed[0, 0] = True
    dist = geodesic_steps(seed, allowed, 5)
    assert list(dist[0, :7]) == [0, 1, 2, 3, 4, 5, np.inf]


def test_point_distance_matches_the_distance_transform() -> None:
    from cxrground.percept.deform.builtin import _distance_to

    rng = np.random.default_rng(3)
    mask = rng.random((90, 70)) < 0.004
    mask[40:50, 30:45] = True
    edt = ndimage.distance_transform_edt(~mask)
    yx = np.argwhere(mask)
    for y, x in zip(rng.integers(0, 90, 200), rng.integers(0, 70, 200), strict=True):
        assert _distance_to(yx, int(x), int(y)) == edt[y, x]
