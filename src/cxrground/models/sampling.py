"""The 1:1 positive/negative balanced sampling of ILS.md §17.4, seeded.

Epoch length = 2 × #positives. Position ``i < #pos`` is the i-th positive; every other position is a
uniformly random negative drawn with replacement. The epoch's order is then shuffled. Everything is
drawn from ``numpy.random.default_rng((seed, epoch))`` so that an epoch is reproducible on its own,
which is what resuming a killed training run needs.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np

__all__ = ["BalancedSampler"]


class BalancedSampler:
    """Indices into a dataset for one epoch of balanced sampling (usable as a torch ``Sampler``)."""

    def __init__(self, positives: Sequence[int], negatives: Sequence[int], seed: int = 0,
                 shuffle: bool = True) -> None:
        if not positives:
            raise ValueError("balanced sampling needs at least one positive sample")
        self.positives = np.asarray(positives, dtype=np.int64)
        self.negatives = np.asarray(negatives, dtype=np.int64)
        self.seed = seed
        self.shuffle = shuffle
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch whose draw :meth:`__iter__` returns."""
        self.epoch = epoch

    def __len__(self) -> int:
        return 2 * len(self.positives)

    def indices(self, epoch: int | None = None) -> np.ndarray:
        """The dataset indices of one epoch, in sampling order."""
        rng = np.random.default_rng((self.seed, self.epoch if epoch is None else epoch))
        n = len(self.positives)
        if len(self.negatives):
            neg = self.negatives[rng.integers(0, len(self.negatives), size=n)]
        else:  # no negatives at all: the second half repeats the positives
            neg = self.positives[rng.integers(0, n, size=n)]
        order = np.concatenate([self.positives, neg])
        if self.shuffle:
            order = order[rng.permutation(len(order))]
        return order

    def __iter__(self) -> Iterator[int]:
        return iter(int(i) for i in self.indices())
