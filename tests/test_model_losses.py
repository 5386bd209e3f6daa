"""ILS.md §17.3 losses and §17.4 balanced sampling, checked against hand-computed values."""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from cxrground.models.losses import dice_loss, sigmoid_bce  # noqa: E402
from cxrground.models.sampling import BalancedSampler  # noqa: E402


def test_bce_is_mean_over_pixels_then_masks():
    logits = torch.zeros(2, 2, 2)
    targets = torch.tensor([[[1.0, 1.0], [1.0, 1.0]], [[0.0, 0.0], [0.0, 0.0]]])
    assert sigmoid_bce(logits, targets).item() == pytest.approx(math.log(2))
    logits[1] = -100.0  # the negative mask is now perfect: mean over masks halves the loss
    assert sigmoid_bce(logits, targets).item() == pytest.approx(math.log(2) / 2, rel=1e-4)


def test_dice_skips_empty_targets_and_normalises_by_positives():
    big = torch.full((1, 4, 4), 50.0)
    perfect = torch.ones(1, 4, 4)
    empty = torch.zeros(1, 4, 4)
    assert dice_loss(big, perfect).item() == pytest.approx(0.0, abs=1e-4)
    # an empty target adds nothing, whatever the prediction
    both = dice_loss(torch.cat([big, big]), torch.cat([perfect, empty]))
    assert both.item() == pytest.approx(0.0, abs=1e-4)
    assert dice_loss(big, empty).item() == 0.0
    # half-covered target, prediction everywhere: dice = 2*8/(16+8) -> loss 1/3
    half = torch.zeros(1, 4, 4)
    half[0, :2] = 1
    assert dice_loss(big, half).item() == pytest.approx(1 / 3, abs=1e-4)


def test_losses_reject_shape_mismatch():
    with pytest.raises(ValueError, match=r"\(1, 2, 2\)"):
        sigmoid_bce(torch.zeros(1, 2, 2), torch.zeros(1, 3, 3))


def test_balanced_sampler_is_one_to_one_and_seeded():
    pos, neg = list(range(10)), list(range(100, 150))
    s = BalancedSampler(pos, neg, seed=3)
    idx = s.indices()
    assert len(idx) == len(s) == 20
    assert sorted(i for i in idx if i < 100) == pos  # every positive exactly once
    assert sum(i >= 100 for i in idx) == 10
    assert np.array_equal(idx, BalancedSampler(pos, neg, seed=3).indices())
    s.set_epoch(1)
    assert not np.array_equal(idx, s.indices())
    assert not np.array_equal(idx, BalancedSampler(pos, neg, seed=4).indices())
