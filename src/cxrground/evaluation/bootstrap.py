"""Percentile bootstrap confidence intervals, shared by the ILS metrics and the CheXpercept scores."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

__all__ = ["bootstrap_ci"]


def bootstrap_ci(values: np.ndarray, stat: Callable[[np.ndarray], np.ndarray], n_boot: int = 1000,
                 seed: int = 0, level: float = 0.95) -> tuple[float, float] | None:
    """Percentile bootstrap CI of ``stat`` over the rows of ``values`` (resampled with replacement).

    ``stat`` receives an array of shape ``(B, n, ...)`` (B resamples) and returns ``(B,)``.
    """
    n = len(values)
    if n == 0 or n_boot <= 0:
        return None
    rng = np.random.default_rng(seed)
    chunk = max(1, 2_000_000 // n)
    stats: list[np.ndarray] = []
    done = 0
    while done < n_boot:
        b = min(chunk, n_boot - done)
        idx = rng.integers(0, n, size=(b, n))
        stats.append(np.asarray(stat(values[idx]), float))
        done += b
    all_stats = np.concatenate(stats)
    tail = (1.0 - level) / 2 * 100
    lo, hi = np.percentile(all_stats, [tail, 100 - tail])
    return float(lo), float(hi)
