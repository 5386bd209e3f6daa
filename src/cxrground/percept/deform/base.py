"""The deformer interface of CHEXPERCEPT.md §7.3 and its validity rule.

A :class:`Deformer` turns one mask plus expansion/contraction points into a deformed, §6-cleaned mask.
Backends: ``builtin`` (CPU, geodesic growth and disc removal) and ``sam`` (a local SAM checkpoint).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

from cxrground.errors import BackendError, MaskError
from cxrground.io.masks import as_mask
from cxrground.percept.refine import Point
from cxrground.registry import backend_label, call_backend

__all__ = ["CheckedDeformer", "DeformRequest", "DeformResult", "Deformer", "is_valid", "validity_problem"]


@dataclass(frozen=True, eq=False)
class DeformResult:
    """A deformed native bool mask and, for prompt-based backends, its low-resolution logits (N×N)."""

    mask: np.ndarray
    logits: np.ndarray | None = None


@dataclass(frozen=True, eq=False)
class DeformRequest:
    """The arguments of one :meth:`Deformer.deform` call (see there)."""

    image: np.ndarray
    mask: np.ndarray
    anatomy_region: np.ndarray
    lung_union: np.ndarray | None
    expansion_points: tuple[Point, ...]
    contraction_points: tuple[Point, ...]
    rng: np.random.Generator
    prev_logits: np.ndarray | None = None
    seed_points: tuple[Point, ...] | None = None


@runtime_checkable
class Deformer(Protocol):
    """Deforms ``mask`` toward the expansion points and away from the contraction points (§7.3).

    Backends inherit :meth:`deform` and implement :meth:`apply`; any object with a compatible ``deform``
    also satisfies the protocol.
    """

    name: str

    def deform(
        self,
        image: np.ndarray,
        mask: np.ndarray,
        anatomy_region: np.ndarray,
        lung_union: np.ndarray,
        expansion_points: Sequence[Point],
        contraction_points: Sequence[Point],
        rng: np.random.Generator,
        prev_logits: np.ndarray | None = None,
        *,
        seed_points: Sequence[Point] | None = None,
    ) -> DeformResult:
        """Return the deformed mask. ``anatomy_region`` bounds the change; ``lung_union`` confines the
        expansion kernels of the SAM mask prompt (None or all-True = not confined); ``seed_points`` are
        label-1 refinement points (default: the 64 px lattice of ``mask``). The caller checks :func:`is_valid`."""
        request = DeformRequest(
            image=image,
            mask=mask,
            anatomy_region=anatomy_region,
            lung_union=lung_union,
            expansion_points=tuple((int(x), int(y)) for x, y in expansion_points),
            contraction_points=tuple((int(x), int(y)) for x, y in contraction_points),
            rng=rng,
            prev_logits=prev_logits,
            seed_points=None if seed_points is None else tuple((int(x), int(y)) for x, y in seed_points),
        )
        return self.apply(request)

    def apply(self, request: DeformRequest) -> DeformResult:
        """Return the deformed mask for one request (backends implement this)."""
        raise NotImplementedError


class CheckedDeformer:
    """``deformer`` with its :meth:`deform` checked: an error of its own, or a result that is not a
    :class:`DeformResult` whose mask is binary (bool, or 0/1 or 0/255 numbers, returned as bool) with the input
    mask's shape, is a :class:`~cxrground.errors.BackendError` naming the deformer (a case failure, not an abort)."""

    def __init__(self, deformer: Deformer) -> None:
        self.inner = deformer
        self.name = str(getattr(deformer, "name", type(deformer).__name__))

    def __getattr__(self, attr: str) -> Any:
        if attr == "inner":  # not set yet (e.g. while unpickling)
            raise AttributeError(attr)
        return getattr(self.inner, attr)

    def deform(self, image: np.ndarray, mask: np.ndarray, *args: Any, **kwargs: Any) -> DeformResult:
        """The inner deformer's :meth:`Deformer.deform`, checked; its mask as bool."""
        res = call_backend("deformer", self.inner, "deform", DeformResult, "DeformResult", image, mask, *args, **kwargs)
        got = np.shape(res.mask)
        if got != np.shape(mask):
            raise BackendError(f"{backend_label('deformer', self.inner)} returned a mask of {got} for a mask of "
                               f"{np.shape(mask)} (expected the same shape)")
        try:
            deformed = as_mask(res.mask, "its mask")
        except MaskError as exc:
            raise BackendError(f"{backend_label('deformer', self.inner)} returned an unusable mask: {exc}") from exc
        return res if deformed is res.mask else DeformResult(deformed, res.logits)


def _value(mask: np.ndarray, point: Point) -> int:
    x, y = int(point[0]), int(point[1])
    if not (0 <= y < mask.shape[0] and 0 <= x < mask.shape[1]):
        return 0
    return int(mask[y, x])


def validity_problem(
    mask: np.ndarray,
    original: np.ndarray | None,
    expansion_points: Sequence[Point],
    contraction_points: Sequence[Point],
) -> str | None:
    """Return why a deformed mask breaks the §7.3 validity rule, or None when it holds.

    Rule: every expansion point inside (value ≥ 128 of 255; a bool mask counts True as 255) and every
    contraction point outside. Choice: the mask must also be non-empty and differ from ``original``.
    """
    m = np.asarray(mask)
    if m.dtype == bool:
        m = m.astype(np.uint8) * 255
    if not m.any():
        return "the deformed mask is empty"
    for p in expansion_points:
        if _value(m, p) < 128:
            return f"expansion point {tuple(int(v) for v in p)} is outside the deformed mask"
    for p in contraction_points:
        if _value(m, p) >= 128:
            return f"contraction point {tuple(int(v) for v in p)} is inside the deformed mask"
    if original is not None and np.array_equal(m >= 128, np.asarray(original) > 0):
        return "the deformed mask equals the original"
    return None


def is_valid(
    mask: np.ndarray,
    original: np.ndarray | None,
    expansion_points: Sequence[Point],
    contraction_points: Sequence[Point],
) -> bool:
    """Return True when :func:`validity_problem` finds nothing."""
    return validity_problem(mask, original, expansion_points, contraction_points) is None
